"""``layerflow serve``: the REST API (``engine.api``) with uvicorn (``engine.cli`` adds it to ``main``).

A server that binds anything but a loopback address must be given a token
(``--token`` or ``LAYERFLOW_API_TOKEN``): contexts and tapes hold business data. On
loopback without one, a random token is made for the run and printed on stderr, so
the API is never open, not even to other programs of the same machine.
"""

from __future__ import annotations

import errno
import ipaddress
import secrets
import socket
import sys
from pathlib import Path

import click


__all__ = ["serve", "is_loopback"]

EXIT_BAD_INPUT = 2  # as engine.cli: bad input


def is_loopback(host: str) -> bool:
    if host.lower() in ("localhost", "localhost.localdomain", "ip6-localhost"):
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False  # a host name: it may resolve to anything


def _default_catalog() -> str:
    here = Path("bpmn_examples")
    if here.is_dir():
        return str(here)
    return str(Path(__file__).resolve().parent.parent / "bpmn_examples")


@click.command("serve")
@click.option("--host", default="127.0.0.1", show_default=True, help="address to bind")
@click.option("--port", default=8765, show_default=True, type=click.IntRange(0, 65535))
@click.option("--catalog", default=None, metavar="DIR",
              help="the processes POST /api/instances may start (default: ./bpmn_examples)")
@click.option("--store", default=None, metavar="URL",
              help="memory://, sqlite:///FILE, redis://HOST:PORT/DB[?prefix=P] (default: $LAYERFLOW_STORE, else the user "
                   "data folder)")
@click.option("--token", default=None, envvar="LAYERFLOW_API_TOKEN", show_envvar=True,
              help="the bearer token clients must send")
@click.option("--model", default=None, metavar="NAME", help="model for activities with llm config")
@click.option("--max-body-bytes", default=None, envvar="LAYERFLOW_MAX_BODY_BYTES", show_envvar=True,
              type=click.IntRange(min=1), metavar="N",
              help="refuse (413) a request body larger than this  [default: 1048576 (1 MiB)]")
@click.option("--queue", default=None, metavar="URL",
              help="the workers' Redis, whose dead letters the instance rows name (default: the store when it is "
                   "Redis, else $LAYERFLOW_QUEUE)")
@click.option("--stream", default="layerflow:ready", show_default=True,
              help="the workers' Redis stream of ready instances (as `layerflow worker --stream`)")
@click.option("--log-level", default="info", show_default=True,
              type=click.Choice(["critical", "error", "warning", "info", "debug"]))
def serve(host: str, port: int, catalog: str | None, store: str | None, token: str | None, model: str | None,
          max_body_bytes: int | None, queue: str | None, stream: str, log_level: str) -> None:
    """Serve the REST API (OpenAPI docs at /docs)."""
    if not token and not is_loopback(host):
        click.echo(f"layerflow: refusing to serve on {host} without a token: contexts and tapes hold business "
                   "data; pass --token or set LAYERFLOW_API_TOKEN (or bind 127.0.0.1)", err=True)
        sys.exit(EXIT_BAD_INPUT)
    if not token:
        token = secrets.token_urlsafe(24)
        click.echo(f"layerflow: no --token given; this run's API token is {token}\n"
                   f"  send it as `Authorization: Bearer {token}`", err=True)
    catalog_dir = catalog or _default_catalog()
    if not Path(catalog_dir).is_dir():
        click.echo(f"layerflow: catalog directory {catalog_dir} does not exist; pass --catalog DIR", err=True)
        sys.exit(EXIT_BAD_INPUT)

    import uvicorn

    from context_layers.errors import LayerflowError

    from .api import create_app
    from .store import default_store_url

    store_url = store or default_store_url()
    try:
        app = create_app(store_url, catalog_dir, token, model=model, max_body_bytes=max_body_bytes, queue=queue,
                         stream=stream)
    except LayerflowError as err:
        click.echo(f"layerflow: {err}", err=True)
        sys.exit(EXIT_BAD_INPUT)
    from .governance import Catalog

    for problem in Catalog(catalog_dir).problems():
        click.echo(f"layerflow: warning: {problem}", err=True)
    # Bind before saying where: a port in use is bad input named here (uvicorn alone announced the
    # address, then exited 3, the code of "waiting"), and --port 0 announces the port it got.
    try:
        family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0][0]
        listener = socket.create_server((host, port), family=family)
    except socket.gaierror as err:
        click.echo(f"layerflow: --host {host} is no address of this machine ({err.strerror or err}); pass one, "
                   "e.g. --host 127.0.0.1", err=True)
        sys.exit(EXIT_BAD_INPUT)
    except OSError as err:
        reason = "is in use" if err.errno == errno.EADDRINUSE else f"cannot be bound ({err.strerror or err})"
        click.echo(f"layerflow: {_where(host, port)} {reason}; pass another --port (--port 0 takes a free one) "
                   "or stop what listens there", err=True)
        sys.exit(EXIT_BAD_INPUT)
    bound = int(listener.getsockname()[1])
    # the store named as `run` names it: `layerflow inspect ID --store ...` finds what the server ran
    from .cli import _shown_url

    click.echo(f"layerflow: serving {catalog_dir} on http://{_where(host, bound)} (docs at /docs; store "
               f"{_shown_url(store_url)})", err=True)
    server = uvicorn.Server(uvicorn.Config(app, host=host, port=bound, log_level=log_level))
    server.run(sockets=[listener])
    if not server.started:  # uvicorn logged why
        sys.exit(1)


def _where(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
