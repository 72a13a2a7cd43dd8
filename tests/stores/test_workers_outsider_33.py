"""Workers at scale, as an operator who read README's "Many workers" and DESIGN's "Stores" runs them.

Real processes only: ``layerflow worker`` / ``layerflow serve`` / ``layerflow inspect|tape|replay``
as subprocesses on 127.0.0.1, sharing the real Redis (``$REDIS_URL``'s server, DB 14, a key prefix
and stream of this module's own), and a private ``redis-server`` on a free port for the restart.
The process (fixtures/outsider33): prepare, a parallel split whose second branch waits on a 1 s
timer, a join, a person's review (a user task), a last step. Its handlers append one line per run to
a file, so an activity run twice shows there as well as on the tape.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from context_layers.stores import open_store
from tests import local_http
from tests.stores.conftest import redis_or_skip

pytestmark = pytest.mark.slow

FIXTURES = Path(__file__).parent / "fixtures" / "outsider33"
BPMN = FIXTURES / "outsider33.bpmn"
REPO = Path(__file__).resolve().parents[2]
SHARED = os.environ.get("LAYERFLOW_TEST_REDIS_33", "redis://127.0.0.1:6379/14")
ACTIVITIES = ("prepare", "check_a", "check_b", "finish")


def _env(**extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env.update(extra)
    return env


def cli(*args: str, env: dict[str, str] | None = None, timeout: float = 30) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "engine.cli", *args], capture_output=True, text=True,
                          env=env or _env(), timeout=timeout, cwd=REPO)


class Scene:
    """One test's corner of a Redis: a store prefix and a stream of its own, workers it started."""

    def __init__(self, tmp_path: Path, redis_url: str) -> None:
        self.name = f"workers33{uuid.uuid4().hex[:10]}"
        self.redis_url = redis_url
        self.store = f"{redis_url}?prefix={self.name}"
        self.stream = f"{self.name}-ready"
        self.runs = tmp_path / "runs.txt"
        self.tmp = tmp_path
        self.procs: list[subprocess.Popen[str]] = []

    def env(self, **extra: str) -> dict[str, str]:
        return _env(LAYERFLOW_TEST_RUNS=str(self.runs), **extra)

    def submit(self, count: int) -> list[str]:
        out = cli("submit", str(BPMN), "--data", json.dumps({"amount": 10}), "--count", str(count),
                  "--store", self.store, "--stream", self.stream, "--json", env=self.env())
        assert out.returncode == 0, out.stderr
        return list(json.loads(out.stdout)["instance_ids"])

    def worker(self, name: str, *args: str, **extra: str) -> subprocess.Popen[str]:
        log = open(self.tmp / f"{name}.log", "w")
        proc = subprocess.Popen([sys.executable, "-m", "engine.cli", "worker", "--store", self.store,
                                 "--stream", self.stream, "--consumer", name, "--timer-interval", "0.3", *args],
                                stdout=subprocess.DEVNULL, stderr=log, text=True, env=self.env(**extra), cwd=REPO)
        self.procs.append(proc)
        return proc

    def log(self, name: str) -> str:
        return (self.tmp / f"{name}.log").read_text()

    def statuses(self, ids: list[str]) -> Counter[str]:
        store = open_store(self.store)
        try:
            return Counter(store.load(i)[0]["status"] for i in ids)
        finally:
            store.close()

    def wait_for(self, ids: list[str], status: str, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while True:
            seen = self.statuses(ids)
            if seen[status] == len(ids):
                return
            for p in self.procs:
                assert p.poll() is None or p.returncode == 0, f"a worker exited {p.returncode}: {p.args}"
            if time.monotonic() > deadline:
                raise AssertionError(f"after {timeout}s: {dict(seen)}, wanted all {status}")
            time.sleep(0.2)

    def runs_of(self) -> Counter[tuple[str, str]]:
        if not self.runs.exists():
            return Counter()
        return Counter(tuple(line.split()[1:3]) for line in self.runs.read_text().splitlines())  # type: ignore[misc]

    def stop(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in self.procs:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        self.procs.clear()

    def drop(self) -> None:
        import redis

        client = redis.Redis.from_url(self.redis_url)
        try:
            keys = list(client.scan_iter(match=f"{self.name}*", count=1000))
            if keys:
                client.delete(*keys)
        finally:
            client.close()


@pytest.fixture
def scene(tmp_path: Path) -> Iterator[Scene]:
    redis_or_skip(SHARED)
    s = Scene(tmp_path, SHARED)
    try:
        yield s
    finally:
        s.stop()
        s.drop()


def tape_of(scene: Scene, instance_id: str) -> list[dict[str, Any]]:
    out = cli("tape", instance_id, "--store", scene.store, "--json")
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def begun(tape: list[dict[str, Any]]) -> Counter[str]:
    return Counter(e["activity"] for e in tape if e["kind"] == "begin")


def completed(tape: list[dict[str, Any]]) -> Counter[str]:
    return Counter(e["activity"] for e in tape if e["kind"] == "complete")


class Server:
    def __init__(self, scene: Scene) -> None:
        self.token = "t33-" + uuid.uuid4().hex
        log = open(scene.tmp / "serve.log", "w")
        self.proc = subprocess.Popen([sys.executable, "-m", "engine.cli", "serve", "--host", "127.0.0.1", "--port",
                                      "0", "--catalog", str(FIXTURES), "--store", scene.store],
                                     stdout=subprocess.DEVNULL, stderr=log, text=True,
                                     env=scene.env(LAYERFLOW_API_TOKEN=self.token), cwd=REPO)
        scene.procs.append(self.proc)
        deadline = time.monotonic() + 20
        logfile = scene.tmp / "serve.log"
        while True:
            text = logfile.read_text()
            if "http://127.0.0.1:" in text:
                port = text.split("http://127.0.0.1:", 1)[1].split()[0].strip("/.,)")
                self.base = f"http://127.0.0.1:{int(port)}"
                break
            assert self.proc.poll() is None, text
            assert time.monotonic() < deadline, text
            time.sleep(0.1)
        while local_http.get(f"{self.base}/api/health").status_code != 200:
            time.sleep(0.1)

    def post(self, path: str, body: dict[str, Any]) -> Any:
        return local_http.post(self.base + path, json=body, headers={"Authorization": f"Bearer {self.token}"},
                               timeout=30)

    def get(self, path: str) -> Any:
        return local_http.get(self.base + path, headers={"Authorization": f"Bearer {self.token}"}, timeout=30)


def test_three_workers_drain_thirty_instances_each_activity_once(scene: Scene) -> None:
    t0 = time.monotonic()
    ids = scene.submit(30)
    print("submit", time.monotonic() - t0)
    assert len(set(ids)) == 30
    for n in range(3):
        scene.worker(f"w{n}")
    scene.wait_for(ids, "waiting", timeout=40)
    # each is at the review now (the timer fired through the workers' scan)
    print("waiting", time.monotonic() - t0)
    server = Server(scene)
    print("server", time.monotonic() - t0)
    for i, iid in enumerate(ids):
        r = server.post(f"/api/instances/{iid}/user-tasks/review", {"data": {"approved": True}})
        assert r.status_code == 200, r.text
        assert r.json()["status"] == "completed", r.text
    scene.wait_for(ids, "completed", timeout=10)
    print("completed", time.monotonic() - t0)
    runs = scene.runs_of()
    for i, iid in enumerate(ids):
        r = server.get(f"/api/instances/{iid}/tape")
        assert r.status_code == 200, r.text
        tape = r.json()["events"]
        assert begun(tape) == completed(tape) == Counter(ACTIVITIES) + Counter(["review"]), tape
        for activity in ACTIVITIES:
            assert runs[(iid, activity)] == 1, (iid, activity, runs)
