"""`layerflow run` holds its new instance's lease as `resume` does, on the stores several
processes share (sqlite, redis): a `resume` of an instance that a `run` is running right now
is refused up front (exit 2, naming who runs it) instead of running the same activity beside
it; a `run` killed with SIGKILL mid-activity is resumed from its last save once its lease is
gone, re-running only the activity it was in.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from context_layers import LayeredContext
from context_layers.stores import open_store
from engine import Engine

from .conftest import Backend
from .test_cli_store_outage import write_process

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]


# the backends two processes can share (the `backend` fixture without memory)
shared_backends = pytest.mark.parametrize("backend", ["sqlite", "redis"], indirect=True)


def start_run(url: str, bpmn: Path, mark: Path, pause: float, go: Path | None = None) -> subprocess.Popen[str]:
    """`layerflow run`; its s2 waits ``pause`` seconds, or until the file ``go`` exists."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "MARK": str(mark), "PAUSE": str(pause),
           **({"GO": str(go)} if go is not None else {})}
    return subprocess.Popen([sys.executable, "-m", "engine.cli", "run", str(bpmn), "--store", url, "--json"],
                            env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def wait_for_mark(mark: Path) -> str:
    deadline = time.monotonic() + 60
    while not (mark.exists() and mark.read_text()) and time.monotonic() < deadline:
        time.sleep(0.05)
    return mark.read_text().split()[0]


def resume(url: str, iid: str, mark: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "MARK": str(mark), "PAUSE": "0"}
    return subprocess.run([sys.executable, "-m", "engine.cli", "resume", iid, "--store", url, "--json"],
                          env=env, cwd=ROOT, capture_output=True, text=True, timeout=120)


@shared_backends
def test_resume_of_an_instance_run_is_running_is_refused(backend: Backend, tmp_path: Path) -> None:
    mark = tmp_path / "mark"
    go = tmp_path / "go"
    run = start_run(backend.url, write_process(tmp_path), mark, pause=60, go=go)
    iid = wait_for_mark(mark)  # s2 is running in `run`, until `go` exists
    second = resume(backend.url, iid, mark)
    go.touch()
    out, err = run.communicate(timeout=120)
    assert second.returncode == 2, (second.stdout[-1500:], second.stderr[-1500:])
    refusal = json.loads(second.stdout)
    assert refusal["error"]["kind"] == "invalid_state" and refusal["instance_id"] == iid
    assert "cli-" in refusal["error"]["message"]
    assert run.returncode == 0, err[-2000:]
    assert json.loads(out)["status"] == "completed"
    assert mark.read_text().split() == [iid]  # s2 ran once


@shared_backends
def test_run_killed_mid_activity_resumes_from_its_last_save(backend: Backend, tmp_path: Path) -> None:
    mark = tmp_path / "mark"
    run = start_run(backend.url, write_process(tmp_path), mark, pause=60)
    iid = wait_for_mark(mark)
    os.kill(run.pid, signal.SIGKILL)
    run.communicate(timeout=30)
    store = open_store(backend.url)
    record, _ = store.load(iid)
    assert record["status"] != "completed"
    # the dead command's lease outlives it (at most LEASE_TTL): resume says who holds it
    early = resume(backend.url, iid, mark)
    assert early.returncode == 2 and "lease" in json.loads(early.stdout)["error"]["message"]
    owner = store.lease_owner(iid)
    assert owner is not None and store.release_lease(iid, owner)  # as if it ran out
    store.close()
    done = resume(backend.url, iid, mark)
    assert done.returncode == 0, (done.stdout[-1500:], done.stderr[-1500:])
    doc = json.loads(done.stdout)
    assert doc["status"] == "completed" and (doc["layers"]["L3"]["r1"], doc["layers"]["L3"]["r2"]) == (1, 2)
    assert mark.read_text().split() == [iid, iid]  # s2 again (it never committed), s1 not
    instance = Engine(backend.url).load(iid)
    assert LayeredContext.replay(instance.main.tape) == instance.main
    assert [e.activity for e in instance.main.tape if e.kind == "begin"] == ["s1", "s2"]
