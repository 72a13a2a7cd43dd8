"""``layerflow worker`` and ``layerflow submit``, registered on the ``layerflow`` group.

Importing this module adds the two commands to ``engine.cli.main`` (``engine/cli.py``
imports it at its end).
"""

from __future__ import annotations

import dataclasses
import json
import logging

import click

from context_layers.errors import LayerflowError
from context_layers.stores import open_store

from .cli import EXIT_ERROR, _fail, _json_option, _model_option, _read_mapping, main
from .store import default_store_url
from .worker import DEFAULT_GROUP, DEFAULT_STREAM, queue_client, run_worker, submit

_store = click.option("--store", "store", default=None, metavar="URL",
                      help="memory://NAME, sqlite:///FILE, redis://HOST:PORT/DB[?prefix=P] "
                           "(default: $LAYERFLOW_STORE, else the user data folder)")
_queue = click.option("--queue", "queue", default=None, metavar="URL",
                      help="the Redis holding the stream (default: the store when it is Redis, else $LAYERFLOW_QUEUE)")
_stream = click.option("--stream", default=DEFAULT_STREAM, show_default=True, help="Redis stream of ready instances")
_group = click.option("--group", default=DEFAULT_GROUP, show_default=True, help="consumer group of the workers")


@main.command("worker")
@_store
@_queue
@_stream
@_group
@click.option("--consumer", default=None, help="this worker's name in the group (default: host-pid-random)")
@click.option("--idle-ms", type=int, default=30_000, show_default=True,
              help="an entry unacknowledged this long is taken over from its (dead) worker")
@click.option("--stop-after", type=int, default=None, help="exit after this many entries")
@_model_option
@_json_option
def worker(store: str | None, queue: str | None, stream: str, group: str, consumer: str | None, idle_ms: int,
           stop_after: int | None, model: str | None, as_json: bool) -> None:
    """Run instances from the stream until stopped (SIGTERM / Ctrl-C finish the current one)."""
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(message)s")
    logging.getLogger("layerflow.worker").setLevel(logging.INFO)
    try:
        stats = run_worker(store or default_store_url(), queue_url=queue, stream=stream, group=group,
                           consumer=consumer, idle_ms=idle_ms, stop_after=stop_after, model=model)
    except LayerflowError as err:
        _fail(str(err), EXIT_ERROR, as_json=as_json, kind=err.kind)
    doc = dataclasses.asdict(stats)
    click.echo(json.dumps(doc) if as_json else
               f"worker {stats.consumer}: {stats.acked} done, {stats.ran} run, {stats.reclaimed} taken over, "
               f"{stats.conflicts} conflicts")


@main.command("submit")
@click.argument("bpmn", type=click.Path(dir_okay=False))
@click.option("--config", default=None, metavar="FILE", help="config file (default: PROCESS.layerflow.yaml beside it)")
@click.option("--process", "process_id", default=None, help="the bpmn:process id, when the file has several")
@click.option("--data", "data_file", default=None, metavar="FILE", help="initial data (JSON or YAML object)")
@click.option("--count", type=int, default=1, show_default=True, help="submit this many instances")
@_store
@_queue
@_stream
@_group
@_json_option
def submit_command(bpmn: str, config: str | None, process_id: str | None, data_file: str | None, count: int,
                   store: str | None, queue: str | None, stream: str, group: str, as_json: bool) -> None:
    """Create instances of a process and put them on the stream for the workers."""
    data = _read_mapping(data_file, "data", as_json)
    try:
        target = open_store(store or default_store_url())
        client = queue_client(target.url, queue)
        ids = [submit(target, bpmn, data, config=config, process_id=process_id, stream=stream, group=group,
                      client=client) for _ in range(count)]
    except LayerflowError as err:
        _fail(str(err), as_json=as_json, kind=err.kind)
    click.echo(json.dumps({"instance_ids": ids, "stream": stream}) if as_json else "\n".join(ids))
