"""HTTP calls from the tests to the servers they start on 127.0.0.1.

``httpx.get``/``httpx.post``/``httpx.request`` build a new client per call, and each client builds
an SSL context that loads the CA bundle: about 25 ms of CPU per call, spent on plain-HTTP calls
to local servers (health polls every few ms while a server starts, hundreds of API calls per
module). These build one client per thread, once. It keeps no connection open between calls
(the tests stop, kill and restart their servers), so each call still opens its own connection,
as the module-level functions did; timeouts and redirects are httpx's defaults, as there.
"""

from __future__ import annotations

import threading
from typing import Any

import httpx

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
