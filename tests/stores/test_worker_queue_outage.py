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
