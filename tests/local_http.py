"""HTTP calls from the tests to the servers they start on 127.0.0.1.

``httpx.get``/``httpx.post``/``httpx.request`` build a new client per call, and each client builds
an SSL context that loads the CA bundle: about 25 ms of CPU per call, spent on plain-HTTP calls
to local servers (health polls every few ms while a server starts, hundreds of API calls per
module). These build one client per thread, once. It keeps no connection open between calls
(the tests stop, kill and restart their servers), so each call still opens its own connection,
as the module-level functions did; timeouts and redirects are httpx's defaults, as there.
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parent.parent

_local = threading.local()


def _client() -> httpx.Client:
    client = getattr(_local, "client", None)
    if client is None:
        client = _local.client = httpx.Client(limits=httpx.Limits(max_keepalive_connections=0))
    return client


def request(method: str, url: str, **kwargs: Any) -> httpx.Response:
    return _client().request(method, url, **kwargs)


def get(url: str, **kwargs: Any) -> httpx.Response:
    return _client().get(url, **kwargs)


def post(url: str, **kwargs: Any) -> httpx.Response:
    return _client().post(url, **kwargs)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@contextlib.contextmanager
def serving(catalog: Path, store_file: Path, token: str) -> Iterator[str]:
    """A real `layerflow serve` of `catalog` on a free port (store: the sqlite `store_file`, API token
    `token`, this checkout's code); yields its base URL once uvicorn says it listens."""
    port = free_port()
    env = {k: v for k, v in os.environ.items() if k != "LAYERFLOW_STORE"}
    env.update(PYTHONPATH=str(ROOT), LAYERFLOW_API_TOKEN=token)
    process = subprocess.Popen(
        [sys.executable, "-m", "engine.cli", "serve", "--host", "127.0.0.1", "--port", str(port),
         "--catalog", str(catalog), "--store", f"sqlite:///{store_file}"],
        env=env, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        assert process.stderr is not None
        seen = []
        for line in process.stderr:  # uvicorn says when it listens
            seen.append(line)
            if "Uvicorn running on" in line or "Application startup complete" in line:
                break
        else:
            raise AssertionError("serve ended: " + "".join(seen))
        yield f"http://127.0.0.1:{port}"
    finally:
        process.terminate()
        process.wait(timeout=30)
