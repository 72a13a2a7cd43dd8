"""Round 37: a fleet of workers on one Redis, a worker killed mid-activity, connections dropped.

The real Redis, database 14, with a key prefix and a stream of this module's own (removed afterwards);
connections are dropped with CLIENT KILL by their client name (``?client_name=`` in the URL), so no
one else's connection is touched.

What the scene found: a worker whose connection the server closed (CLIENT KILL, the server's
``timeout``, a proxy) while it waited on the stream logged "the queue's Redis ... did not answer ...;
start redis-server there": the server was running, and the worker's next read went through. It now
says the connection was dropped, by what, and that it reconnects.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from engine import Engine
from engine.worker import WorkerStats, dead_letters, queue_client, run_worker, submit

from tests.engine.engine_helpers import redis_scratch, stop_all
from tests.stores.test_lease_lapse_15 import wait_for

ROOT = Path(__file__).resolve().parents[2]
FLEET = Path(__file__).resolve().parent / "fleet37" / "fleet37.bpmn"
REDIS = "redis://127.0.0.1:6379/14"
LOAN = ROOT / "bpmn_examples" / "loan_approval.bpmn"


@pytest.fixture
def scene(tmp_path: Path) -> Iterator[dict[str, Any]]:
    with redis_scratch(REDIS, "w37fleet") as name:
        admin = redis.Redis.from_url(REDIS, decode_responses=True)
        try:
            yield {"name": name, "store": f"{REDIS}?prefix={name}", "stream": f"{name}-ready", "admin": admin,
                   "tmp": tmp_path}
        finally:
            admin.close()


def drop_connections(admin: Any, client_name: str) -> int:
    """CLIENT KILL every connection named ``client_name``; how many."""
    killed = 0
    for client in admin.client_list():
        if client.get("name") == client_name:
            killed += int(admin.client_kill_filter(_id=client["id"]))
    return killed


class Warnings(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


def test_a_dropped_connection_is_named_as_such_and_the_worker_goes_on(scene):
    name, stream = scene["name"], scene["stream"]
    client = queue_client(queue_url=f"{REDIS}?client_name={name}-queue")
    seen = Warnings()
    logging.getLogger("layerflow.worker").addHandler(seen)
    stop = threading.Event()
    stats: list[WorkerStats] = []
    thread = threading.Thread(target=lambda: stats.append(run_worker(
        scene["store"], client=client, stream=stream, consumer="w1", block_ms=2000, timer_interval=0, stop=stop,
        stop_after=1)), daemon=True)
    thread.start()
    try:
        # the worker blocks on the stream: its connection is the one waiting in XREADGROUP
        wait_for(lambda: any(c.get("name") == f"{name}-queue" and c.get("cmd") == "xreadgroup"
                             for c in scene["admin"].client_list()), "the worker to wait on the stream", timeout=10)
        assert drop_connections(scene["admin"], f"{name}-queue") >= 1
        wait_for(lambda: seen.lines, "the worker's warning", timeout=10)
        iid = submit(scene["store"], LOAN, {"amount": 20000, "applicant_id": "A1", "purpose": "x"}, stream=stream)
        thread.join(timeout=20)
    finally:
        stop.set()
        thread.join(timeout=10)
        logging.getLogger("layerflow.worker").removeHandler(seen)
        client.close()
    [line] = seen.lines
    assert "dropped the connection" in line and "Connection closed by server" in line, line
    assert "start redis-server" not in line, line
    assert "CLIENT KILL" in line and "retrying in" in line, line
    assert stats[0].statuses == {"completed": 1} and Engine(scene["store"]).load(iid).status == "completed", stats
