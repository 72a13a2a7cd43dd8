"""`layerflow worker` as a real process: SIGTERM in the middle of an activity is a graceful
stop. The worker finishes the instance in hand, acknowledges its entry, prints its stats and
exits 0; nothing is left pending for another worker to redo."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from context_layers import LayeredContext
from context_layers.stores import InstanceRecords, open_store
from engine import Engine
from engine.worker import queue_client, submit

from .conftest import REDIS_URL, redis_or_skip

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
BPMN = Path(__file__).parent / "fixtures" / "slow_process.bpmn"


def test_sigterm_mid_activity_finishes_the_instance_then_exits(tmp_path):
    redis_or_skip()
    name = f"lftest-{uuid.uuid4().hex[:12]}"
    stream = f"{name}:ready"
    client = queue_client(queue_url=REDIS_URL)
    store_url = f"sqlite:///{tmp_path / 'store.db'}"
    marker = tmp_path / "slow_step.started"
    iid = submit(store_url, BPMN, {"amount": 21}, queue_url=REDIS_URL, stream=stream, client=client)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "LAYERFLOW_TEST_SLOW_MARKER": str(marker),
           "LAYERFLOW_TEST_SLOW_SECONDS": "2"}
    worker = subprocess.Popen([sys.executable, "-m", "engine.cli", "worker", "--store", store_url, "--queue", REDIS_URL,
                               "--stream", stream, "--consumer", "graceful", "--json"], cwd=ROOT, env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60  # a safety limit
        while not (marker.exists() and marker.read_text()):  # created, then its pid written
            assert worker.poll() is None and time.monotonic() < deadline, worker.communicate(timeout=5)
            time.sleep(0.02)
        worker.send_signal(signal.SIGTERM)  # the slow activity is running
        out, err = worker.communicate(timeout=60)
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.communicate(timeout=10)
        client.delete(stream)
    assert worker.returncode == 0, err[-3000:]
    stats = json.loads(out.strip().splitlines()[-1])
    assert stats["acked"] == 1 and stats["statuses"] == {"completed": 1}, stats
    instance = Engine(InstanceRecords(open_store(store_url))).load(iid)
    assert instance.status == "completed"
    tape = instance.main.tape.to_list()
    assert [e["seq"] for e in tape] == list(range(1, len(tape) + 1))
    assert LayeredContext.replay(instance.main.tape) == instance.main
    assert [e["data"]["task_id"] for e in tape if e["kind"] == "begin"].count("slow_step") == 1
    client.close()
