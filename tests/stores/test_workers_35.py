"""A worker started while its Redis does not answer (a wrong port stands in for a Redis that is
down for a moment; the shared Redis is never stopped): it exits at once with exit code 2 (bad
input, as `submit` does for the same URL), naming the URL with its password masked and what to
do, without a traceback, whichever of the two is down (the store's Redis, or the queue's).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from .conftest import redis_or_skip
from .test_faults import free_port

ROOT = Path(__file__).resolve().parents[2]
BPMN = Path(__file__).parent / "fixtures" / "slow_process.bpmn"


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
