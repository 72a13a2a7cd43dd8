"""A store or queue URL whose TLS does not match the server's: ``rediss://`` at a Redis that does
not speak TLS (the shared Redis), and ``redis://`` at a port that speaks only TLS (a TLS stub
server of the test's own on a free port, with a self-signed certificate).

Both fail within seconds (the TLS handshake is bounded by the connect timeout, not by the 30 s
read timeout, and is not retried), as ``StoreUnavailable`` (CLI exit 2), naming the URL with its
password hidden and what to do. Nothing is written to the shared Redis.
"""

from __future__ import annotations

import json
import socket
import ssl
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
from click.testing import CliRunner

from context_layers.stores import StoreUnavailable, open_store
from context_layers.stores.redis import _TLSConnection
from engine.cli import main

from .conftest import REDIS_URL, redis_or_skip

BPMN = Path(__file__).parent / "fixtures" / "chaos14" / "chaos14.bpmn"
# what the TLS handshakes of one command may wait in all: one handshake, ended by the 5 s connect
# timeout (a plain Redis never answers a ClientHello), not the 30 s read timeout (or, for the queue, no
# timeout) it had before, and not retried. The handshakes are timed, not the whole command: on a loaded
# machine the command's own work (parsing the BPMN, opening the store) took seconds more.
FEW_SECONDS = 8.0


@pytest.fixture
def plain_redis() -> str:
    """host:port of a Redis that does not speak TLS."""
    redis_or_skip()
    parts = urlsplit(REDIS_URL)
    return f"{parts.hostname}:{parts.port or 6379}"


@pytest.fixture
def tls_only(tmp_path: Path) -> Iterator[int]:
    """The port of a server that speaks only TLS: it drops a client that talks plain text, as a
    Redis with ``tls-port`` and ``port 0`` does."""
    pytest.importorskip("cryptography")
    import datetime

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(1).not_valid_before(now - datetime.timedelta(minutes=1))
            .not_valid_after(now + datetime.timedelta(hours=1)).sign(key, hashes.SHA256()))
    (tmp_path / "cert.pem").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    (tmp_path / "key.pem").write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                                         serialization.NoEncryption()))
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(tmp_path / "cert.pem", tmp_path / "key.pem")
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    listener.settimeout(0.2)
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except OSError:
                continue
            try:
                context.wrap_socket(conn, server_side=True).close()
            except OSError:
                conn.close()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield int(listener.getsockname()[1])
    stop.set()
    thread.join(timeout=2)
    listener.close()


@contextmanager
def _handshakes() -> Iterator[list[float]]:
    """The seconds each TLS handshake (``_TLSConnection._connect``) took while the block ran."""
    waits: list[float] = []
    connect = _TLSConnection._connect

    def timed(self: Any) -> Any:
        started = time.monotonic()
        try:
            return connect(self)
        finally:
            waits.append(time.monotonic() - started)

    _TLSConnection._connect = timed  # type: ignore[method-assign]
    try:
        yield waits
    finally:
        _TLSConnection._connect = connect  # type: ignore[method-assign]


def _invoke(args: list[str]) -> tuple[int, str, float]:
    """Exit code, output, and how long the command's TLS handshakes waited in all (at least one ran)."""
    with _handshakes() as waits:
        result = CliRunner().invoke(main, args, catch_exceptions=False)
    assert waits, ("no TLS handshake was tried", result.output)
    return result.exit_code, result.output, sum(waits)


def _refused(url: str) -> str:
    """What ``open_store(url)`` raises (``StoreUnavailable``, within a few seconds), as text: for
    ``rediss://`` its TLS handshakes are timed, for ``redis://`` (no handshake) the whole call."""
    started = time.monotonic()
    with _handshakes() as waits, pytest.raises(StoreUnavailable) as caught:
        open_store(url)
    tls = url.startswith("rediss://")
    assert bool(waits) == tls, waits
    took = sum(waits) if tls else time.monotonic() - started
    assert took < FEW_SECONDS, took
    return str(caught.value)


def test_rediss_store_at_a_plain_redis_fails_fast_naming_tls(plain_redis):
    message = _refused(f"rediss://:s3cret@{plain_redis}/11?prefix=gaps15tls")
    assert f"rediss://:***@{plain_redis}/11" in message and "s3cret" not in message, message
    assert "does not answer TLS" in message and "redis://" in message and "port" in message, message
    assert "start redis-server" not in message.lower(), message


@pytest.mark.parametrize("command", ["inspect", "submit"])
def test_cli_rediss_store_at_a_plain_redis_exits_2_within_seconds(plain_redis, command):
    url = f"rediss://:s3cret@{plain_redis}/11?prefix=gaps15tls"
    args = ["inspect", "abc123"] if command == "inspect" else ["submit", str(BPMN), "--data", json.dumps({"amount": 3})]
    code, output, took = _invoke([*args, "--store", url])
    assert code == 2, output
    assert took < FEW_SECONDS, (took, output)
    assert f"rediss://:***@{plain_redis}/11" in output and "s3cret" not in output, output
    assert "does not answer TLS" in output and "Traceback" not in output, output


@pytest.mark.parametrize("command", ["submit", "dead"])
def test_rediss_queue_at_a_plain_redis_fails_fast_naming_tls(plain_redis, tmp_path, command):
    store = f"sqlite:///{tmp_path / 'store.db'}"
    queue = f"rediss://:s3cret@{plain_redis}/11"
    args = (["submit", str(BPMN), "--data", json.dumps({"amount": 3})] if command == "submit"
            else ["worker", "dead"])
    code, output, took = _invoke([*args, "--store", store, "--queue", queue])
    assert code in (1, 2), output  # as for a queue Redis that is down or locked
    assert took < FEW_SECONDS, (took, output)
    assert f"rediss://:***@{plain_redis}/11" in output and "s3cret" not in output, output
    assert "does not answer TLS" in output and "redis://" in output, output
    if command == "submit":
        assert open_store(store).list_instances() == []


def test_redis_store_at_a_tls_only_port_says_to_use_rediss(tls_only):
    message = _refused(f"redis://:s3cret@127.0.0.1:{tls_only}/0?prefix=gaps15tls")
    assert f"redis://:***@127.0.0.1:{tls_only}/0" in message and "s3cret" not in message, message
    assert "rediss://" in message and "TLS" in message, message
