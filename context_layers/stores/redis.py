"""``redis://host:port/db?prefix=lf``: one store for many workers on many machines.

Every write that must be atomic is one Lua script (Redis runs a script alone, and with
``appendonly yes`` logs its effects as one unit): the version check, the tape-continuity
checks and all the writes of a save happen in one step, every check before any write,
so a failed check writes nothing. Keys, all under ``<prefix>:``::

    meta                      hash   format, timer_index (the version of ``due``; absent: fill it)
    index                     zset   instance id, scored by creation time
    due                       zset   waiting instance id, scored by its earliest timer due time
    i:{id}                    hash   record, version, format, process_id, status, created, updated
    i:{id}:heads              hash   context -> last seq
    i:{id}:t:<context>        list   event JSON; element n-1 is seq n
    i:{id}:snaps / :blobs     hash   snapshot id -> manifest / sha256 -> part (of snapshots and tapes)
    i:{id}:confs              set    confirmation ids of the instance
    confs / confs:pending     hash / set   confirmation id -> JSON / ids not yet answered
    lease:{id}                string owner, with a PX expiry

``delete`` names tape keys inside its script, so this backend needs a single Redis
(or a primary with replicas), not Redis Cluster.
"""

from __future__ import annotations

import contextlib
import json
import socket
import ssl
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from datetime import datetime
from typing import Any
from urllib.parse import parse_qsl, urlsplit

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
    InvalidRecord,
    InvalidStoreURL,
    PreparedSnapshot,
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

try:
    import redis as _redis
except ImportError as exc:  # pragma: no cover - redis is a dependency; keep the message useful anyway
    raise ImportError("the redis store needs redis-py: pip install 'redis>=5'") from exc

__all__ = ["RedisStore", "map_redis_error", "check_redis_url", "redis_refuses_for_now", "redis_client", "NotTLS",
           "not_tls_advice"]


class NotTLS(_redis.exceptions.ConnectionError):
    """A ``rediss://`` server that did not answer the TLS handshake: a plain Redis, or not Redis's
    TLS port. Trying again cannot help, so it is named as such instead of as an outage."""


def not_tls_advice(where: str) -> str:
    """What to do about ``NotTLS``, for the messages of the store and of the queue."""
    return (f"{where} does not answer TLS (rediss://); use redis:// for a Redis without TLS, or check the port "
            "(Redis's TLS port is its tls-port)")


#: Why a TLS handshake fails when the other end does not speak TLS at all (OpenSSL's reasons).
_NOT_TLS_REASONS = frozenset({"WRONG_VERSION_NUMBER", "RECORD_LAYER_FAILURE", "PACKET_LENGTH_TOO_LONG",
                              "UNEXPECTED_EOF_WHILE_READING", "HTTP_REQUEST", "UNKNOWN_PROTOCOL"})


class _TLSConnection(_redis.connection.SSLConnection):
    """redis-py's TLS connection with its handshake bounded by the connect timeout: redis-py runs it
    under the read timeout (30 s), which is how long a plain Redis, waiting for the end of what it
    takes for a command, kept a ``rediss://`` client before it failed."""

    def _connect(self) -> Any:
        wrap = getattr(self, "_wrap_socket_with_ssl", None)
        if wrap is None:  # a redis-py without the split (before 5.1): its own way
            return super()._connect()  # type: ignore[no-untyped-call]
        tcp: Any = _redis.connection.Connection._connect
        sock = tcp(self)  # TCP: its errors are redis-py's usual ones
        sock.settimeout(self.socket_connect_timeout)
        try:
            tls = wrap(sock)
        except ssl.SSLCertVerificationError:
            sock.close()
            raise  # it speaks TLS; its certificate is the problem, and the message says so
        except (socket.timeout, ssl.SSLError, ConnectionResetError, BrokenPipeError) as exc:
            sock.close()
            if isinstance(exc, ssl.SSLError) and not isinstance(exc, ssl.SSLEOFError) and (
                    getattr(exc, "reason", None) not in _NOT_TLS_REASONS):
                raise
            why = ("no TLS reply within the connect timeout" if isinstance(exc, socket.timeout)
                   else f"{type(exc).__name__}: {str(exc).rstrip('.')}")
            raise NotTLS(f"{self.host}:{self.port} did not answer the TLS handshake ({why})") from exc
        tls.settimeout(self.socket_timeout)
        return tls


def redis_client(url: str, **options: Any) -> Any:
    """``redis.Redis.from_url(url, **options)``; a ``rediss://`` URL gets a TLS connection whose
    handshake fails within the connect timeout, as ``NotTLS``, at a server that does not speak TLS."""
    if urlsplit(url).scheme.lower() == "rediss":
        options.setdefault("connection_class", _TLSConnection)
    return _redis.Redis.from_url(url, **options)


#: URL query options besides ``prefix``: what redis-py parses, and the connection settings it
#: passes on by name. Anything else would reach redis-py as an unknown keyword (a TypeError on
#: the first command), so it is refused up front with the list.
_URL_OPTIONS = frozenset(getattr(_redis.connection, "URL_QUERY_ARGUMENT_PARSERS", {})) | {
    "db", "socket_timeout", "socket_connect_timeout", "socket_keepalive", "retry_on_timeout", "max_connections",
    "health_check_interval", "client_name", "username", "password", "protocol", "ssl_cert_reqs", "ssl_ca_certs",
    "ssl_ca_path", "ssl_certfile", "ssl_keyfile", "ssl_password", "ssl_check_hostname", "ssl_ciphers"}


def check_redis_url(url: str) -> None:
    """``InvalidStoreURL`` naming what is wrong with a redis URL (given without ``prefix``):
    redis-py would take ``/abc`` or ``/0/x`` as database 0, pass an unknown ``?option`` on as a
    keyword, and fail on a bad port only with a bare ValueError."""
    shown = _redact(url)
    form = "redis://[:PASSWORD@]HOST[:PORT][/DB][?prefix=NAME]"
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    if scheme in ("redis", "rediss"):
        if not parts.hostname:
            raise InvalidStoreURL(f"redis store URL {shown} names no host; write {form}")
        try:
            parts.port
        except ValueError:
            raise InvalidStoreURL(f"redis store URL {shown}: the port is not a number; write {form}") from None
        path = parts.path.strip("/")
        if path and not path.isdigit():
            raise InvalidStoreURL(f"redis store URL {shown}: the database {path!r} is not a number; write {form} "
                                  "with DB a number such as 0")
    for name, _value in parse_qsl(parts.query, keep_blank_values=True):
        if name not in _URL_OPTIONS:
            raise InvalidStoreURL(f"redis store URL {shown}: unknown option {name!r}; it takes prefix= and "
                                  f"redis-py's {', '.join(sorted(_URL_OPTIONS))}")


def _db_of(url: str) -> str:
    path = urlsplit(url).path.strip("/")
    return path or dict(parse_qsl(urlsplit(url).query)).get("db", "0")

# KEYS: 1 instance, 2 index, 3 heads, 4 snaps, 5 blobs, 6 instance confs, 7 confs, 8 pending, 9 due, 10.. tapes
# ARGV: 1 mode (create | save | side), 2 expected version or "", 3 record or "", 4 process_id, 5 status,
#       6 now (the record's created on create, its updated on save; else the time), 7 format,
#       8 instance id, 9 the record's due time or "" (none), 10 #appends, then per append:
#       context, first seq, n, n events; then #tape parts, (hash, part) pairs;
#       then #snapshots, per snapshot: id, manifest, #blobs, (hash, body) pairs; then #confs, (id, JSON) pairs.
_WRITE = """
local mode = ARGV[1]
local exists = redis.call('EXISTS', KEYS[1]) == 1
if mode == 'create' then
  if exists then return {'exists'} end
elseif not exists then
  return {'missing'}
end
local version = 0
if exists then version = tonumber(redis.call('HGET', KEYS[1], 'version')) end
if ARGV[2] ~= '' and tonumber(ARGV[2]) ~= version then return {'conflict', version} end
local n_app = tonumber(ARGV[10])
local pos = 11
for a = 1, n_app do
  local first, n = tonumber(ARGV[pos + 1]), tonumber(ARGV[pos + 2])
  local last = tonumber(redis.call('HGET', KEYS[3], ARGV[pos]) or '0')
  if first ~= last + 1 then return {'gap', ARGV[pos], first, last} end
  pos = pos + 3 + n
end
-- every check passed: write
if mode ~= 'side' then
  version = version + 1
  if mode == 'create' then
    redis.call('HSET', KEYS[1], 'created', ARGV[6])
    redis.call('ZADD', KEYS[2], ARGV[6], ARGV[8])
  end
  redis.call('HSET', KEYS[1], 'version', version, 'updated', ARGV[6], 'format', ARGV[7])
  if ARGV[3] ~= '' then
    redis.call('HSET', KEYS[1], 'record', ARGV[3], 'process_id', ARGV[4], 'status', ARGV[5])
    if ARGV[9] == '' then
      redis.call('ZREM', KEYS[9], ARGV[8])
    else
      redis.call('ZADD', KEYS[9], ARGV[9], ARGV[8])
    end
  end
end
pos = 11
for a = 1, n_app do
  local first, n = tonumber(ARGV[pos + 1]), tonumber(ARGV[pos + 2])
  local i = pos + 3
  while i <= pos + 2 + n do
    local j = math.min(i + 499, pos + 2 + n)
    redis.call('RPUSH', KEYS[9 + a], unpack(ARGV, i, j))
    i = j + 1
  end
  redis.call('HSET', KEYS[3], ARGV[pos], first + n - 1)
  pos = pos + 3 + n
end
local n_parts = tonumber(ARGV[pos])
for b = 0, n_parts - 1 do
  redis.call('HSETNX', KEYS[5], ARGV[pos + 1 + 2 * b], ARGV[pos + 2 + 2 * b])
end
pos = pos + 1 + 2 * n_parts
local n_snap = tonumber(ARGV[pos])
pos = pos + 1
for s = 1, n_snap do
  local n_blobs = tonumber(ARGV[pos + 2])
  for b = 0, n_blobs - 1 do
    redis.call('HSETNX', KEYS[5], ARGV[pos + 3 + 2 * b], ARGV[pos + 4 + 2 * b])
  end
  redis.call('HSET', KEYS[4], ARGV[pos], ARGV[pos + 1])
  pos = pos + 3 + 2 * n_blobs
end
local n_conf = tonumber(ARGV[pos])
pos = pos + 1
for c = 1, n_conf do
  if redis.call('HSETNX', KEYS[7], ARGV[pos], ARGV[pos + 1]) == 1 then
    redis.call('SADD', KEYS[6], ARGV[pos])
    redis.call('SADD', KEYS[8], ARGV[pos])
  end
  pos = pos + 2
end
return {'ok', version}
"""

# KEYS: 1 confs, 2 pending; ARGV: id, new JSON, the JSON it replaces (compare-and-set)
_ANSWER = """
local cur = redis.call('HGET', KEYS[1], ARGV[1])
if not cur then return 'missing' end
if cur ~= ARGV[3] then return 'changed' end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
redis.call('SREM', KEYS[2], ARGV[1])
return 'ok'
"""

# KEYS: 1 instance, 2 index, 3 heads, 4 snaps, 5 blobs, 6 instance confs, 7 confs, 8 pending, 9 due, 10 lease
# ARGV: 1 instance id, 2 tape key prefix
_DELETE = """
if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
for _, ctx in ipairs(redis.call('HKEYS', KEYS[3])) do redis.call('DEL', ARGV[2] .. ctx) end
for _, cid in ipairs(redis.call('SMEMBERS', KEYS[6])) do
  redis.call('HDEL', KEYS[7], cid)
  redis.call('SREM', KEYS[8], cid)
end
redis.call('DEL', KEYS[1], KEYS[3], KEYS[4], KEYS[5], KEYS[6], KEYS[10])
redis.call('ZREM', KEYS[2], ARGV[1])
redis.call('ZREM', KEYS[9], ARGV[1])
return 1
"""

# Filling the timer index of instances saved before it existed, a batch at a time: an index
# value is written only if the instance still has the version it was computed from (a save
# since then wrote its own). KEYS: 1 due; ARGV: instance key prefix, then (id, version, due or "")
# triples.
_FILL_DUE = """
for i = 2, #ARGV, 3 do
  local id, due = ARGV[i], ARGV[i + 2]
  if redis.call('HGET', ARGV[1] .. id .. '}', 'version') == ARGV[i + 1] then
    if due == '' then redis.call('ZREM', KEYS[1], id) else redis.call('ZADD', KEYS[1], due, id) end
  end
end
return 1
"""

# KEYS: 1 lease; ARGV: 1 op (acquire | renew | release), 2 owner, 3 ttl ms
_LEASE = """
local cur = redis.call('GET', KEYS[1])
if ARGV[1] == 'acquire' then
  if cur and cur ~= ARGV[2] then return 0 end
  redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3])
  return 1
end
if cur ~= ARGV[2] then return 0 end
if ARGV[1] == 'renew' then redis.call('PEXPIRE', KEYS[1], ARGV[3]) else redis.call('DEL', KEYS[1]) end
return 1
"""


#: Replies of a server that answers but refuses work for now (out of memory, a read-only replica
#: after a failover, a failed RDB save, a long script): an outage to wait out, not a bad entry.
_REFUSING = ("MISCONF", "MASTERDOWN", "NOREPLICAS", "BUSY ", "TRYAGAIN")


def redis_refuses_for_now(exc: BaseException) -> bool:
    """A redis-py error that says the server refuses commands for now (see ``_REFUSING``)."""
    e = _redis.exceptions
    return isinstance(exc, (e.OutOfMemoryError, e.ReadOnlyError)) or (
        isinstance(exc, e.ResponseError) and str(exc).startswith(_REFUSING))


def map_redis_error(exc: BaseException, url: str) -> StoreError:
    """redis-py exceptions -> the store's (the one place they are mapped)."""
    # AuthenticationError is a ConnectionError: ask it first
    if isinstance(exc, _redis.exceptions.AuthenticationError):
        return StoreUnavailable(f"redis store {url}: {str(exc).rstrip('.')}; put the password in the URL "
                                "(redis://:PASSWORD@host)")
    if isinstance(exc, NotTLS):
        return StoreUnavailable(f"redis store {url}: {not_tls_advice('the server')} ({exc}); nothing was read or "
                                "written")
    if redis_refuses_for_now(exc):
        return StoreUnavailable(f"redis store {url} refuses commands for now ({type(exc).__name__}: "
                                f"{str(exc).rstrip('.')}); fix that on the server (maxmemory, a replica that is "
                                "read-only, a failed RDB save), then retry")
    if isinstance(exc, (_redis.exceptions.ConnectionError, _redis.exceptions.TimeoutError)):
        return StoreUnavailable(f"redis store {url}: {type(exc).__name__}: {str(exc).rstrip('.')}. Is redis-server "
                                "running? A save interrupted this way may or may not have been applied: reload the "
                                "instance")
    return StoreError(f"redis store {url}: {type(exc).__name__}: {exc}")


class RedisStore:
    def __init__(self, url: str = "redis://127.0.0.1:6379/0", *, prefix: str = "layerflow",
                 client: Any = None, tape_part_bytes: int | None = PART_BYTES) -> None:
        self.url = url
        self._part_bytes = tape_part_bytes  # None: tape values stored whole (tape_parts)
        self.prefix = prefix
        self._url_for_errors = _redact(url)
        if not isinstance(prefix, str) or not prefix or ":" in prefix:
            raise InvalidStoreURL(f"redis store {self._url_for_errors}: prefix {prefix!r} is not usable; give a "
                                  "non-empty name without ':' (?prefix=NAME), or leave it out for 'layerflow'")
        if client is None:
            check_redis_url(url)
        try:
            with self._mapped():
                self.redis: Any = client if client is not None else redis_client(
                    url, decode_responses=True, socket_connect_timeout=5, socket_timeout=30, health_check_interval=30)
                self._write_script = self.redis.register_script(_WRITE)
                self._answer_script = self.redis.register_script(_ANSWER)
                self._delete_script = self.redis.register_script(_DELETE)
                self._lease_script = self.redis.register_script(_LEASE)
                self._fill_due_script = self.redis.register_script(_FILL_DUE)
                self._timer_index_ready = False
                meta = self._k("meta")
                if self.redis.hsetnx(meta, "format", STORE_FORMAT):  # a new prefix: nothing to fill the index from
                    self.redis.hsetnx(meta, "timer_index", TIMER_INDEX)
                check_format(f"redis store {self._url_for_errors} prefix {prefix!r}", self.redis.hget(meta, "format"))
        except ValueError as exc:  # redis-py's own URL parsing
            raise InvalidStoreURL(f"redis store URL {self._url_for_errors}: {exc}; write "
                                  "redis://[:PASSWORD@]HOST[:PORT][/DB][?prefix=NAME]") from None
        except StoreUnavailable as exc:
            cause = exc.__cause__
            if isinstance(cause, (_redis.exceptions.AuthenticationError, NotTLS)) or (
                    cause is not None and redis_refuses_for_now(cause)):
                raise  # it answered, or is not Redis over TLS: its own message says what to do
            raise StoreUnavailable(f"cannot reach the redis store {self._url_for_errors} "
                                   f"({type(cause).__name__}: {str(cause).rstrip('.')}); nothing was read or written. "
                                   "Start redis-server there, or point --store / $LAYERFLOW_STORE at a server that "
                                   f"answers{_maybe_tls_only(url, cause)}") from cause
        except StoreError as exc:
            if "DB index is out of range" in str(exc):
                raise InvalidStoreURL(f"redis store URL {self._url_for_errors}: that server has no database "
                                      f"{_db_of(url)} (a Redis has 16 by default, 0-15); use one it has") from None
            raise

    def __repr__(self) -> str:
        return f"<RedisStore {self._url_for_errors} prefix={self.prefix!r}>"

    @contextlib.contextmanager
    def _mapped(self) -> Iterator[None]:
        try:
            yield
        except _redis.exceptions.RedisError as exc:
            raise map_redis_error(exc, self._url_for_errors) from exc

    def _k(self, *parts: str) -> str:
        return ":".join((self.prefix, *parts))

    def _ik(self, instance_id: str, *parts: str) -> str:
        return ":".join((self.prefix, "i", "{" + instance_id + "}", *parts))

    def _instance_keys(self, instance_id: str) -> list[str]:
        return [self._ik(instance_id), self._k("index"), self._ik(instance_id, "heads"),
                self._ik(instance_id, "snaps"), self._ik(instance_id, "blobs"), self._ik(instance_id, "confs"),
                self._k("confs"), self._k("confs", "pending"), self._k("due")]

    # ----- the one write path ------------------------------------------------------------------

    def _run_write(self, mode: str, instance_id: str, w: PreparedWrite, expected_version: int | None) -> int:
        keys = self._instance_keys(instance_id)
        r = w.record
        # on create the record's created stamps both created and updated (an engine record has them equal)
        now = r.stamp("created" if mode == "create" else "updated", time.time) if r else time.time()
        args: list[Any] = [mode, "" if expected_version is None else expected_version, r.text if r else "",
                           r.process_id if r else "", r.status if r else "", repr(now), INSTANCE_FORMAT,
                           instance_id, "" if r is None or r.due is None else repr(r.due), len(w.appends)]
        parts: dict[str, str] = {}
        for a in w.appends:
            keys.append(self._ik(instance_id, "t", a.context))
            args += [a.context, a.first_seq, len(a.events), *a.events]
            parts.update(a.parts)
        args.append(len(parts))
        for digest, body in parts.items():
            args += [digest, body]
        args.append(len(w.snapshots))
        for s in w.snapshots:
            args += [s.snapshot_id, s.manifest, len(s.blobs)]
            for digest, body in s.blobs.items():
                args += [digest, body]
        args.append(len(w.confirmations))
        for cid, text in w.confirmations:
            args += [cid, text]
        with self._mapped():
            out = self._write_script(keys=keys, args=args)
        status = out[0]
        if status == "ok":
            return int(out[1])
        if status == "conflict":
            raise version_conflict(instance_id, int(expected_version or 0), int(out[1]))
        if status == "gap":
            raise tape_gap(instance_id, out[1], int(out[2]), int(out[3]))
        if status == "exists":
            raise InstanceExists(f"instance {instance_id!r} already exists; load and save it, "
                                 "or create it under a new id")
        if status == "missing":
            raise InstanceNotFound(instance_id)
        raise StoreError(f"redis store {self._url_for_errors}: unexpected script reply {out!r}")

    # ----- instances ---------------------------------------------------------------------------

    def create(self, record: Mapping[str, Any], *, tape_appends: TapeAppends | None = None,
               snapshots: Mapping[str, Mapping[str, Any]] | None = None,
               confirmations: Sequence[Mapping[str, Any]] = ()) -> int:
        w = prepare_write(None, record, tape_appends, snapshots, confirmations, self._part_bytes)
        assert w.record is not None
        return self._run_write("create", w.record.instance_id, w, None)

    def load(self, instance_id: str) -> tuple[dict[str, Any], int]:
        with self._mapped():
            text, version, fmt = self.redis.hmget(self._ik(instance_id), "record", "version", "format")
        if text is None:
            raise InstanceNotFound(instance_id)
        check_format(f"instance {instance_id!r}", fmt, INSTANCE_FORMAT)
        return record_json(text, instance_id, f"redis store {self._url_for_errors} (key {self._ik(instance_id)!r})"), \
            int(version)

    def save(self, instance_id: str, record: Mapping[str, Any], expected_version: int,
             tape_appends: TapeAppends | None = None, *,
             snapshots: Mapping[str, Mapping[str, Any]] | None = None,
             confirmations: Sequence[Mapping[str, Any]] = ()) -> int:
        w = prepare_write(instance_id, record, tape_appends, snapshots, confirmations, self._part_bytes)
        return self._run_write("save", instance_id, w, expected_version)

    def list_instances(self, status: str | None = None) -> list[InstanceSummary]:
        with self._mapped():
            ids = self.redis.zrange(self._k("index"), 0, -1)
        return self._summaries(ids, status)

    def count_instances(self) -> int:
        """How many instances the store holds (one ZCARD; not part of ``Store``: a worker's start line)."""
        with self._mapped():
            return int(self.redis.zcard(self._k("index")))

    def due_instances(self, until: float | datetime) -> list[InstanceSummary]:
        bound = until_seconds(until)
        if not self._timer_index_ready:
            self._fill_timer_index()
        with self._mapped():
            ids = self.redis.zrangebyscore(self._k("due"), "-inf", repr(bound))  # ties: by id, as Redis orders them
        return self._summaries(ids, None)

    def _fill_timer_index(self, batch: int = 500) -> None:
        """Index the instances of a prefix written before the timer index, once. Records are read
        in batches outside any transaction; ``_FILL_DUE`` writes a value only where the version is
        still the one read, so a save in between (which indexed itself) is never overwritten."""
        meta = self._k("meta")
        with self._mapped():
            found = self.redis.hget(meta, "timer_index")
            if found is None or int(found) < TIMER_INDEX:
                ids = self.redis.zrange(self._k("index"), 0, -1)
                for start in range(0, len(ids), batch):
                    chunk = ids[start:start + batch]
                    pipe = self.redis.pipeline(transaction=False)
                    for iid in chunk:
                        pipe.hget(self._ik(iid), "status")
                    waiting = [iid for iid, st in zip(chunk, pipe.execute()) if st == "waiting"]  # only they have one
                    if not waiting:
                        continue
                    pipe = self.redis.pipeline(transaction=False)
                    for iid in waiting:
                        pipe.hmget(self._ik(iid), "record", "version")
                    args: list[Any] = [self._k("i", "{")]
                    for iid, (text, version) in zip(waiting, pipe.execute()):
                        if text is None:
                            continue  # deleted meanwhile
                        due = timer_due(json.loads(text))
                        args += [iid, version, "" if due is None else repr(due)]
                    self._fill_due_script(keys=[self._k("due")], args=args)
                self.redis.hset(meta, "timer_index", TIMER_INDEX)
        self._timer_index_ready = True

    def _summaries(self, ids: Sequence[str], status: str | None) -> list[InstanceSummary]:
        fields = ("process_id", "status", "version", "created", "updated")
        with self._mapped():
            pipe = self.redis.pipeline(transaction=False)
            for iid in ids:
                pipe.hmget(self._ik(iid), *fields)
            rows = pipe.execute()
        out = []
        for iid, (process_id, st, version, created, updated) in zip(ids, rows):
            if version is None or (status is not None and st != status):
                continue  # deleted between the two reads
            out.append(summary(iid, process_id, st, int(version), float(created), float(updated)))
        return out

    def delete(self, instance_id: str) -> bool:
        keys = [*self._instance_keys(instance_id), self._k("lease", instance_id)]
        with self._mapped():
            return bool(self._delete_script(keys=keys, args=[instance_id, self._ik(instance_id, "t", "")]))

    # ----- tapes -------------------------------------------------------------------------------

    def append_events(self, instance_id: str, context_name: str, events: Sequence[Mapping[str, Any]],
                      expected_version: int | None = None) -> int:
        a = prepare_append(instance_id, context_name, events, self._part_bytes)
        return self._run_write("save", instance_id, PreparedWrite(None, (a,) if a else (), (), ()), expected_version)

    def read_tape(self, instance_id: str, context_name: str, since_seq: int = 0) -> list[dict[str, Any]]:
        with self._mapped():
            pipe = self.redis.pipeline(transaction=True)
            pipe.exists(self._ik(instance_id))
            pipe.lrange(self._ik(instance_id, "t", context_name), max(since_seq, 0), -1)
            pipe.hget(self._ik(instance_id, "heads"), context_name)
            exists, texts, head = pipe.execute()
        if not exists:
            raise InstanceNotFound(instance_id)
        if head is not None and len(texts) < int(head) - max(since_seq, 0):
            # a save writes the list and its head in one script: a shorter list lost events since
            raise self._tape_lost(instance_id, context_name, int(head), len(texts) + max(since_seq, 0))
        blobs_key = self._ik(instance_id, "blobs")

        def fetch(hashes: Iterable[str]) -> dict[str, str]:
            # parts are never removed but with their instance: one missing means it was deleted meanwhile
            hashes = list(hashes)
            with self._mapped():
                bodies = self.redis.hmget(blobs_key, hashes)
                if None in bodies and not self.redis.exists(self._ik(instance_id)):
                    raise InstanceNotFound(instance_id)
            return {h: b for h, b in zip(hashes, bodies) if b is not None}

        return read_events(texts, fetch, f"tape {context_name!r} of instance {instance_id!r}")

    def _tape_lost(self, instance_id: str, context_name: str, head: int, held: int) -> InvalidRecord:
        key = self._ik(instance_id, "t", context_name)
        return InvalidRecord(
            f"tape {context_name!r} of instance {instance_id!r} in redis store {self._url_for_errors} is missing "
            f"events: key {key!r} holds {held} of its {head} ({'the key is gone' if not held else 'it was cut short'}). "
            "Redis evicted it (a maxmemory-policy other than noeviction) or it was deleted by hand; the instance "
            "cannot be rebuilt from what is left and is not run. Restore the store from a backup, and give a Redis "
            "that holds a store maxmemory-policy noeviction (and appendonly yes)")

    def tape_heads(self, instance_id: str) -> dict[str, int]:
        with self._mapped():
            pipe = self.redis.pipeline(transaction=True)
            pipe.exists(self._ik(instance_id))
            pipe.hgetall(self._ik(instance_id, "heads"))
            exists, heads = pipe.execute()
        if not exists:
            raise InstanceNotFound(instance_id)
        return {ctx: int(n) for ctx, n in sorted(heads.items())}

    # ----- snapshots ---------------------------------------------------------------------------

    def put_snapshot(self, instance_id: str, snapshot_id: str, snapshot: Mapping[str, Any]) -> None:
        manifest, blobs = split_snapshot(snapshot)
        w = PreparedWrite(None, (), (PreparedSnapshot(snapshot_id, manifest, blobs),), ())
        self._run_write("side", instance_id, w, None)

    def get_snapshot(self, instance_id: str, snapshot_id: str) -> dict[str, Any]:
        with self._mapped():
            pipe = self.redis.pipeline(transaction=True)
            pipe.exists(self._ik(instance_id))
            pipe.hget(self._ik(instance_id, "snaps"), snapshot_id)
            exists, manifest = pipe.execute()
        if not exists:
            raise InstanceNotFound(instance_id)
        if manifest is None:
            raise snapshot_not_found(instance_id, snapshot_id, self.list_snapshots(instance_id))
        blobs_key = self._ik(instance_id, "blobs")

        def fetch(hashes: Iterable[str]) -> dict[str, str]:
            hashes = list(hashes)
            with self._mapped():
                bodies = self.redis.hmget(blobs_key, hashes)
            return {h: b for h, b in zip(hashes, bodies) if b is not None}

        return join_snapshot(manifest, fetch, f"snapshot {snapshot_id!r} of instance {instance_id!r}")

    def list_snapshots(self, instance_id: str) -> list[str]:
        with self._mapped():
            pipe = self.redis.pipeline(transaction=True)
            pipe.exists(self._ik(instance_id))
            pipe.hkeys(self._ik(instance_id, "snaps"))
            exists, ids = pipe.execute()
        if not exists:
            raise InstanceNotFound(instance_id)
        return sorted(ids)

    def blob_stats(self, instance_id: str) -> BlobStats:
        with self._mapped():
            pipe = self.redis.pipeline(transaction=True)
            pipe.exists(self._ik(instance_id))
            pipe.hvals(self._ik(instance_id, "blobs"))
            exists, bodies = pipe.execute()
        if not exists:
            raise InstanceNotFound(instance_id)
        return BlobStats(len(bodies), sum(len(b.encode()) for b in bodies))

    # ----- confirmations ---------------------------------------------------------------------

    def put_confirmation(self, confirmation: Mapping[str, Any]) -> Confirmation:
        cid, text = prepare_confirmation(confirmation)
        iid = json.loads(text)["instance_id"]
        self._run_write("side", iid, PreparedWrite(None, (), (), ((cid, text),)), None)
        return self.get_confirmation(cid)

    def get_confirmation(self, confirmation_id: str) -> Confirmation:
        with self._mapped():
            text = self.redis.hget(self._k("confs"), confirmation_id)
        if text is None:
            raise ConfirmationNotFound(confirmation_id)
        return json.loads(text)  # type: ignore[no-any-return]

    def list_confirmations(self, instance_id: str | None = None, *, pending_only: bool = True) -> list[Confirmation]:
        with self._mapped():
            if instance_id is not None:
                ids = sorted(self.redis.smembers(self._ik(instance_id, "confs")))
                texts = self.redis.hmget(self._k("confs"), ids) if ids else []
            elif pending_only:
                ids = sorted(self.redis.smembers(self._k("confs", "pending")))
                texts = self.redis.hmget(self._k("confs"), ids) if ids else []
            else:
                texts = self.redis.hvals(self._k("confs"))
        items = [json.loads(t) for t in texts if t is not None]
        return sorted((c for c in items if not pending_only or c["status"] == "pending"),
                      key=lambda c: (c["created"], c["id"]))

    def answer_confirmation(self, confirmation_id: str, answer: Any, actor: str) -> Confirmation:
        keys = [self._k("confs"), self._k("confs", "pending")]
        while True:
            with self._mapped():
                current = self.redis.hget(keys[0], confirmation_id)
            if current is None:
                raise ConfirmationNotFound(confirmation_id)
            new = answered(json.loads(current), answer, actor)
            with self._mapped():
                status = self._answer_script(keys=keys, args=[confirmation_id, dumps(new), current])
            if status == "ok":
                return new  # type: ignore[return-value]
            if status == "missing":
                raise ConfirmationNotFound(confirmation_id)
            # "changed": answered (or deleted) in between; the next read says which

    # ----- leases ----------------------------------------------------------------------------

    def _lease(self, op: str, instance_id: str, owner: str, ttl: float = 1.0) -> bool:
        ms = max(1, int(check_ttl(ttl) * 1000))
        with self._mapped():
            return bool(self._lease_script(keys=[self._k("lease", instance_id)], args=[op, owner, ms]))

    def acquire_lease(self, instance_id: str, owner: str, ttl: float) -> bool:
        return self._lease("acquire", instance_id, owner, ttl)

    def renew_lease(self, instance_id: str, owner: str, ttl: float) -> bool:
        return self._lease("renew", instance_id, owner, ttl)

    def release_lease(self, instance_id: str, owner: str) -> bool:
        return self._lease("release", instance_id, owner)

    def lease_owner(self, instance_id: str) -> str | None:
        with self._mapped():
            owner: str | None = self.redis.get(self._k("lease", instance_id))
        return owner

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.redis.close()

    def __enter__(self) -> "RedisStore":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _maybe_tls_only(url: str, cause: BaseException | None) -> str:
    """A hint for a plain ``redis://`` connection that the server dropped as soon as it spoke: what a
    Redis that takes only TLS on that port does."""
    if urlsplit(url).scheme.lower() != "redis" or not isinstance(cause, _redis.exceptions.ConnectionError):
        return ""
    text = str(cause)
    if "reset by peer" in text or "Connection closed by server" in text or "Broken pipe" in text:
        return ". A server that drops the connection at once may take only TLS on that port: use rediss://"
    return ""


def _redact(url: str) -> str:
    """The URL without its password, for messages."""
    from urllib.parse import urlsplit, urlunsplit

    parts = urlsplit(url)
    if parts.password is None:
        return url
    host = parts.hostname or ""
    netloc = f"{parts.username or ''}:***@{host}" + (f":{parts.port}" if parts.port else "")
    return urlunsplit(parts._replace(netloc=netloc))
