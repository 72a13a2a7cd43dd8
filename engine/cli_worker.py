"""``layerflow worker`` (with ``worker dead`` and ``worker requeue``) and ``layerflow submit``,
registered on the ``layerflow`` group.

Importing this module adds the commands to ``engine.cli.main`` (``engine/cli.py`` imports
it at its end). ``layerflow worker`` with no subcommand runs a worker, as it always did.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from collections.abc import Callable
from typing import Any

import click
from click.core import ParameterSource

from context_layers.errors import LayerflowError
from context_layers.stores import open_store

from .cli import (EXIT_BAD_INPUT, EXIT_ERROR, _fail, _json_option, _model_option, _queue_option, _read_mapping,
                  _stream_option, check_start_data, json_stdout, main, start_data_details)
from .process import load_process
from .store import default_store_url
from .worker import (DEFAULT_GROUP, DEFAULT_MAX_DELIVERIES, dead_letters, dead_stream_of,
                     queue_client, queue_error, requeue, run_worker, submit)

_store = click.option("--store", "store", default=None, metavar="URL",
                      help="memory://NAME, sqlite:///FILE, redis://HOST:PORT/DB[?prefix=P] "
                           "(default: $LAYERFLOW_STORE, else the user data folder)")
_queue = _queue_option
_stream = _stream_option
_group = click.option("--group", default=DEFAULT_GROUP, show_default=True, help="consumer group of the workers")
_dead_stream = click.option("--dead-stream", default=None, metavar="STREAM",
                            help="Redis stream of dead letters (default: the --stream name + ':dead')")


def _shared_store(store: str | None, command: str, as_json: bool) -> str:
    """The store URL for ``submit`` / ``worker``: one the other side can see. An unnamed
    ``memory://`` is a fresh store of this process alone: a submitted instance would vanish
    when ``submit`` exits and a worker would find nothing, so it is refused. ``memory://NAME``
    is left alone: code in one process (tests, threads) shares it on purpose."""
    url = store or default_store_url()
    scheme, _, name = url.partition("://")
    if scheme.lower() == "memory":
        if not name.strip("/"):
            _fail(f"{command}: store {url!r} lives only in this process, so what {command} does there is lost when "
                  "it exits and no other process sees it; use --store sqlite:///FILE (workers on this machine) or "
                  "redis://HOST:PORT/DB (workers anywhere)", as_json=as_json, kind="invalid_config")
    return url


@main.group("worker", invoke_without_command=True)
@_store
@_queue
@_stream
@_group
@click.option("--consumer", default=None, help="this worker's name in the group (default: host-pid-random)")
@click.option("--idle-ms", type=int, default=30_000, show_default=True,
              help="an entry unacknowledged this long is taken over from its (dead) worker")
@click.option("--stop-after", type=int, default=None, help="exit after this many entries (done or dead-lettered)")
@click.option("--max-deliveries", type=click.IntRange(min=1), default=DEFAULT_MAX_DELIVERIES, show_default=True,
              help="failed deliveries of an entry before it moves to the dead letters")
@_dead_stream
@click.option("--timer-interval", type=click.FloatRange(min=0), default=5.0, show_default=True,
              help="seconds between scans for due timers (one worker scans; 0: this worker never does)")
@click.option("--requeue", is_flag=True, default=False,
              help="first put every 'running' instance of the store on the stream: after the queue's Redis came "
                   "back empty (restarted without persistence, flushed) and lost their entries")
@_model_option
@_json_option
@click.pass_context
def worker(ctx: click.Context, store: str | None, queue: str | None, stream: str, group: str, consumer: str | None,
           idle_ms: int, stop_after: int | None, max_deliveries: int, dead_stream: str | None, timer_interval: float,
           requeue: bool, model: str | None, as_json: bool) -> None:
    """Run instances from the stream until stopped (SIGTERM / Ctrl-C finish the current one; a second stops at once).

    `layerflow worker dead` lists the entries that failed --max-deliveries times;
    `layerflow worker requeue ID` puts one back once its cause is fixed.
    """
    if ctx.invoked_subcommand is not None:
        # the subcommand has its own options; ignoring these would act on the default stream
        given = [o.opts[0] for o in ctx.command.params
                 if o.name and ctx.get_parameter_source(o.name) not in (None, ParameterSource.DEFAULT)]
        if given:
            _fail(f"put {', '.join(given)} after the subcommand: layerflow worker {ctx.invoked_subcommand} "
                  f"{given[0]} ...", as_json=as_json)
        return
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(message)s")
    logging.getLogger("layerflow.worker").setLevel(logging.INFO)
    try:
        target = open_store(_shared_store(store, "worker", as_json))
        client = queue_client(target.url, queue)
        _answers(client)
    except LayerflowError as err:  # the --store / --queue named cannot be used: bad input, as for submit
        _fail(str(err), as_json=as_json, kind=err.kind)
    try:
        stats = run_worker(target, client=client, stream=stream, group=group,
                           consumer=consumer, idle_ms=idle_ms, stop_after=stop_after, model=model,
                           max_deliveries=max_deliveries, dead_stream=dead_stream, timer_interval=timer_interval,
                           requeue=requeue)
    except LayerflowError as err:
        _fail(str(err), EXIT_ERROR, as_json=as_json, kind=err.kind)
    doc = dataclasses.asdict(stats)
    click.echo(json.dumps(doc) if as_json else
               f"worker {stats.consumer}: {stats.acked} done, {stats.ran} run, {stats.reclaimed} taken over, "
               f"{stats.conflicts} conflicts, {stats.dead} dead-lettered", file=json_stdout())


def _answers(client: Any) -> None:
    """The queue's Redis answers: one that does not is named at start (exit 2, as for the store and
    for ``submit``); once running, a worker waits out an outage instead."""
    import redis

    try:
        client.ping()
    except redis.RedisError as err:
        raise queue_error(client, err) from err


def _on_queue(store: str | None, queue: str | None, as_json: bool, action: Callable[[Any], Any]) -> Any:
    """``action(client)`` on the queue's Redis; its errors end the command as the CLI's do."""
    import redis

    try:
        client = queue_client(store or default_store_url(), queue)
        try:
            return action(client)
        except redis.RedisError as err:
            raise queue_error(client, err) from err
        finally:
            client.close()
    except LayerflowError as err:
        code = EXIT_BAD_INPUT if err.kind == "not_found" else EXIT_ERROR
        _fail(str(err), code, as_json=as_json, kind=err.kind)


@worker.command("dead")
@_store
@_queue
@_stream
@_dead_stream
@_json_option
def worker_dead(store: str | None, queue: str | None, stream: str, dead_stream: str | None, as_json: bool) -> None:
    """List the dead letters: entries that failed --max-deliveries times, oldest first."""
    dead = dead_stream or dead_stream_of(stream)
    letters = _on_queue(store, queue, as_json, lambda client: dead_letters(client, stream, dead_stream=dead))
    if as_json:
        click.echo(json.dumps({"stream": dead, "dead_letters": [dataclasses.asdict(d) for d in letters]}), file=json_stdout())
        return
    for d in letters:
        error = f"{d.error_type}: {d.error}" if d.error_type else d.error
        wake = f"  wake {d.wake}" if d.wake else ""  # a due timer's entry: requeued, it fires the timer
        old = ("\n    (written by a layerflow from before dead letters kept their entry's wake and store: requeued, "
               "it is an entry of any store's workers, and a due timer of its instance fires all the same)"
               if d.format < 2 else "")
        click.echo(f"{d.id}  instance {d.instance_id}  entry {d.entry_id}  {d.deliveries} deliveries  {d.time}  "
                   f"{d.consumer}{wake}\n    {error}{old}")
    click.echo(f"{len(letters)} dead letter(s) in {dead}" +
               (f"; once the cause is fixed: layerflow worker requeue ID --stream {stream}" if letters else ""),
               err=True)


@worker.command("requeue")
@click.argument("dead_id", metavar="ID")
@_store
@_queue
@_stream
@_dead_stream
@_json_option
def worker_requeue(dead_id: str, store: str | None, queue: str | None, stream: str, dead_stream: str | None,
                   as_json: bool) -> None:
    """Put dead letter ID (from `layerflow worker dead`) back on the stream, with a fresh delivery count."""
    dead = dead_stream or dead_stream_of(stream)
    entry_id = _on_queue(store, queue, as_json, lambda client: requeue(client, dead_id, stream, dead_stream=dead))
    click.echo(json.dumps({"requeued": dead_id, "entry_id": entry_id, "stream": stream}) if as_json else
               f"dead letter {dead_id} is back on {stream} as entry {entry_id}", file=json_stdout())


@main.command("submit")
@click.argument("bpmn", nargs=-1, required=True, type=click.Path(dir_okay=False))
@click.option("--config", default=None, metavar="FILE", help="config file (default: PROCESS.layerflow.yaml beside it)")
@click.option("--process", "process_id", default=None, help="the bpmn:process id, when the file has several")
@click.option("--data", "data_file", default=None, metavar="FILE", help="initial data: a JSON or YAML file, - (stdin) or an inline JSON object")
@click.option("--count", type=int, default=1, show_default=True, help="submit this many instances")
@_store
@_queue
@_stream
@_group
@_json_option
def submit_command(bpmn: tuple[str, ...], config: str | None, process_id: str | None, data_file: str | None, count: int,
                   store: str | None, queue: str | None, stream: str, group: str, as_json: bool) -> None:
    """Create instances of a process and put them on the stream for the workers (BPMN: the process's
    file, then the files of the processes it calls, as `layerflow run main.bpmn called.bpmn`)."""
    data = _read_mapping(data_file, "data", as_json)
    try:
        process = load_process(list(bpmn), process_id, config=config)
    except LayerflowError as err:
        _fail(str(err), as_json=as_json, kind=err.kind)
    check_start_data(process, data, data_file, as_json)  # before the store or the queue is opened
    try:
        target = open_store(_shared_store(store, "submit", as_json))
        client = queue_client(target.url, queue)
        ids = [submit(target, process, data, stream=stream, group=group, client=client) for _ in range(count)]
    except LayerflowError as err:
        refused = getattr(err, "process_id", None)  # start data a start form refused names its process
        _fail(str(err), as_json=as_json, kind=err.kind, details=start_data_details(err),
              process_id=refused if isinstance(refused, str) else None)
    click.echo(json.dumps({"instance_ids": ids, "stream": stream}) if as_json else "\n".join(ids), file=json_stdout())
