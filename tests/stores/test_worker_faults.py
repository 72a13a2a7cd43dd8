"""Workers: kill -9 a worker in the middle of an activity; another worker takes its stream
entry over (XAUTOCLAIM) and finishes the instance with the same final context as an
undisturbed run, on a tape with no gap and no duplicate event.

The queue is a uniquely named stream on the shared Redis (the test kills a worker, never
Redis); the store is sqlite (a file both worker processes open) or Redis (own prefix).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import pytest

from context_layers import LayeredContext
from context_layers.stores import InstanceRecords, MemoryStore, open_store
from engine import Engine, load_process
from engine.worker import queue_client, run_worker, submit

from .conftest import REDIS_URL, drop_prefix, redis_or_skip

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
BPMN = Path(__file__).parent / "fixtures" / "slow_process.bpmn"
DATA = {"amount": 21}


def without_time(tape: list[dict]) -> list[dict]:
    return [{k: v for k, v in e.items() if k != "time"} for e in tape]


def contexts_of(engine: Engine, instance_id: str) -> dict[str, LayeredContext]:
    return dict(engine.load(instance_id).contexts)


@pytest.fixture
def queue():
    redis_or_skip()
    name = f"lftest-{uuid.uuid4().hex[:12]}"
    client = queue_client(queue_url=REDIS_URL)
    yield client, f"{name}:ready", name
    client.delete(f"{name}:ready")
    client.close()


@pytest.fixture(params=["sqlite", "redis"])
def store_url(request, tmp_path):
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'workers.db'}"
        return
    redis_or_skip()
    prefix = f"lftest-{uuid.uuid4().hex[:12]}"
    yield f"{REDIS_URL}{'&' if '?' in REDIS_URL else '?'}prefix={prefix}"
    drop_prefix(REDIS_URL, prefix)


def essence(events: list[dict]) -> list[tuple]:
    return [(e["kind"], e["actor"], e.get("activity"), e.get("branch"), e.get("changes")) for e in events]


def test_a_killed_worker_s_instance_completes_on_another(store_url, queue, tmp_path, monkeypatch):
    client, stream, group = queue
    # the undisturbed run, for comparison
    monkeypatch.delenv("LAYERFLOW_TEST_SLOW_MARKER", raising=False)
    ref_engine = Engine(InstanceRecords(MemoryStore()))
    reference = ref_engine.run(ref_engine.start(load_process(BPMN), DATA))
    assert reference.status == "completed"

    instance_id = submit(store_url, BPMN, DATA, queue_url=REDIS_URL, stream=stream, group=group, client=client)

    marker = tmp_path / "slow_step.started"
    env = {**os.environ, "LAYERFLOW_TEST_SLOW_MARKER": str(marker), "PYTHONPATH": str(ROOT)}
    code = ("import sys; from engine.worker import run_worker; "
            "run_worker(sys.argv[1], queue_url=sys.argv[2], stream=sys.argv[3], group=sys.argv[4], "
            "consumer='doomed', idle_ms=1000, stop_after=1)")
    doomed = subprocess.Popen([sys.executable, "-c", code, store_url, REDIS_URL, stream, group], cwd=ROOT, env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while not (marker.exists() and marker.read_text()):  # created, then its pid written
            if doomed.poll() is not None or time.monotonic() > deadline:
                out, err = doomed.communicate(timeout=5) if doomed.poll() is not None else ("", "")
                pytest.fail(f"the worker never reached the slow activity: rc={doomed.poll()} {err[-3000:]}")
            time.sleep(0.02)
        assert marker.read_text() == str(doomed.pid), "the activity runs in the worker subprocess"
        os.kill(doomed.pid, signal.SIGKILL)     # mid-activity
        doomed.wait(timeout=10)
    finally:
        if doomed.poll() is None:
            doomed.kill()
            doomed.wait(timeout=10)
        if doomed.stdout:
            doomed.stdout.close()
        if doomed.stderr:
            doomed.stderr.close()

    pending = client.xpending(stream, group)
    assert pending["pending"] == 1 and pending["consumers"][0]["name"] == "doomed"
    store = open_store(store_url)
    engine = Engine(InstanceRecords(store))
    assert engine.load(instance_id).status == "running", "the slow step was never committed"

    # the survivor (in this process; the marker exists now, so the activity goes straight through)
    monkeypatch.setenv("LAYERFLOW_TEST_SLOW_MARKER", str(marker))
    stop = threading.Event()
    result = {}
    survivor = threading.Thread(target=lambda: result.update(stats=run_worker(
        store_url, queue_url=REDIS_URL, stream=stream, group=group, consumer="survivor", idle_ms=1000,
        block_ms=200, stop_after=1, stop=stop)))
    survivor.start()
    survivor.join(timeout=60)
    stop.set()
    survivor.join(timeout=10)
    stats = result["stats"]
    assert stats.acked == 1 and stats.reclaimed >= 1 and stats.statuses == {"completed": 1}, stats
    assert client.xpending(stream, group)["pending"] == 0

    final = engine.load(instance_id)
    assert final.status == "completed"
    assert set(final.contexts) == set(reference.contexts)
    for name, ctx in final.contexts.items():
        ref = reference.contexts[name]
        assert ctx == ref, f"context {name!r} differs from the undisturbed run"
        tape = ctx.tape.to_list()
        assert [e["seq"] for e in tape] == list(range(1, len(tape) + 1)), f"gap or duplicate on {name!r}"
        # the takeover is on main's tape (a `retry` note, see test_workers_outsider_33); else the same tape
        retried = [e for e in tape if e["kind"] == "note" and e["data"]["note"] == "retry"]
        assert [(e["data"]["previous_consumer"], e["actor"]) for e in retried] == (
            [("doomed", "survivor")] if name == "main" else [])
        # (the note moves the later sequence numbers, and the snapshot ids named after them, by one)
        assert essence([e for e in tape if e not in retried]) == essence(ref.tape.to_list()), \
            f"tape of {name!r} differs"
        # what the store holds is exactly that tape
        assert without_time(store.read_tape(instance_id, name)) == without_time(tape)
    begins = [e for e in final.main.tape if e.kind == "begin" and e.data.get("task_id") == "slow_step"]
    assert len(begins) == 1, "the killed attempt left nothing on the committed tape"
    store.close()
