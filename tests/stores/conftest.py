"""One parametrised fixture, ``store``, runs the contract suite against every backend.

Redis: ``$REDIS_URL`` or redis://127.0.0.1:6379/0, a unique key prefix per test, and
only that prefix is removed afterwards. No answer: skip, or fail when
``LAYERFLOW_REQUIRE_REDIS=1`` (CI).
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from context_layers.stores import Store, open_store

REDIS_URL = os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0")
REQUIRE_REDIS = os.environ.get("LAYERFLOW_REQUIRE_REDIS") == "1"


def redis_or_skip(url: str = REDIS_URL) -> None:
    import redis

    try:
        redis.Redis.from_url(url, socket_connect_timeout=2, socket_timeout=2).ping()
    except redis.RedisError as exc:
        message = f"no Redis answers on {url} ({exc}); set REDIS_URL or start redis-server"
        if REQUIRE_REDIS:
            pytest.fail(message + " (LAYERFLOW_REQUIRE_REDIS=1 makes this a failure)")
        pytest.skip(message)


def drop_prefix(url: str, prefix: str) -> None:
    import redis

    client = redis.Redis.from_url(url)
    keys = list(client.scan_iter(match=f"{prefix}:*", count=1000))
    for i in range(0, len(keys), 500):
        client.delete(*keys[i:i + 500])
    client.close()


@dataclass
class Backend:
    name: str
    url: str
    opened: list[Store]

    def open(self) -> Store:
        """Another handle on the same store (a second process, as far as the backend can tell)."""
        if self.name == "memory":
            return self.opened[0] if self.opened else self._keep(open_store(self.url))
        return self._keep(open_store(self.url))

    def _keep(self, store: Store) -> Store:
        self.opened.append(store)
        return store

    @property
    def sqlite_path(self) -> str:
        return self.url.split("://", 1)[1][1:]

    @property
    def redis_prefix(self) -> str:
        return self.url.rsplit("prefix=", 1)[1]


@pytest.fixture(params=["memory", "sqlite", "redis"])
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Backend]:
    name = request.param
    prefix = None
    if name == "memory":
        url = "memory://"
    elif name == "sqlite":
        url = f"sqlite:///{tmp_path / 'store' / 'layerflow.db'}"
    else:
        redis_or_skip()
        prefix = f"lftest-{uuid.uuid4().hex[:12]}"
        sep = "&" if "?" in REDIS_URL else "?"
        url = f"{REDIS_URL}{sep}prefix={prefix}"
    b = Backend(name, url, [])
    try:
        yield b
    finally:
        for s in b.opened:
            s.close()
        if prefix is not None:
            drop_prefix(REDIS_URL, prefix)


@pytest.fixture
def store(backend: Backend) -> Store:
    return backend.open()


@pytest.fixture
def record() -> Callable[..., dict]:
    def make(instance_id: str = "inst-1", **fields: object) -> dict:
        return {"id": instance_id, "process_id": "loan_approval", "status": "running",
                "workflow": '{"spec": "loan"}', "engine": {"activities": 0}, **fields}
    return make


def forget_timer_index(backend: Backend) -> None:
    """Make the store look as a layerflow before the timer index left it: no index values, no
    ``timer_index`` marker (the records are as they were). Open a new handle afterwards: a
    handle that has seen the marker does not look again."""
    if backend.name == "sqlite":
        import sqlite3

        with sqlite3.connect(backend.sqlite_path) as c:
            c.execute("UPDATE instances SET due = NULL")
            c.execute("DELETE FROM meta WHERE key = 'timer_index'")
        return
    if backend.name == "redis":
        import redis

        client = redis.Redis.from_url(REDIS_URL)
        client.delete(f"{backend.redis_prefix}:due")
        client.hdel(f"{backend.redis_prefix}:meta", "timer_index")
        client.close()
        return
    raise ValueError(f"a {backend.name} store holds nothing from before the timer index")


def indexed(backend: Backend) -> set[str]:
    """The instance ids the backend's timer index holds, read from its storage rather than
    through ``due_instances`` (which skips ids whose record is gone): nothing left behind."""
    if backend.name == "memory":
        return {iid for iid, inst in backend.open()._instances.items() if inst.due is not None}  # type: ignore[attr-defined]
    if backend.name == "sqlite":
        import sqlite3

        with sqlite3.connect(backend.sqlite_path) as c:
            return {r[0] for r in c.execute("SELECT id FROM instances WHERE due IS NOT NULL")}
    import redis

    client = redis.Redis.from_url(REDIS_URL, decode_responses=True)
    try:
        return set(client.zrange(f"{backend.redis_prefix}:due", 0, -1))
    finally:
        client.close()


def scene_on(url: str, tag: str) -> Iterator[dict[str, str]]:
    """For a fixture: a key prefix and a stream of one test's own on the Redis at ``url`` (``name``,
    ``store``: the store URL with that prefix, ``stream``), its keys removed afterwards."""
    import redis

    redis_or_skip(url)
    name = f"{tag}{uuid.uuid4().hex[:10]}"
    try:
        yield {"name": name, "store": f"{url}?prefix={name}", "stream": f"{name}-ready"}
    finally:
        client = redis.Redis.from_url(url)
        keys = list(client.scan_iter(match=f"{name}*", count=1000))
        if keys:
            client.delete(*keys)
        client.close()
