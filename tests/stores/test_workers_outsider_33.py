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
import subprocess
import sys
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from context_layers.stores import open_store
from tests import local_http
from tests.engine.governance_helpers import free_port
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


def clis(*commands: tuple[str, ...]) -> list[str]:
    """Several `layerflow` commands at once (other processes, as on other machines); their stdouts."""
    procs = [subprocess.Popen([sys.executable, "-m", "engine.cli", *args], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, env=_env(), cwd=REPO) for args in commands]
    outs = []
    for args, proc in zip(commands, procs):
        out, err = proc.communicate(timeout=60)
        assert proc.returncode == 0, (args, err)
        outs.append(out)
    return outs


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

    def runs_of(self, ids: list[str] | None = None) -> Counter[tuple[str, str]]:
        """How often each (instance, activity) ran, as its handler counted (of ``ids`` only, when given)."""
        if not self.runs.exists():
            return Counter()
        rows = (line.split()[1:3] for line in self.runs.read_text().splitlines())
        return Counter((iid, activity) for iid, activity in rows if ids is None or iid in ids)

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


@pytest.fixture(scope="module")
def shared(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Scene, Server]]:
    """One store prefix, stream and `layerflow serve` on the shared Redis for the module (a server
    takes seconds to start); each test starts and stops its own workers."""
    redis_or_skip(SHARED)
    s = Scene(tmp_path_factory.mktemp("outsider33"), SHARED)
    server = None
    try:
        server = Server(s)
        yield s, server
    finally:
        if server is not None:
            server.stop()
        s.stop()
        s.drop()


@pytest.fixture
def scene(shared: tuple[Scene, Server]) -> Iterator[Scene]:
    try:
        yield shared[0]
    finally:
        shared[0].stop()


@pytest.fixture
def server(shared: tuple[Scene, Server]) -> Server:
    return shared[1]


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

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()

    def post(self, path: str, body: dict[str, Any]) -> Any:
        return local_http.post(self.base + path, json=body, headers={"Authorization": f"Bearer {self.token}"},
                               timeout=30)

    def get(self, path: str) -> Any:
        return local_http.get(self.base + path, headers={"Authorization": f"Bearer {self.token}"}, timeout=30)


def outside_view_agrees(scene: Scene, server: Server, iid: str) -> None:
    """`layerflow inspect/tape/replay` in another process, on the same Redis, tell what the workers and
    the server made of the instance."""
    served = server.get(f"/api/instances/{iid}").json()
    inspected, tape, replayed = (json.loads(out) for out in clis(
        *[(command, iid, "--store", scene.store, "--json") for command in ("inspect", "tape", "replay")]))
    for field in ("status", "layers", "tokens", "tape_length", "waiting_for", "conflicts"):
        assert inspected[field] == served[field], field
    assert len(tape) == served["tape_length"]
    assert [(e["context"], e["seq"]) for e in tape] == [(e["context"], e["seq"]) for e in
                                                         server.get(f"/api/instances/{iid}/tape").json()["events"]]
    assert replayed["layers"] == served["layers"]
    assert replayed["until"] == replayed["tape_end"] == max(e["seq"] for e in tape if e["context"] == "main")


def test_three_workers_drain_thirty_instances_each_activity_once(scene: Scene, server: Server) -> None:
    """`submit --count 30`, three `layerflow worker`s: each instance runs to its timer and review, the
    workers' scan fires the timers, the reviews are answered through REST; every instance completes,
    every activity ran once (its handler and its tape say so), no entry is left pending or dead."""
    ids = scene.submit(30)
    assert len(set(ids)) == 30
    for n in range(3):
        scene.worker(f"w{n}")
    scene.wait_for(ids, "waiting", timeout=40)
    # the timers fire through the workers' scan: then each waits for its review only
    deadline = time.monotonic() + 20
    while sum(1 for (_, activity) in scene.runs_of(ids) if activity == "check_b") < 30:
        assert time.monotonic() < deadline, scene.runs_of()
        time.sleep(0.2)
    for i, iid in enumerate(ids):
        r = server.post(f"/api/instances/{iid}/user-tasks/review", {"data": {"approved": True}})
        assert r.status_code == 200, r.text
        assert r.json()["status"] == "completed", r.text
    scene.wait_for(ids, "completed", timeout=10)
    outside_view_agrees(scene, server, ids[0])
    runs = scene.runs_of(ids)
    for i, iid in enumerate(ids):
        r = server.get(f"/api/instances/{iid}/tape")
        assert r.status_code == 200, r.text
        tape = r.json()["events"]
        assert begun(tape) == completed(tape) == Counter(ACTIVITIES) + Counter(["review"]), tape
        assert not [e for e in tape if (e.get("data") or {}).get("note") == "retry"], "no worker died here"
        for activity in ACTIVITIES:
            assert runs[(iid, activity)] == 1, (iid, activity, runs)
    import redis

    client = redis.Redis.from_url(scene.redis_url, decode_responses=True)
    try:
        assert client.xpending(scene.stream, "workers")["pending"] == 0
        assert client.xlen(f"{scene.stream}:dead") == 0
    finally:
        client.close()


def test_worker_killed_mid_activity_another_takes_over_tape_honest(scene: Scene) -> None:
    """SIGKILL in the middle of check_a: the lease lapses, another worker takes the entry over and runs
    check_a again from the last save. The tape says so (a ``retry`` note before the second attempt,
    naming the worker that died and the delivery), and holds one begin/complete per activity: the
    killed attempt wrote nothing."""
    marker = scene.tmp / "killed.marker"
    [iid] = scene.submit(1)
    doomed = scene.worker("doomed", "--idle-ms", "1000", LAYERFLOW_TEST_SLOW_MARKER=str(marker))
    deadline = time.monotonic() + 20
    while not marker.exists():
        assert time.monotonic() < deadline and doomed.poll() is None, scene.log("doomed")
        time.sleep(0.05)
    doomed.send_signal(signal.SIGKILL)
    doomed.wait()
    scene.procs.remove(doomed)
    scene.worker("heir", "--idle-ms", "1000", LAYERFLOW_TEST_SLOW_MARKER=str(marker))
    deadline = time.monotonic() + 20
    while scene.runs_of([iid])[(iid, "check_a")] < 1:
        assert time.monotonic() < deadline, scene.log("heir")
        time.sleep(0.2)
    scene.wait_for([iid], "waiting", timeout=20)
    scene.stop()  # the timer's branch (check_b) may or may not have run by now: keep what there is
    runs = scene.runs_of([iid])
    assert runs[(iid, "prepare")] == runs[(iid, "check_a")] == 1 and runs[(iid, "check_b")] <= 1, runs
    whole, only_retries = (json.loads(out) for out in clis(("tape", iid, "--store", scene.store, "--json"),
                                                           ("tape", iid, "--store", scene.store, "--json",
                                                            "--kind", "retry")))
    tape = whole
    assert begun(tape) == completed(tape) == Counter(["prepare", "check_a"] + ["check_b"] * runs[(iid, "check_b")])
    retries = [e for e in tape if e["kind"] == "note" and (e.get("data") or {}).get("note") == "retry"]
    assert len(retries) == 1, [(e["kind"], e.get("data")) for e in tape]
    assert only_retries == retries  # README: `layerflow tape ID --kind retry`
    retry = retries[0]["data"]
    assert retries[0]["actor"] == "heir"
    assert retry["previous_consumer"] == "doomed" and retry["delivery"] == 2, retry
    assert retry["resumed_from_version"] >= 1 and retry["entry_id"]
    # before the second attempt of check_a, the one the dead worker had in hand
    begin_a = next(e for e in tape if e["kind"] == "begin" and e["activity"] == "check_a")
    assert retries[0]["time"] <= begin_a["time"]
    assert "taken over from consumer 'doomed'" in scene.log("heir")


def test_user_task_answered_through_rest_while_a_worker_holds_the_instance(scene: Scene, server: Server) -> None:
    """The review's answer arrives while a worker runs check_a (2 s) holding the lease: the server
    waits for the lease (or answers 409 naming the holder, and the client posts again), never loses
    the answer, never runs an activity beside the worker."""
    marker = scene.tmp / "held.marker"
    [iid] = scene.submit(1)
    scene.worker("holder", LAYERFLOW_TEST_SLOW_MARKER=str(marker), LAYERFLOW_TEST_SLOW_SECONDS="2")
    deadline = time.monotonic() + 20
    while not marker.exists():
        assert time.monotonic() < deadline, scene.log("holder")
        time.sleep(0.05)
    while True:
        r = server.post(f"/api/instances/{iid}/user-tasks/review", {"data": {"approved": True}})
        if r.status_code != 409:
            break
        assert r.json()["error"]["kind"] == "invalid_state" and "holder" in r.text, r.text
        assert time.monotonic() < deadline, r.text
    assert r.status_code == 200, r.text
    doc = r.json()
    assert doc["completed_user_task"]["task_id"] == "review"
    scene.wait_for([iid], "completed", timeout=20)
    final = server.get(f"/api/instances/{iid}").json()
    assert final["layers"]["L3"]["approved"] is True and final["layers"]["L3"]["done"] is True
    assert scene.runs_of([iid]) == Counter({(iid, a): 1 for a in ACTIVITIES})
    tape = server.get(f"/api/instances/{iid}/tape").json()["events"]
    assert begun(tape) == completed(tape) == Counter(ACTIVITIES) + Counter(["review"])
    # the answer went in after the worker's check_a, not beside it
    check_a_done = next(e["time"] for e in tape if e["kind"] == "complete" and e["activity"] == "check_a")
    review_begun = next(e["time"] for e in tape if e["kind"] == "begin" and e["activity"] == "review")
    assert check_a_done <= review_begun


class PrivateRedis:
    """A redis-server of this test's own (appendonly, as README asks of one workers share)."""

    def __init__(self, folder: Path) -> None:
        self.port, self.folder = free_port(), folder
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        import redis

        self.proc = subprocess.Popen(["redis-server", "--port", str(self.port), "--bind", "127.0.0.1",
                                      "--appendonly", "yes", "--save", "", "--dir", str(self.folder)],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 10
        while True:
            try:
                redis.Redis.from_url(self.url, socket_connect_timeout=0.5).ping()
                return
            except redis.RedisError:
                assert time.monotonic() < deadline, "private redis-server did not start"
                time.sleep(0.05)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(timeout=10)


@pytest.mark.skipif(shutil.which("redis-server") is None, reason="needs redis-server to start a private one")
def test_redis_restarted_while_workers_run(tmp_path: Path) -> None:
    server = PrivateRedis(tmp_path)
    server.start()
    scene = Scene(tmp_path, server.url)
    try:
        ids = scene.submit(6)
        scene.worker("r1", "--idle-ms", "1000")
        scene.worker("r2", "--idle-ms", "1000")
        deadline = time.monotonic() + 20
        while not scene.runs_of():
            assert time.monotonic() < deadline
            time.sleep(0.05)
        server.stop()
        time.sleep(0.3)
        server.start()
        deadline = time.monotonic() + 40
        while sum(1 for (_, a) in scene.runs_of() if a == "check_b") < len(ids):
            assert time.monotonic() < deadline, (scene.runs_of(), scene.log("r1"), scene.log("r2"))
            time.sleep(0.2)
        scene.wait_for(ids, "waiting", timeout=20)
        runs = scene.runs_of()
        assert {iid for iid, _ in runs} == set(ids)
        retried = [iid for iid in ids if any(runs[(iid, a)] != 1 for a in ("prepare", "check_a", "check_b"))]
        # a save the outage cut may have gone through or not: its activity ran at most once more
        assert all(runs[(iid, a)] <= 2 for iid in ids for a in ("prepare", "check_a", "check_b")), runs
        looked_at = retried or ids[:1]
        for iid, out in zip(looked_at, clis(*[("tape", iid, "--store", scene.store, "--json") for iid in looked_at])):
            tape = json.loads(out)
            assert begun(tape) == completed(tape) == Counter(["prepare", "check_a", "check_b"]), tape
            notes = [e for e in tape if e["kind"] == "note" and (e.get("data") or {}).get("note") == "retry"]
            # an activity run twice is told (a retry can also find the cut save applied: then nothing runs twice)
            assert notes or iid not in retried, tape
        # every entry acknowledged, none dead-lettered
        import redis

        client = redis.Redis.from_url(server.url, decode_responses=True)
        deadline = time.monotonic() + 10
        while client.xpending(scene.stream, "workers")["pending"]:
            assert time.monotonic() < deadline, client.xpending(scene.stream, "workers")
            time.sleep(0.1)
        assert client.xlen(f"{scene.stream}:dead") == 0
        client.close()
    finally:
        scene.stop()
        server.stop()
