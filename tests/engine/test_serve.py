"""``layerflow serve``: a real server process on 127.0.0.1, and the refusal to serve in the open."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import httpx
import local_http
import pytest
from click.testing import CliRunner

from engine.cli import main
from engine.cli_serve import is_loopback
from governance_helpers import NOTES, ROOT, free_port, make_catalog

pytestmark = pytest.mark.slow


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "LAYERFLOW_API_TOKEN"}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    return {**env, **extra}


def _wait_ready(proc: subprocess.Popen, url: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"layerflow serve exited with {proc.returncode}: {proc.stderr.read() if proc.stderr else ''}")
        try:
            if local_http.get(f"{url}/api/health", timeout=1).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.1)
    raise AssertionError("layerflow serve did not answer in time")


def _stop(proc: subprocess.Popen) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=15)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=5)


def test_serve_answers_over_http(tmp_path):
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    cmd = [sys.executable, "-m", "engine.cli", "serve", "--port", str(port), "--catalog", str(make_catalog(tmp_path)),
           "--store", f"sqlite:///{tmp_path / 'serve.db'}", "--log-level", "warning"]
    proc = subprocess.Popen(cmd, cwd=tmp_path, env=_env(LAYERFLOW_API_TOKEN="serve-token"),
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        _wait_ready(proc, url)
        auth = {"Authorization": "Bearer serve-token"}
        assert local_http.get(f"{url}/api/instances", timeout=10).status_code == 401
        started = local_http.post(f"{url}/api/instances", json={"process_id": "notes_review", "data": NOTES},
                             headers=auth, timeout=60)
        assert started.status_code == 201 and started.json()["status"] == "waiting"
        listed = local_http.get(f"{url}/api/instances", headers=auth, timeout=10).json()
        assert [r["id"] for r in listed] == [started.json()["instance_id"]]
        assert local_http.get(f"{url}/openapi.json", timeout=10).json()["info"]["title"] == "layerflow"
    finally:
        _stop(proc)
    assert (tmp_path / "serve.db").is_file()


def test_serve_on_loopback_without_a_token_makes_one(tmp_path):
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    cmd = [sys.executable, "-m", "engine.cli", "serve", "--port", str(port), "--catalog", str(make_catalog(tmp_path)),
           "--store", "memory://", "--log-level", "warning"]
    proc = subprocess.Popen(cmd, cwd=tmp_path, env=_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stderr is not None
        line = proc.stderr.readline()
        assert "this run's API token is" in line, line
        token = line.rsplit(" ", 1)[1].strip()
        _wait_ready(proc, url)
        assert local_http.get(f"{url}/api/instances", timeout=10).status_code == 401
        assert local_http.get(f"{url}/api/instances", headers={"Authorization": f"Bearer {token}"}, timeout=10).json() == []
    finally:
        _stop(proc)


@pytest.mark.parametrize("host", ["0.0.0.0", "192.168.1.10", "::", "example.com"])
def test_serve_refuses_to_bind_in_the_open_without_a_token(host, monkeypatch):
    monkeypatch.delenv("LAYERFLOW_API_TOKEN", raising=False)
    result = CliRunner().invoke(main, ["serve", "--host", host, "--catalog", str(ROOT / "bpmn_examples")])
    assert result.exit_code == 2
    assert "refusing to serve" in result.output and "--token" in result.output


def test_serve_refuses_a_missing_catalog(tmp_path):
    result = CliRunner().invoke(main, ["serve", "--token", "t", "--catalog", str(tmp_path / "nope")])
    assert result.exit_code == 2 and "does not exist" in result.output


@pytest.mark.parametrize("host, loopback", [("127.0.0.1", True), ("127.1.2.3", True), ("localhost", True),
                                            ("::1", True), ("[::1]", True), ("0.0.0.0", False), ("10.0.0.1", False),
                                            ("my-host", False)])
def test_is_loopback(host, loopback):
    assert is_loopback(host) is loopback


def test_serve_is_on_the_cli():
    result = CliRunner().invoke(main, ["--help"])
    assert "serve" in result.output
    assert Path(ROOT / "engine" / "cli_serve.py").is_file()
