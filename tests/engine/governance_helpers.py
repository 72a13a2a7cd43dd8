"""Helpers of the governance tests: a catalog directory, an API server on a thread."""

from __future__ import annotations

import socket
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "bpmn_examples"
FIXTURES = Path(__file__).resolve().parent / "fixtures" / "governance"
TOKEN = "test-token-7f3a"

LOAN_CONFLICT = {"amount": 120000, "applicant_id": "APP001", "purpose": "business loan", "industry": "gambling"}
NOTES = {"applicant": "APP9"}


def make_catalog(tmp: Path) -> Path:
    """The loan example and the notes_review fixture, linked into one catalog directory."""
    catalog = tmp / "catalog"
    catalog.mkdir(exist_ok=True)
    links = [EXAMPLES / "loan_approval.bpmn", EXAMPLES / "loan_approval.layerflow.yaml",
             EXAMPLES / "loan_handlers.py", EXAMPLES / "knowledge", *sorted(FIXTURES.iterdir())]
    for src in links:
        dst = catalog / src.name
        if not dst.exists():
            dst.symlink_to(src)
    return catalog


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class ServerThread:
    """``uvicorn`` serving ``app`` on 127.0.0.1 in a thread: real HTTP, one process."""

    def __init__(self, app: Any) -> None:
        import uvicorn

        self.port = free_port()
        self.server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="warning"))
        self.thread = threading.Thread(target=self.server.run, name="api", daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def __enter__(self) -> "ServerThread":
        self.thread.start()
        deadline = time.monotonic() + 20
        while not self.server.started:
            if time.monotonic() > deadline or not self.thread.is_alive():
                raise RuntimeError("the API server did not start")
            time.sleep(0.02)
        return self

    def __exit__(self, *exc: Any) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)
