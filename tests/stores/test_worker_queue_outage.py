"""A worker outlives an outage of the queue's Redis: it waits (with a warning) instead of
dying with a traceback, and runs what is submitted once the server is back.

The queue is a redis-server of the test's own (AOF on, so the stream and its group survive
the restart); the store is a sqlite file. The shared Redis is not touched.
"""

from __future__ import annotations

import logging
import threading
from pathlib import Path

import pytest

from context_layers.stores import open_store
from engine.worker import queue_client, run_worker, submit

from .test_faults import own_redis  # noqa: F401 - the fixture

pytestmark = pytest.mark.slow

LOAN = Path(__file__).resolve().parents[2] / "bpmn_examples" / "loan_approval.bpmn"
DATA = {"amount": 20000, "applicant_id": "A1", "purpose": "x"}


class _Seen(logging.Handler):
    def __init__(self, text: str) -> None:
        super().__init__()
        self.text, self.event = text, threading.Event()

    def emit(self, record: logging.LogRecord) -> None:
        if self.text in record.getMessage():
            self.event.set()


def test_a_worker_waits_out_a_queue_outage(own_redis, tmp_path):  # noqa: F811
    store_url = f"sqlite:///{tmp_path / 'store.db'}"
    stream = "outage:ready"
    first = submit(store_url, LOAN, DATA, queue_url=own_redis.url, stream=stream)
    seen = _Seen("did not answer")
    logging.getLogger("layerflow.worker").addHandler(seen)
    stop = threading.Event()
    result: dict = {}

    def work() -> None:
        try:
            result["stats"] = run_worker(store_url, queue_url=own_redis.url, stream=stream, consumer="w",
                                         idle_ms=500, block_ms=100, stop_after=2, stop=stop)
        except BaseException as err:  # noqa: BLE001 - what the test looks for
            result["error"] = err

    worker = threading.Thread(target=work)
    worker.start()
    try:
        store = open_store(store_url)
        for _ in range(600):  # safety limit only
            if store.load(first)[0]["status"] == "completed":
                break
            threading.Event().wait(0.05)
        assert store.load(first)[0]["status"] == "completed"
        own_redis.kill()
        assert seen.event.wait(30), f"the worker did not report the outage: {result.get('error')!r}"
        assert worker.is_alive(), f"the worker died: {result.get('error')!r}"
        own_redis.start()
        client = queue_client(queue_url=own_redis.url)
        second = submit(store_url, LOAN, DATA, stream=stream, client=client)
        worker.join(timeout=60)
        assert not worker.is_alive() and "error" not in result, result
        stats = result["stats"]
        assert stats.acked == 2 and stats.failures >= 1, stats
        assert store.load(second)[0]["status"] == "completed"
        client.close()
    finally:
        stop.set()
        worker.join(timeout=30)
        logging.getLogger("layerflow.worker").removeHandler(seen)


def test_a_worker_waits_out_a_store_outage_met_by_its_timer_scan(own_redis, tmp_path, monkeypatch):  # noqa: F811
    """The timer scan reads the store: a store whose Redis is down there (StoreUnavailable, not the
    queue's connection error) is an outage to wait out too, not the worker's end (found by
    test_redis_chaos_14 when the kill fell on a scan)."""
    import engine.worker as worker_module
    from context_layers.stores import StoreUnavailable

    store_url = f"sqlite:///{tmp_path / 'store.db'}"
    stream = "scan:ready"
    scan = worker_module.enqueue_due_timers
    failed: list[str] = []

    def flaky_scan(*args, **kwargs):
        if not failed:
            failed.append("once")
            raise StoreUnavailable("redis store redis://127.0.0.1:1/0: ConnectionError: reset. Is redis-server running?")
        return scan(*args, **kwargs)

    monkeypatch.setattr(worker_module, "enqueue_due_timers", flaky_scan)
    seen = _Seen("Is redis-server running?")
    logging.getLogger("layerflow.worker").addHandler(seen)
    try:
        iid = submit(store_url, LOAN, DATA, queue_url=own_redis.url, stream=stream)
        stats = run_worker(store_url, queue_url=own_redis.url, stream=stream, consumer="w", idle_ms=500,
                           block_ms=100, stop_after=1, timer_interval=0.01)
    finally:
        logging.getLogger("layerflow.worker").removeHandler(seen)
    assert failed == ["once"] and seen.event.is_set()
    assert stats.acked == 1 and stats.failures >= 1, stats
    assert open_store(store_url).load(iid)[0]["status"] == "completed"
