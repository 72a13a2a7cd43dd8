"""Workers sharing a Redis that misbehaves: real `layerflow worker` processes, a real process
(tests/stores/fixtures/chaos14: a parallel join, a step the test can hold, a person's review,
a timer), and a redis-server of each test's own on a free port that the test kills, restarts
(with its AOF, or empty) and locks with a password. The shared Redis on 6379 is not touched.

What is checked: a worker rides out an outage (idle, and in the middle of an activity) with a
warning naming the server, and goes on when Redis is back; a Redis that comes back empty is
reported as lost data, not a crash; a worker stopped (SIGSTOP) past its lease cannot overwrite
the save of the worker that took over; the CLI refuses bad or locked store URLs with the URL
(password masked) and what to do, writing nothing.

About 40 s in all. Without redis-server on PATH the tests skip (CI installs it; with
LAYERFLOW_REQUIRE_REDIS=1 they fail instead).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from context_layers import LayeredContext
from context_layers.stores import InstanceNotFound, InstanceRecords, open_store
from engine import Engine
from engine.cli import main

from .test_faults import OwnRedis, free_port

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
BPMN = Path(__file__).parent / "fixtures" / "chaos14" / "chaos14.bpmn"
DATA = {"amount": 3}
ACTIVITIES = ["prepare", "check_a", "check_b", "slow_step", "finish"]
# prepared 6, b_score 7, slow_result 70
FINAL = {"prepared": 6, "a_ok": True, "b_score": 7, "slow_result": 70, "approved": True,
         "outcome": "70 approved=True a=True"}


class Workers:
    """`layerflow worker` subprocesses on one store, each logging to its own file."""

    def __init__(self, tmp: Path, url: str) -> None:
        self.tmp, self.url = tmp, url
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.hold = tmp / "hold"
        self.runs = tmp / "runs"
        self.env = {**os.environ, "PYTHONPATH": str(ROOT), "CHAOS14_HOLD": str(self.hold),
                    "CHAOS14_RUNS": str(self.runs), "CHAOS14_HOLD_SECONDS": "3"}

    def start(self, name: str, *, idle_ms: int = 1500) -> subprocess.Popen[bytes]:
        log = open(self.tmp / f"{name}.log", "wb")
        proc = subprocess.Popen([sys.executable, "-m", "engine.cli", "worker", "--store", self.url, "--consumer", name,
                                 "--idle-ms", str(idle_ms), "--timer-interval", "0.5"],
                                cwd=ROOT, env=self.env, stdout=log, stderr=subprocess.STDOUT)
        log.close()
        self.procs[name] = proc
        self.wait_log(name, "running the instances")
        return proc

    def log(self, name: str) -> str:
        return (self.tmp / f"{name}.log").read_text(errors="replace")

    def wait_log(self, name: str, text: str, timeout: float = 20, after: int = 0) -> str:
        """Wait until the worker's log (from character ``after`` on) holds ``text``."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            log = self.log(name)
            if text in log[after:]:
                return log
            assert self.procs[name].poll() is None, f"worker {name} exited:\n{log[-4000:]}"
            time.sleep(0.05)
        raise AssertionError(f"worker {name} never logged {text!r}:\n{self.log(name)[-4000:]}")

    def ran(self) -> list[tuple[str, int]]:
        if not self.runs.exists():
            return []
        return [(a, int(p)) for a, p in (line.split() for line in self.runs.read_text().splitlines())]

    def cli(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "engine.cli", *args, "--store", self.url], cwd=ROOT,
                              env=self.env, capture_output=True, text=True, timeout=60)

    def stop_all(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGCONT)
                proc.terminate()
        for proc in self.procs.values():
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=5)


@pytest.fixture
def own(tmp_path: Path) -> Iterator[Callable[..., OwnRedis]]:
    servers: list[OwnRedis] = []

    def make(*, durable: bool, folder: str = "redis") -> OwnRedis:
        (tmp_path / folder).mkdir()
        server = OwnRedis(tmp_path / folder, durable=durable)
        server.start()
        servers.append(server)
        return server

    yield make
    for server in servers:
        server.stop()


@pytest.fixture
def workers(tmp_path: Path) -> Iterator[Callable[[str], Workers]]:
    made: list[Workers] = []

    def make(url: str) -> Workers:
        made.append(Workers(tmp_path, url))
        return made[-1]

    yield make
    for w in made:
        w.stop_all()


def wait_for(check: Callable[[], Any], what: str, timeout: float = 30) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            got = check()
        except Exception:  # noqa: BLE001 - the store may be down for a moment
            got = None
        if got:
            return got
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def status_of(url: str, iid: str, versions: list[int] | None = None) -> str:
    store = open_store(url)
    try:
        record, version = store.load(iid)
    finally:
        store.close()
    if versions is not None:
        versions.append(version)
    return str(record["status"])


def answer_review(w: Workers, iid: str, tmp: Path) -> None:
    answers = tmp / "answers.json"
    answers.write_text(json.dumps({"user_tasks": {"review": {"approved": True}}}))
    done = w.cli("resume", iid, "--answers", str(answers))
    assert done.returncode == 3, done.stderr  # now waiting for the timer


def check_final(url: str, iid: str) -> None:
    """Completed once: every activity began once on the committed tape, the tape has no gap
    and replays to the context, and the context holds what an undisturbed run computes."""
    store = open_store(url)
    instance = Engine(InstanceRecords(store)).load(iid)
    assert instance.status == "completed", instance.error
    begins: list[str] = []
    for name, ctx in instance.contexts.items():
        tape = ctx.tape.to_list()
        begins += [e["data"]["task_id"] for e in tape if e["kind"] == "begin" and e["data"]["task_id"] != "review"]
        assert [e["seq"] for e in tape] == list(range(1, len(tape) + 1)), f"gap or duplicate on {name!r}"
        assert store.read_tape(iid, name) == tape, f"the store's tape of {name!r} is not the context's"
        assert LayeredContext.replay(ctx.tape) == ctx
    assert sorted(begins) == sorted(ACTIVITIES), begins
    for key, value in FINAL.items():
        assert instance.main.get(key) == value, key
    store.close()


def test_a_worker_rides_out_redis_outages_idle_and_mid_activity(own, workers, tmp_path):
    """Redis (AOF) goes away while the worker waits for work, then again while it runs an
    activity and until after the activity ends: the worker warns naming the server, backs
    off, and once Redis is back runs the instance on from its last save, exactly once."""
    server = own(durable=True)
    url = server.url
    w = workers(url)
    w.start("w1")
    where = f"127.0.0.1:{server.port}"

    server.kill()  # idle
    w.wait_log("w1", "did not answer")
    assert where in w.log("w1") and "retrying in" in w.log("w1")
    server.start()

    sub = w.cli("submit", str(BPMN), "--data", json.dumps(DATA))
    assert sub.returncode == 0, sub.stderr
    iid = sub.stdout.strip()
    wait_for(w.hold.exists, "the slow step to start")
    mark = len(w.log("w1"))
    server.kill()  # mid-activity; still down when the activity ends and the worker saves
    time.sleep(4.5)  # the held step ends (3 s) and its save finds no server
    assert w.procs["w1"].poll() is None, w.log("w1")
    server.start()
    versions: list[int] = []
    wait_for(lambda: status_of(url, iid, versions) == "waiting", "the instance to reach the review", timeout=40)
    log = w.log("w1")[mark:]
    assert where in log and ("did not answer" in log or "Is redis-server running" in log), log

    answer_review(w, iid, tmp_path)
    wait_for(lambda: status_of(url, iid, versions) == "completed", "the timer to fire and finish it")
    assert versions == sorted(versions), f"the version went back: {versions}"
    check_final(url, iid)
    # at least once: the held attempt's save was lost with the server, so slow_step ran again
    ran = [a for a, _pid in w.ran()]
    assert ran.count("slow_step") == 2 and all(ran.count(a) == 1 for a in ACTIVITIES if a != "slow_step"), ran
    assert w.procs["w1"].poll() is None


def test_redis_restarted_empty_is_reported_as_lost_data(own, workers):
    """Redis without persistence restarts while a worker runs an activity: the instance and
    the stream are gone. The worker says so (the data was lost, naming the server) instead of
    dying on a NOGROUP traceback, writes nothing half, and runs what is submitted afterwards."""
    server = own(durable=False)
    url = server.url
    w = workers(url)
    w.start("w1")
    sub = w.cli("submit", str(BPMN), "--data", json.dumps(DATA))
    assert sub.returncode == 0, sub.stderr
    lost = sub.stdout.strip()
    wait_for(w.hold.exists, "the slow step to start")
    server.kill()
    server.start()  # empty
    log = w.wait_log("w1", "vanished from the store", timeout=30)  # the instance in hand
    assert f"127.0.0.1:{server.port}" in log and lost in log and "lost its data" in log, log
    log = w.wait_log("w1", "is gone from the queue's Redis")  # the stream and its group
    assert "NOGROUP" not in log, log
    assert w.procs["w1"].poll() is None, log

    sub = w.cli("submit", str(BPMN), "--data", json.dumps(DATA))
    assert sub.returncode == 0, sub.stderr
    fresh = sub.stdout.strip()
    wait_for(lambda: status_of(url, fresh) == "waiting", "the new instance to reach the review")
    store = open_store(url)
    assert [s["instance_id"] for s in store.list_instances()] == [fresh]  # the lost one is not half back
    with pytest.raises(InstanceNotFound):
        store.load(lost)
    store.close()


def test_a_redis_out_of_memory_is_waited_out(own, workers):
    """A Redis that answers but refuses writes (maxmemory reached; a read-only replica or a failed
    RDB save look the same to a worker) is an outage to wait out with a warning naming the server,
    not a traceback that ends the worker."""
    import redis

    server = own(durable=False)
    w = workers(server.url)
    w.start("w1")
    admin = redis.Redis.from_url(server.url)
    admin.config_set("maxmemory", "1")
    try:
        log = w.wait_log("w1", "refuses commands for now")
        assert f"127.0.0.1:{server.port}" in log and "maxmemory" in log, log
        sub = w.cli("submit", str(BPMN), "--data", json.dumps(DATA))
        assert sub.returncode != 0 and "refuses commands for now" in sub.stderr, sub.stderr
        assert w.procs["w1"].poll() is None, w.log("w1")
    finally:
        admin.config_set("maxmemory", "0")
        admin.close()
    sub = w.cli("submit", str(BPMN), "--data", json.dumps(DATA))
    assert sub.returncode == 0, sub.stderr
    iid = sub.stdout.strip()
    wait_for(lambda: status_of(server.url, iid) == "waiting", "the worker to run the instance once Redis takes writes")
    store = open_store(server.url)
    assert [s["instance_id"] for s in store.list_instances()] == [iid]  # the refused submit left nothing
    store.close()


def test_a_worker_stopped_past_its_lease_cannot_overwrite_the_takeover(own, workers, tmp_path):
    """Worker A is SIGSTOPped in the middle of an activity, past its lease and idle time; B
    takes the entry over and commits. A, continued, finishes the activity and tries to save:
    the version check refuses it, so B's save stands and the tape has each activity once."""
    server = own(durable=False)
    url = server.url
    w = workers(url)
    a = w.start("a")
    sub = w.cli("submit", str(BPMN), "--data", json.dumps(DATA))
    assert sub.returncode == 0, sub.stderr
    iid = sub.stdout.strip()
    wait_for(w.hold.exists, "the slow step to start")
    assert int(w.hold.read_text()) == a.pid
    a.send_signal(signal.SIGSTOP)
    try:
        b = w.start("b")
        wait_for(lambda: status_of(url, iid) == "waiting", "B to take over and reach the review", timeout=30)
        store = open_store(url)
        record, version = store.load(iid)
        tapes = {name: store.read_tape(iid, name) for name in store.tape_heads(iid)}
        time.sleep(3.2 - 1.5)  # A's held step (3 s) is over by the time it continues
    finally:
        a.send_signal(signal.SIGCONT)
    w.wait_log("a", "saved by someone else", timeout=20)
    time.sleep(0.5)
    assert store.load(iid) == (record, version), "the stale worker's save went through"
    assert {name: store.read_tape(iid, name) for name in store.tape_heads(iid)} == tapes
    store.close()
    assert a.poll() is None and b.poll() is None

    answer_review(w, iid, tmp_path)
    wait_for(lambda: status_of(url, iid) == "completed", "the timer to fire and finish it")
    check_final(url, iid)
    slow = [pid for act, pid in w.ran() if act == "slow_step"]
    assert sorted(slow) == sorted([a.pid, b.pid]), slow  # both ran it; only B's result was committed


# ----------------------------------------------------------------------------- the CLI

def _invoke(args: list[str]) -> Any:
    return CliRunner().invoke(main, args, catch_exceptions=False)


@pytest.fixture
def locked(own) -> OwnRedis:
    """A redis-server that wants a password (s3cret)."""
    import redis

    server = own(durable=False, folder="locked")
    client = redis.Redis.from_url(server.url)
    client.config_set("requirepass", "s3cret")
    client.close()
    return server


@pytest.mark.parametrize("command", ["submit", "resume", "inspect"])
@pytest.mark.parametrize("case", ["refused", "db-not-a-number", "no-password", "wrong-password", "no-such-db"])
def test_cli_refuses_a_bad_or_locked_store_url(locked, tmp_path, command, case):
    port = locked.port
    url, expect = {
        "refused": (f"redis://127.0.0.1:{free_port()}/0", "start redis-server"),
        "db-not-a-number": (f"redis://127.0.0.1:{port}/zero", "not a number"),
        "no-password": (f"redis://127.0.0.1:{port}/0", "password"),
        "wrong-password": (f"redis://:wrong@127.0.0.1:{port}/0", "password"),
        "no-such-db": (f"redis://:s3cret@127.0.0.1:{port}/99", "database 99"),
    }[case]
    args = {"submit": ["submit", str(BPMN), "--data", json.dumps(DATA)], "resume": ["resume", "abc123"],
            "inspect": ["inspect", "abc123"]}[command]
    result = _invoke([*args, "--store", url])
    assert result.exit_code in (1, 2), result.output
    shown = url.replace(":wrong@", ":***@").replace(":s3cret@", ":***@")
    assert shown in result.output and expect.lower() in result.output.lower(), result.output
    assert "wrong" not in result.output.replace(shown, "") and "s3cret" not in result.output
    assert "Traceback" not in result.output
    # nothing was written
    good = open_store(f"redis://:s3cret@127.0.0.1:{port}/0")
    assert good.list_instances() == []
    good.close()


@pytest.mark.parametrize("command", ["submit", "dead"])
def test_a_locked_queue_is_named_as_locked(locked, tmp_path, command):
    """The store answers (sqlite) but the queue's Redis wants a password: the error says so and
    names the queue's URL, not "did not answer ... start redis-server"; submit creates nothing."""
    store = f"sqlite:///{tmp_path / 'store.db'}"
    queue = f"redis://:wrong@127.0.0.1:{locked.port}/0"
    args = (["submit", str(BPMN), "--data", json.dumps(DATA)] if command == "submit" else ["worker", "dead"])
    result = _invoke([*args, "--store", store, "--queue", queue])
    assert result.exit_code in (1, 2), result.output
    assert f"127.0.0.1:{locked.port}" in result.output and "password" in result.output.lower(), result.output
    assert "start redis-server" not in result.output and "wrong" not in result.output.replace(":***@", ""), result.output
    if command == "submit":
        assert open_store(store).list_instances() == []
