"""What a long-running worker leaves behind in Redis: the entries of the ready stream every group is
done with are trimmed, and a worker that stops cleanly takes its consumer out of the group (a
worker that died keeps its consumer while an entry is pending with it).

A worker started while its Redis does not answer (a wrong port stands in for a Redis that is
down for a moment; the shared Redis is never stopped): it exits at once with exit code 2 (bad
input, as `submit` does for the same URL), naming the URL with its password masked and what to
do, without a traceback, whichever of the two is down (the store's Redis, or the queue's).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner

from context_layers.stores import open_store
from engine.cli import main

from .conftest import REDIS_URL, redis_or_skip, scene_on
from .test_faults import OwnRedis, free_port

ROOT = Path(__file__).resolve().parents[2]
BPMN = Path(__file__).parent / "fixtures" / "slow_process.bpmn"
SHARED = os.environ.get("LAYERFLOW_TEST_REDIS_35", REDIS_URL)


@pytest.mark.parametrize("down", ["store", "queue"])
@pytest.mark.parametrize("command", ["worker", "submit"])
def test_a_redis_that_does_not_answer_at_start_is_bad_input_named_with_its_password_masked(
        tmp_path: Path, down: str, command: str) -> None:
    dead = f"redis://:s3cret@127.0.0.1:{free_port()}/3"
    if down == "store":
        where = ["--store", f"{dead}?prefix=w35"]
    else:
        redis_or_skip()
        where = ["--store", f"sqlite:///{tmp_path / 'store.db'}", "--queue", dead]
    args = (["worker", "--timer-interval", "0", "--stop-after", "1"] if command == "worker" else
            ["submit", str(BPMN), "--data", json.dumps({"amount": 1})])
    out = CliRunner().invoke(main, [*args, *where, "--json"])
    assert out.exit_code == 2, (out.exit_code, out.output)
    error = json.loads(out.stdout)["error"]
    shown = dead.replace(":s3cret@", ":***@")
    assert shown in error["message"] and "redis-server" in error["message"], error
    assert "s3cret" not in out.output and out.exception is None or isinstance(out.exception, SystemExit), out.output
    if down == "queue" and (tmp_path / "store.db").exists():
        assert open_store(f"sqlite:///{tmp_path / 'store.db'}").list_instances() == []


# ----------------------------------------------------------------------------- what a worker leaves in Redis

@pytest.fixture
def scene() -> Iterator[dict[str, str]]:
    yield from scene_on(SHARED, "workers35")


def test_the_stream_keeps_only_what_a_group_has_not_done_and_a_stopped_worker_leaves_no_consumer(scene):
    """Acknowledged entries are trimmed from the ready stream (XADD without trimming keeps every
    instance ever submitted in Redis, for good); an entry pending with a worker that died, and
    everything after it, stays, and so does that worker's consumer, whose entry a live worker
    takes over. A worker that stops cleanly removes its own consumer from the group."""
    import redis

    from engine.worker import prune_consumers, queue_client, run_worker, submit

    client = queue_client(queue_url=SHARED)
    raw = redis.Redis.from_url(SHARED, decode_responses=True)
    stream = scene["stream"]
    try:
        ids = [submit(scene["store"], BPMN, {"amount": i}, stream=stream, client=client) for i in range(40)]
        stats = run_worker(scene["store"], client=client, stream=stream, stop_after=40, timer_interval=0,
                           consumer="w35-a")
        assert stats.statuses == {"completed": 40}
        assert raw.xlen(stream) == 0, raw.xlen(stream)
        assert raw.xinfo_consumers(stream, "workers") == []

        # a worker that read an entry and died: its entry and what came after stay for the taker
        late = [submit(scene["store"], BPMN, {"amount": i}, stream=stream, client=client) for i in range(3)]
        [(_, [(held, _fields)])] = raw.xreadgroup("workers", "w35-dead", {stream: ">"}, count=1)
        stats = run_worker(scene["store"], client=client, stream=stream, stop_after=2, timer_interval=0,
                           consumer="w35-b", idle_ms=60_000)
        assert stats.acked == 2
        assert [eid for eid, _ in raw.xrange(stream)][0] == held
        assert [c["name"] for c in raw.xinfo_consumers(stream, "workers")] == ["w35-dead"]
        run_worker(scene["store"], client=client, stream=stream, stop_after=1, timer_interval=0,
                   consumer="w35-c", idle_ms=1, lease_ttl=5)  # takes it over
        assert raw.xlen(stream) == 0 and raw.xpending(stream, "workers")["pending"] == 0
        # the dead worker's consumer, nothing pending with it any more, goes once it stayed idle long enough
        assert [c["name"] for c in raw.xinfo_consumers(stream, "workers")] == ["w35-dead"]
        assert prune_consumers(client, stream, "workers", idle_ms=3_600_000) == []
        raw.xgroup_createconsumer(stream, "workers", "w35-idle")  # as a worker starts: holds nothing
        submit(scene["store"], BPMN, {"amount": 9}, stream=stream, client=client)
        raw.xreadgroup("workers", "w35-holder", {stream: ">"}, count=1)
        time.sleep(0.05)
        assert prune_consumers(client, stream, "workers", idle_ms=20) == ["w35-dead", "w35-idle"]
        assert [c["name"] for c in raw.xinfo_consumers(stream, "workers")] == ["w35-holder"]
        done = {r["instance_id"] for r in open_store(scene["store"]).list_instances(status="completed")}
        assert done == set(ids + late)
    finally:
        raw.close()
        client.close()


def test_tidying_a_stream_the_queue_lost_leaves_it_to_the_worker_s_recovery(scene):
    """The queue's Redis came back empty (or someone removed the group): the tidying finds no stream
    or no group and says so instead of raising "no such key" out of the worker's loop; the worker's
    next read puts the group back (NOGROUP, as before). A stream that no group reads is not trimmed."""
    import redis

    from engine.worker import _tidy, queue_client, submit

    client = queue_client(queue_url=SHARED)
    raw = redis.Redis.from_url(SHARED, decode_responses=True)
    try:
        assert _tidy(client, scene["stream"], "workers") is False  # no stream at all
        submit(scene["store"], BPMN, {"amount": 1}, stream=scene["stream"], client=client)
        assert _tidy(client, scene["stream"], "workers") is True
        raw.xgroup_destroy(scene["stream"], "workers")
        assert _tidy(client, scene["stream"], "workers") is False
        assert raw.xlen(scene["stream"]) == 1
    finally:
        raw.close()
        client.close()


# ----------------------------------------------------------------------------- three workers, one killed

CREW = Path(__file__).parent / "fixtures" / "workers35" / "crew.bpmn"
CREW_COUNT = 9


def _runs(path: Path) -> list[tuple[int, str, str, int, float]]:
    rows = [line.split() for line in path.read_text().splitlines()] if path.exists() else []
    return [(int(n), activity, what, int(pid), float(t)) for n, activity, what, pid, t in rows]


@pytest.mark.slow
def test_three_workers_one_killed_mid_activity_finish_every_instance_once(scene, tmp_path: Path) -> None:
    """Three `layerflow worker` processes on one stream; one is killed (-9) in the middle of an
    activity. Its entry is taken over: every instance completes, each activity once on its tape,
    only the killed one's activity ran twice (once in the killed process), no two processes ever
    ran one instance at the same moment, no dead letter, and the stream ends empty."""
    import redis

    runs = tmp_path / "runs"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "CREW_RUNS": str(runs), "CREW_SECONDS": "0.3"}
    common = ["--store", scene["store"], "--stream", scene["stream"]]
    from engine.worker import queue_client, submit

    client = queue_client(queue_url=SHARED)
    ids = [submit(scene["store"], CREW, {"n": n}, stream=scene["stream"], client=client) for n in range(CREW_COUNT)]
    procs = [subprocess.Popen([sys.executable, "-m", "engine.cli", "worker", *common, "--consumer", f"crew{i}",
                               "--idle-ms", "1000", "--timer-interval", "0"], cwd=ROOT, env=env,
                              stdout=subprocess.DEVNULL, stderr=open(tmp_path / f"crew{i}.log", "wb"))
             for i in range(3)]
    raw = redis.Redis.from_url(SHARED, decode_responses=True)
    try:
        deadline = time.monotonic() + 30
        victim = None
        while victim is None and time.monotonic() < deadline:  # a `work` begun and not ended
            rows = _runs(runs)
            ended = {(n, pid) for n, a, what, pid, _ in rows if a == "work" and what == "end"}
            begun = [(n, pid) for n, a, what, pid, _ in rows if a == "work" and what == "begin" and (n, pid) not in ended]
            if begun and any(p.pid == begun[0][1] for p in procs):
                victim = begun[0]
            time.sleep(0.02)
        assert victim is not None, "no worker began `work`"
        killed = next(p for p in procs if p.pid == victim[1])
        killed.kill()
        killed.wait(timeout=10)

        store = open_store(scene["store"])
        while time.monotonic() < deadline:
            if {r["status"] for r in store.list_instances()} == {"completed"}:
                break
            time.sleep(0.1)
        assert {r["instance_id"]: r["status"] for r in store.list_instances()} == {i: "completed" for i in ids}
    finally:
        for p in procs:
            if p.poll() is None:
                p.terminate()
        for p in procs:
            p.wait(timeout=20)
        client.close()

    from context_layers.stores import InstanceRecords
    from engine import Engine

    engine = Engine(InstanceRecords(open_store(scene["store"])))
    for iid in ids:
        tape = engine.load(iid).main.tape.to_list()
        begins = [e["data"]["task_id"] for e in tape if e["kind"] == "begin"]
        assert begins == ["intake", "work", "close"], (iid, begins)
        assert [e["seq"] for e in tape] == list(range(1, len(tape) + 1)), iid
    rows = _runs(runs)
    twice = {(n, a) for n, a, what, _, _ in rows if what == "begin"
             if sum(1 for m, b, w, _, _ in rows if (m, b, w) == (n, a, "begin")) > 1}
    assert twice == {(victim[0], "work")}, twice
    # never two processes in one instance at once: per instance, each begin..end span is one process's
    for n in range(CREW_COUNT):
        spans = sorted((t, what, pid) for m, _, what, pid, t in rows if m == n)
        inside = None
        for _t, what, pid in spans:
            if what == "begin":
                assert inside in (None, victim[1]), (n, spans)  # the killed one never ended its begin
                inside = pid
            else:
                assert inside == pid, (n, spans)
                inside = None
    assert raw.xlen(f"{scene['stream']}:dead") == 0
    assert raw.xlen(scene["stream"]) == 0 and raw.xpending(scene["stream"], "workers")["pending"] == 0
    survivors = {c["name"] for c in raw.xinfo_consumers(scene["stream"], "workers")}
    assert survivors <= {f"crew{procs.index(killed)}"}, survivors  # those stopped cleanly took theirs out
    raw.close()


def test_a_redis_that_refuses_the_trim_costs_the_tidying_only(tmp_path: Path, caplog) -> None:
    """An ACL that does not allow XTRIM (a managed Redis, a cautious operator): the worker warns,
    naming the queue's Redis, and goes on serving the stream; nothing is trimmed."""
    import logging

    import redis

    from engine.worker import _tidy, submit

    server = OwnRedis(tmp_path, durable=False)
    server.start()
    try:
        admin = redis.Redis.from_url(server.url)
        admin.acl_setuser("lf", enabled=True, passwords=["+pw"], keys=["*"], commands=["+@all", "-xtrim"])
        url = server.url.replace("redis://", "redis://lf:pw@")
        store = f"sqlite:///{tmp_path / 'store.db'}"
        from engine.worker import queue_client

        client = queue_client(queue_url=url)
        submit(store, BPMN, {"amount": 1}, stream="s", client=client)
        client.xreadgroup("workers", "w", {"s": ">"}, count=1)
        [(entry_id, _)] = [(r["message_id"], r) for r in client.xpending_range("s", "workers", "-", "+", 10)]
        client.xack("s", "workers", entry_id)
        with caplog.at_level(logging.WARNING, logger="layerflow.worker"):
            assert _tidy(client, "s", "workers") is True
        assert client.xlen("s") == 1
        assert "could not tidy stream 's'" in caplog.text and f"lf:***@127.0.0.1:{server.port}" in caplog.text
        assert "pw@" not in caplog.text
        client.close()
        admin.close()
    finally:
        server.stop()
