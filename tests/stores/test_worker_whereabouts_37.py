"""Round 37: a worker says what it serves, and hints when the work it waits for is in another database.

A worker started against the wrong Redis database (``--store redis://HOST:6379/5`` while `layerflow
submit` put the instances in /14) idled silently forever: its stream there never gets an entry. It now
says at start which store it serves (the ``store_identity``), which stream and group, how many
instances the store holds and how many entries wait for it; and while its stream has never had an
entry, a cheap check (the server's INFO keyspace, then one look at a key of the stream's name in each
other database that holds keys, and a SCAN of its own database's streams while that holds at most 10,000
keys; at start and once a minute while idle) logs one line naming the database whose stream of that name
has entries, with the --store to start the worker with, or the stream of its own database whose entries no
worker reads, with the --stream.

The databases are those of a redis-server of this module's own (``own_redis``, nothing on disk): the
test needs two databases, and the shared server's other databases belong to other people.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from engine import worker as worker_module
from engine.worker import WorkerStats, run_worker, submit

from .test_faults import OwnRedis
from .test_stores_outsider_18 import own_redis

ROOT = Path(__file__).resolve().parents[2]
LOAN = ROOT / "bpmn_examples" / "loan_approval.bpmn"
DATA = {"amount": 20000, "applicant_id": "A1", "purpose": "x"}


@pytest.fixture
def server(tmp_path: Path) -> Iterator[OwnRedis]:
    yield from own_redis(tmp_path / "redis", durable=False)


def on(server: OwnRedis, db: int, prefix: str | None = None) -> str:
    url = f"redis://127.0.0.1:{server.port}/{db}"
    return f"{url}?prefix={prefix}" if prefix else url


class Lines(logging.Handler):
    """The worker's log lines; ``wait(text)`` until one holds ``text``."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.lines: list[str] = []
        self.changed = threading.Condition()

    def emit(self, record: logging.LogRecord) -> None:
        with self.changed:
            self.lines.append(record.getMessage())
            self.changed.notify_all()

    def wait(self, text: str, timeout: float = 10) -> str:
        with self.changed:
            found = self.changed.wait_for(lambda: next((x for x in self.lines if text in x), None), timeout)
        assert found, f"no log line with {text!r} within {timeout}s: {self.lines}"
        return found


@pytest.fixture
def lines() -> Iterator[Lines]:
    handler = Lines()
    log = logging.getLogger("layerflow.worker")
    old = log.level
    log.addHandler(handler)
    log.setLevel(logging.INFO)
    try:
        yield handler
    finally:
        log.removeHandler(handler)
        log.setLevel(old)


def start_worker(store: str, **options: Any) -> tuple[threading.Event, threading.Thread, list[WorkerStats]]:
    stop = threading.Event()
    out: list[WorkerStats] = []
    thread = threading.Thread(target=lambda: out.append(run_worker(
        store, consumer="w37", block_ms=50, timer_interval=0, stop=stop, **options)), daemon=True)
    thread.start()
    return stop, thread, out


def test_a_worker_on_another_database_says_what_it_serves_and_where_the_work_is(server, lines):
    right = on(server, 14, "lf")
    ids = [submit(right, LOAN, DATA) for _ in range(2)]

    stop, thread, _ = start_worker(on(server, 5))
    try:
        start = lines.wait("running the instances put on stream")
        hint = lines.wait("has never had an entry")
    finally:
        stop.set()
        thread.join(timeout=10)
    # what it serves: the store (as entries name it), the stream and its group, what it sees there
    assert "redis db 5 prefix 'layerflow'" in start and "'layerflow:ready'" in start and "'workers'" in start, start
    assert "0 instances" in start and "0 entries" in start, start
    # where the work is, and what to do: one line, naming database 14, its entries and the --store
    assert "\n" not in hint, hint
    assert f"redis://127.0.0.1:{server.port}/5" in hint, hint
    assert "database 14" in hint and "2 entries" in hint, hint
    assert f"--store redis://127.0.0.1:{server.port}/14?prefix=lf" in hint, hint
    assert len([x for x in lines.lines if "has never had an entry" in x]) == 1, lines.lines

    # the worker on the right database: its start line counts what waits for it; no hint
    lines.lines.clear()
    stats = run_worker(right, consumer="w37b", block_ms=50, timer_interval=0, stop_after=2)
    assert stats.acked == 2 and sorted(stats.statuses.items()) == [("completed", 2)], stats
    start = next(x for x in lines.lines if "running the instances put on stream" in x)
    assert "redis db 14 prefix 'lf'" in start and "2 instances" in start and "2 entries" in start, start
    assert "2 not yet read" in start, start
    assert not [x for x in lines.lines if "has never had an entry" in x], lines.lines
    assert len(ids) == 2


def test_work_submitted_elsewhere_after_the_worker_started_is_hinted_at_while_it_idles(server, lines, monkeypatch):
    monkeypatch.setattr(worker_module, "HINT_INTERVAL", 0.2)
    stop, thread, _ = start_worker(on(server, 5))
    try:
        lines.wait("running the instances put on stream")
        time.sleep(0.5)  # a few idle rounds with nothing anywhere: nothing to hint at
        assert not [x for x in lines.lines if "has never had an entry" in x], lines.lines
        submit(on(server, 3), LOAN, DATA)
        hint = lines.wait("has never had an entry")
        assert "database 3" in hint and "1 entries" in hint and f"--store redis://127.0.0.1:{server.port}/3" in hint
        time.sleep(0.5)
        assert len([x for x in lines.lines if "has never had an entry" in x]) == 1, "said once, not every minute"
    finally:
        stop.set()
        thread.join(timeout=10)


def test_a_worker_whose_stream_has_had_entries_is_not_hinted_at(server, lines):
    """A stream that has had entries (all done now) is this worker's: another database with a stream
    of that name is another fleet, not a mistake."""
    submit(on(server, 3), LOAN, DATA)
    mine = on(server, 5)
    submit(mine, LOAN, DATA)
    assert run_worker(mine, consumer="w37", block_ms=50, timer_interval=0, stop_after=1).acked == 1
    lines.lines.clear()
    stop, thread, _ = start_worker(mine)
    try:
        lines.wait("running the instances put on stream")
        time.sleep(0.3)
    finally:
        stop.set()
        thread.join(timeout=10)
    assert not [x for x in lines.lines if "has never had an entry" in x], lines.lines


def test_the_cli_worker_prints_the_hint_on_stderr(server, tmp_path):
    submit(on(server, 14, "lf"), LOAN, DATA)
    err = tmp_path / "worker.err"
    with err.open("w") as sink:
        proc = subprocess.Popen([sys.executable, "-m", "engine.cli", "worker", "--store", on(server, 5),
                                 "--timer-interval", "0"], cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)},
                                stdout=subprocess.DEVNULL, stderr=sink)
    try:
        deadline = time.monotonic() + 30
        while "has never had an entry" not in err.read_text() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=20)
    text = err.read_text()
    assert "has never had an entry" in text and "database 14" in text, text
    assert f"--store redis://127.0.0.1:{server.port}/14?prefix=lf" in text, text


def test_work_on_another_stream_of_the_same_database_is_hinted_at(server, lines):
    """`submit --stream claims` beside a worker left on the default stream: another stream of its database
    holds entries that no worker has read. A stream its workers keep up with is another fleet's: no hint."""
    mine = on(server, 5)
    submit(mine, LOAN, DATA, stream="claims")
    submit(mine, LOAN, DATA, stream="kept-up")
    queue = redis.Redis.from_url(mine)
    queue.xadd("someone-elses", {"event": "x"})  # another program's stream, and dead letters: not work
    queue.xadd("letters", {"instance_id": "i", "entry_id": "1-0", "error": "x"})
    queue.close()
    assert run_worker(mine, stream="kept-up", consumer="other", block_ms=50, timer_interval=0,
                      stop_after=1).acked == 1
    stop, thread, _ = start_worker(mine)
    try:
        hint = lines.wait("has never had an entry")
    finally:
        stop.set()
        thread.join(timeout=10)
    assert "stream 'claims' of that database has 1 entries" in hint and "start this worker with --stream claims" in hint
    assert "kept-up" not in hint and "database 5" not in hint, hint
    assert "someone-elses" not in hint and "letters" not in hint, hint


@pytest.mark.parametrize(("client_kwargs", "expected"), [
    ({"host": "10.0.0.5", "port": 6380, "db": 5, "password": "s3cret"}, "redis://:***@10.0.0.5:6380/14?prefix=lf"),
    ({"unix_socket_path": "/run/redis.sock", "db": 5}, "unix:///run/redis.sock?db=14&prefix=lf"),
])
def test_the_hint_names_the_other_database_as_a_url_the_worker_takes(client_kwargs, expected):
    client = redis.Redis(**client_kwargs)  # never connects: the URL is made from its settings
    assert worker_module._WorkElsewhere(client, "s", "g", "w")._url(14, "lf") == expected
    assert worker_module._WorkElsewhere(client, "s", "g", "w")._url(14).endswith(("/14", "?db=14"))
