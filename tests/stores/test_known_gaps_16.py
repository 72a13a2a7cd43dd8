"""Gap (d) of round 16: a queue Redis that comes back empty (restarted without persistence, flushed)
has lost the stream entries of the instances submitted to it; the store (another Redis DB, sqlite)
still has them as ``running``. ``layerflow worker --requeue`` (``run_worker(requeue=True)``,
``requeue_running``) puts every ``running`` instance of the store back on the stream, and a worker
that finds the stream gone while it runs does so itself.

The queue is a stream of this module's own prefix on the shared Redis (``$REDIS_URL``, DB 13 in
round 16), deleted afterwards; losing it is simulated by deleting that stream, not by a flush.
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from context_layers.stores import open_store
from engine import Engine, load_process
from engine.worker import DEFAULT_GROUP, queue_client, requeue_running, run_worker, submit

from stores.conftest import REDIS_URL, redis_or_skip

@pytest.fixture
def queue() -> Iterator[tuple[Any, str]]:
    """A redis-py client of the queue and a stream name under this module's prefix, removed afterwards."""
    redis_or_skip()
    client = queue_client(queue_url=REDIS_URL)
    stream = f"lfg16:{uuid.uuid4().hex[:12]}:ready"
    try:
        yield client, stream
    finally:
        client.delete(*client.scan_iter(match=f"{stream}*"), stream)
        client.close()


@pytest.fixture
def process(tmp_path: Path) -> Path:
    """One script task: ``done = amount * 2``."""
    flows = "".join(f'<bpmn:sequenceFlow id="f{i}" sourceRef="{a}" targetRef="{b}"/>'
                    for i, (a, b) in enumerate([("start", "work"), ("work", "end")]))
    path = tmp_path / "requeue16.bpmn"
    path.write_text('<bpmn:definitions xmlns:bpmn="http://www.omg.org/spec/BPMN/20100524/MODEL" id="d" '
                    'targetNamespace="https://layerflow.dev/tests"><bpmn:process id="requeue16" isExecutable="true">'
                    '<bpmn:startEvent id="start"/><bpmn:scriptTask id="work"><bpmn:script>done = amount * 2'
                    f'</bpmn:script></bpmn:scriptTask><bpmn:endEvent id="end"/>{flows}</bpmn:process>'
                    '</bpmn:definitions>', encoding="utf-8")
    return path


def _lost_queue(client: Any, stream: str) -> None:
    """What a Redis restarted empty leaves of the queue: nothing (the stream and its group)."""
    client.delete(stream)
    assert not client.exists(stream)


def _has_consumer(client: Any, stream: str) -> bool:
    try:
        return any(c["name"] == "w16" for c in client.xinfo_consumers(stream, DEFAULT_GROUP))
    except Exception:  # noqa: BLE001 - no stream or group yet
        return False


def _work(store_url: str, stream: str, **options: Any) -> Any:
    stop = threading.Event()
    watchdog = threading.Timer(30, stop.set)
    watchdog.start()
    try:
        return run_worker(store_url, queue_url=REDIS_URL, stream=stream, consumer="w16", idle_ms=10, lease_ttl=5,
                          block_ms=20, stop=stop, timer_interval=0, **options)
    finally:
        watchdog.cancel()


def test_requeue_running_puts_the_stores_running_instances_back(queue: Any, process: Path, tmp_path: Path) -> None:
    client, stream = queue
    store_url = f"sqlite:///{tmp_path / 'store.db'}"
    lost = [submit(store_url, process, {"amount": n}, queue_url=REDIS_URL, stream=stream) for n in (1, 2)]
    waiting = Engine(store_url).start(load_process(process), {"amount": 5}).id  # running, never queued
    _lost_queue(client, stream)
    assert requeue_running(store_url, client, stream) == [*lost, waiting]
    assert [f["instance_id"] for _, f in client.xrange(stream)] == [*lost, waiting]
    stats = _work(store_url, stream, stop_after=3)
    assert stats.acked == 3
    store = open_store(store_url)
    assert {s["status"] for s in store.list_instances()} == {"completed"}


def test_worker_requeue_on_the_cli(queue: Any, process: Path, tmp_path: Path,
                                   caplog: pytest.LogCaptureFixture) -> None:
    from engine.cli import main

    client, stream = queue
    store_url = f"sqlite:///{tmp_path / 'store.db'}"
    iid = submit(store_url, process, {"amount": 4}, queue_url=REDIS_URL, stream=stream)
    _lost_queue(client, stream)
    result = CliRunner().invoke(main, ["worker", "--store", store_url, "--queue", REDIS_URL, "--stream", stream,
                                       "--requeue", "--stop-after", "1", "--idle-ms", "10", "--timer-interval", "0",
                                       "--json"], catch_exceptions=False)
    assert result.exit_code == 0, (result.stdout, result.stderr)
    doc = json.loads(result.stdout)
    assert doc["requeued"] == 1 and doc["acked"] == 1, doc
    assert open_store(store_url).list_instances()[0]["status"] == "completed"
    assert iid in caplog.text and "back on stream" in caplog.text  # the worker says what it put back


def test_a_worker_that_finds_the_stream_gone_requeues_the_running_instances(queue: Any, process: Path,
                                                                             tmp_path: Path) -> None:
    client, stream = queue
    store_url = f"sqlite:///{tmp_path / 'store.db'}"
    result: dict[str, Any] = {}
    submit(store_url, process, {"amount": 1}, queue_url=REDIS_URL, stream=stream)
    _lost_queue(client, stream)  # gone before any worker ran it; the worker starts on an empty stream
    thread = threading.Thread(target=lambda: result.update(stats=_work(store_url, stream, stop_after=1)))
    thread.start()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and not _has_consumer(client, stream):
        time.sleep(0.02)
    client.delete(stream)  # the server loses its data again while the worker runs
    thread.join(35)
    assert not thread.is_alive()
    stats = result["stats"]
    assert stats.requeued == 1 and stats.acked == 1, stats
    assert open_store(store_url).list_instances()[0]["status"] == "completed"


def test_a_queue_redis_restarted_empty_is_refilled_by_worker_requeue(tmp_path: Path, process: Path) -> None:
    """The real thing: a redis-server of the test's own without persistence holds the queue, a sqlite
    file the store; two instances are submitted, no worker runs, the server is killed and started again
    empty. ``layerflow worker --requeue`` puts both back and runs them to completion."""
    from engine.cli import main

    from .test_faults import OwnRedis

    (tmp_path / "redis").mkdir()
    server = OwnRedis(tmp_path / "redis", durable=False)
    server.start()
    try:
        store_url = f"sqlite:///{tmp_path / 'store.db'}"
        ids = [submit(store_url, process, {"amount": n}, queue_url=server.url, stream="q16:ready") for n in (1, 2)]
        server.kill()
        server.start()  # empty: the stream, its group and both entries are gone
        assert not queue_client(queue_url=server.url).exists("q16:ready")
        result = CliRunner().invoke(main, ["worker", "--store", store_url, "--queue", server.url, "--stream",
                                           "q16:ready", "--requeue", "--stop-after", "2", "--idle-ms", "10",
                                           "--timer-interval", "0", "--json"], catch_exceptions=False)
        assert result.exit_code == 0, (result.stdout, result.stderr)
        assert json.loads(result.stdout)["requeued"] == 2
        store = open_store(store_url)
        assert {s["instance_id"]: s["status"] for s in store.list_instances()} == dict.fromkeys(ids, "completed")
    finally:
        server.stop()
