"""Round 37: a fleet of workers on one Redis, a worker killed mid-activity, connections dropped.

The real Redis, database 14, with a key prefix and a stream of this module's own (removed afterwards);
connections are dropped with CLIENT KILL by their client name (``?client_name=`` in the URL), so no
one else's connection is touched.

What the scene found: a worker whose connection the server closed (CLIENT KILL, the server's
``timeout``, a proxy) while it waited on the stream logged "the queue's Redis ... did not answer ...;
start redis-server there": the server was running, and the worker's next read went through. It now
says the connection was dropped, by what, and that it reconnects. And a read whose reply such a drop
lost leaves an entry pending with a worker that never saw it: the worker that took it over said "an
activity begun then runs again" when none had begun; it says that none was marked begun.
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
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import redis

from context_layers.stores import open_store
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
        # the worker blocks on the stream most of the time; a connection dropped between two commands is
        # reconnected by redis-py without a word, so drop it until the worker has had one dropped under it
        wait_for(lambda: any(c.get("name") == f"{name}-queue" for c in scene["admin"].client_list()),
                 "the worker to connect", timeout=10)

        def dropped_under_it() -> list[str]:
            if not seen.lines:
                drop_connections(scene["admin"], f"{name}-queue")
            return seen.lines
        wait_for(dropped_under_it, "the worker's warning", timeout=20, interval=0.3)
        iid = submit(scene["store"], LOAN, {"amount": 20000, "applicant_id": "A1", "purpose": "x"}, stream=stream)
        thread.join(timeout=20)
    finally:
        stop.set()
        thread.join(timeout=10)
        logging.getLogger("layerflow.worker").removeHandler(seen)
        client.close()
    for line in seen.lines:
        assert "the queue's Redis redis://127.0.0.1:6379/14 dropped the connection (ConnectionError: " in line, line
        assert "start redis-server" not in line, line
        assert "CLIENT KILL" in line and "retrying in" in line, line
    assert stats[0].statuses == {"completed": 1} and Engine(scene["store"]).load(iid).status == "completed", stats


def side_effects(path: Path) -> list[tuple[str, str, int]]:
    """(activity, instance id, pid) of every run of an activity, in order."""
    return [(a, iid, int(pid)) for a, iid, pid in (line.split() for line in path.read_text().splitlines())]


def test_a_fleet_runs_thirty_instances_through_a_kill_and_dropped_connections(scene):
    """Three worker processes, thirty instances of prepare -> approve (a person) -> a one-second
    cool-off -> finish. The worker of the first prepare is SIGKILLed inside it; another's connections
    are dropped (CLIENT KILL) while the fleet works. Every instance completes; finish runs once for each,
    prepare once for each but the one the killed worker had begun, which runs again once its lease ran
    out, taken over with a ``retry`` note naming the dead worker; nothing is left pending or dead; no
    log line has a traceback or sends anyone to start a Redis that was running."""
    name, store, stream, tmp = scene["name"], scene["store"], scene["stream"], scene["tmp"]
    side = tmp / "side_effects.log"
    side.write_text("")
    env = {**os.environ, "PYTHONPATH": str(ROOT), "FLEET37_SIDE_EFFECTS": str(side), "FLEET37_SLOW_S": "0.05",
           "FLEET37_GATE": str(tmp / "gate"), "FLEET37_HOLD_S": "30"}
    from engine import load_process

    process = load_process(FLEET)
    client = queue_client(queue_url=REDIS)
    ids = [submit(store, process, {}, stream=stream, client=client) for _ in range(30)]
    procs: dict[str, subprocess.Popen[str]] = {}
    try:
        for w in ("w1", "w2", "w3"):
            procs[w] = subprocess.Popen(
                [sys.executable, "-m", "engine.cli", "worker", "--store", f"{store}&client_name={name}-{w}",
                 "--stream", stream, "--consumer", w, "--idle-ms", "1500", "--timer-interval", "0.3", "--json"],
                env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=(tmp / f"{w}.err").open("w"), text=True)
        by_pid = {p.pid: w for w, p in procs.items()}

        # the first prepare holds (FLEET37_HOLD_S): its worker dies inside it
        _, killed_iid, pid = wait_for(lambda: side_effects(side)[:1], "a first prepare", timeout=60)[0]
        killed = by_pid[pid]
        procs[killed].send_signal(signal.SIGKILL)
        dropped_from = min(w for w in procs if w != killed)
        wait_for(lambda: any(c.get("name") == f"{name}-{dropped_from}" for c in scene["admin"].client_list()),
                 f"{dropped_from} to connect", timeout=60)
        dropped = 0
        for _ in range(5):  # while the others work: its stream read's and its store's connections
            dropped += drop_connections(scene["admin"], f"{name}-{dropped_from}")
            time.sleep(0.1)
        assert dropped, f"{dropped_from} had connections to drop"

        records = open_store(store)

        def at_approve() -> list[str]:
            waiting = [s["instance_id"] for s in records.list_instances(status="waiting")
                       if records.lease_owner(s["instance_id"]) is None]
            return waiting if len(waiting) == 30 else []

        def approve(batch: list[str]) -> None:  # a clerk: an engine of its own
            clerk = Engine(store)
            for iid in batch:
                instance = clerk.load(iid)
                assert [w["task_id"] for w in instance.waiting_for] == ["approve"], instance.waiting_for
                clerk.complete_user_task(instance, "approve", {"ok": True})

        waiting = wait_for(at_approve, "every instance at approve", timeout=60)
        with ThreadPoolExecutor(3) as clerks:
            list(clerks.map(approve, [waiting[i::3] for i in range(3)]))
        wait_for(lambda: len(records.list_instances(status="completed")) == 30,
                 "the workers to fire every cool-off and finish", timeout=60)
    finally:
        for w, p in procs.items():
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        outs = {w: p.communicate(timeout=30)[0] for w, p in procs.items()}
        stop_all(list(procs.values()))
        client.close()

    runs = Counter((activity, iid) for activity, iid, _ in side_effects(side))
    assert {iid: runs[("finish", iid)] for iid in ids} == {iid: 1 for iid in ids}
    assert {iid: runs[("prepare", iid)] for iid in ids} == {iid: 2 if iid == killed_iid else 1 for iid in ids}
    from click.testing import CliRunner

    from engine.cli import main

    [note] = json.loads(CliRunner().invoke(main, ["tape", killed_iid, "--kind", "retry", "--store", store,
                                                  "--json"]).stdout)
    assert note["data"]["previous_consumer"] == killed and note["data"]["activity_begun"] == "prepare", note

    admin = queue_client(queue_url=REDIS)
    try:
        assert admin.xpending(stream, "workers")["pending"] == 0
        assert dead_letters(admin, stream) == []
    finally:
        admin.close()
    assert procs[killed].returncode == -signal.SIGKILL
    stats = {w: json.loads(out) for w, out in outs.items() if w != killed}
    assert all(procs[w].returncode == 0 for w in stats), {w: procs[w].returncode for w in stats}
    assert sum(s["statuses"].get("completed", 0) for s in stats.values()) == 30, stats
    # (a save whose reply a dropped connection lost, retried by redis-py, may come back as a conflict with
    # itself: the work was saved, and the next run goes on from it; the counts of runs above show nothing twice)
    assert sum(s["dead"] for s in stats.values()) == 0, stats

    logs = {w: (tmp / f"{w}.err").read_text() for w in procs}
    for w, text in logs.items():
        assert "Traceback" not in text and "start redis-server" not in text, (w, text)
    taken = [line for text in logs.values() for line in text.splitlines()
             if f"taken over from consumer {killed!r}" in line]
    assert len(taken) == 1 and killed_iid in taken[0] and "activity 'prepare', begun then, runs again" in taken[0], taken


def test_an_entry_whose_read_reply_was_lost_is_taken_over_without_claiming_an_activity_ran(scene, caplog):
    """A read whose reply a dropped connection lost leaves the entry pending with a worker that never
    saw it (nothing begun, nothing marked). The worker that takes it over said "an activity begun then
    runs again"; no activity had begun, and it now says so."""
    stream = scene["stream"]
    client = queue_client(queue_url=REDIS)
    try:
        iid = submit(scene["store"], LOAN, {"amount": 20000, "applicant_id": "A1", "purpose": "x"}, stream=stream,
                     client=client)
        assert client.xreadgroup("workers", "lost-reply", {stream: ">"}, count=1)  # delivered, never seen
        with caplog.at_level(logging.WARNING, logger="layerflow.worker"):
            stats = run_worker(scene["store"], client=client, stream=stream, consumer="w2", idle_ms=1, lease_ttl=5,
                               timer_interval=0, stop_after=1)
    finally:
        client.close()
    assert stats.reclaimed == 1 and stats.statuses == {"completed": 1}, stats
    [line] = [r.getMessage() for r in caplog.records if "taken over" in r.getMessage()]
    assert "from consumer 'lost-reply'" in line and iid in line, line
    assert "begun then runs again" not in line and "no activity was marked begun since that save" in line, line
