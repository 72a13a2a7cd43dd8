"""Outsider round 18, continued (a module of its own to keep each under a minute): a worker in the
middle of an activity when the queue's Redis restarts empty. See test_stores_outsider_18.py."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from engine import Engine

from .test_faults import OwnRedis
from .test_stores_outsider_18 import Procs, base_env, own_redis, submit, wait_for, worker_args

pytestmark = pytest.mark.slow


@pytest.fixture
def own_redis_bare(tmp_path: Path) -> Iterator[OwnRedis]:
    yield from own_redis(tmp_path / "bare", durable=False)


@pytest.fixture
def procs() -> Iterator[Procs]:
    with Procs() as p:
        yield p


def test_a_worker_mid_activity_when_the_queue_comes_back_empty_requeues_the_rest(tmp_path, own_redis_bare, procs):
    """README: a worker that finds the stream gone while it runs puts the store's `running`
    instances back on it. A is in `work` (held on the gate) when the queue's Redis restarts empty,
    taking B's entry with it; B still runs."""
    names = {"prefix": "st18", "stream": "st18:ready", "group": "st18"}
    store_url = f"sqlite:///{tmp_path / 'kept.db'}"
    queue = own_redis_bare.url
    gate, started = tmp_path / "gate", tmp_path / "started"
    env = base_env(tmp_path, LF18_GATE=str(gate), LF18_STARTED=str(started))
    first = submit(tmp_path, store_url, queue, names, env)
    second = submit(tmp_path, store_url, queue, names, env)
    worker = procs.start(tmp_path, *worker_args(store_url, queue, names, "--consumer", "through", "--stop-after", "2",
                                                "--json"), env=env, name="through")
    wait_for(lambda: started.exists() or worker.poll() is not None, "the worker to reach `work`")
    own_redis_bare.kill()
    own_redis_bare.start()
    gate.write_text("open")
    worker.wait(timeout=50)
    err = (tmp_path / "through.err").read_text()
    assert worker.returncode == 0, err
    assert json.loads((tmp_path / "through.out").read_text())["requeued"] >= 1, err
    engine = Engine(store_url)
    assert {engine.load(first).status, engine.load(second).status} == {"waiting"}, err
