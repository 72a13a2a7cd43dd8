"""Dead letters: an entry whose handling fails every time is moved to ``<stream>:dead``
after ``max_deliveries`` failed deliveries (Redis's own delivery count) and acknowledged;
busy leases, version conflicts and store outages do not count; ``requeue`` puts it back;
the ``layerflow worker dead`` / ``worker requeue`` commands.

The queue is a uniquely named stream on the real Redis (removed afterwards); the store
is a named in-memory store, whose record a test breaks so that loading it raises.
"""

from __future__ import annotations

import json
import threading
import uuid
from collections.abc import Callable, Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from context_layers.errors import VersionConflict
from context_layers.stores import Store, StoreUnavailable, open_store
from engine.worker import DEFAULT_GROUP, WorkerStats, dead_letters, queue_client, requeue, run_worker, submit

from stores.conftest import REDIS_URL, redis_or_skip  # the worker tests' Redis (skip, or fail in CI)

LOAN = Path(__file__).resolve().parents[1] / "bpmn_examples" / "loan_approval.bpmn"
FULL = {"amount": 120000, "applicant_id": "APP002", "purpose": "warehouse expansion", "industry": "logistics"}


@pytest.fixture
def queue() -> Iterator[tuple[Any, str]]:
    redis_or_skip()
    stream = f"lftest-{uuid.uuid4().hex[:12]}:ready"
    client = queue_client(queue_url=REDIS_URL)
    yield client, stream
    client.delete(stream, f"{stream}:dead")
    client.close()


@pytest.fixture
def store() -> Store:
    return open_store(f"memory://deadletter-{uuid.uuid4().hex}")


def work(store: Store | str, stream: str, **options: Any) -> WorkerStats:
    """One worker until ``stop_after`` entries are done or dead; 30 s at most, should a test go wrong."""
    stop = threading.Event()
    watchdog = threading.Timer(30, stop.set)
    watchdog.start()
    try:
        return run_worker(store, queue_url=REDIS_URL, stream=stream, consumer="w1", idle_ms=10, lease_ttl=5,
                          block_ms=20, stop=stop, **{"stop_after": 1, **options})
    finally:
        watchdog.cancel()


def break_record(store: Store, instance_id: str) -> Callable[[], None]:
    """Make the stored record undeserializable (loading it raises); returns the repair."""
    record, version = store.load(instance_id)
    store.save(instance_id, {**record, "workflow": "not a serialized workflow"}, version)

    def repair() -> None:
        store.save(instance_id, record, store.load(instance_id)[1])

    return repair


def only_entry(client: Any, stream: str) -> str:
    [(entry_id, _fields)] = client.xrange(stream)
    return str(entry_id)


@pytest.mark.parametrize("max_deliveries", [1, 3])
def test_a_record_that_never_loads_is_dead_lettered_after_max_deliveries(queue, store, max_deliveries):
    client, stream = queue
    instance_id = submit(store, LOAN, FULL, stream=stream, client=client)
    entry_id = only_entry(client, stream)
    break_record(store, instance_id)

    stats = work(store, stream, max_deliveries=max_deliveries)

    assert (stats.failures, stats.dead, stats.acked, stats.ran) == (max_deliveries, 1, 0, 0), stats
    [letter] = dead_letters(client, stream)
    assert (letter.instance_id, letter.entry_id, letter.deliveries) == (instance_id, entry_id, max_deliveries)
    # a damaged record is named as such (workers34), the parser's complaint kept
    assert letter.error_type == "InvalidRecord" and "Expecting value" in letter.error and instance_id in letter.error
    assert (letter.consumer, letter.group) == ("w1", DEFAULT_GROUP)
    assert datetime.fromisoformat(letter.time).tzinfo is not None
    assert client.xpending(stream, DEFAULT_GROUP)["pending"] == 0, "the original entry is acknowledged"


def test_requeue_gives_a_fresh_count_and_a_repaired_instance_completes(queue, store):
    client, stream = queue
    instance_id = submit(store, LOAN, FULL, stream=stream, client=client)
    repair = break_record(store, instance_id)
    work(store, stream, max_deliveries=2)
    [letter] = dead_letters(client, stream)

    requeue(client, letter.id, stream)          # not repaired yet: two more failed deliveries
    assert dead_letters(client, stream) == []
    assert work(store, stream, max_deliveries=2).failures == 2
    [again] = dead_letters(client, stream)
    assert again.deliveries == 2 and again.id != letter.id

    repair()
    entry_id = requeue(client, again.id, stream)
    assert dict(client.xrange(stream, min=entry_id, max=entry_id)) == {entry_id: {"instance_id": instance_id}}
    stats = work(store, stream, max_deliveries=2)
    assert (stats.acked, stats.dead, stats.statuses) == (1, 0, {"completed": 1}), stats
    assert client.xrange(stream) == [], "done, so trimmed from the stream"
    assert store.load(instance_id)[0]["status"] == "completed"
    assert dead_letters(client, stream) == []
    with pytest.raises(KeyError, match="no dead letter"):
        requeue(client, again.id, stream)


def test_a_worker_on_another_store_does_not_drop_the_entry(queue, store, caplog):
    """A worker started with another --store than `submit` used (another sqlite file, prefix
    or db) finds no instance: that is a failed delivery that names the store and the fix, not
    an acknowledgement that would take the work away from the workers on the right store. Its
    log lines say so without a traceback of the worker's own code (one per delivery, before)."""
    client, stream = queue
    instance_id = submit(store, LOAN, FULL, stream=stream, client=client)
    elsewhere = open_store(f"memory://elsewhere-{uuid.uuid4().hex}")

    with caplog.at_level("WARNING", logger="layerflow.worker"):
        stats = work(elsewhere, stream, max_deliveries=2)
    assert (stats.acked, stats.dead, stats.failures) == (0, 1, 2), stats
    told = [r for r in caplog.records if instance_id in r.getMessage()]
    assert len(told) == 2 and all(r.exc_info is None for r in told), [(r.getMessage(), r.exc_info) for r in told]
    assert "is not in this worker's store" in told[0].getMessage()
    [letter] = dead_letters(client, stream)
    assert letter.instance_id == instance_id
    assert instance_id in letter.error and "memory://elsewhere-" in letter.error and "--store" in letter.error
    assert elsewhere.list_instances() == [] and elsewhere.lease_owner(instance_id) is None

    requeue(client, letter.id, stream)  # the cause fixed: a worker on the store submit used
    stats = work(store, stream)
    assert (stats.acked, stats.statuses) == (1, {"completed": 1}), stats
    assert store.load(instance_id)[0]["status"] == "completed"


class Scripted:
    """A store whose deliveries go as scripted, one word per delivery (each starts with
    acquire_lease): "busy" (another worker holds the lease), "conflict" (the save loses),
    "down" (load: StoreUnavailable), "broken" (load raises), then "ok"."""

    def __init__(self, store: Store, script: list[str]) -> None:
        self._store = store
        self.script = script
        self.now = "ok"

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)

    def acquire_lease(self, instance_id: str, owner: str, ttl: float) -> bool:
        self.now = self.script.pop(0) if self.script else "ok"
        return self.now != "busy" and self._store.acquire_lease(instance_id, owner, ttl)

    def load(self, instance_id: str) -> Any:
        if self.now == "down":
            raise StoreUnavailable("the store does not answer (scripted)")
        if self.now == "broken":
            raise RuntimeError("this record cannot be read (scripted)")
        return self._store.load(instance_id)

    def save(self, *args: Any, **kwargs: Any) -> Any:
        if self.now == "conflict":
            raise VersionConflict("another worker saved first (scripted)")
        return self._store.save(*args, **kwargs)


@pytest.mark.parametrize(("outcome", "counter", "expected"), [
    ("busy", "busy", 4),
    ("conflict", "conflicts", 4),
    ("down", "failures", 4 + 3),     # counted as failures in the stats, not toward the dead letter
])
def test_busy_conflict_and_store_down_do_not_count(queue, store, outcome, counter, expected):
    client, stream = queue
    scripted = Scripted(store, [outcome] * 4 + ["broken"] * 10)
    instance_id = submit(store, LOAN, FULL, stream=stream, client=client)

    stats = work(scripted, stream, max_deliveries=3)

    assert getattr(stats, counter) == expected and stats.dead == 1, stats
    assert len(scripted.script) == 10 - 3, "exactly max_deliveries failed deliveries after the uncounted ones"
    [letter] = dead_letters(client, stream)
    assert (letter.instance_id, letter.deliveries) == (instance_id, 3)
    assert (letter.error_type, letter.error) == ("RuntimeError", "this record cannot be read (scripted)")


def test_an_entry_its_workers_died_on_is_dead_lettered_without_running(queue, store):
    client, stream = queue
    instance_id = submit(store, LOAN, FULL, stream=stream, client=client)
    entry_id = only_entry(client, stream)
    # three deliveries to workers that died without an outcome (kill -9, out of memory)
    client.xreadgroup(DEFAULT_GROUP, "ghost", {stream: ">"}, count=1)
    client.xclaim(stream, DEFAULT_GROUP, "ghost", 0, [entry_id], retrycount=3, justid=True)

    stats = work(store, stream, max_deliveries=3)

    assert (stats.dead, stats.ran, stats.failures) == (1, 0, 0), stats
    [letter] = dead_letters(client, stream)
    assert (letter.entry_id, letter.deliveries, letter.error_type) == (entry_id, 4, "")
    assert "no outcome recorded" in letter.error
    assert store.load(instance_id)[0]["status"] == "running", "it was not run again"


def test_the_dead_and_requeue_commands(queue):
    from engine.cli import main

    client, stream = queue
    url = f"memory://deadletter-cli-{uuid.uuid4().hex}"
    store = open_store(url)
    instance_id = submit(store, LOAN, FULL, stream=stream, client=client)
    repair = break_record(store, instance_id)
    where = ["--queue", REDIS_URL, "--stream", stream]
    runner = CliRunner()

    out = runner.invoke(main, ["worker", "--store", url, *where, "--idle-ms", "10", "--max-deliveries", "2",
                               "--stop-after", "1", "--json"])
    assert out.exit_code == 0, out.output
    assert json.loads(out.stdout.strip().splitlines()[-1])["dead"] == 1

    out = runner.invoke(main, ["worker", "dead", *where])
    assert out.exit_code == 0, out.output
    [letter] = dead_letters(client, stream)
    assert f"{letter.id}  instance {instance_id}" in out.stdout and "JSONDecodeError: Expecting value" in out.stdout
    assert "1 dead letter(s)" in out.stderr and "layerflow worker requeue ID" in out.stderr

    out = runner.invoke(main, ["worker", "dead", *where, "--json"])
    assert out.exit_code == 0, out.output
    doc = json.loads(out.stdout)
    assert doc["stream"] == f"{stream}:dead"
    assert [(d["id"], d["instance_id"], d["deliveries"]) for d in doc["dead_letters"]] == [(letter.id, instance_id, 2)]

    out = runner.invoke(main, ["worker", "requeue", letter.id, *where, "--json"])
    assert out.exit_code == 0, out.output
    doc = json.loads(out.stdout)
    assert (doc["requeued"], doc["stream"]) == (letter.id, stream) and doc["entry_id"] in dict(client.xrange(stream))

    out = runner.invoke(main, ["worker", "requeue", letter.id, *where])
    assert out.exit_code == 2 and "no dead letter" in out.stderr, out.output
    out = runner.invoke(main, ["worker", "--stream", stream, "dead"])
    assert out.exit_code == 2 and "put --stream after the subcommand" in out.stderr, out.output

    repair()
    out = runner.invoke(main, ["worker", "--store", url, *where, "--idle-ms", "10", "--stop-after", "1", "--json"])
    assert out.exit_code == 0, out.output
    assert json.loads(out.stdout.strip().splitlines()[-1])["statuses"] == {"completed": 1}
    out = runner.invoke(main, ["worker", "dead", *where, "--json"])
    assert json.loads(out.stdout)["dead_letters"] == []


def test_the_worker_says_what_it_reads_and_each_instance_it_ran(queue, caplog) -> None:
    from engine.cli import main

    client, stream = queue
    url = f"memory://worker-says-{uuid.uuid4().hex}"
    instance_id = submit(url, LOAN, FULL, stream=stream, client=client)
    caplog.set_level("INFO", logger="layerflow.worker")
    out = CliRunner().invoke(main, ["worker", "--store", url, "--queue", REDIS_URL, "--stream", stream,
                                    "--stop-after", "1"])
    assert out.exit_code == 0, out.output
    assert f"running the instances put on stream {stream!r}" in caplog.text and "Ctrl-C or SIGTERM" in caplog.text
    assert f"instance {instance_id} (loan_approval): completed" in caplog.text
