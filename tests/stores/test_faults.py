"""Redis durability: kill -9 redis-server (AOF, fsync always) while writers save, restart
it on the same directory, and check that nothing a writer saw committed was lost.

The test starts its own redis-server on a free loopback port in a temporary directory and
stops only that one; the shared server on 6379 is never touched.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from context_layers.errors import VersionConflict
from context_layers.stores import InstanceExists, StoreUnavailable, open_store

from .conftest import REQUIRE_REDIS

pytestmark = pytest.mark.slow


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class OwnRedis:
    """A redis-server of this test's own: loopback, AOF with fsync on every write."""

    def __init__(self, directory: Path, *, durable: bool = True) -> None:
        binary = shutil.which("redis-server")
        if binary is None:
            message = "redis-server is not installed (apt-get install redis-server)"
            if REQUIRE_REDIS:
                pytest.fail(message + "; LAYERFLOW_REQUIRE_REDIS=1 makes this a failure")
            pytest.skip(message)
        self.binary = binary
        self.dir = directory
        self.port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None
        # durable: AOF with fsync on every write (the kill tests); else nothing on disk (faster)
        self.persistence = (["--appendonly", "yes", "--appendfsync", "always"] if durable
                            else ["--appendonly", "no"])

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        log = open(self.dir / "redis.log", "ab")
        self.proc = subprocess.Popen(
            [self.binary, "--bind", "127.0.0.1", "--port", str(self.port), "--dir", str(self.dir),
             *self.persistence, "--save", "", "--daemonize", "no"],
            stdout=log, stderr=subprocess.STDOUT)
        log.close()
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.5) as s:
                    s.sendall(b"PING\r\n")
                    if s.recv(16).startswith(b"+PONG"):
                        return
            except OSError:
                pass
            if self.proc.poll() is not None:
                break
            time.sleep(0.05)
        raise RuntimeError(f"own redis-server on port {self.port} did not come up: "
                           f"{(self.dir / 'redis.log').read_text()[-2000:]}")

    def kill(self) -> None:
        """SIGKILL: no shutdown, no final fsync."""
        assert self.proc is not None
        self.proc.kill()
        self.proc.wait(timeout=10)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)


@pytest.fixture
def own_redis(tmp_path: Path) -> Iterator[OwnRedis]:
    server = OwnRedis(tmp_path)
    server.start()
    try:
        yield server
    finally:
        server.stop()


def test_nothing_committed_is_lost_when_redis_is_killed(own_redis):
    url = own_redis.url + "?prefix=fault"
    deadline = time.monotonic() + 60
    stop = threading.Event()
    acked: dict[str, int] = {}  # instance id -> the version its writer saw committed
    lost: list[str] = []
    outcomes: list[str] = []
    problems: list[BaseException] = []
    lock = threading.Lock()

    def record(iid: str, step: int) -> dict:
        return {"id": iid, "process_id": "fault", "status": "running", "step": step, "payload": "x" * 200}

    def event(seq: int) -> dict:
        return {"seq": seq, "kind": "write", "time": time.time(), "actor": "writer"}

    def commit(store, iid: str, version_after: int, op: Callable[[], int]) -> None:
        """Run ``op`` until its outcome is known: a retry that finds the write already
        there (the reply was lost with the server) counts as committed."""
        while time.monotonic() < deadline:  # even after stop: every write's outcome is known
            try:
                op()
            except (VersionConflict, InstanceExists):
                outcomes.append("reconciled")
                rec, version = store.load(iid)
                if version < acked.get(iid, 0):
                    lost.append(f"{iid}: version {acked[iid]} was acknowledged, the store has {version}")
                    return
                if not (version == version_after and rec["step"] == version_after - 1):
                    raise AssertionError(f"{iid}: unexpected state at version {version}: {rec['step']}")
            except StoreUnavailable:
                outcomes.append("unavailable")
                time.sleep(0.05)
                continue
            with lock:
                acked[iid] = version_after
            return

    def writer(w: int) -> None:
        try:
            store = open_store(url)
            n = 0
            while not stop.is_set() and time.monotonic() < deadline:
                iid = f"w{w}-{n}"
                n += 1
                commit(store, iid, 1, lambda: store.create(record(iid, 0), tape_appends={"main": [event(1)]}))
                for v in range(1, 5):
                    commit(store, iid, v + 1, lambda v=v: store.save(iid, record(iid, v), v, {"main": [event(v + 1)]}))
            store.close()
        except BaseException as exc:  # noqa: BLE001 - reported by the main thread
            problems.append(exc)

    def wait_for_acks(n: int) -> None:
        target = len(acked) + n
        while len(acked) < target and not problems and time.monotonic() < deadline:
            time.sleep(0.01)

    threads = [threading.Thread(target=writer, args=(w,), daemon=True) for w in range(3)]
    for t in threads:
        t.start()
    for _ in range(2):
        wait_for_acks(15)
        own_redis.kill()        # mid-run: writers have saves in flight
        time.sleep(0.2)
        own_redis.start()       # same directory: the AOF is replayed
    wait_for_acks(15)
    stop.set()
    for t in threads:
        t.join(timeout=30)
    assert not problems, problems
    assert not lost, lost
    assert time.monotonic() < deadline, "the test ran out of time"
    assert len(acked) >= 45
    assert "unavailable" in outcomes, "the kills did not interrupt any writer: the test proved nothing"

    store = open_store(url)
    stored = {s["instance_id"]: s["version"] for s in store.list_instances()}
    for iid, version in acked.items():
        assert stored.get(iid) == version, f"{iid}: acknowledged version {version}, stored {stored.get(iid)}"
    for iid, version in stored.items():
        rec, v = store.load(iid)
        tape = store.read_tape(iid, "main")
        # one event per committed write: a write is never half there
        assert [e["seq"] for e in tape] == list(range(1, v + 1)) and rec["step"] == v - 1, iid
    store.close()
    assert os.listdir(own_redis.dir / "appendonlydir"), "the AOF was written"
