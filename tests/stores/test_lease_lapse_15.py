"""A worker whose lease lapsed while it ran an activity (paused past its lease: SIGSTOP here; a
long GC pause or a suspended VM in life) and another worker took the instance over: the first
worker must not start the next activity. Its save after the activity in hand can still go
through (the version check sees no save of the taker yet), but the next activity's side effect
(here a line in a file) would run twice, once by each worker. It checks its lease before each
activity and, having lost it, stops with a logged notice; the instance completes once.

Real ``layerflow worker`` processes on the shared Redis (``$LAYERFLOW_TEST_REDIS_GAPS15``,
default database 11) under a key prefix and stream of the test's own, deleted afterwards.
About 15 s.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from context_layers.stores import open_store

from .conftest import drop_prefix, redis_or_skip

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
BPMN = Path(__file__).parent / "fixtures" / "lapse15" / "lapse15.bpmn"
REDIS = os.environ.get("LAYERFLOW_TEST_REDIS_GAPS15", "redis://127.0.0.1:6379/11")


@pytest.fixture
def scratch() -> Iterator[str]:
    """A prefix of this test's own on the Redis (its stream is ``PREFIX:ready``)."""
    import uuid

    redis_or_skip(REDIS)
    prefix = f"lapse15-{uuid.uuid4().hex[:10]}"
    yield prefix
    drop_prefix(REDIS, prefix)


def wait_for(check: Callable[[], Any], what: str, timeout: float = 20, interval: float = 0.05) -> Any:
    """``check()``'s first true answer, asked every ``interval`` seconds (a check that runs a CLI command in this
    process takes CPU from the workers it waits for: ask it less often)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = check()
        if got:
            return got
        time.sleep(interval)
    raise AssertionError(f"timed out waiting for {what}")


def test_a_worker_whose_lease_lapsed_does_not_start_the_next_activity(scratch: str, tmp_path: Path) -> None:
    url = f"{REDIS}?prefix={scratch}"
    stream = ["--stream", f"{scratch}:ready", "--group", f"{scratch}-workers"]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "LAPSE15_DIR": str(tmp_path), "LAPSE15_HOLD_SECONDS": "3"}
    procs: dict[str, subprocess.Popen[bytes]] = {}

    def start(name: str) -> subprocess.Popen[bytes]:
        with open(tmp_path / f"{name}.log", "wb") as log:
            procs[name] = subprocess.Popen(
                [sys.executable, "-m", "engine.cli", "worker", "--store", url, *stream, "--consumer", name,
                 "--idle-ms", "1500", "--timer-interval", "0"],
                cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
        return procs[name]

    def log(name: str) -> str:
        return (tmp_path / f"{name}.log").read_text(errors="replace")

    def seconds() -> list[tuple[int, float]]:
        """Each run of `second`: the worker's pid and when it ran."""
        path = tmp_path / "second"
        lines = path.read_text().splitlines() if path.exists() else []
        return [(int(pid), float(at)) for pid, at in (line.split() for line in lines)]

    try:
        a = start("a")
        wait_for(lambda: "running the instances" in log("a"), "worker a to start")
        sub = subprocess.run([sys.executable, "-m", "engine.cli", "submit", str(BPMN), "--store", url, *stream],
                             cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
        assert sub.returncode == 0, sub.stderr
        iid = sub.stdout.strip()
        wait_for((tmp_path / f"hold.{a.pid}").exists, "worker a to start the first activity")
        a.send_signal(signal.SIGSTOP)  # past its lease (1.5 s) in the middle of `first`
        try:
            b = start("b")
            # b takes the entry over once it is idle and a's lease ran out, and holds in `first` too
            wait_for(lambda: (tmp_path / f"hold.{b.pid}").exists(), "worker b to take the instance over",
                     timeout=20)
        finally:
            a.send_signal(signal.SIGCONT)

        def completed() -> bool:
            store = open_store(url)
            try:
                record, _version = store.load(iid)
            finally:
                store.close()
            return record["status"] == "completed"

        # a finishes `first` (its hold is over) while b still holds in it: a's save goes through, and
        # then a must see that the lease is b's before it starts `second`
        wait_for(completed, "the instance to complete", timeout=30)
        # `second` ran once, and not while b held the lease in `first` (a would have run it then)
        wait_for((tmp_path / f"done.{b.pid}").exists, "worker b to end its hold in `first`")
        b_done = float((tmp_path / f"done.{b.pid}").read_text())
        assert len(seconds()) == 1 and seconds()[0][1] > b_done, (seconds(), b_done, a.pid, b.pid,
                                                                  log("a")[-3000:])
        notice = next(line for line in log("a").splitlines() if "lease" in line and iid in line)
        assert "'b' holds it now" in notice and "activity 'second'" in notice, notice
        assert a.poll() is None and b.poll() is None, (log("a")[-2000:], log("b")[-2000:])
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGCONT)
                proc.terminate()
        for proc in procs.values():
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=5)

