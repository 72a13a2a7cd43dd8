"""``layerflow``: run, resume and look into process instances.

Exit codes: 0 completed (or a command that succeeded), 3 waiting, 1 error, 2 bad input
(an unreadable file, a process that does not validate, an unknown instance).
``--json`` prints exactly one JSON document on stdout (DESIGN.md "Interfaces");
progress and prompts go to stderr. A person is asked at the terminal only when stdin is
a terminal and no ``--answers``/``--answer``/``--yes`` was given; otherwise an
unanswered step leaves the instance waiting (exit 3). litellm is imported only by a
model call.
"""

from __future__ import annotations

import json
import os
import select
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, NoReturn

import click

from context_layers import Layer, LayeredContext, thaw
from context_layers.errors import ContextKeyError, ContextWriteDenied, LayerflowError

from .confirm import TerminalPrompt, stdin_is_terminal
from .process import load_process
from .runtime import Engine, Instance
from .store import default_store_url, open_store

EXIT_OK, EXIT_ERROR, EXIT_BAD_INPUT, EXIT_WAITING = 0, 1, 2, 3

EXAMPLES = Path(__file__).resolve().parent.parent / "bpmn_examples"
LOAN_SCENARIOS: dict[str, dict[str, Any]] = {
    # the seed walk-through: high risk, 120,000 -> the reviews conflict -> dual approval
    "conflict": {"amount": 120000, "applicant_id": "APP001", "purpose": "business loan", "industry": "gambling"},
    "full": {"amount": 120000, "applicant_id": "APP002", "purpose": "warehouse expansion", "industry": "logistics"},
    "fast": {"amount": 20000, "applicant_id": "APP003", "purpose": "equipment", "industry": "bakery"},
}


# ----------------------------------------------------------------------------- output

class _Out:
    def __init__(self, as_json: bool) -> None:
        self.as_json = as_json
        self.tty = sys.stdout.isatty() and not as_json
        self._console: Any = None

    @property
    def console(self) -> Any:
        if self._console is None:
            from rich.console import Console

            self._console = Console(stderr=False)
        return self._console

    def info(self, text: str) -> None:
        """A progress line: stderr, so stdout stays the result."""
        click.echo(text, err=True)

    def doc(self, document: Any) -> None:
        click.echo(json.dumps(document, ensure_ascii=False, indent=None if not sys.stdout.isatty() else 2, default=str))


def _fail(message: str, code: int = EXIT_BAD_INPUT, *, as_json: bool = False, kind: str = "bad_input") -> NoReturn:
    if as_json:
        click.echo(json.dumps({"status": "error", "error": {"kind": kind, "message": message, "task_id": None}}))
    else:
        click.echo(f"layerflow: {message}", err=True)
    sys.exit(code)


def _exit_code(instance: Instance) -> int:
    if instance.status == "completed":
        return EXIT_OK
    if instance.status == "waiting":
        return EXIT_WAITING
    return EXIT_ERROR


def _progress(out: _Out) -> Callable[[Instance, str, LayeredContext], None]:
    def show(instance: Instance, task_id: str, ctx: LayeredContext) -> None:
        tokens = ctx.token_report()
        layers = " ".join(f"{k}={v}" for k, v in tokens.items() if k != "total")
        where = "" if ctx.name == "main" else f" [{ctx.name}]"
        if out.tty:
            out.console.print(f"[green]✓[/] [bold]{task_id}[/]{where}  [dim]{layers}[/]  total [cyan]{tokens['total']}[/]",
                              highlight=False)
        else:
            out.info(f"activity {task_id}{where} completed; tokens {layers} total={tokens['total']}")
    return show


def _summary(out: _Out, instance: Instance) -> None:
    doc = instance.to_document()
    if out.as_json:
        out.doc(doc)
        return
    lines = [f"instance {instance.id} ({instance.process_id}): {instance.status}"]
    if instance.error:
        lines.append(f"  error [{instance.error['kind']}] at {instance.error.get('task_id')}: {instance.error['message']}")
    for c in doc["conflicts"]:
        res = c.get("resolution")
        how = f"-> {json.dumps(res['value'])} by {res['resolver']} ({res['reason']})" if res else "-> unresolved"
        lines.append(f"  conflict {c['gateway_id']}/{c['key']}: {json.dumps(c['values'], ensure_ascii=False)} {how}")
    for c in doc["compressions"]:
        lines.append(f"  compression at {c.get('activity_id')}: {c.get('tokens_before')} -> {c.get('tokens_after')} tokens "
                     f"({', '.join(c.get('triggers') or [])})")
    for w in doc["waiting_for"]:
        if w["kind"] == "confirmation":
            entry = next((c for c in instance.confirmations if c["id"] == w["id"]), {})
            values = " | ".join(json.dumps(o.get("value"), ensure_ascii=False) for o in entry.get("options", []))
            how = f"--answer {w['id']}=VALUE` (VALUE: {values})"
            if w.get("escalated"):
                how += " [escalated: no answer before the deadline]"
        elif w["kind"] == "user_task":
            how = f"--answer {w['task_id']}='{{...}}'` (a JSON object)"
        else:
            how = "` once the event has happened"
        lines.append(f"  waiting for {w['kind']} {w['id']} at {w['task_id']}: `layerflow resume {instance.id} {how}")
    tokens = doc["tokens"]
    lines.append("  tokens " + " ".join(f"{k}={v}" for k, v in tokens.items()))
    if out.tty:
        from rich.panel import Panel

        style = {"completed": "green", "waiting": "yellow", "error": "red"}.get(instance.status, "white")
        out.console.print(Panel("\n".join(lines[1:]) or "-", title=lines[0], border_style=style), highlight=False)
    else:
        click.echo("\n".join(lines))


# ----------------------------------------------------------------------------- inputs

def _read_mapping(path: str | None, what: str, as_json: bool) -> dict[str, Any]:
    if path is None:
        return {}
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as err:
        _fail(f"cannot read {what} file {path}: {err.strerror}", as_json=as_json)
    try:
        if path.endswith((".yaml", ".yml")):
            import yaml

            data = yaml.safe_load(text)
        else:
            data = json.loads(text)
    except Exception as err:  # noqa: BLE001 - any parse error is bad input
        _fail(f"{what} file {path} is not valid {'YAML' if path.endswith(('.yaml', '.yml')) else 'JSON'}: {err}",
              as_json=as_json)
    if data is None:
        return {}
    if not isinstance(data, dict):
        _fail(f"{what} file {path} must hold an object, got {type(data).__name__}", as_json=as_json)
    return data


def _parse_value(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return text


def _answers(answers_file: str | None, answer: tuple[str, ...], as_json: bool) -> dict[str, Any]:
    doc = _read_mapping(answers_file, "answers", as_json)
    for key in doc:
        if key not in ("user_tasks", "confirmations"):
            _fail(f"answers file {answers_file}: unknown section {key!r}; use user_tasks and confirmations",
                  as_json=as_json)
    out = {"user_tasks": dict(doc.get("user_tasks") or {}), "confirmations": dict(doc.get("confirmations") or {})}
    for item in answer:
        key, sep, value = item.partition("=")
        if not sep or not key:
            _fail(f"--answer {item!r}: write KEY=VALUE (KEY: a confirmation id, GATEWAY/KEY, *, or a user task id)",
                  as_json=as_json)
        parsed = _parse_value(value)
        out["confirmations"][key] = parsed
        if isinstance(parsed, dict):
            out["user_tasks"][key] = parsed
    return out


def _suggested(item: dict[str, Any]) -> Any:
    """``--yes``: the policy's (or model's) suggestion, else the configured default."""
    if item["kind"] != "confirmation":
        return None
    if item.get("suggested") is not None:
        return item["suggested"]
    return item.get("default")


def _asker(out: _Out, yes: bool, answered: bool) -> Callable[[dict[str, Any]], Any] | None:
    if yes:
        return _suggested
    if not answered and stdin_is_terminal():
        return TerminalPrompt()  # numbered options, the deadline counting down (engine.confirm)
    return None


def _engine(store: str | None, model: str | None, out: _Out, as_json: bool) -> Engine:
    url = store or default_store_url()
    try:
        st = open_store(url)
    except LayerflowError as err:
        _fail(str(err), as_json=as_json)
    return Engine(st, model=model, progress=_progress(out))


# ----------------------------------------------------------------------------- commands

_store_option = click.option("--store", "store", default=None, metavar="URL",
                             help="memory://, sqlite:///FILE (default: $LAYERFLOW_STORE, else the user data folder)")
_json_option = click.option("--json", "as_json", is_flag=True, help="print one JSON document and nothing else on stdout")
_answers_option = click.option("--answers", "answers_file", default=None, metavar="FILE",
                               help='JSON {"user_tasks": {TASK: {...}}, "confirmations": {ID: ANSWER}}')
_answer_option = click.option("--answer", "answer", multiple=True, metavar="KEY=VALUE",
                              help="answer one confirmation (ID, GATEWAY/KEY or *) or user task (a JSON object)")
_yes_option = click.option("--yes", "yes", is_flag=True, help="take the policy's suggestion for every confirmation")
_model_option = click.option("--model", "model", default=None, metavar="NAME",
                             help="model for activities with llm config (litellm name); none: offline handlers")


@click.group()
@click.version_option(package_name="layerflow")
def main() -> None:
    """layerflow: BPMN processes with a governed, layered context per activity."""


def _run_process(bpmn: str, config: str | None, process_id: str | None, data: dict[str, Any], answers_file: str | None,
                 answer: tuple[str, ...], yes: bool, store: str | None, model: str | None, as_json: bool) -> None:
    out = _Out(as_json)
    answers = _answers(answers_file, answer, as_json)
    try:
        process = load_process(bpmn, process_id, config=config)
    except LayerflowError as err:
        _fail(str(err), as_json=as_json, kind=err.kind)
    engine = _engine(store, model, out, as_json)
    try:
        instance = engine.start(process, data)
    except (ContextWriteDenied, LayerflowError) as err:
        _fail(f"initial data: {err}", as_json=as_json, kind=getattr(err, "kind", "bad_input"))
    if not as_json:
        out.info(f"instance {instance.id} of {process.id} started (store {_store_name(store)})")
    instance = engine.run(instance, answers=answers, ask=_asker(out, yes, bool(answers_file or answer)))
    _summary(out, instance)
    sys.exit(_exit_code(instance))


def _store_name(store: str | None) -> str:
    return store or default_store_url()


@main.command()
@click.argument("bpmn", type=click.Path(dir_okay=False))
@click.option("--config", default=None, metavar="FILE", help="config file (default: PROCESS.layerflow.yaml beside it)")
@click.option("--process", "process_id", default=None, help="the bpmn:process id, when the file has several")
@click.option("--data", "data_file", default=None, metavar="FILE", help="initial data (JSON or YAML object) -> PROCESS")
@_answers_option
@_answer_option
@_yes_option
@_store_option
@_model_option
@_json_option
def run(bpmn: str, config: str | None, process_id: str | None, data_file: str | None, answers_file: str | None,
        answer: tuple[str, ...], yes: bool, store: str | None, model: str | None, as_json: bool) -> None:
    """Start an instance of BPMN and run it until it completes, waits or fails."""
    _run_process(bpmn, config, process_id, _read_mapping(data_file, "data", as_json), answers_file, answer, yes,
                 store, model, as_json)


@main.group()
def demo() -> None:
    """Runnable demos shipped with layerflow."""


@demo.command("loan")
@click.option("--scenario", type=click.Choice(sorted(LOAN_SCENARIOS)), default="conflict", show_default=True,
              help="conflict: high risk, the reviews disagree; full: medium risk, full review; fast: fast track")
@click.option("--data", "data_file", default=None, metavar="FILE", help="application data instead of the scenario's")
@_answers_option
@_answer_option
@_yes_option
@_store_option
@_model_option
@_json_option
def demo_loan(scenario: str, data_file: str | None, answers_file: str | None, answer: tuple[str, ...], yes: bool,
              store: str | None, model: str | None, as_json: bool) -> None:
    """The loan-approval walk-through (bpmn_examples/loan_approval.bpmn)."""
    bpmn = EXAMPLES / "loan_approval.bpmn"
    if not bpmn.is_file():
        _fail(f"the demo process {bpmn} is not installed; run from a source checkout (pip install -e .)",
              as_json=as_json)
    data = _read_mapping(data_file, "data", as_json) if data_file else dict(LOAN_SCENARIOS[scenario])
    _run_process(str(bpmn), None, None, data, answers_file, answer, yes, store, model, as_json)


def _load(engine: Engine, instance_id: str, as_json: bool) -> Instance:
    try:
        return engine.load(instance_id)
    except ContextKeyError as err:
        _fail(str(err), as_json=as_json, kind="not_found")
    except LayerflowError as err:
        _fail(str(err), EXIT_ERROR, as_json=as_json, kind=err.kind)


@main.command()
@click.argument("instance_id")
@_answers_option
@_answer_option
@_yes_option
@click.option("--set", "sets", multiple=True, metavar="KEY=VALUE",
              help="write a corrected value (JSON, else text) into the failed activity's context before retrying")
@_store_option
@_model_option
@_json_option
def resume(instance_id: str, answers_file: str | None, answer: tuple[str, ...], yes: bool, sets: tuple[str, ...],
           store: str | None, model: str | None, as_json: bool) -> None:
    """Continue a waiting instance, or retry the failed activity of one in error."""
    out = _Out(as_json)
    answers = _answers(answers_file, answer, as_json)
    engine = _engine(store, model, out, as_json)
    instance = _load(engine, instance_id, as_json)
    if instance.status == "completed":
        _summary(out, instance)
        sys.exit(EXIT_OK)
    if sets:
        values = {}
        for item in sets:
            key, sep, value = item.partition("=")
            if not sep or not key:
                _fail(f"--set {item!r}: write KEY=VALUE", as_json=as_json)
            values[key] = _parse_value(value)
        try:
            engine.inject(instance, values, actor="operator")
        except LayerflowError as err:
            _fail(f"--set: {err}", as_json=as_json, kind=err.kind)
    for key, value in answers["confirmations"].items():
        if any(c["id"] == key and not c.get("answered") for c in instance.confirmations):
            try:
                instance = engine.answer_confirmation(instance, key, value, run=False)
            except LayerflowError as err:
                _fail(str(err), as_json=as_json, kind=err.kind)
    instance = engine.resume(instance, answers=answers, ask=_asker(out, yes, bool(answers_file or answer)))
    _summary(out, instance)
    sys.exit(_exit_code(instance))


@main.command("list")
@_store_option
@_json_option
def list_instances(store: str | None, as_json: bool) -> None:
    """Instances in the store, newest first."""
    rows = open_store(store or default_store_url()).list()
    if as_json:
        _Out(True).doc(rows)
        return
    for r in rows:
        click.echo(f"{r['id']}  {r['process_id']}  {r['status']}  v{r['version']}  "
                   f"{time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(r['updated'] or 0))}")


def _context(instance: Instance, name: str | None, as_json: bool) -> LayeredContext:
    name = name or "main"
    if name not in instance.contexts:
        _fail(f"instance {instance.id} has no context {name!r}; contexts: {', '.join(instance.contexts)}",
              as_json=as_json)
    return instance.contexts[name]


def _short(value: Any, width: int = 60) -> str:
    text = json.dumps(thaw(value), ensure_ascii=False, default=str)
    return text if len(text) <= width else text[: width - 1] + "…"


@main.command()
@click.argument("instance_id")
@click.option("--context", "context_name", default=None, help="a branch context (default: main)")
@_store_option
@_json_option
def inspect(instance_id: str, context_name: str | None, store: str | None, as_json: bool) -> None:
    """The layers of an instance's context: keys, tokens, attention."""
    out = _Out(as_json)
    engine = Engine(open_store(store or default_store_url()))
    instance = _load(engine, instance_id, as_json)
    ctx = _context(instance, context_name, as_json)
    attention = _attention(ctx)
    if as_json:
        doc = instance.to_document()
        doc["context"] = ctx.name
        doc["layers"] = ctx.as_dict()
        doc["tokens"] = ctx.token_report()
        doc["attention"] = attention
        out.doc(doc)
        return
    rows = []
    for layer in Layer:
        view = ctx.layer(layer)
        for key in view:
            rows.append((str(layer), key, ctx.key_tokens(layer, key), _short(view[key]),
                         "preserved" if key in ctx.preserved else ""))
    header = f"instance {instance.id} ({instance.process_id}) {instance.status}, context {ctx.name}"
    tokens = ctx.token_report()
    if out.tty:
        from rich.table import Table

        table = Table(title=header)
        for col in ("layer", "key", "tokens", "value", ""):
            table.add_column(col)
        for r in rows:
            table.add_row(r[0], r[1], str(r[2]), r[3], r[4])
        out.console.print(table)
        out.console.print("tokens " + " ".join(f"{k}={v}" for k, v in tokens.items()))
        if attention:
            out.console.print("attention " + " ".join(f"{k}={v:.2f}" for k, v in attention.items()))
    else:
        click.echo(header)
        for r in rows:
            click.echo(f"{r[0]}\t{r[1]}\t{r[2]}\t{r[3]}\t{r[4]}".rstrip())
        click.echo("tokens " + " ".join(f"{k}={v}" for k, v in tokens.items()))
        if attention:
            click.echo("attention " + " ".join(f"{k}={v:.2f}" for k, v in attention.items()))


def _attention(ctx: LayeredContext) -> dict[str, float] | None:
    try:
        from context_layers.attention import AttentionScore
    except ImportError:
        return None
    try:
        return dict(AttentionScore.compute(ctx).to_dict())
    except Exception:  # noqa: BLE001 - inspection must not fail on a scoring problem
        return None


@main.command()
@click.argument("instance_id")
@click.option("--context", "context_name", default=None, help="only this context (default: all, by time)")
@click.option("--kind", default=None, help="event kind or note (write, denied, complete, split, join, conflict, ...)")
@click.option("--activity", default=None, help="events of this activity (BPMN id)")
@click.option("--key", default=None, help="events that change this key")
@click.option("--branch", default=None, help="events of this branch id")
@click.option("--since", type=int, default=None, help="from this sequence number")
@_store_option
@_json_option
def tape(instance_id: str, context_name: str | None, kind: str | None, activity: str | None, key: str | None,
         branch: str | None, since: int | None, store: str | None, as_json: bool) -> None:
    """The events of an instance's tape(s), filtered."""
    engine = Engine(open_store(store or default_store_url()))
    instance = _load(engine, instance_id, as_json)
    names = [context_name] if context_name else list(instance.contexts)
    events = []
    for name in names:
        ctx = _context(instance, name, as_json)
        for e in ctx.tape.filter(kind=kind, activity=activity, branch=branch, key=key):
            if since is None or e.seq >= since:
                events.append((e.time, name, e))
    events.sort(key=lambda t: (t[0], t[2].seq))
    if as_json:
        _Out(True).doc([{"context": name, **e.to_dict()} for _, name, e in events])
        return
    for _, name, e in events:
        note = e.data.get("note") if e.data else None
        what = f"{e.kind}{':' + note if note else ''}"
        changes = ", ".join(f"L{c[0]}.{c[1]}" for c in e.changes[:6]) + (" …" if len(e.changes) > 6 else "")
        click.echo(f"{name}#{e.seq}\t{what}\t{e.actor}\t{e.activity or ''}\t{changes}".rstrip())


@main.command()
@click.argument("instance_id")
@click.option("--until", "until", type=int, required=True, help="the sequence number to stop at (inclusive)")
@click.option("--context", "context_name", default=None, help="a branch context (default: main)")
@_store_option
@_json_option
def replay(instance_id: str, until: int, context_name: str | None, store: str | None, as_json: bool) -> None:
    """The context as it was at a sequence number of its tape, rebuilt from the tape."""
    engine = Engine(open_store(store or default_store_url()))
    instance = _load(engine, instance_id, as_json)
    ctx = _context(instance, context_name, as_json)
    rebuilt = LayeredContext.replay(ctx.tape, until=until, name=ctx.name)
    layers = rebuilt.as_dict()
    doc = {"instance_id": instance.id, "context": ctx.name, "until": until, "layers": layers,
           "tokens": rebuilt.token_report()}
    if as_json:
        _Out(True).doc(doc)
        return
    click.echo(f"context {ctx.name} of {instance.id} at #{until}")
    for layer, values in layers.items():
        for k, v in values.items():
            click.echo(f"{layer}\t{k}\t{_short(v)}")


@main.command()
@click.argument("bpmn", nargs=-1, required=True, type=click.Path(dir_okay=False))
@click.option("--config", default=None, metavar="FILE", help="config file (default: PROCESS.layerflow.yaml beside it)")
@click.option("--process", "process_id", default=None, help="the bpmn:process id to check")
@_json_option
def validate(bpmn: tuple[str, ...], config: str | None, process_id: str | None, as_json: bool) -> None:
    """Report every problem of a process and its config at once (exit 2 when there is one)."""
    from . import spiff
    from .validate import format_report, validate_process

    report = validate_process(list(bpmn), config, process_id, parser_factory=spiff.LayerflowBpmnParser)
    if as_json:
        _Out(True).doc(report.to_dict())
    else:
        click.echo(format_report(report))
    sys.exit(EXIT_OK if report.ok else EXIT_BAD_INPUT)


from .cli_serve import serve  # noqa: E402  (`layerflow serve`: the REST API)

main.add_command(serve)

from . import cli_worker  # noqa: E402,F401  (`layerflow worker`, `layerflow submit`: Redis workers)

if __name__ == "__main__":  # pragma: no cover
    main(prog_name=os.path.basename(sys.argv[0]) or "layerflow")
