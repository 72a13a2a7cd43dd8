"""An instance whose worker delivery was dead-lettered says so in the REST rows (REST round 33), as
`layerflow list --stream` does: ``dead_letter`` on ``GET /api/instances`` and the console's
``/api/instance-summaries`` of a real ``layerflow serve --stream`` on the workers' Redis (DB 12, a key prefix
and stream of this module's own), after a real worker dead-lettered it. The console's list, which loads each
instance, lists the one whose record cannot be loaded with the damage as its error instead of failing."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import local_http
import pytest

from test_contracts_rest import AUTH, ROOT, serving
from test_contracts_rest_33 import EXPENSE

pytestmark = pytest.mark.slow

REDIS = os.environ.get("LAYERFLOW_TEST_REDIS_33", "redis://127.0.0.1:6379/12")


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("LAYERFLOW_STORE", "LAYERFLOW_QUEUE")}
    env["PYTHONPATH"] = str(ROOT)
    return env


def _get(url: str) -> Any:
    r = local_http.get(url, headers=AUTH, timeout=120)
    assert r.status_code == 200, r.text
    return r.json()


def test_an_instance_whose_delivery_was_dead_lettered_says_so_in_its_rows(tmp_path: Path) -> None:
    """A worker dead-letters an instance (its tape is gone); `layerflow list --stream` names the dead letter,
    and so do the rows of a server started on that stream: no worker will run it until it is requeued."""
    redis = pytest.importorskip("redis")
    client = redis.Redis.from_url(REDIS, decode_responses=True)
    try:
        client.ping()
    except redis.exceptions.ConnectionError:
        pytest.skip(f"no Redis at {REDIS}")
    (tmp_path / "catalog").mkdir()
    (tmp_path / "catalog" / "expense.bpmn").write_text(EXPENSE)
    prefix = f"rest33dead{uuid.uuid4().hex[:8]}"
    stream = f"{prefix}:ready"
    store = f"{REDIS}?prefix={prefix}"

    def cli(*args: str) -> Any:
        done = subprocess.run([sys.executable, "-m", "engine.cli", *args, "--json"], cwd=ROOT, env=_env(),
                              capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr
        return json.loads(done.stdout)

    try:
        [iid, fine] = cli("submit", str(tmp_path / "catalog" / "expense.bpmn"), "--store", store, "--stream", stream,
                          "--count", "2")["instance_ids"]
        client.delete(f"{prefix}:i:{{{iid}}}:t:main")  # lost: the worker cannot rebuild it
        stats = cli("worker", "--store", store, "--stream", stream, "--max-deliveries", "1", "--timer-interval", "0",
                    "--stop-after", "2")
        assert stats["dead"] == 1, stats
        [(dead_id, letter)] = client.xrange(f"{stream}:dead")
        assert letter["instance_id"] == iid
        listed = {r["id"]: r for r in cli("list", "--store", store, "--stream", stream)}
        assert listed[iid]["dead_letter"] == dead_id and "dead_letter" not in listed[fine]
        with contextlib.contextmanager(serving)(tmp_path, tmp_path / "catalog", store=store,
                                                extra=("--stream", stream)) as url:
            rows = {r["id"]: r for r in _get(f"{url}/api/instances")}
            assert rows[iid]["dead_letter"] == dead_id, rows  # before: no word of it
            assert rows[iid]["status"] == "running" and rows[iid]["held_by"] is None
            assert rows[fine].get("dead_letter") is None and rows[fine]["status"] == "waiting", rows
            summaries = {r["id"]: r for r in _get(f"{url}/api/instance-summaries")}  # before: 422 for all
            assert summaries[iid]["dead_letter"] == dead_id, summaries
            assert summaries[fine].get("dead_letter") is None and summaries[fine]["error"] is None
            # its record cannot be loaded (the lost tape): a row naming the damage
            assert summaries[iid]["error"]["kind"] == "invalid_record", summaries[iid]
            assert "is missing events" in summaries[iid]["error"]["message"], summaries[iid]
            # requeued (its cause not fixed yet), it waits on the stream again: no dead letter named
            cli("worker", "requeue", dead_id, "--store", store, "--stream", stream)
            assert "dead_letter" not in {r["id"]: r for r in _get(f"{url}/api/instances")}[iid]
    finally:
        keys = list(client.scan_iter(f"{prefix}*"))
        if keys:
            client.delete(*keys)
        client.close()
