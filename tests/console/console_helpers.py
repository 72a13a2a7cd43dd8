"""Helpers of the console tests: a real ``layerflow serve`` process, a headless Chromium.

The browser is Debian's ``chromium`` driven by Playwright for Python (never
``playwright install``, which downloads a browser). Without either, the browser tests
skip with the reason, unless ``LAYERFLOW_REQUIRE_BROWSER=1`` (CI), where they fail.
"""

from __future__ import annotations

import importlib.util
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import local_http
import pytest

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "bpmn_examples"
ARTIFACTS = ROOT / "artifacts"
CHROMIUM = os.environ.get("LAYERFLOW_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run", "--disable-quic"]


def browser_missing() -> str | None:
    """Why the browser tests cannot run here, or None."""
    if not Path(CHROMIUM).is_file():
        return f"{CHROMIUM} is missing: apt-get install -y chromium"
    if importlib.util.find_spec("playwright") is None:
        return "Playwright for Python is missing: pip install -e '.[dev]' (never `playwright install`)"
    return None


def require_browser() -> None:
    reason = browser_missing()
    if reason is None:
        return
    if os.environ.get("LAYERFLOW_REQUIRE_BROWSER") == "1":
        pytest.fail(f"LAYERFLOW_REQUIRE_BROWSER=1 but {reason}")
    pytest.skip(reason)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Server:
    """``layerflow serve`` on 127.0.0.1 in a subprocess; ``api(...)`` calls it with the token."""

    def __init__(self, url: str, token: str, proc: subprocess.Popen[str]) -> None:
        self.url, self.token, self.proc = url, token, proc

    def api(self, method: str, path: str, **kwargs: Any) -> Any:
        r = local_http.request(method, self.url + path, headers={"Authorization": f"Bearer {self.token}"},
                          timeout=60, **kwargs)
        assert r.is_success, f"{method} {path}: {r.status_code} {r.text}"
        return r.json()


@contextmanager
def serve(tmp: Path, token: str, catalog: Path = EXAMPLES) -> Iterator[Server]:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    prefix = "" if catalog == EXAMPLES else f"{catalog.name}-"  # a second server beside the first
    env = {k: v for k, v in os.environ.items() if k != "LAYERFLOW_API_TOKEN"}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env["LAYERFLOW_API_TOKEN"] = token
    cmd = [sys.executable, "-m", "engine.cli", "serve", "--host", "127.0.0.1", "--port", str(port),
           "--catalog", str(catalog), "--store", f"sqlite:///{tmp / (prefix + 'console.db')}", "--log-level", "warning"]
    log = open(tmp / f"{prefix}serve.log", "w+")  # noqa: SIM115 - read back when the server fails
    proc = subprocess.Popen(cmd, cwd=tmp, env=env, stdout=log, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 60
        while True:
            if proc.poll() is not None:
                log.seek(0)
                raise AssertionError(f"layerflow serve exited with {proc.returncode}:\n{log.read()}")
            try:
                if local_http.get(f"{url}/api/health", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                raise AssertionError("layerflow serve did not answer within 60 s")
            time.sleep(0.1)
        yield Server(url, token, proc)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=5)
        log.close()


@contextmanager
def chromium(tmp: Path, default_timeout: float | None = None) -> Iterator[Any]:
    """A headless Chromium with a fresh profile (user-data dir) under ``tmp``: a Playwright
    ``BrowserContext``; each of its pages has its own session storage. ``default_timeout`` (ms):
    the longest any single step may take. Skips (fails in CI) when the browser is missing."""
    require_browser()
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        context = p.chromium.launch_persistent_context(
            str(tmp / "chromium-profile"), executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True,
            timeout=30_000, viewport={"width": 1280, "height": 800}, env={**os.environ, "HOME": str(tmp)})
        if default_timeout is not None:
            context.set_default_timeout(default_timeout)
        try:
            yield context
        finally:
            context.close()
