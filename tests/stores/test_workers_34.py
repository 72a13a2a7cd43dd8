"""Workers sharing a Redis server, as an operator runs them: real ``layerflow`` processes on the
shared Redis (DB 10 unless ``$LAYERFLOW_TEST_REDIS_34``; a key prefix and stream of this module's own).

What a store on a shared Redis can suffer under running workers: a record overwritten by
something else (not JSON), a tape key gone (evicted by a ``maxmemory-policy`` other than
``noeviction``, or deleted by hand). A worker must not run such an instance from what is left
(an empty context, its side effects done on nothing) nor loop on tracebacks: it dead-letters the
entry with a message naming the instance and what to do, and serves the others.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.stores.conftest import scene_on

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
BPMN = Path(__file__).parent / "fixtures" / "slow_process.bpmn"
SHARED = os.environ.get("LAYERFLOW_TEST_REDIS_34", "redis://127.0.0.1:6379/10")


def look(*args: str) -> tuple[int, str, str]:
    """A quick `layerflow` command in this process (the workers it looks at are real ones):
    exit code, stdout, stderr."""
    from click.testing import CliRunner

    from engine.cli import main

    result = CliRunner().invoke(main, list(args))
    return result.exit_code, result.stdout, result.stderr


def cli(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    return subprocess.run([sys.executable, "-m", "engine.cli", *args], capture_output=True, text=True, env=env,
                          timeout=timeout, cwd=REPO)


@pytest.fixture
def scene() -> Iterator[dict[str, str]]:
    yield from scene_on(SHARED, "workers34")


def test_a_damaged_record_or_a_lost_tape_is_dead_lettered_not_run_and_the_others_are_served(scene):
    import redis

    out = cli("submit", str(BPMN), "--data", '{"amount": 21}', "--count", "5", "--store", scene["store"],
              "--stream", scene["stream"], "--json")
    assert out.returncode == 0, out.stderr
    damaged, tapeless, alien, garbled, sound = json.loads(out.stdout)["instance_ids"]
    client = redis.Redis.from_url(SHARED, decode_responses=True)

    def key(iid: str) -> str:
        return f"{scene['name']}:i:{{{iid}}}"

    client.hset(key(damaged), "record", '{"broken')  # written over by something else
    client.delete(f"{key(tapeless)}:t:main")  # evicted, or deleted by hand
    client.hset(key(alien), "record", json.dumps({"id": alien}))  # JSON, but no layerflow record
    record = json.loads(client.hget(key(garbled), "record"))
    record["workflow"] = {"spec": 1}  # a layerflow record whose saved workflow was damaged
    client.hset(key(garbled), "record", json.dumps(record))
    client.close()

    worker = cli("worker", "--store", scene["store"], "--stream", scene["stream"], "--max-deliveries", "1",
                 "--timer-interval", "0", "--stop-after", "5", "--json")
    assert worker.returncode == 0, worker.stderr
    stats = json.loads(worker.stdout)
    assert stats["statuses"] == {"completed": 1} and stats["dead"] == 4, (stats, worker.stderr)
    assert "Traceback" not in worker.stderr, worker.stderr  # a known damage is named, not a bug's stack

    # the tapeless instance was not run from an empty context: still as submit left it
    rows = {row["instance_id"]: row for row in json.loads(look("list", "--store", scene["store"], "--json")[1])}
    assert rows[sound]["status"] == "completed"
    assert rows[tapeless]["status"] == "running" and rows[tapeless]["version"] == 1, rows[tapeless]

    dead = look("worker", "dead", "--store", scene["store"], "--stream", scene["stream"], "--json")[1]
    letters = {d["instance_id"]: d for d in json.loads(dead)["dead_letters"]}
    assert set(letters) == {damaged, tapeless, alien, garbled}
    for iid in (alien, garbled):
        assert letters[iid]["error_type"] == "InvalidRecord", letters[iid]
        assert iid in letters[iid]["error"] and "damaged" in letters[iid]["error"], letters[iid]
        assert "backup" in letters[iid]["error"] and "Upgrade" not in letters[iid]["error"], letters[iid]
    assert letters[damaged]["error_type"] == "InvalidRecord"
    assert damaged in letters[damaged]["error"] and "not valid JSON" in letters[damaged]["error"]
    assert "backup" in letters[damaged]["error"]
    assert letters[tapeless]["error_type"] == "InvalidRecord"
    assert tapeless in letters[tapeless]["error"] and "noeviction" in letters[tapeless]["error"]

    # an operator's look at either gets the same diagnosis, not a traceback or an empty context
    for iid, says in ((damaged, "not valid JSON"), (tapeless, "missing")):
        code, _out, err = look("inspect", iid, "--store", scene["store"])
        assert code == 1 and says in err, (code, err)


TIMER_BPMN = Path(__file__).parent / "fixtures" / "outsider33" / "outsider33.bpmn"


def _waiting_on_a_due_timer(store_url: str, count: int) -> list[str]:
    """``count`` instances of outsider33 waiting on its 1 s timer, which is due by the time this returns."""
    import time

    from engine import Engine, load_process

    engine = Engine(store_url)
    process = load_process(TIMER_BPMN)
    ids = [engine.run_process(process, {"amount": 10}).id for _ in range(count)]
    time.sleep(1.1)
    return ids


def test_timers_fire_does_not_report_a_timer_another_process_fired_meanwhile(scene, monkeypatch):
    """`timers --fire` lists the due timers, then takes each instance's lease; a worker or another
    cron `timers --fire` may fire it in between. What it then finds is no longer due: reported as
    skipped (already fired), not as fired by this run (a cron count of fired timers would double)."""
    from click.testing import CliRunner

    from engine import Engine
    from engine.cli import main

    ids = _waiting_on_a_due_timer(scene["store"], 2)
    listed = Engine.due_timers

    def then_another_process_fires(self):  # between this run's listing and its lease
        due = listed(self)
        other = Engine(scene["store"])
        other.resume(other.load(ids[0]))
        return due

    monkeypatch.setattr(Engine, "due_timers", then_another_process_fires)
    result = CliRunner().invoke(main, ["timers", "--fire", "--store", scene["store"], "--json"])
    assert result.exit_code == 0, result.output
    fired = {f["instance_id"]: f for f in json.loads(result.stdout)["fired"]}
    assert fired[ids[1]]["status"] == "waiting" and "skipped" not in fired[ids[1]]
    assert "status" not in fired[ids[0]] and "already fired" in fired[ids[0]]["skipped"], fired[ids[0]]


def test_sigterm_says_what_it_waits_for_and_a_second_one_stops_at_once(scene, tmp_path):
    """An operator stops a worker in the middle of a long activity: the first SIGTERM says that the
    worker finishes the instance in hand first, and how to stop it at once; a second one does (as a
    kill would: nothing of the activity saved, the instance not marked failed, its entry pending), and
    another worker takes the entry over and completes the instance."""
    import signal
    import time

    import redis

    out = cli("submit", str(BPMN), "--data", '{"amount": 21}', "--store", scene["store"], "--stream", scene["stream"],
              "--json")
    assert out.returncode == 0, out.stderr
    (iid,) = json.loads(out.stdout)["instance_ids"]
    marker = tmp_path / "slow_step.started"
    env = dict(os.environ, PYTHONPATH=str(REPO), LAYERFLOW_TEST_SLOW_MARKER=str(marker),
               LAYERFLOW_TEST_SLOW_SECONDS="60")
    args = [sys.executable, "-m", "engine.cli", "worker", "--store", scene["store"], "--stream", scene["stream"],
            "--timer-interval", "0", "--idle-ms", "300", "--json"]
    log = tmp_path / "first.log"
    with open(log, "w") as err:
        first = subprocess.Popen([*args, "--consumer", "first"], cwd=REPO, env=env, stdout=subprocess.PIPE,
                                 stderr=err, text=True)
    try:
        deadline = time.monotonic() + 30
        while not (marker.exists() and marker.read_text()):
            assert first.poll() is None and time.monotonic() < deadline, log.read_text()
            time.sleep(0.05)
        # what an operator sees meanwhile: the instance runs, and which worker runs it
        rows = {r["instance_id"]: r for r in json.loads(look("list", "--store", scene["store"], "--json")[1])}
        assert rows[iid]["status"] == "running" and rows[iid]["held_by"] == "first", rows[iid]
        plain = look("list", "--store", scene["store"])[1]
        assert "held by first" in next(line for line in plain.splitlines() if line.startswith(iid)), plain
        first.send_signal(signal.SIGTERM)
        while "received SIGTERM" not in log.read_text():
            assert first.poll() is None and time.monotonic() < deadline, log.read_text()
            time.sleep(0.05)
        said = log.read_text()
        assert "after the instance in hand" in said and "again to stop at once" in said, said
        first.send_signal(signal.SIGTERM)
        first.wait(timeout=5)  # not the 60 s the activity would take
    finally:
        if first.poll() is None:
            first.kill()
            first.wait()
    assert first.returncode == -signal.SIGTERM, (first.returncode, log.read_text())
    assert "stopping at once" in log.read_text()
    listed = {r["instance_id"]: r for r in json.loads(look("list", "--store", scene["store"], "--json")[1])}
    assert listed[iid]["status"] == "running", listed[iid]  # not saved as failed by the interruption
    client = redis.Redis.from_url(SHARED)
    assert client.xpending(scene["stream"], "workers")["pending"] == 1
    client.close()

    second = cli("worker", "--store", scene["store"], "--stream", scene["stream"], "--timer-interval", "0",
                 "--idle-ms", "300", "--consumer", "second", "--stop-after", "1", "--json")
    assert second.returncode == 0, second.stderr
    assert json.loads(second.stdout)["statuses"] == {"completed": 1}, second.stderr
    assert "taken over from consumer 'first'" in second.stderr


@pytest.mark.parametrize("text", ['{"broken', '["a list"]'])
@pytest.mark.parametrize("kind", ["sqlite", "redis"])
def test_a_record_written_over_is_invalid_record_naming_the_instance(kind, text, scene, tmp_path):
    from context_layers.stores import InvalidRecord, open_store

    url = f"sqlite:///{tmp_path / 'store.db'}" if kind == "sqlite" else scene["store"]
    store = open_store(url)
    store.create({"id": "inst-1", "process_id": "p", "status": "running", "workflow": "{}"})
    if kind == "sqlite":
        import sqlite3

        with sqlite3.connect(tmp_path / "store.db") as c:
            c.execute("UPDATE instances SET record = ? WHERE id = 'inst-1'", (text,))
    else:
        import redis

        client = redis.Redis.from_url(SHARED)
        client.hset(f"{scene['name']}:i:{{inst-1}}", "record", text)
        client.close()
    try:
        with pytest.raises(InvalidRecord, match=r"instance 'inst-1' in (sqlite|redis) store .* backup"):
            store.load("inst-1")
    finally:
        store.close()


def test_a_worker_warns_of_a_redis_that_evicts_keys(tmp_path, caplog):
    """A store on a Redis with an evicting maxmemory-policy loses tapes and records without an error
    once it fills up (the dead letters above are what is left to see): the worker says so as it starts."""
    import logging

    import redis

    from engine.worker import run_worker
    from tests.stores.test_faults import OwnRedis

    server = OwnRedis(tmp_path, durable=False)
    server.start()
    try:
        client = redis.Redis.from_url(server.url)
        client.config_set("maxmemory-policy", "allkeys-lru")
        client.close()
        with caplog.at_level(logging.WARNING, logger="layerflow.worker"):
            run_worker(f"{server.url}?prefix=evict", stream="evict-ready", stop_after=0, timer_interval=0)
    finally:
        server.stop()
    said = [r.getMessage() for r in caplog.records if "maxmemory-policy" in r.getMessage()]
    assert len(said) == 1, caplog.text  # one server: one warning, for the store and the queue
    assert "allkeys-lru" in said[0] and "noeviction" in said[0] and f"127.0.0.1:{server.port}" in said[0], said
