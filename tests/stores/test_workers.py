"""Workers sharing one stream: every instance runs to rest exactly once, duplicates included;
the ``submit`` / ``worker`` commands."""

from __future__ import annotations

import json
import threading
import time
import uuid
from pathlib import Path

import pytest
from click.testing import CliRunner

from context_layers.stores import open_store
from engine.worker import enqueue, queue_client, run_worker, submit

from .conftest import REDIS_URL, redis_or_skip

LOAN = Path(__file__).resolve().parents[2] / "bpmn_examples" / "loan_approval.bpmn"
FULL = {"amount": 120000, "applicant_id": "APP002", "purpose": "warehouse expansion", "industry": "logistics"}


@pytest.fixture
def stream():
    redis_or_skip()
    name = f"lftest-{uuid.uuid4().hex[:12]}"
    client = queue_client(queue_url=REDIS_URL)
    yield client, f"{name}:ready"
    client.delete(f"{name}:ready")
    client.close()


def test_two_workers_run_each_instance_once(stream):
    client, key = stream
    store = open_store(f"memory://workers-{uuid.uuid4().hex}")
    ids = [submit(store, LOAN, FULL, stream=key, client=client) for _ in range(6)]
    for iid in ids[:3]:
        enqueue(client, iid, stream=key)  # duplicates: acknowledged once the instance is at rest
    stop = threading.Event()
    stats = []

    def work(name: str) -> None:
        stats.append(run_worker(store, queue_url=REDIS_URL, stream=key, consumer=name, idle_ms=300, block_ms=100,
                                stop=stop))

    threads = [threading.Thread(target=work, args=(f"w{i}",)) for i in range(2)]
    for t in threads:
        t.start()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        group = client.xinfo_groups(key)[0]
        if group["pending"] == 0 and group["lag"] == 0:  # every entry delivered and acknowledged
            break
        time.sleep(0.05)
    stop.set()
    for t in threads:
        t.join(timeout=10)
    assert sorted(s["status"] for s in store.list_instances()) == ["completed"] * 6
    assert sum(s.ran for s in stats) == 6, stats
    assert sum(s.acked for s in stats) == 9, stats
    assert client.xpending(key, "workers")["pending"] == 0


def test_submit_and_worker_commands(stream, tmp_path):
    import engine.cli_worker  # noqa: F401 - registers the commands
    from engine.cli import main

    client, key = stream
    data = tmp_path / "data.json"
    data.write_text(json.dumps(FULL))
    url = f"memory://cli-{uuid.uuid4().hex}"
    runner = CliRunner()
    out = runner.invoke(main, ["submit", str(LOAN), "--data", str(data), "--count", "2", "--store", url,
                               "--queue", REDIS_URL, "--stream", key, "--json"])
    assert out.exit_code == 0, out.output
    ids = json.loads(out.output)["instance_ids"]
    out = runner.invoke(main, ["worker", "--store", url, "--queue", REDIS_URL, "--stream", key, "--stop-after", "2",
                               "--json"])
    assert out.exit_code == 0, out.output
    assert json.loads(out.output.strip().splitlines()[-1])["statuses"] == {"completed": 2}
    assert {s["instance_id"]: s["status"] for s in open_store(url).list_instances()} == dict.fromkeys(ids, "completed")


def test_a_store_that_is_not_redis_needs_a_queue(monkeypatch):
    from context_layers.errors import LayerflowError

    monkeypatch.delenv("LAYERFLOW_QUEUE", raising=False)
    monkeypatch.delenv("REDIS_URL", raising=False)
    with pytest.raises(LayerflowError, match="--queue redis://"):
        queue_client("sqlite:///x.db")


def test_workers_fire_a_due_timer_once(stream, tmp_path):
    """Nothing else fires a timer: one worker per interval puts the instances whose timer is due
    on the stream (once per due time, however many workers scan), and a worker runs them on."""
    client, key = stream
    path = tmp_path / "nap.bpmn"
    path.write_text("""<?xml version="1.0" encoding="UTF-8"?>
<bpmn:definitions xmlns:bpmn="http://www.omg.org/spec/BPMN/20100524/MODEL" id="d" targetNamespace="x">
  <bpmn:process id="napping" isExecutable="true">
    <bpmn:startEvent id="start"/>
    <bpmn:intermediateCatchEvent id="nap"><bpmn:timerEventDefinition><bpmn:timeDuration>"PT1S"</bpmn:timeDuration>
    </bpmn:timerEventDefinition></bpmn:intermediateCatchEvent>
    <bpmn:scriptTask id="wake"><bpmn:script>woke = True</bpmn:script></bpmn:scriptTask>
    <bpmn:endEvent id="end"/>
    <bpmn:sequenceFlow id="f1" sourceRef="start" targetRef="nap"/>
    <bpmn:sequenceFlow id="f2" sourceRef="nap" targetRef="wake"/>
    <bpmn:sequenceFlow id="f3" sourceRef="wake" targetRef="end"/>
  </bpmn:process>
</bpmn:definitions>
""", encoding="utf-8")
    store = open_store(f"memory://timers-{uuid.uuid4().hex}")
    ids = [submit(store, path, {}, stream=key, client=client) for _ in range(2)]
    stop = threading.Event()
    stats = []

    def work(name: str) -> None:
        stats.append(run_worker(store, queue_url=REDIS_URL, stream=key, consumer=name, idle_ms=5000, block_ms=100,
                                stop=stop, timer_interval=0.2))

    threads = [threading.Thread(target=work, args=(f"w{i}",)) for i in range(2)]
    for t in threads:
        t.start()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and sorted(s["status"] for s in store.list_instances()) != ["completed"] * 2:
        time.sleep(0.05)
    time.sleep(0.5)  # further scans find nothing due
    stop.set()
    for t in threads:
        t.join(timeout=10)
    assert sorted(s["status"] for s in store.list_instances()) == ["completed"] * 2
    assert sum(s.timers for s in stats) == 2, stats  # each due time queued once, by one of the two
    assert sum(s.ran for s in stats) == 4, stats  # each instance: to its timer, then past it
    from engine import Engine

    assert all(Engine(store).load(iid).main.get("woke") is True for iid in ids)
    for key_ in client.scan_iter(f"{key}:timer*"):
        client.delete(key_)
