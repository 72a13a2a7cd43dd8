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
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from context_layers.stores import open_store

from .conftest import REDIS_URL, redis_or_skip
from .test_faults import free_port

ROOT = Path(__file__).resolve().parents[2]
BPMN = Path(__file__).parent / "fixtures" / "slow_process.bpmn"
SHARED = os.environ.get("LAYERFLOW_TEST_REDIS_35", REDIS_URL)


def _layerflow(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-m", "engine.cli", *args], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=60)


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
    out = _layerflow(*args, *where, "--json")
    assert out.returncode == 2, (out.returncode, out.stderr)
    error = json.loads(out.stdout)["error"]
    shown = dead.replace(":s3cret@", ":***@")
    assert shown in error["message"] and "redis-server" in error["message"], error
    assert "s3cret" not in out.stdout + out.stderr and "Traceback" not in out.stderr, out.stderr
    if down == "queue":
        assert not (tmp_path / "store.db").exists() or "running" not in _layerflow(
            "list", "--store", f"sqlite:///{tmp_path / 'store.db'}").stdout


# ----------------------------------------------------------------------------- what a worker leaves in Redis

@pytest.fixture
def scene() -> Iterator[dict[str, str]]:
    import redis

    redis_or_skip(SHARED)
    name = f"workers35{uuid.uuid4().hex[:10]}"
    try:
        yield {"store": f"{SHARED}?prefix={name}", "stream": f"{name}-ready"}
    finally:
        client = redis.Redis.from_url(SHARED)
        keys = list(client.scan_iter(match=f"{name}*", count=1000))
        if keys:
            client.delete(*keys)
        client.close()


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
