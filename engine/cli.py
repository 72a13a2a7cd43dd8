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

import contextlib
import importlib
import json
import os
import shlex
import socket
import sys
import time
import uuid
from urllib.parse import urlsplit
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from datetime import datetime, timezone
from typing import Any, NoReturn, get_args

import click

from context_layers import DELETED, Layer, LayeredContext, json_equal, thaw
from context_layers.canonical import MAX_DEPTH
from context_layers.tape import EventKind
from context_layers.errors import ActivityError, ContextKeyError, ContextWriteDenied, LayerflowError, VersionConflict
from context_layers.stores import ConfirmationAnswered, InstanceNotFound, StoreError
from gateways.policy import ESCALATE

from .confirm import TerminalPrompt, stdin_is_terminal, terminal_text
from .governance import InvalidAnswer, event_document, moved_keys, tape_miss, tape_rows
from .leases import LEASE_TTL, held_by, holding
from .process import load_process
from .runtime import (AnswerWriteDenied, Engine, Instance, Status, Unattended, check_start,
                      check_completed_answer_keys, refuse_if_cancelled, refuse_late_answers, _utc)
from .store import default_store_url, open_store, record_head
from .worker import DEFAULT_STREAM

EXIT_OK, EXIT_ERROR, EXIT_BAD_INPUT, EXIT_WAITING = 0, 1, 2, 3

EXAMPLES = Path(__file__).resolve().parent.parent / "bpmn_examples"
LOAN_SCENARIOS: dict[str, dict[str, Any]] = {
    # the seed walk-through: high risk, 120,000 -> the reviews conflict -> dual approval
    "conflict": {"amount": 120000, "applicant_id": "APP001", "purpose": "business loan", "industry": "gambling"},
    "full": {"amount": 120000, "applicant_id": "APP002", "purpose": "warehouse expansion", "industry": "logistics"},
    "fast": {"amount": 20000, "applicant_id": "APP003", "purpose": "equipment", "industry": "bakery"},
}


# ----------------------------------------------------------------------------- output

def _stdout_is_terminal() -> bool:
    return sys.stdout.isatty()


class _Out:
    def __init__(self, as_json: bool) -> None:
        self.as_json = as_json
        self.tty = _stdout_is_terminal() and not as_json
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
        stdout = json_stdout() or sys.stdout
        click.echo(json.dumps(document, ensure_ascii=False, indent=None if not stdout.isatty() else 2, default=str),
                   file=stdout)


_JSON_STDOUT: list[Any] = []  # the real stdout of the running --json command (innermost last)


def json_stdout() -> Any:
    """Where a ``--json`` command writes its document (None outside one: click's default).

    While a ``--json`` command runs, ``sys.stdout`` is stderr: a BPMN script's ``print`` must
    not land before the one document scripts parse."""
    return _JSON_STDOUT[-1] if _JSON_STDOUT else None


_ABOUT: list[Instance] = []  # the instance the running command acts on (``_acting_on``), innermost last


class _Refused(BaseException):
    """Bad input refused after the command found its instance, under ``--json``: raised through the
    command, and through its ``Engine.all_or_nothing``, which puts the instance back as the request
    found it, to ``_Command``, which prints the instance as it is then (``_refusal_document``).
    A BaseException: no ``except Exception`` of the command's on the way takes it for its own."""

    def __init__(self, error: dict[str, Any], code: int, instance: Instance) -> None:
        super().__init__(error["message"])
        self.error, self.code, self.instance = error, code, instance


def _acting_on(instance: Instance) -> Instance:
    """Name ``instance`` as the one this command acts on: from here on, its ``--json`` document of a
    refusal (exit 2) shows it as it is, not an empty document with ``"status": "error"``."""
    _ABOUT.append(instance)
    return instance


def _refusal_document(instance: Instance, error: dict[str, Any]) -> dict[str, Any]:
    """The ``run --json`` document of ``instance`` as it is (its layers, waiting_for: nothing of the
    refused command applied), with the refusal as its ``error``. ``status`` stays ``"error"``, as the
    contract pairs it with an ``error`` (``"status"`` is the command's outcome for a script that reads
    it alone); the instance's real status is ``instance_status``, and an instance that failed before
    keeps its own error as ``instance_error``."""
    document = _instance_document(instance)
    document["status"] = "error"
    error = {**error, "instance_status": instance.status}
    if instance.error:
        error["instance_error"] = dict(instance.error)
    document["error"] = error
    return document


def _args_problem(err: Any) -> str:
    """A command's first bad argument (a pydantic ``ValidationError``), naming its field: ``label: String
    should have at most 500 characters``."""
    first = err.errors()[0]
    field = ".".join(str(p) for p in first["loc"])
    return f"{field}: {first['msg']}" if field else str(first["msg"])


def _fail(message: str, code: int = EXIT_BAD_INPUT, *, as_json: bool = False, kind: str = "bad_input",
          details: dict[str, Any] | None = None, process_id: str | None = None) -> NoReturn:
    if as_json:
        error = {"kind": kind, "message": message, "task_id": None, **(details or {})}
        if code == EXIT_BAD_INPUT and _ABOUT:
            raise _Refused(error, code, _ABOUT[-1])
        document = _error_document(error)
        for name in ("instance_id", "process_id"):
            if isinstance(error.get(name), str):
                document[name] = error[name]
        if process_id is not None:  # a start refused before any instance exists still names its process
            document["process_id"] = process_id
        click.echo(json.dumps(document, ensure_ascii=False, default=str), file=json_stdout())
    else:
        click.echo(f"layerflow: {message}", err=True)
    sys.exit(code)


def start_data_details(err: Exception) -> dict[str, Any] | None:
    """The error fields of start data that does not fit the start event's form: the event's id and
    the refused fields one by one, as a user task's refused answer lists them."""
    problems = getattr(err, "problems", None)
    if not problems:
        return None
    return {"task_id": getattr(err, "task_id", None), "problems": [{"field": f, "problem": p} for f, p in problems]}


def _named(instance: Instance) -> dict[str, Any]:
    """The error fields that name a loaded instance: the failure's document names it too."""
    return {"instance_id": instance.id, "process_id": instance.process_id}


def _error_document(error: dict[str, Any]) -> dict[str, Any]:
    """The `run --json` document for a failure before any instance exists: every field of
    the contract is there (empty), so scripts can read it like any other result."""
    layers = [str(layer) for layer in Layer]
    return {"instance_id": None, "process_id": None, "status": "error", "error": error,
            "layers": {name: {} for name in layers}, "tokens": {**{name: 0 for name in layers}, "total": 0},
            "conflicts": [], "compressions": [], "confirmations": [], "waiting_for": [], "tape_length": 0,
            "version": None}


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
        last = ctx.tape[-1] if len(ctx.tape) else None
        if last is not None and last.kind == "complete" and last.data.get("status") == "error_thrown":
            record = ctx.get(str(last.data.get("record_key")), None) or {}
            out.info(f"activity {task_id}{where} threw BPMN error {record.get('error_code')!r}"
                     + (f" ({record['error_message']})" if record.get("error_message") else "")
                     + f"; caught by {', '.join(record.get('caught_by') or [])}")
            return
        if out.tty:
            out.console.print(f"[green]✓[/] [bold]{task_id}[/]{where}  [dim]{layers}[/]  total [cyan]{tokens['total']}[/]",
                              highlight=False)
        else:
            out.info(f"activity {task_id}{where} completed; tokens {layers} total={tokens['total']}")
    return show


def _store_hint(store: str | None) -> str:
    """`` --store URL`` for the commands a summary suggests, when this command was given a store
    (without it they would look in the default store and not find the instance); a Redis
    password is not printed: the user writes it again."""
    if not store:
        return ""
    parts = urlsplit(store)
    if parts.password:
        return " --store URL"
    return f" --store {shlex.quote(store)}"


_FALLBACK_TEXT = {"expression": "its condition expressions decided", "default": "its default flow was taken",
                  "extractive": "the summary was made without it (extractive)", "rules": "the compress rules ran",
                  "human": "a person is asked, with no suggestion from the model",
                  "policy": "the join's policy decided", "strategy": "the join's merge strategy decided",
                  "None": "nothing decided yet"}


def _undone_text(undone: Any) -> str:
    """How a compression the instance lists was undone (``Instance.compression_records``)."""
    if not isinstance(undone, dict):
        return ""
    if undone.get("by") == "abort":
        return f"; undone: activity {undone.get('task_id')} failed after it"
    where = f" of {undone['context']}" if undone.get("context") else ""
    to = f" to {undone['snapshot_id']}" if undone.get("snapshot_id") else ""
    return f"; undone by {undone.get('by')}{to} (event {undone.get('seq')}{where})"


def _fallback_lines(lines: list[str], fallbacks: list[dict[str, Any]]) -> None:
    """One line per element and purpose where the configured model gave no usable answer."""
    grouped: dict[tuple[Any, Any], list[dict[str, Any]]] = {}
    for f in fallbacks:
        grouped.setdefault((f["element_id"], f["purpose"]), []).append(f)
    for (element, purpose), items in grouped.items():
        last = items[-1]
        times = f", {len(items)} times" if len(items) > 1 else ""
        error = f"; last error: {terminal_text(str(last['error'])[:200])}" if last.get("error") else ""
        lines.append(f"  model fallback at {element} ({purpose}{times}): "
                     f"{_FALLBACK_TEXT.get(str(last['fallback']), str(last['fallback']))}{error}")


def _instance_document(instance: Instance) -> dict[str, Any]:
    """The ``run --json`` document of ``instance``, with its ``version`` (the ``expected_version`` of a
    next change), as ``inspect --json``, ``rollback --json`` and REST's documents carry it."""
    return {**instance.to_document(), "version": instance.version}


def _fix_hint(instance: Instance, at: str) -> str | None:
    """How to go on from a failed activity (``at``: the ``--store`` the commands need), or None: for
    every kind a step fails with (a layer rule's refusal, a model's error, ...), as the worker's log
    says it; a join's conflict error says itself how to settle it (``--set`` there needs ``--context``)."""
    error = instance.error or {}
    if instance.status != "error" or error.get("kind") == "merge_conflict" or not error.get("task_id"):
        return None
    return (f"fix its cause, then `layerflow resume {instance.id}{at}` runs {error['task_id']} again "
            f"(`--set KEY=VALUE` writes a corrected value first; `layerflow tape {instance.id}{at} "
            f"--activity {error['task_id']}` shows what it did)")


def _summary(out: _Out, instance: Instance, store: str | None = None) -> None:
    doc = _instance_document(instance)
    if out.as_json:
        # what the command did not do that it was asked to (an answer it did not use, and why), as
        # REST's reply to a request that ran the instance carries them; stderr has them too
        out.doc({**doc, "notices": list(instance.notices)})
        return
    lines = [f"instance {instance.id} ({instance.process_id}): {instance.status}"]
    if store is not None and store.lower().startswith("memory://") and instance.status in ("waiting", "error"):
        lines.append(f"  store {store} lives only in this command: the instance is gone when it exits; run it "
                     "with --store sqlite:///FILE (or set LAYERFLOW_STORE) to continue it later")
    at = _store_hint(store)
    if instance.error and instance.status == "error":
        command = f"`layerflow resume {instance.id}"  # the commands the error names, with the store
        message = str(instance.error["message"]).replace(command, command + at)
        lines.append(f"  error [{instance.error['kind']}] at {instance.error.get('task_id')}: {message}")
        fix = _fix_hint(instance, at)
        if fix:
            lines.append(f"  {fix}")
    if instance.cancelled:
        lines.append(f"  cancelled by {instance.cancelled['by']} (was {instance.cancelled['status']}): "
                     f"{instance.cancelled['reason']}")
    for c in doc["conflicts"]:
        res = c.get("resolution")
        how = (f"-> {json.dumps(res['value'], ensure_ascii=False)} by {res['resolver']} ({terminal_text(res['reason'])})"
               if res else "-> unresolved")
        lines.append(f"  conflict {c['gateway_id']}/{c['key']}: {json.dumps(c['values'], ensure_ascii=False)} {how}")
    for c in doc["compressions"]:
        lines.append(f"  compression at {c.get('activity_id')}: {c.get('tokens_before')} -> {c.get('tokens_after')} tokens "
                     f"({', '.join(c.get('triggers') or [])})"
                     + _undone_text(c.get("undone")))
    _fallback_lines(lines, doc.get("model_fallbacks") or [])
    for m in doc.get("messages_out") or []:
        signal = " --signal" if m["kind"] == "signal" else ""
        payload = "" if m["payload"] is None else \
            f" --json-payload {shlex.quote(json.dumps(m['payload'], ensure_ascii=False))}"
        lines.append(f"  {m['kind']} {m['name']!r} thrown at {m['element_id']} left the instance (nothing in it waits "
                     f"for it): `layerflow send OTHER_ID{at} {shlex.quote(str(m['name']))}{signal}{payload}` delivers "
                     "it to an instance that does")
    for w in doc["waiting_for"]:
        which = _which_instance(w)
        if w["kind"] == "confirmation":
            # the open one: a loop back through a join asks again under the same id, with new options
            same = [c for c in instance.confirmations if c["id"] == w["id"]]
            entry = next((c for c in same if not c.get("answered")), same[-1] if same else {})
            values = _option_words(entry.get("options", []))
            how = f"--answer {shlex.quote(w['id'] + '=VALUE')}` (VALUE: {values})"  # a key may hold a space
            if w.get("escalated"):
                how += " [escalated: no answer before the deadline]"
        elif w["kind"] == "user_task" and which:  # this instance's answer; the BPMN id's answers them all
            how = (f"--answer {w['id']}='{{...}}'` (a JSON object; --answer {w['task_id']}='{{...}}' answers every "
                   "instance alike)")
        elif w["kind"] == "user_task":
            how = f"--answer {w['task_id']}='{{...}}'` (a JSON object)"
            form = w.get("form") or {}
            if form.get("fields"):
                from .forms import describe_fields

                how += f"; form: {describe_fields(form['fields'])}"
            elif form.get("form_key"):
                how += f"; form {form['form_key']!r} ({form.get('source')})"
        elif w.get("event"):
            signal = " --signal" if w.get("event_kind") == "signal" else ""
            lines.append(f"  waiting for {w['event_kind']} {w['event']!r} at {w['task_id']}{which}: "
                         f"`layerflow send {instance.id}{at} {shlex.quote(w['event'])}{signal} --json-payload '{{...}}'`")
            continue
        elif w.get("never_fires"):
            others = [o.get("event_id") for o in doc["waiting_for"]
                      if o.get("gateway_id") == w["gateway_id"] and not o.get("never_fires")]
            lines.append(f"  conditional branch {w['event_id']!r} ({w['condition']!r}) of event-based gateway "
                         f"{w['gateway_id']!r} never fires: SpiffWorkflow 3.2 never evaluates such a branch's "
                         "condition, so nothing written to the context releases it; " +
                         (f"the gateway's other branches ({', '.join(map(repr, others))}) decide"
                          if others else "nothing else decides at this gateway: `layerflow cancel "
                          f"{instance.id}{at} --reason TEXT` ends the instance") +
                         ". Model it as an interrupting conditional boundary event on a receive task (or on "
                         "a user task) instead; `layerflow validate` warns of it")
            continue
        elif w.get("event_kind") == "conditional":
            lines.append(f"  waiting at {w['task_id']}{which} until its condition {w['condition']!r} holds: change what it "
                         f"reads, `layerflow resume {instance.id}{at} --set KEY=VALUE` (a key PROCESS or SYSTEM fixed "
                         "never changes)")
            continue
        elif w["kind"] == "timer":
            left = w.get("repetitions_left", 0)
            repeats = "" if "repetitions_left" not in w else (
                ", repeats without end" if left is None else f", {left} repetition(s) left")
            how = (f"` after {w.get('due')}, when it is due{repeats} (`layerflow timers --fire` resumes every "
                   "instance whose timer is due)") if w.get("due") else "` once the event has happened"
        else:
            how = "` once the event has happened"
        nth = f" (round {w['round']})" if w.get("round") else ""  # a user task on a standard loop
        lines.append(f"  waiting for {w['kind']} {w['id']} at {w['task_id']}{nth}{which}: `layerflow resume {instance.id}{at}"
                     f"{'' if how.startswith('`') else ' '}{how}")
        for said in ("instructions", "documentation"):  # what the person is asked, as the BPMN says it
            text = w.get(said) if w["kind"] == "user_task" else None
            if isinstance(text, str) and text.strip():
                lines.append(f"    {said}: " + "\n      ".join(line.rstrip() for line in text.strip().splitlines()))
    tokens = doc["tokens"]
    lines.append("  tokens " + " ".join(f"{k}={v}" for k, v in tokens.items()))
    if out.tty:
        from rich.panel import Panel

        style = {"completed": "green", "waiting": "yellow", "error": "red"}.get(instance.status, "white")
        out.console.print(Panel("\n".join(lines[1:]) or "-", title=lines[0], border_style=style), highlight=False)
    else:
        click.echo("\n".join(lines))


def _which_instance(item: Mapping[str, Any]) -> str:
    """Which line of a multi-instance activity a waiting item is (its ``instance``, from 1, and its
    ``input`` item), as the plain summary names it; "" for an item of no such activity."""
    if not item.get("instance"):
        return ""
    given = item.get("input") or {}
    return f" (instance {item['instance']}" + "".join(f", {k} {_short(v, 40)}" for k, v in given.items()) + ")"


# ----------------------------------------------------------------------------- inputs

def _is_inline(path: str) -> bool:
    if not path.lstrip().startswith(("{", "[")):
        return False
    try:
        return not Path(path).exists()
    except OSError:  # longer than a file name may be ("File name too long"): JSON written inline
        return True


def _source_name(path: str, what: str) -> str:
    """How messages name where a ``--data``-like option's object came from."""
    if _is_inline(path):
        return f"inline {what}"
    return f"{what} from stdin" if path == "-" else f"{what} file {path}"


def _read_mapping(path: str | None, what: str, as_json: bool) -> dict[str, Any]:
    """An object from a JSON or YAML file (by its extension), from stdin (``-``, JSON) or written
    on the command line (``--data '{"amount": 20000}'``: a value starting with ``{`` or ``[`` that
    names no file)."""
    if path is None:
        return {}
    yaml_file = False
    source = _source_name(path, what)
    if _is_inline(path):  # a list is refused below, by name
        text = path
    elif path == "-":
        text = sys.stdin.read().removeprefix("\ufeff")
    else:
        try:
            # utf-8-sig: a byte order mark (Notepad, PowerShell's Out-File) is not part of the JSON
            text = Path(path).read_text(encoding="utf-8-sig")
        except OSError as err:
            _fail(f"cannot read {what} file {path}: {err.strerror}; give a JSON or YAML file, - for stdin, "
                  "or an inline JSON object", as_json=as_json)
        yaml_file = path.endswith((".yaml", ".yml"))
    try:
        if yaml_file:
            import yaml

            data = yaml.safe_load(text)
        else:
            data = json.loads(text)
    except RecursionError:  # valid, but deeper than Python's parser goes (thousands of levels)
        _fail(f"{source} is nested too deep to read; layerflow keeps values nested at most {MAX_DEPTH} objects or "
              "lists deep: flatten it, or store the deep part as a JSON string", as_json=as_json)
    except Exception as err:  # noqa: BLE001 - any parse error is bad input
        _fail(f"{source} is not valid {'YAML' if yaml_file else 'JSON'}: {err}", as_json=as_json)
    if data is None:
        return {}
    if not isinstance(data, dict):
        _fail(f"{source} must hold an object, got {type(data).__name__}", as_json=as_json)
    if yaml_file:
        dated = _yaml_date(data)
        if dated is not None:
            _fail(f"{source}: {dated[0]!r} is {dated[1]}, which YAML reads as a date, not text; quote it "
                  f"('{dated[1]}') to pass it on as text", as_json=as_json)
    return data


def _yaml_date(value: Any, path: str = "") -> tuple[str, str] | None:
    """(where, the date's text) of the first date or time an unquoted YAML value became."""
    import datetime

    if isinstance(value, (datetime.date, datetime.time)):
        return path, value.isoformat()
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    for k, v in items:
        found = _yaml_date(v, f"{path}[{k}]" if isinstance(k, int) else f"{path}.{k}" if path else str(k))
        if found is not None:
            return found
    return None


# Python's spelling of JSON's literals: `--set eligible=False` is the text 'False', not false
_PYTHON_WORDS = {"True": "true", "False": "false", "None": "null"}


def _parse_value(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return text


def _answers(answers_file: str | None, answer: tuple[str, ...], as_json: bool) -> dict[str, Any]:
    doc = _read_mapping(answers_file, "answers", as_json)
    from .governance import InvalidAnswer
    from .runtime import check_answers_shape

    try:
        check_answers_shape(doc, source=f"answers file {answers_file}")
    except InvalidAnswer as err:
        _fail(str(err), as_json=as_json)
    out = {"user_tasks": dict(doc.get("user_tasks") or {}), "confirmations": dict(doc.get("confirmations") or {})}
    given: dict[str, Any] = {}
    for item in answer:
        key, sep, value = item.partition("=")
        if not sep or not key:
            _fail(f"--answer {item!r}: write KEY=VALUE (KEY: a confirmation id, GATEWAY/KEY, *, or a user task id)",
                  as_json=as_json)
        parsed = _parse_value(value)
        if key in given and not json_equal(given[key], parsed):  # two answers to one step: which one was meant?
            _fail(f"--answer {key!r} is given twice with different values: {_value_text(given[key])} and "
                  f"{_value_text(parsed)}; give one answer per step", as_json=as_json)
        given[key] = parsed
        out["confirmations"][key] = parsed
        if isinstance(parsed, dict):
            out["user_tasks"][key] = parsed
    return out


def _value_text(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, sort_keys=True)


def _person(by: str | None, as_json: bool) -> str | None:
    """``--by``: the name of the person answering, checked before anything runs."""
    if by is None:
        return None
    name = by.strip()
    if not name:
        _fail("--by: give the name of the person answering (e.g. --by alice), or leave --by out to answer "
              "as an unnamed person", as_json=as_json)
    return name


def _suggested(item: dict[str, Any]) -> Any:
    """``--yes``: the policy's (or model's) suggestion, else the configured default."""
    if item["kind"] != "confirmation":
        return None
    if item.get("suggested") is not None:
        return item["suggested"]
    return item.get("default")


def _option_words(options: list[dict[str, Any]]) -> str:
    """A confirmation's option values as `--answer KEY=VALUE` takes them: JSON, and the word
    ``escalate`` for ``"$escalate"``, which a shell pasting it in double quotes expands to nothing."""
    return " | ".join("escalate" if o.get("value") == ESCALATE else json.dumps(o.get("value"), ensure_ascii=False)
                      for o in options)


def _asker(out: _Out, yes: bool, answered: bool,
           clock: Callable[[], float] = time.time) -> Callable[[dict[str, Any]], Any] | None:
    if yes:
        told: set[str] = set()

        def suggested(item: dict[str, Any]) -> Any:
            value = _suggested(item)
            if value is None and item.get("kind") == "confirmation" and item.get("id") not in told:
                # --yes takes a suggestion: say why this one is left waiting, and what answers it
                told.add(item["id"])
                values = _option_words(item.get("options", []))
                out.info(f"--yes: confirmation {item['id']!r} has no suggestion to take (no conflictPolicy rule or "
                         f"model suggested a value, and it has no default): it waits; answer it with --answer "
                         f"{shlex.quote(item['id'] + '=VALUE')} (VALUE: {values})")
            # nobody looked at it: recorded as taken by --yes, not as a person's decision
            return None if value is None else Unattended(value, actor="layerflow --yes")

        return suggested
    if not answered and stdin_is_terminal():
        # numbered options, the deadline counting down (engine.confirm) on the clock that set it
        return TerminalPrompt(clock=clock)
    return None


def _engine(store: str | None, model: str | None, out: _Out, as_json: bool, *, create: bool = True,
            clock: Callable[[], float] = time.time) -> Engine:
    """The engine on the store --store / $LAYERFLOW_STORE names. ``create=False`` for a command on
    stored instances: a store that is not there is a wrong path (exit 2), never made empty."""
    url = store or default_store_url()
    try:
        st = open_store(url, create=create)
    except LayerflowError as err:  # the store --store / $LAYERFLOW_STORE names cannot be used: bad input
        asked = click.get_current_context(silent=True)
        instance_id = asked.params.get("instance_id") if asked is not None else None
        if err.kind == "not_found" and isinstance(instance_id, str):
            _fail(f"instance {instance_id!r} cannot be loaded: {err}", as_json=as_json, kind=err.kind,
                  details={"instance_id": instance_id})
        _fail(str(err), as_json=as_json, kind=err.kind)
    return Engine(st, model=model, progress=_progress(out), clock=clock)


def _existing_engine(store: str | None, model: str | None, as_json: bool, *,
                     clock: Callable[[], float] = time.time) -> Engine | None:
    """For a command that lists what a store holds (``list``, ``timers``): a sqlite file that
    is not there yet holds nothing (None, a note on stderr), and is not made by asking."""
    url = store or default_store_url()
    try:
        st = open_store(url, create=False)
    except LayerflowError as err:
        if err.kind != "not_found":
            _fail(str(err), as_json=as_json, kind=err.kind)
        click.echo(f"nothing to list: {err}", err=True)
        return None
    return Engine(st, model=model, progress=_progress(_Out(as_json)), clock=clock)


# ----------------------------------------------------------------------------- commands

_store_option = click.option("--store", "store", default=None, metavar="URL",
                             help="memory://, sqlite:///FILE, redis://HOST:PORT/DB (default: $LAYERFLOW_STORE, "
                                  "else the user data folder)")
_json_option = click.option("--json", "as_json", is_flag=True, help="print one JSON document and nothing else on stdout")
_queue_option = click.option("--queue", "queue", default=None, metavar="URL",
                             help="the Redis holding the stream (default: the store when it is Redis, else "
                                  "$LAYERFLOW_QUEUE)")
_stream_option = click.option("--stream", default=DEFAULT_STREAM, show_default=True,
                              help="Redis stream of ready instances")
_answers_option = click.option("--answers", "answers_file", default=None, metavar="FILE",
                               help='JSON {"user_tasks": {TASK: {...}}, "confirmations": {ID: ANSWER}}')
_answer_option = click.option("--answer", "answer", multiple=True, metavar="KEY=VALUE",
                              help="answer one confirmation (ID, GATEWAY/KEY or *) or user task (a JSON object)")
_yes_option = click.option("--yes", "yes", is_flag=True, help="take the policy's suggestion for every confirmation")
_by_option = click.option("--by", "by", default=None, metavar="NAME",
                          help="the person whose answers these are: the tape's actor, named in a join's resolution "
                               "(default: a person, unnamed)")
_model_option = click.option("--model", "model", default=None, metavar="NAME",
                             help="model for activities with llm config (litellm name); none: offline handlers")
_now_option = click.option("--now", "now", default=None, metavar="ISO",
                           help="run as if it were this moment, e.g. 2026-01-05T09:00:00Z (ISO 8601 with its time "
                                "zone, not in the past): timers and confirmation timeouts due by then are due; the "
                                "clock runs on from it (default: the wall clock)")


def _clock(now: str | None, as_json: bool) -> Callable[[], float]:
    """The engine's clock (``Engine(clock=)``) for ``--now``: the wall clock moved forward to NOW,
    running on from there; without it, the wall clock."""
    if now is None:
        return time.time
    example = "2026-01-05T09:00:00Z or 2026-01-05T10:00:00+01:00"
    try:
        moment = datetime.fromisoformat(now.strip())
    except ValueError:
        _fail(f"--now {now!r} is no ISO 8601 time; write a date and time with its time zone, e.g. {example}",
              as_json=as_json)
    if moment.tzinfo is None:
        _fail(f"--now {now!r} has no time zone, so it names no moment; add one, e.g. {example}", as_json=as_json)
    ahead = moment.timestamp() - time.time()
    if ahead < 0:
        # deadlines and due times already fixed were fixed on a clock that has passed NOW: a clock
        # turned back would un-fire nothing and make what the instance waits for look further away
        _fail(f"--now {now!r} is in the past (it is {datetime.now(timezone.utc).isoformat(timespec='seconds')} "
              "now): the engine's clock only runs forward; leave --now out to run on the wall clock",
              as_json=as_json)
    return lambda: time.time() + ahead


class _Command(click.Command):
    """A command whose store errors end it as the CLI's other errors do (a message on stderr or
    the ``--json`` document, exit 1), never as a traceback: another writer saved the instance
    first (a second ``layerflow resume``, a worker, the REST API), or the store went away or
    refuses writes (a read-only file) while the command ran."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        """A usage error (an unknown option, a missing argument, a value of the wrong type) of a
        command called with ``--json`` still gives the one document scripts parse, beside click's
        usage message on stderr."""
        wants_json = "--json" in args
        try:
            return super().parse_args(ctx, args)
        except click.UsageError as err:
            if not wants_json or not any(p.name == "as_json" for p in self.params):
                raise
            err.show()
            _fail(err.format_message(), as_json=True)

    def invoke(self, ctx: click.Context) -> Any:
        as_json = bool(ctx.params.get("as_json"))
        about = len(_ABOUT)
        if not as_json:
            try:
                return self._invoke(ctx, as_json)
            finally:
                del _ABOUT[about:]
        _JSON_STDOUT.append(sys.stdout)
        try:
            with contextlib.redirect_stdout(sys.stderr):
                return self._invoke(ctx, as_json)
        except _Refused as refused:
            _Out(True).doc(_refusal_document(refused.instance, refused.error))
            sys.exit(refused.code)
        finally:
            _JSON_STDOUT.pop()
            del _ABOUT[about:]

    def _invoke(self, ctx: click.Context, as_json: bool) -> Any:
        try:
            return super().invoke(ctx)
        except VersionConflict as err:
            iid = getattr(err, "instance_id", None) or "ID"
            _fail(f"instance {iid!r} was saved by another process while this command ran (a second `layerflow "
                  f"resume`, a worker, the REST API): this command expected version {getattr(err, 'expected', '?')}, "
                  f"the store holds {getattr(err, 'actual', '?')}. Its last save was refused and nothing of it was "
                  f"written; what the other process saved stands. `layerflow inspect {iid}` shows the instance now; "
                  f"`layerflow resume {iid}` continues it if it still waits", EXIT_ERROR, as_json=as_json,
                  kind=err.kind, details={"instance_id": iid})
        except StoreError as err:
            _fail(str(err), EXIT_ERROR, as_json=as_json, kind=err.kind)
        except OSError as err:
            if err.filename is None:
                raise
            # a path the system refuses as a name ("File name too long"), met where a file is looked for
            _fail(f"{err.filename}: {err.strerror or err}; check the path given", as_json=as_json)


class _Commands(click.Group):
    command_class = _Command


@click.group(cls=_Commands)
@click.version_option(package_name="layerflow")
def main() -> None:
    """layerflow: BPMN processes with a governed, layered context per activity."""


def _run_process(bpmn: str | list[str], config: str | None, process_id: str | None, data: dict[str, Any],
                 answers_file: str | None, answer: tuple[str, ...], yes: bool, store: str | None,
                 model: str | None, as_json: bool, data_file: str | None = None, by: str | None = None) -> None:
    out = _Out(as_json)
    answers = _answers(answers_file, answer, as_json)
    by = _person(by, as_json)
    try:
        process = load_process(bpmn, process_id, config=config)
    except LayerflowError as err:
        _fail(str(err), as_json=as_json, kind=err.kind)
    _unknown_user_tasks(process, answers_file, answers, answer, as_json)
    _answers_naming_nothing(process, answers, [item.partition("=")[0] for item in answer], as_json)
    _user_task_answers_are_objects(process, answer, as_json)
    _unmatchable_confirmations(out, process, answers, answers_file, answer)
    check_start_data(process, data, data_file, as_json)
    engine = _engine(store, model, out, as_json)
    # the new instance's lease is held from before it exists until the command ends, as `resume`
    # holds it: a `resume`, worker or REST request that learns the id meanwhile leaves it alone
    # instead of running the same activities beside this command
    instance_id = uuid.uuid4().hex[:12]
    with _holding(engine, instance_id, as_json):
        try:
            # its data passed check_start_data; with answers, it is created once the run has taken them
            with engine.starting(process, data, instance_id=instance_id, answers=answers) as instance:
                # stderr, --json too: where the instance is kept is what a later resume or inspect needs
                out.info(f"instance {instance.id} of {process.id} started (store {_store_name(store)}"
                         + ("; saved once the run has taken the answers given" if instance.version == 0 else "")
                         + ")")
                instance = engine.run(instance, answers=answers, by=by,
                                      ask=_asker(out, yes, bool(answers_file or answer), instance.clock))
        except (InvalidAnswer, AnswerWriteDenied) as err:
            source = _answers_source(answers_file, answer)
            if instance.version == 0:  # refused before it was created: nothing of it is in the store
                _refused_start(out, process.id, err, source)
            _invalid_answer(out, instance, err, source, getattr(err, "task_id", None), store)
        except StoreError as err:
            _store_failed_mid_run(instance, err, as_json, store)
        for notice in instance.notices:  # an answer that matched no confirmation is named there too
            out.info(f"layerflow: {notice}")
        _summary(out, instance, store)
        sys.exit(_exit_code(instance))


def check_start_data(process: Any, data: Mapping[str, Any], data_file: str | None, as_json: bool) -> None:
    """The start's checks (``engine.runtime.check_start``) before ``run``, ``demo`` or ``submit`` opens the
    store or the queue: refused data is bad input (exit 2) that leaves no empty sqlite file, no Redis key
    and nothing queued behind, and is the error reported when the store named cannot be used either."""
    try:
        check_start(process, data)
    except (ContextWriteDenied, LayerflowError) as err:
        where = _source_name(data_file, "data") if data_file else "initial data"
        _fail(f"{where}: {err}", as_json=as_json, kind=getattr(err, "kind", "bad_input"),
              details=start_data_details(err), process_id=process.id)


def _store_failed_mid_run(instance: Instance, err: StoreError, as_json: bool, store: str | None = None) -> NoReturn:
    """The store stopped answering (or refused a write) while the instance ran: name the instance,
    which its last committed save keeps, so the user can continue it (the `--json` document
    carries its id and process, not null). A second answer to a confirmation is no store failure
    but bad input (exit 2), with the fields that say who answered, as before anything runs."""
    if isinstance(err, ConfirmationAnswered):
        fields = {k: v for k, v in err.to_dict().items() if k not in ("kind", "message")}
        _fail(str(err), as_json=as_json, kind=err.kind, details={**fields, **_named(instance)})
    if instance.version == 0:  # a start whose run saves at its end (``Engine.starting``): nothing was created
        _fail(f"instance {instance.id} of process {instance.process_id}: {err}. It was not created (nothing was "
              "saved); once the store answers, run the command again", EXIT_ERROR, as_json=as_json, kind=err.kind,
              process_id=instance.process_id)
    _fail(f"instance {instance.id} of process {instance.process_id}: {err}. What it saved before stands; once "
          f"the store answers, `layerflow resume {instance.id}{_store_hint(store)}` continues it from its last save",
          EXIT_ERROR,
          as_json=as_json, kind=err.kind, details={"instance_id": instance.id, "process_id": instance.process_id})


def _unknown_user_tasks(target: Any, answers_file: str | None, answers: Mapping[str, Any], answer: tuple[str, ...],
                        as_json: bool) -> None:
    """An answers file that names no user task of the process (``target``: it, or the instance to
    resume) is a typo: say so before running (``runtime.check_user_task_keys``, as ``Engine.run``
    and REST check it). On `resume`, a task's `waiting_for` id names it too, as `--answer ID={...}`
    and REST take it. An ``--answer`` is checked by ``_unmatchable_confirmations``."""
    from .runtime import check_user_task_keys

    given = {item.partition("=")[0] for item in answer}
    process = getattr(target, "process", target)
    try:
        check_user_task_keys(target, [k for k in answers["user_tasks"] if k not in given],
                             source=f"answers file {answers_file}")
    except LayerflowError as err:
        _fail(str(err), as_json=as_json, kind=err.kind, process_id=process.id)


def _unmatchable_confirmations(out: _Out, target: Any, answers: dict[str, Any], answers_file: str | None,
                               answer: tuple[str, ...], named: Iterable[str] | None = None) -> None:
    """A confirmations key of the answers file or an ``--answer`` that can match no confirmation of
    the process (``target``: it, or the instance to resume) is a typo, refused before anything runs
    (``runtime.check_confirmation_keys``), as a user task the process does not have is: exit 2,
    nothing changed. One the process may still ask (a join's key it has not met) is not: it is
    named on stderr at the end if it went unused. ``named``: the ``--answer`` keys as ``_answer_keys``
    read them."""
    from .runtime import check_confirmation_keys, unknown_user_task_keys

    given = set(named) if named is not None else {item.partition("=")[0] for item in answer}
    # an --answer object is in both sections: a confirmation's answer only when it names no user task
    no_task = set(unknown_user_task_keys(target, [k for k in answers["user_tasks"] if k in given]))
    keys = [k for k in answers["confirmations"] if k not in answers["user_tasks"] or k in no_task]
    process = getattr(target, "process", target)
    for source, mine in ((f"answers file {answers_file}", [k for k in keys if k not in given]),
                         ("--answer", [k for k in keys if k in given])):
        try:
            check_confirmation_keys(target, mine, source=source)
        except LayerflowError as err:
            _fail(str(err), as_json=out.as_json, kind=err.kind, process_id=process.id)


def _answers_naming_nothing(target: Any, answers: Mapping[str, Any], keys: Iterable[str], as_json: bool) -> None:
    """An ``--answer KEY={...}`` (a user task's answer, a JSON object) whose KEY can name nothing of
    the process (``target``: it, or the instance to resume) is a typo, refused as an answers file's
    unknown user task is: no user task has that id, nor anything the instance waits for or asked,
    and it is no ``*``, ``GATEWAY_ID/CONTEXT_KEY`` or model's ``model:N`` (``_unmatchable_confirmations``
    checks those). Kept "for a later step", it would never be used."""
    from .runtime import known_confirmation_ids, nearest_answer_keys, unknown_user_task_keys

    process = getattr(target, "process", target)
    known = set() if target is process else known_confirmation_ids(target)
    objects = [k for k in dict.fromkeys(keys) if k in answers["user_tasks"] and k not in known]
    unknown = [k for k in unknown_user_task_keys(target, objects) if k != "*" and "/" not in k and ":" not in k]
    if unknown:
        tasks = process.user_task_ids()
        near = "".join(f" {h}" for h in nearest_answer_keys(target, unknown))
        _fail(f"--answer {', '.join(map(repr, unknown))}: names no user task of process {process.id!r} and nothing "
              f"its instance waits for, so no step would ever take it;{near} answer a user task by its BPMN id "
              f"({', '.join(tasks) or 'the process has none'}) or its waiting_for id, a join's conflict by "
              f"GATEWAY_ID/CONTEXT_KEY, any other confirmation by its id or *{_changed_definition_hint(target)}",
              as_json=as_json)


def _changed_definition_hint(target: Any) -> str:
    """For an instance whose files changed since it started: the ids it knows are its own version's."""
    if target is getattr(target, "process", target):
        return ""
    definition = target.process.definition()
    if definition["on_disk"] != "changed":
        return ""
    return (f" (instance {target.id} runs the definition it started with, version {definition['version']}; its "
            "files changed since, so an id the file has now may not be one of its own)")


def _user_task_answers_are_objects(process: Any, answer: tuple[str, ...], as_json: bool) -> None:
    """``--answer TASK=VALUE`` for a user task takes a JSON object; anything else would be
    ignored and leave the task waiting, so it is refused."""
    from . import spiff

    tasks = {ts.bpmn_id for s in [process.spec, *process.subprocess_specs.values()]
             for ts in spiff.iter_user_specs(s) if getattr(ts, "manual", False)}
    for item in answer:
        key, _, value = item.partition("=")
        if key in tasks and value.lstrip().startswith("{"):
            try:
                json.loads(value)
            except ValueError as err:  # an object meant, a brace or a quote lost: say so, not "give an object"
                _fail(f"--answer {item!r}: the answer to user task {key!r} is not valid JSON: {err}; give one JSON "
                      f"object of its fields (double-quoted names and strings)", as_json=as_json)
        if key in tasks and not isinstance(_parse_value(value), dict):
            _fail(f"--answer {item!r}: {key!r} is a user task; answer it with a JSON object of its fields, "
                  f"e.g. --answer '{key}={{\"approved\": true}}'", as_json=as_json)


def _answers_source(answers_file: str | None, answer: tuple[str, ...]) -> str:
    return " and ".join(([f"answers file {answers_file}"] if answers_file else []) + (["--answer"] if answer else []))


def _answer_error(err: LayerflowError, message: str, task_id: str | None) -> dict[str, Any]:
    """The ``error`` of a refused answer's document: kind, message, task and, of a form, each problem."""
    cause = err.__cause__
    error = {"kind": "invalid_answer", "message": message,
             "task_id": task_id or getattr(cause, "task_id", None) or getattr(err, "task_id", None)}
    if getattr(err, "problems", None):  # an answer that does not fit the task's form: field by field
        error["problems"] = [{"field": f, "problem": p} for f, p in err.problems]  # type: ignore[attr-defined]
    return error


def _refused_start(out: _Out, process_id: str, err: LayerflowError, source: str) -> NoReturn:
    """Exit 2: the answer a new instance's run was given is refused, so the instance was never created
    (``Engine.starting``): the document is empty but for the process, nothing is in the store, and the
    same command with a corrected answer starts afresh."""
    message = f"{source}: {err}"  # which says that nothing was created (``Engine.starting``)
    error = _answer_error(err, message, getattr(err, "task_id", None))
    _fail(message, as_json=out.as_json, kind="invalid_answer", process_id=process_id,
          details={k: v for k, v in error.items() if k not in ("kind", "message")})


def _invalid_answer(out: _Out, instance: Instance, err: LayerflowError, source: str,
                    task_id: str | None = None, store: str | None = None) -> NoReturn:
    """Exit 2: an answer given that is not an offered option. Nothing of it was applied (of a
    resume, nothing of the command: ``Engine.all_or_nothing``); the instance still waits
    (``layerflow resume ID --answer ...`` with a valid one, in the store this command used)."""
    message = _resume_at(f"{source}: {err}" if source else str(err), instance.id, store)
    if out.as_json:
        out.doc(_refusal_document(instance, _answer_error(err, message, task_id)))
    else:
        click.echo(f"layerflow: {message}", err=True)
    sys.exit(EXIT_BAD_INPUT)


def _resume_at(message: str, instance_id: str, store: str | None) -> str:
    """The engine's ``layerflow resume ID`` in ``message`` (it knows no store) as this command's user
    pastes it: with the ``--store`` the command was given; of a ``memory://`` store, gone with the
    command, not offered at all."""
    command = f"`layerflow resume {instance_id}"
    if command not in message:
        return message
    if store is not None and store.lower().startswith("memory://"):
        return (message.split(f"; instance {instance_id} still waits", 1)[0]
                + f"; store {store} lives only in this command: run it again with a corrected answer, or with "
                  "--store sqlite:///FILE to resume it later")
    return message.replace(command, command + _store_hint(store))


def _waiting_ids(instance: Instance) -> set[str]:
    """What an --answer KEY may name of what the instance waits for now."""
    waiting = {"*"}
    for w in instance.waiting_for:
        waiting.update(str(w[k]) for k in ("id", "task_id") if w.get(k))
        if w.get("key"):
            waiting.add(f"{w['task_id']}/{w['key']}")
    return waiting


def _answer_keys(instance: Instance, answers: dict[str, Any], answer: tuple[str, ...]) -> list[str]:
    """The KEY of each --answer KEY=VALUE. A context key may hold '=' (a conflict on 'k=v' waits as
    'gw/k=v'): when the text before the first '=' names nothing the instance waits for and the text
    before a later '=' does, that is the KEY, and the answer is moved to it."""
    waiting = _waiting_ids(instance)
    keys = []
    for item in answer:
        key, _, value = item.partition("=")
        if key not in waiting:
            cuts = [i for i, c in enumerate(item) if c == "=" and item[:i] in waiting]
            if len(cuts) == 1:
                for section in ("confirmations", "user_tasks"):
                    answers[section].pop(key, None)
                key, value = item[:cuts[0]], item[cuts[0] + 1:]
                parsed = _parse_value(value)
                answers["confirmations"][key] = parsed
                if isinstance(parsed, dict):
                    answers["user_tasks"][key] = parsed
        keys.append(key)
    return keys


def _unused_answers(out: _Out, instance: Instance, answers: Mapping[str, Any], keys: list[str]) -> None:
    """An --answer for nothing the instance waits for is kept for the steps this resume reaches; say so
    on stderr (the run names it after, when it reached none: ``unreached_answer_notices``; one
    for a confirmation that was cancelled with its join is used by none: say that; one for a user task
    done already is named after the resume, unless the task came back and took it)."""
    from .runtime import passed_user_tasks

    waiting = _waiting_ids(instance)
    cancelled = {c["id"] for c in instance.confirmations if c.get("cancelled")}
    passed = passed_user_tasks(instance, [k for k in keys if k in answers["user_tasks"]])
    for key in keys:
        if key in passed:
            continue  # ``Engine.run``'s notice, after the resume: ``passed_answer_notices``
        if key in cancelled:
            out.info(f"layerflow: --answer {key!r}: confirmation {key!r} of instance {instance.id} was cancelled "
                     "with its join (an interrupting event ended the activity or branch it was in): nobody asks it "
                     "any more, and the answer was not used")
        elif key not in waiting:
            listed = ", ".join(sorted(waiting - {"*"})) or "nothing"
            out.info(f"layerflow: --answer {key!r}: instance {instance.id} does not wait for it now "
                     f"(it waits for: {listed}); it is used if this resume reaches that step")


def _store_name(store: str | None) -> str:
    """The store as the started line names it: a password in its URL is not printed."""
    return _shown_url(store or default_store_url())


@main.command()
@click.argument("bpmn", nargs=-1, required=True, type=click.Path(dir_okay=False))
@click.option("--config", default=None, metavar="FILE", help="config file (default: PROCESS.layerflow.yaml beside it)")
@click.option("--process", "process_id", default=None,
              help="the bpmn:process id to start, when the files hold several (default: the one no other calls)")
@click.option("--data", "data_file", default=None, metavar="FILE",
              help="initial data -> PROCESS: a JSON or YAML file, - (stdin) or an inline JSON object")
@_answers_option
@_answer_option
@_yes_option
@_by_option
@_store_option
@_model_option
@_json_option
def run(bpmn: tuple[str, ...], config: str | None, process_id: str | None, data_file: str | None,
        answers_file: str | None, answer: tuple[str, ...], yes: bool, by: str | None, store: str | None,
        model: str | None, as_json: bool) -> None:
    """Start an instance of BPMN and run it until it completes, waits or fails.

    Give every file the process needs (call activities name processes of other files):
    ``layerflow run main.bpmn called.bpmn``."""
    _run_process(list(bpmn), config, process_id, _read_mapping(data_file, "data", as_json), answers_file, answer, yes,
                 store, model, as_json, data_file, by)


@main.group()
def demo() -> None:
    """Runnable demos shipped with layerflow."""


@demo.command("loan")
@click.option("--scenario", type=click.Choice(sorted(LOAN_SCENARIOS)), default="conflict", show_default=True,
              help="conflict: high risk, the reviews disagree; full: medium risk, full review; fast: fast track")
@click.option("--data", "data_file", default=None, metavar="FILE",
              help="application data instead of the scenario's (file, - or inline JSON object)")
@_answers_option
@_answer_option
@_yes_option
@_by_option
@_store_option
@_model_option
@_json_option
def demo_loan(scenario: str, data_file: str | None, answers_file: str | None, answer: tuple[str, ...], yes: bool,
              by: str | None, store: str | None, model: str | None, as_json: bool) -> None:
    """The loan-approval walk-through (bpmn_examples/loan_approval.bpmn)."""
    bpmn = EXAMPLES / "loan_approval.bpmn"
    if not bpmn.is_file():
        _fail(f"the demo process {bpmn} is not installed; run from a source checkout (pip install -e .)",
              as_json=as_json)
    data = _read_mapping(data_file, "data", as_json) if data_file else dict(LOAN_SCENARIOS[scenario])
    _run_process(str(bpmn), None, None, data, answers_file, answer, yes, store, model, as_json, data_file, by)


def _shown_url(url: str | None) -> str:
    """A store URL fit for a message: a password in it is not."""
    if not url:
        return "the store"
    scheme, sep, rest = url.partition("://")
    netloc, slash, path = rest.partition("/")
    if sep and "@" in netloc:
        netloc = "***@" + netloc.rsplit("@", 1)[1]
    return f"{scheme}{sep}{netloc}{slash}{path}"


def _load(engine: Engine, instance_id: str, as_json: bool) -> Instance:
    try:
        return engine.load(instance_id)
    except InstanceNotFound:
        store = _shown_url(getattr(engine.store, "url", None))
        _fail(f"no instance {instance_id!r} in {store}; `layerflow list` shows the stored instances "
              "(add --store URL when they are in another store)", as_json=as_json, kind="not_found",
              details={"instance_id": instance_id})
    except ContextKeyError as err:
        _fail(str(err), as_json=as_json, kind="not_found")
    except LayerflowError as err:
        _fail(str(err), EXIT_ERROR, as_json=as_json, kind=err.kind)


@contextlib.contextmanager
def _holding(engine: Engine, instance_id: str, as_json: bool) -> Iterator[None]:
    """Hold the instance's lease while a command runs it, as a worker does: a worker that is
    handed the instance meanwhile leaves it alone, and a second ``resume`` is refused up front
    instead of running the same activities and losing at the save."""
    with holding(engine.store, instance_id, f"cli-{socket.gethostname()}-{os.getpid()}") as holder:
        if holder is not None:
            _fail(f"instance {instance_id!r} is being run by {holder} right now (it holds the instance's lease); "
                  f"nothing was changed. Wait until it is at rest (`layerflow inspect {instance_id}`), then resume "
                  f"it if it still waits; if that process is gone, its lease runs out within the time it took it for "
                  f"(a worker's --idle-ms, 30 s unless set; {LEASE_TTL:.0f} s for `resume` and the server)",
                  as_json=as_json, kind="invalid_state", details={"instance_id": instance_id})
        yield


@main.command()
@click.argument("instance_id")
@_answers_option
@_answer_option
@_yes_option
@_by_option
@click.option("--set", "sets", multiple=True, metavar="KEY=VALUE",
              help="write a corrected value (JSON, else text) into the failed activity's context before retrying")
@click.option("--context", "context_name", metavar="NAME",
              help="the context --set writes into: a branch id (the BPMN id of the branch's first element) or a "
                   "context name (`inspect` lists them); default: the failed activity's, else the main context")
@_now_option
@_store_option
@_model_option
@_json_option
def resume(instance_id: str, answers_file: str | None, answer: tuple[str, ...], yes: bool, by: str | None,
           sets: tuple[str, ...], context_name: str | None, now: str | None, store: str | None, model: str | None,
           as_json: bool) -> None:
    """Continue a waiting instance, or retry the failed activity of one in error; with --now, as if
    it were that moment (a timer due by then fires)."""
    out = _Out(as_json)
    engine = _engine(store, model, out, as_json, create=False, clock=_clock(now, as_json))
    with _holding(engine, instance_id, as_json):
        instance = _acting_on(_load(engine, instance_id, as_json))
        # read once the instance is found: a refused answers file shows it as it is (`--json`)
        answers = _answers(answers_file, answer, as_json)
        by = _person(by, as_json)
        try:  # before anything runs: an answer its timeout beat is refused, not applied nor dropped
            refuse_late_answers(instance, answers)
        except LayerflowError as err:  # the fields REST's 409 gives: who answered, when, with what
            fields = {k: v for k, v in err.to_dict().items() if k not in ("kind", "message")}
            _fail(str(err), as_json=as_json, kind=err.kind, details={**fields, **_named(instance)})
        if instance.status == "completed":
            if sets:  # a correction of a finished context: as REST refuses an inject into it
                _fail(f"--set: instance {instance.id} is completed; a completed instance's contexts are not "
                      "changed. Start a new instance with the corrected data", as_json=as_json,
                      kind="invalid_state", details=_named(instance))
            try:  # a user task's answer that names no user task is a typo, completed or not
                check_completed_answer_keys(instance, answers, source=_answers_source(answers_file, answer))
            except InvalidAnswer as err:
                _invalid_answer(out, instance, err, "", store=store)
            instance = engine.resume(instance, answers=answers)  # as it is: its notices name each answer
            for notice in instance.notices:
                out.info(f"layerflow: {notice}")
            _summary(out, instance, store)
            sys.exit(EXIT_OK)
        try:
            refuse_if_cancelled(instance, "resume it")
        except LayerflowError as err:
            _fail(str(err), as_json=as_json, kind=err.kind, details=_named(instance))
        if context_name is not None and not sets:
            _fail("--context names the context --set writes into: give --set KEY=VALUE too", as_json=as_json)
        source = _answers_source(answers_file, answer)
        # one command, all or nothing: its --set, its answers to open confirmations and the steps the
        # answers drive are saved together, or (an answer refused, bad input) none of them is
        try:
            with engine.all_or_nothing(instance):
                if sets:
                    values = {}
                    for item in sets:
                        key, sep, value = item.partition("=")
                        if not sep or not key:
                            _fail(f"--set {item!r}: write KEY=VALUE", as_json=as_json)
                        values[key] = _parse_value(value)
                    target: str | None = None
                    if context_name is not None or instance.status != "error":
                        # a named context, or the main one: as REST inject, never under open branches
                        from .governance import GovernanceService

                        try:
                            ctx = GovernanceService.context_of(instance, context_name)
                            GovernanceService._writable(instance, ctx, "--set")
                        except LayerflowError as err:
                            message = str(err).replace("(`context`: ", "(`--context`: ")
                            _fail(message, as_json=as_json, kind=err.kind, details=_named(instance))
                        target = ctx.name
                    hints = Engine.new_key_hints(instance, values, context=target)
                    try:
                        engine.inject(instance, values, context=target, actor="operator")
                    except LayerflowError as err:
                        from .governance import fixed_key_hint

                        hint = fixed_key_hint(instance.id, err) if isinstance(err, ContextWriteDenied) else ""
                        _fail(f"--set: {err}{hint}", as_json=as_json, kind=err.kind,
                              details={"instance_id": instance.id, "key": getattr(err, "key", None)})
                    for line in hints:  # the write stands: a new key may be the fix
                        out.info(f"layerflow: --set {line}")
                    for key, value in values.items():  # Python's word for a JSON literal is text here
                        if isinstance(value, str) and value in _PYTHON_WORDS:
                            out.info(f"layerflow: --set {key}={value}: {value} is not JSON, so it was written as the "
                                     f"text {value!r}; write {key}={_PYTHON_WORDS[value]} for the JSON value")
                _unknown_user_tasks(instance, answers_file, answers, answer, as_json)
                _user_task_answers_are_objects(instance.process, answer, as_json)
                given = _answer_keys(instance, answers, answer)
                _answers_naming_nothing(instance, answers, given, as_json)
                _unmatchable_confirmations(out, instance, answers, answers_file, answer, given)
                _unused_answers(out, instance, answers, given)
                for key, value in answers["confirmations"].items():
                    if any(c["id"] == key and not c.get("answered") for c in instance.confirmations):
                        try:
                            instance = engine.answer_confirmation(instance, key, value, run=False, actor=by or "person",
                                                                 by=by)
                        except InvalidAnswer:
                            raise  # reported below, once the instance is as it was
                        except ActivityError as err:  # not an offered option: nothing was applied
                            raise InvalidAnswer(str(err), task_id=getattr(err, "task_id", None)) from None
                        except LayerflowError as err:
                            _fail(str(err), as_json=as_json, kind=err.kind, details=_named(instance))
                instance = engine.resume(instance, answers=answers,
                                         ask=_asker(out, yes, bool(answers_file or answer), instance.clock), by=by)
        except (InvalidAnswer, AnswerWriteDenied) as err:
            _invalid_answer(out, instance, err, source, getattr(err, "task_id", None), store)
        except StoreError as err:
            _store_failed_mid_run(instance, err, as_json, store)
        for notice in instance.notices:  # an answer that matched no confirmation is named there too
            out.info(f"layerflow: {notice}")
        _summary(out, instance, store)
        sys.exit(_exit_code(instance))


@main.command()
@click.argument("instance_id")
@click.option("--reason", required=True, help="why: recorded on the tape with who cancelled")
@_store_option
@_json_option
def cancel(instance_id: str, reason: str, store: str | None, as_json: bool) -> None:
    """Stop an unfinished instance for good: its open tasks are cancelled, its pending
    confirmations closed, and nothing of it runs again (resume, answers, events, timers are
    refused). Nothing is deleted; the reason is on its tape."""
    out = _Out(as_json)
    engine = _engine(store, None, out, as_json, create=False)
    with _holding(engine, instance_id, as_json):
        instance = _acting_on(_load(engine, instance_id, as_json))
        try:
            instance = engine.cancel(instance, reason=reason, actor="cli")
        except LayerflowError as err:
            _fail(str(err), as_json=as_json, kind=err.kind, details=_named(instance))
        _summary(out, instance, store)
        sys.exit(EXIT_OK)


@main.command()
@click.argument("instance_id")
@click.argument("name")
@click.option("--data", "data_file", default=None, metavar="FILE",
              help="the payload: a JSON or YAML file, - (stdin) or an inline JSON object")
@click.option("--json-payload", "json_payload", default=None, metavar="TEXT", help="the payload as JSON text")
@click.option("--signal", is_flag=True, help="broadcast a signal NAME instead of sending a message NAME")
@_store_option
@_model_option
@_json_option
def send(instance_id: str, name: str, data_file: str | None, json_payload: str | None, signal: bool,
         store: str | None, model: str | None, as_json: bool) -> None:
    """Send a message NAME (or broadcast a signal) to a waiting instance, then run it on.

    The payload's keys go to WORKING of the context that catches it (one key, when the BPMN
    names a messageVariable), through the layer rules; HISTORY records event:<catch id>."""
    out = _Out(as_json)
    payload = _payload(data_file, json_payload, as_json)
    engine = _engine(store, model, out, as_json, create=False)
    with _holding(engine, instance_id, as_json):  # as resume: never beside a worker or another command
        instance = _acting_on(_load(engine, instance_id, as_json))
        kind = "signal" if signal else "message"
        try:
            instance = engine.send_event(instance, name, payload, kind=kind, actor="cli")
        except LayerflowError as err:
            _governance_fail(err, as_json, prefix=f"{kind} {name!r}: ", instance=instance)
        for notice in instance.notices:  # the files changed since it started, as `resume` says
            out.info(f"layerflow: {notice}")
        _summary(out, instance, store)
        sys.exit(_exit_code(instance))


def _payload(data_file: str | None, json_payload: str | None, as_json: bool) -> Any:
    """``send``'s and ``correlate``'s payload: ``--data FILE`` or ``--json-payload TEXT``."""
    if data_file is not None and json_payload is not None:
        _fail("give the payload with --data FILE or --json-payload TEXT, not both", as_json=as_json)
    payload: Any = _read_mapping(data_file, "payload", as_json) if data_file is not None else None
    if json_payload is not None:
        try:
            payload = json.loads(json_payload)
        except ValueError as err:
            _fail(f"--json-payload is not valid JSON: {err}", as_json=as_json)
    return payload


@main.command()
@click.argument("name")
@click.option("--match", "matches", multiple=True, metavar="KEY=VALUE",
              help="a context value the instance must hold (JSON, else text); repeat for several keys")
@click.option("--data", "data_file", default=None, metavar="FILE",
              help="the payload: a JSON or YAML file, - (stdin) or an inline JSON object")
@click.option("--json-payload", "json_payload", default=None, metavar="TEXT", help="the payload as JSON text")
@click.option("--process", "process_files", multiple=True, metavar="FILE",
              help="a BPMN file whose process starts on message NAME: started when no waiting instance takes it")
@_store_option
@_model_option
@_json_option
def correlate(name: str, matches: tuple[str, ...], data_file: str | None, json_payload: str | None,
              process_files: tuple[str, ...], store: str | None, model: str | None, as_json: bool) -> None:
    """Send message NAME to the one waiting instance it is meant for, then run it on.

    The instance is found, not named: it waits for NAME, takes the payload's correlation
    properties, and holds every --match KEY=VALUE in the context that waits. None does: an
    instance of a --process whose message start event is NAME is started and gets it.
    Exit codes and --json as `send`; several instances, or none, are refused (exit 2)."""
    from .correlate import find
    from .process import Process

    out = _Out(as_json)
    payload = _payload(data_file, json_payload, as_json)
    match: dict[str, Any] = {}
    for item in matches:
        key, sep, text = item.partition("=")
        if not sep or not key:
            _fail(f"--match {item!r}: give KEY=VALUE (a context key and the value it must hold)", as_json=as_json)
        try:
            match[key] = json.loads(text)
        except ValueError:
            match[key] = text
    processes = []
    for file in process_files:
        try:
            processes.append(load_process(file))
        except LayerflowError as err:
            _fail(str(err), as_json=as_json, kind=err.kind)
    engine = _engine(store, model, out, as_json, create=bool(processes))
    try:
        target = find(engine, name, payload, match=match, process=processes)
    except LayerflowError as err:  # its message names the message
        _governance_fail(err, as_json)
    started = isinstance(target, Process)
    instance_id = uuid.uuid4().hex[:12] if isinstance(target, Process) else target.id
    with _holding(engine, instance_id, as_json):  # as send: never beside a worker or another command
        if isinstance(target, Process):
            instance = _acting_on(engine.run(engine.start(target, instance_id=instance_id)))
        else:
            instance = _acting_on(_load(engine, instance_id, as_json))
        try:
            instance = engine.send_event(instance, name, payload, actor="cli")
        except LayerflowError as err:
            _governance_fail(err, as_json, prefix=f"message {name!r}: ", instance=instance)
        for notice in instance.notices:  # the files changed since it started, as `send` says
            out.info(f"layerflow: {notice}")
        out.info(f"layerflow: message {name!r} " + (f"started instance {instance.id} of {instance.process_id}"
                                                      if started else f"went to instance {instance.id}"))
        _summary(out, instance, store)
        sys.exit(_exit_code(instance))


@main.command()
@click.option("--fire", is_flag=True, help="resume every instance with a due timer (run this from cron)")
@_now_option
@_store_option
@_model_option
@_json_option
def timers(fire: bool, now: str | None, store: str | None, model: str | None, as_json: bool) -> None:
    """Timers of waiting instances that are due by now (or by --now); with --fire, resume those instances.

    Nothing fires a timer by itself: a run or resume after its due time does. Each instance is
    resumed under its lease, as `resume` does; one that another process holds is skipped. Exit 1
    when a fired instance ends in error (named, with the `resume` that goes on), for cron."""
    out = _Out(as_json)
    engine = _existing_engine(store, model, as_json, clock=_clock(now, as_json))
    due = engine.due_timers() if engine is not None else []
    fired: list[dict[str, Any]] = []
    if fire and engine is not None:
        listed = {item["instance_id"]: item["version"] for item in due}
        for instance_id, version in listed.items():
            fired.append(_fire(engine, instance_id, version))
    # run from cron: an instance whose timer path failed is an error of this run (exit 1), named
    failed = [f for f in fired if f.get("status") == "error"]
    if as_json:
        out.doc({"due": due, "fired": fired})
        if failed:
            sys.exit(EXIT_ERROR)
        return
    for item in due:
        what = f"confirmation {item['id']} times out" if item["kind"] == "confirmation" else f"timer {item['task_id']}"
        click.echo(f"{item['instance_id']}  {what}  due {item['due']}")
    for f in fired:
        line = f"skipped: {f['skipped']}" if "skipped" in f else f"-> {f['status']}"
        if f.get("error"):
            err = f["error"]
            line += (f" [{err.get('kind')}]" + (f" at {err['task_id']}" if err.get("task_id") else "")
                     + f": {err.get('message')}; fix the cause, then `layerflow resume {f['instance_id']}`")
        click.echo(f"{f['instance_id']}  {line}")
    if not due:
        click.echo("no timer is due", err=True)
    if failed:
        sys.exit(EXIT_ERROR)


def _fire(engine: Engine, instance_id: str, version: int) -> dict[str, Any]:
    """Resume one instance whose timer was due at ``version``, holding its lease; what came of it."""
    with holding(engine.store, instance_id, f"cli-timers-{socket.gethostname()}-{os.getpid()}") as holder:
        if holder is not None:
            return {"instance_id": instance_id, "skipped": f"held by {holder}"}
        try:
            instance = engine.load(instance_id)
            if instance.status != "waiting":
                return {"instance_id": instance_id, "skipped": f"now {instance.status}"}
            if instance.version != version and not _still_due(engine, instance):
                # a worker or another `timers --fire` fired it between the listing and the lease
                return {"instance_id": instance_id,
                        "skipped": f"already fired by another process (now version {instance.version})"}
            instance = engine.resume(instance)
        except LayerflowError as err:
            return {"instance_id": instance_id, "skipped": str(err)}
        result = {"instance_id": instance_id, "status": instance.status, "version": instance.version}
        if instance.status == "error" and instance.error:
            result["error"] = dict(instance.error)
        return result


def _still_due(engine: Engine, instance: Instance) -> bool:
    """Whether a timer or confirmation timeout of ``instance`` is due by its clock (the engine's,
    never behind the instance's latest time; as ``Engine.due_timers`` tells it, for this one instance)."""
    now = datetime.fromtimestamp(instance.clock(), timezone.utc)
    head = record_head(engine.store, instance.id)
    return any(item.get("kind") in ("timer", "confirmation") and item.get("due") and _utc(item["due"]) <= now
               for item in head.get("engine", {}).get("waiting_for", []))


@main.command("list")
@click.option("--status", type=click.Choice(get_args(Status)), default=None,
              help="only the instances of this status (as GET /api/instances?status=)")
@click.option("--process", "process_id", default=None, metavar="PROCESS_ID",
              help="only the instances of this process (as GET /api/instances?process_id=)")
@click.option("--limit", type=click.IntRange(min=1), default=None, help="at most N instances (as ?limit=)")
@click.option("--offset", type=click.IntRange(min=0), default=0, help="skip the first N selected (as ?offset=)")
@_store_option
@_queue_option
@_stream_option
@_json_option
def list_instances(status: str | None, process_id: str | None, limit: int | None, offset: int, store: str | None,
                   queue: str | None, stream: str, as_json: bool) -> None:
    """Instances in the store, newest first; one that a worker, `resume` or the server runs right now
    names it (held by ...), so a running one can be told from one that waits on the queue, and a
    waiting one whose timer or answer is being run from one that still waits; one whose entry is in
    the --stream's dead letters names its dead letter, as no worker will run it until it is requeued."""
    from .governance import instance_rows, mark_dead_letters

    engine = _existing_engine(store, None, as_json)
    rows = (instance_rows(engine.store, status, holders=True, process_id=process_id, limit=limit, offset=offset)
            if engine is not None else [])
    mark_dead_letters(rows, _dead_letter_ids(store, queue, stream) if rows else {})
    if as_json:  # `instance_id` as `run --json` names it, beside the store's `id`
        _Out(True).doc(rows)
        return
    for r in rows:
        by = f"  held by {r['held_by']}" if r["held_by"] else ""
        if r.get("dead_letter"):
            by += (f"  dead letter {r['dead_letter']}: no worker runs it (`layerflow worker dead` says why; once "
                   f"fixed, `layerflow worker requeue {r['dead_letter']} --stream {stream}`)")
        click.echo(f"{r['id']}  {r['process_id']}  {r['status']}  v{r['version']}  "
                   f"{time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(r['updated'] or 0))}{by}")


def _dead_letter_ids(store: str | None, queue: str | None, stream: str) -> dict[str, str]:
    """Instance id -> the id of its latest dead letter of ``stream``. Read only when there is a queue to read:
    a Redis store, ``--queue`` or $LAYERFLOW_QUEUE; one that does not answer is named on stderr, and `list`
    lists the store all the same."""
    from .worker import dead_letter_ids, has_queue, queue_client

    url = store or default_store_url()
    if not has_queue(url, queue):
        return {}
    try:
        client = queue_client(url, queue)
    except LayerflowError as err:
        click.echo(f"layerflow: dead letters not read: {err}", err=True)
        return {}
    try:
        return dead_letter_ids(client, stream)
    except LayerflowError as err:
        click.echo(f"layerflow: dead letters of {stream!r} not read: {err}", err=True)
        return {}
    finally:
        client.close()


def _context(instance: Instance, name: str | None, as_json: bool) -> LayeredContext:
    name = name or "main"
    if name not in instance.contexts:
        _fail(f"instance {instance.id} has no context {name!r}; contexts: {', '.join(instance.contexts)}",
              as_json=as_json)
    return instance.contexts[name]


def _short(value: Any, width: int = 60) -> str:
    text = json.dumps(thaw(value), ensure_ascii=False, default=str)
    return text if len(text) <= width else text[: width - 1] + "…"


# ----------------------------------------------------------------------------- governance

# kind -> exit code: what the user asked cannot be done as asked (2), or something broke (1)
_BAD_INPUT_KINDS = frozenset({"not_found", "bad_request", "invalid_state", "invalid_config", "invalid_answer",
                              "invalid_value", "permission_denied"})
# Scores that fire below their threshold (DESIGN.md "Compression": density < 0.15, decay < 0.6,
# toolEfficiency < 0.5); the other two fire above it.
_SCORES = ("density", "redundancy", "decay", "conflict", "toolEfficiency")


def _governance_fail(err: LayerflowError, as_json: bool, prefix: str = "", instance: Instance | None = None) -> NoReturn:
    """Fail as the service refused; the document names the instance when it was found."""
    code = EXIT_BAD_INPUT if err.kind in _BAD_INPUT_KINDS else EXIT_ERROR
    message = str(err)  # the service may name the operation itself ("rollback: context 'main' ...")
    message = message.replace("(`context`: ", "(`--context`: ")  # the service names the REST body's field
    details = _named(instance) if instance is not None else {}
    if getattr(err, "task_id", None):  # the element the refusal is about (a payload's catch event)
        details["task_id"] = err.task_id  # type: ignore[attr-defined]
    _fail(message if prefix and message.startswith(prefix) else f"{prefix}{message}", code, as_json=as_json,
          kind=err.kind, details=details or None)


def _service(store: str | None, as_json: bool) -> Any:
    """The governance service the REST API serves, on the CLI's store: CLI and REST agree."""
    from .governance import GovernanceService

    return GovernanceService(_engine(store, None, _Out(as_json), as_json, create=False))


def _branch_context(service: Any, instance: Instance, name: str | None, as_json: bool) -> LayeredContext:
    """A context by name or by branch id (as the REST API takes it). A branch id that ran in several
    contexts (a loop back through its split) gives the open one, else the latest: stderr says which,
    and names the others, so an audit of an earlier round does not read the latest one's unawares."""
    try:
        ctx: LayeredContext = service.context_of(instance, name)
    except LayerflowError as err:
        _governance_fail(err, as_json, instance=instance)
    ran = service.branch_contexts(instance, name) if name is not None and name not in instance.contexts else []
    if len(ran) > 1:
        click.echo(f"layerflow: branch {name!r} ran in {len(ran)} contexts: {', '.join(ran)}; this is {ctx.name}"
                   f"{', the latest' if ctx.name == ran[-1] else ''}; name another with --context in full", err=True)
    return ctx


def _event_at(tape: Any, seq: int) -> Any:
    if 0 < seq <= len(tape) and tape[seq - 1].seq == seq:  # seqs count from 1 without gaps
        return tape[seq - 1]
    return next((e for e in tape if e.seq == seq), None)


def _writer(instance: Instance, ctx: LayeredContext, layer: Layer, key: str) -> dict[str, Any] | None:
    """The tape event that set the current value of ``layer``/``key``.

    A slot keeps the seq of the event that set it through snapshots and restores, so a
    rolled-back value still names its writer. A branch inherits its parent's slots, whose
    seqs are on the parent's tape: when the event at that seq on this tape does not touch
    the key, the value came from the parent (or its parent)."""
    seq = ctx.layer(layer).seq_of(key)
    owner: LayeredContext | None = ctx
    while owner is not None:
        e = _event_at(owner.tape, seq)
        if e is not None and any(c[0] == layer and c[1] == key for c in e.changes):
            if layer == Layer.HISTORY and key in moved_keys(e):
                # a move is no write: a value another hand left in WORKING keeps its writer
                earlier = _working_writer(instance, owner, e.seq, key)
                if earlier is not None and earlier[1].activity != e.activity:
                    return _attribution(*earlier)
            return _attribution(owner, e)
        parent = instance.branches.get(owner.name, {}).get("parent")
        owner = instance.contexts.get(parent) if parent else None
    return None


def _attribution(owner: LayeredContext, e: Any) -> dict[str, Any]:
    if e.kind == "changes":
        via = (e.data or {}).get("note") or "changes"
    else:
        via = None if e.kind in ("write", "complete") else e.kind
    return {"context": owner.name, "seq": e.seq, "activity": e.activity, "actor": e.actor, "via": via}


def _working_writer(instance: Instance, ctx: LayeredContext, before: int, key: str
                    ) -> tuple[LayeredContext, Any] | None:
    """The last event before seq ``before`` that set WORKING's ``key`` in ``ctx``, or in the context
    it was forked from, before the fork."""
    owner: LayeredContext | None = ctx
    for _ in range(32):  # a branch of a branch ...: as deep as the console's walk goes
        if owner is None:
            return None
        split = None
        for e in reversed(owner.tape):
            if e.seq >= before:
                continue
            if any(c[0] == Layer.WORKING and c[1] == key for c in e.changes):
                return (owner, e) if not any(c[0] == Layer.WORKING and c[1] == key and c[2] is DELETED
                                             for c in e.changes) else None
            if e.kind == EventKind.FORK and e.snapshot is not None:
                split = e.snapshot
                break
        if split is None:
            return None
        owner, before = instance.contexts.get(split.context), split.seq + 1
    return None


def _writer_label(w: dict[str, Any] | None) -> str:
    """``activity (how, actor)``: how only when not a plain write, the actor only when it
    is not the activity itself (the retriever, a join, the compressor, an operator)."""
    if w is None:
        return "-"
    who = w["activity"] or w["actor"]
    extra = [x for x in dict.fromkeys((w["via"], w["actor"])) if x and x != who]
    return f"{who} ({', '.join(extra)})" if extra else who


def _last_activity(instance: Instance, ctx: LayeredContext) -> str | None:
    """The open activity of the context, else the last one begun on it (or on its parents)."""
    owner: LayeredContext | None = ctx
    while owner is not None:
        if owner.current_activity:
            return owner.current_activity
        for e in reversed(owner.tape):
            if e.kind == "begin":
                return str((e.data or {}).get("task_id") or e.activity)
        parent = instance.branches.get(owner.name, {}).get("parent")
        owner = instance.contexts.get(parent) if parent else None
    return None


def _attention_check(instance: Instance, report: dict[str, Any], activity: str | None) -> dict[str, Any]:
    """Each trigger's value against its threshold, and whether it fires (the detector's
    verdict, as ``compress_status`` of the governance service gives it)."""
    from context_layers.attention import FIRE_BELOW, CompressTriggerDetector
    from context_layers.config import ActivityExtensionConfig

    status = report["compress_status"]
    thresholds, fired = status["thresholds"], set(status["would_trigger"])
    layers = report["layers"]
    cfg = instance.process.config(activity) if activity else None
    floor = CompressTriggerDetector().floor(cfg or ActivityExtensionConfig())
    rows = [
        {"name": "token_threshold", "measure": "HISTORY+WORKING tokens", "fires_when": "above",
         "value": layers["L3"]["token_count"] + layers["L4"]["token_count"]},
        {"name": "message_threshold", "measure": "HISTORY entries", "fires_when": "above",
         "value": layers["L3"]["key_count"]},
        *({"name": n, "measure": "attention", "fires_when": "below" if n in FIRE_BELOW else "above",
           "value": report["attention"][n]} for n in _SCORES),
    ]
    for row in rows:
        limit = row["threshold"] = thresholds.get(row["name"])
        row["crossed"] = limit is not None and (row["value"] < limit if row["fires_when"] == "below"
                                                else row["value"] > limit)
        row["fires"] = row["name"] in fired
    return {"activity_id": activity, "config": "activity" if cfg is not None else "defaults",
            "compresses_after": bool(cfg is not None and cfg.compression_configured),
            "scope_tokens": rows[0]["value"], "min_attention_tokens": floor, "triggers": rows,
            "would_trigger": status["would_trigger"], "explain": status["explain"]}


def _prompt_rows(instance: Instance, contexts: list[LayeredContext]) -> dict[str, Any]:
    """The recorded model requests (``llm_call`` notes) and their prefix stability."""
    from .llm import prompt_report, request_messages

    rows = []
    for ctx in contexts:
        for r in prompt_report(ctx.tape):
            rows.append({"context": ctx.name, **r, "messages": request_messages(ctx.tape, r["seq"]),
                         "time": _event_at(ctx.tape, r["seq"]).time})
    rows.sort(key=lambda r: (r["time"], r["seq"]))
    shares = [r["share"] for r in rows if r["share"] is not None]
    return {"requests": rows, "count": len(rows),
            "mean_stability": sum(shares) / len(shares) if shares else None,
            "note": None if rows else "no model calls recorded"}


def _score(value: float) -> str:
    return f"{value:.3f}" if isinstance(value, float) else str(value)


@main.command()
@click.argument("instance_id")
@click.option("--context", "context_name", default=None, help="a context name or branch id (default: main)")
@click.option("--prompts", is_flag=True,
              help="also the recorded model requests: tokens per request and prefix stability")
@click.option("--layer", "--layers", "only_layers", multiple=True, metavar="L3,L4",
              help="only these layers (L0..L5 or their names; repeat or separate by commas)")
@_store_option
@_json_option
def inspect(instance_id: str, context_name: str | None, prompts: bool, only_layers: tuple[str, ...],
            store: str | None, as_json: bool) -> None:
    """The layers of an instance's context: keys, tokens, writers, attention, compressions."""
    from .governance import InspectArgs

    out = _Out(as_json)
    service = _service(store, as_json)
    instance = _acting_on(_load(service.engine, instance_id, as_json))
    shown_layers = _layer_names(only_layers, as_json)
    ctx = _branch_context(service, instance, context_name, as_json)
    activity = _last_activity(instance, ctx)
    if activity is not None and activity not in instance.process.element_ids():
        activity = None  # e.g. a model's own note: no config to score against
    try:
        # the open conflicts of the context named; without --context, the whole instance's
        report = service.inspect(instance.id, InspectArgs(context=ctx.name if context_name else None,
                                                          activity_id=activity))
    except LayerflowError as err:
        _governance_fail(err, as_json, instance=instance)
    preserved = set(report["preserved"])
    tables: dict[str, list[dict[str, Any]]] = {}
    for layer in Layer:
        view = ctx.layer(layer)
        if str(layer) not in shown_layers:
            continue
        tables[str(layer)] = [{"key": k, "tokens": ctx.key_tokens(layer, k), "preview": _short(view[k]),
                               "preserved": k in preserved, "written_by": _writer(instance, ctx, layer, k)}
                              for k in view]
    check = _attention_check(instance, report, activity)
    compressions = report["compress_status"]["compressions"]
    shown = [ctx] if context_name else list(instance.contexts.values())
    prompt_doc = _prompt_rows(instance, shown) if prompts else None
    holder = held_by(service.engine.store, instance.id, instance.status)

    if as_json:
        doc = instance.to_document()  # the `run --json` fields, for this context
        layers = {name: values for name, values in ctx.as_dict().items() if name in shown_layers}
        doc.update({"version": report["version"], "held_by": holder,
                    "context": ctx.name, "layers": layers,
                    "tokens": ctx.token_report(), "attention": report["attention"], "attention_check": check,
                    "layer_stats": {name: {**report["layers"][name], "entries": rows}
                                    for name, rows in tables.items()},
                    "context_compressions": compressions, "preserved": report["preserved"],
                    "open_conflicts": report["conflicts"], "branches": report["branches"],
                    "active_config": report["active_config"]})
        if prompt_doc is not None:
            doc["prompts"] = prompt_doc
        out.doc(doc)
        return

    header = f"instance {instance.id} ({instance.process_id}) {instance.status}, context {ctx.name}"
    status_rows = [*_inspect_status_rows(instance, _store_hint(store)), *([["held_by", holder]] if holder else []),
                   ["definition", _definition_text(instance.process.definition())]]
    # the engine compresses after an activity only where its config asks for it
    idle = "so no compression runs after it: `fires` is what a compress request would act on"
    if check["config"] == "activity":
        against = f"thresholds of {activity}" + ("" if check["compresses_after"] else
                                                 f"; {activity} asks for none (no threshold, "
                                                 f"attentionThresholds or compressRules), {idle}")
    else:
        against = "default thresholds" + (f" ({activity} has no config, {idle})" if activity else "")
    if out.tty:
        _inspect_rich(out, header, report, tables, check, against, compressions, prompt_doc, ctx, status_rows)
    else:
        _inspect_plain(header, report, tables, check, against, compressions, prompt_doc, ctx, status_rows)


def _inspect_status_rows(instance: Instance, at: str) -> list[list[str]]:
    """What an operator acts on first, as records of inspect's listing: the error of a failed instance
    (``error``, kind, task, message) and how to go on (``fix``), what a waiting one waits for
    (``waiting``, kind, id, task, due), as `run` prints them (and ``held_by``, added by the caller)."""
    rows: list[list[str]] = []
    if instance.status == "error" and instance.error:
        command = f"`layerflow resume {instance.id}"  # the commands the error names, with the store
        message = str(instance.error.get("message")).replace(command, command + at)
        rows.append(["error", str(instance.error.get("kind")), str(instance.error.get("task_id") or "-"),
                     terminal_text(message)])
        fix = _fix_hint(instance, at)
        if fix:
            rows.append(["fix", fix])
    for w in instance.to_document()["waiting_for"]:
        rows.append(["waiting", str(w["kind"]), str(w["id"]), str(w.get("task_id") or ""), str(w.get("due") or "")])
    return rows


def _definition_text(definition: dict[str, Any]) -> str:
    """The definition an instance runs (``Process.definition``): the one it started with, and
    whether its files on disk still read so."""
    if definition["version"] is None:
        return "the one kept in its record (started before layerflow kept definition versions)"
    files = definition["files"]
    line = f"version {definition['version']} ({', '.join(Path(f['path']).name for f in files)})"
    for state, what in (("changed", "changed on disk since it started"), ("gone", "gone from disk")):
        names = [Path(f["path"]).name for f in files if f["now"] == state]
        if names:
            line += f"; {', '.join(names)} {what}"
    if definition["on_disk"] != "same":
        line += ": the instance runs the version it started with, new instances the files as they are"
    return line


def _layer_names(given: tuple[str, ...], as_json: bool) -> list[str]:
    """The layers `--layer` names (all six when none), in layer order."""
    if not given:
        return [str(layer) for layer in Layer]
    chosen: set[Layer] = set()
    for text in (part for value in given for part in value.split(",") if part.strip()):
        try:
            chosen.add(Layer.parse(text))
        except ValueError as err:
            _fail(f"--layer {text.strip()}: {err}", as_json=as_json)
    return [str(layer) for layer in sorted(chosen)]


def _score_cells(row: dict[str, Any]) -> tuple[str, str, str]:
    op = "<" if row["fires_when"] == "below" else ">"
    limit = "not set" if row["threshold"] is None else f"{op} {row['threshold']}"
    verdict = "fires" if row["fires"] else ("crossed, scope under the floor" if row["crossed"] else "-")
    return _score(row["value"]), limit, verdict


def _compression_line(c: dict[str, Any]) -> str:
    before, after = c.get("tokens_before"), c.get("tokens_after")
    ratio = f" (ratio {c['ratio']:.2f})" if isinstance(c.get("ratio"), float) else ""
    return (f"{c.get('activity_id')}\t{before} -> {after} tokens{ratio}\t{', '.join(c.get('triggers') or [])}\t"
            f"snapshot {c.get('snapshot_id')}{_undone_text(c.get('undone'))}")


def _attention_delta(c: dict[str, Any]) -> str:
    a, b = c.get("attention_before") or {}, c.get("attention_after") or {}
    return " ".join(f"{n} {a[n]:.2f}->{b[n]:.2f}" for n in _SCORES if n in a and n in b and a[n] != b[n])


def _prompt_cells(r: dict[str, Any]) -> tuple[str, ...]:
    share = "first" if r["share"] is None else f"{r['share']:.3f}"
    return (f"{r['context']}#{r['seq']}", str(r["task_id"]), str(r["agent"]), str(r["attempt"]), str(r["status"]),
            str(r["tokens"]), str(r["prefix_tokens"]), share)


def _inspect_plain(header: str, report: dict[str, Any], tables: dict[str, list[dict[str, Any]]],
                   check: dict[str, Any], against: str, compressions: list[dict[str, Any]],
                   prompt_doc: dict[str, Any] | None, ctx: LayeredContext, status_rows: list[list[str]]) -> None:
    """Tab-separated lines, one record each, for grep and cut (the value preview last)."""
    lines = [header, *("\t".join(row).rstrip("\t") for row in status_rows),
             "layer\tkey\ttokens\tpreserved\twritten_by\tvalue"]
    for name, rows in tables.items():
        for r in rows:
            lines.append(f"{name}\t{r['key']}\t{r['tokens']}\t{'preserved' if r['preserved'] else ''}\t"
                         f"{_writer_label(r['written_by'])}\t{r['preview']}")
    for name in tables:
        stats = report["layers"][name]
        att = " ".join(f"{k}={v:.2f}" for k, v in stats["attention_score"].items())
        lines.append(f"stats\t{name} {Layer.parse(name).name}\t{stats['key_count']} keys\t{stats['token_count']} tokens"
                     f"\tattention {att}")
    lines.append(f"attention\t{check['scope_tokens']} tokens in HISTORY+WORKING, {against}")
    for row in check["triggers"]:
        lines.append("threshold\t" + row["name"] + "\t" + "\t".join(_score_cells(row)))
    if any(r["crossed"] and not r["fires"] for r in check["triggers"]):
        lines.append(f"note\tattention triggers need {check['min_attention_tokens']} tokens in scope")
    for c in compressions:
        lines.append(f"compression\t{_compression_line(c)}\t{_attention_delta(c)}".rstrip())
    if prompt_doc is not None:
        if not prompt_doc["requests"]:
            lines.append("prompts\tno model calls recorded")
        else:
            lines.append("prompt\trequest\ttask\tagent\tattempt\tstatus\ttokens\tprefix_tokens\tstability")
        for r in prompt_doc["requests"]:
            lines.append("prompt\t" + "\t".join(_prompt_cells(r)))
        if prompt_doc["mean_stability"] is not None:
            lines.append(f"prompts\t{prompt_doc['count']} requests\tmean prefix stability "
                         f"{prompt_doc['mean_stability']:.3f}")
    lines.append("tokens " + " ".join(f"{k}={v}" for k, v in ctx.token_report().items()))
    click.echo("\n".join(lines))


def _inspect_rich(out: _Out, header: str, report: dict[str, Any], tables: dict[str, list[dict[str, Any]]],
                  check: dict[str, Any], against: str, compressions: list[dict[str, Any]],
                  prompt_doc: dict[str, Any] | None, ctx: LayeredContext, status_rows: list[list[str]]) -> None:
    from rich.markup import escape
    from rich.table import Table

    console = out.console
    console.print(f"[bold]{escape(header)}[/]", highlight=False)
    for row in status_rows:
        console.print(f"[bold red]{row[0]}[/] {escape(' · '.join(cell for cell in row[1:] if cell))}",
                      highlight=False)
    for name, rows in tables.items():
        stats = report["layers"][name]
        if not rows:
            console.print(f"[bold]{name} {Layer.parse(name).name}[/] · empty", highlight=False)
            continue
        att = " ".join(f"{k}={v:.2f}" for k, v in stats["attention_score"].items())
        table = Table(title=f"{name} {Layer.parse(name).name} · {stats['key_count']} keys · "
                            f"{stats['token_count']} tokens", caption=f"attention {att}",
                      title_justify="left", caption_justify="left", expand=False)
        table.add_column("key", overflow="fold")
        table.add_column("tokens", justify="right")
        for col in ("", "written by", "value"):
            table.add_column(col, overflow="ellipsis")
        for r in rows:
            table.add_row(escape(r["key"]), str(r["tokens"]), "[green]preserved[/]" if r["preserved"] else "",
                          escape(_writer_label(r["written_by"])), escape(r["preview"]))
        console.print(table)
    console.print(f"[bold]triggers[/] · {check['scope_tokens']} tokens in HISTORY+WORKING · {escape(against)}",
                  highlight=False)
    scores = Table()
    for col in ("trigger", "value", "threshold", ""):
        scores.add_column(col)
    for row in check["triggers"]:
        value, limit, verdict = _score_cells(row)
        style = "red" if row["fires"] else ("yellow" if row["crossed"] else "dim")
        scores.add_row(row["name"], value, limit, f"[{style}]{verdict}[/]")
    if any(r["crossed"] and not r["fires"] for r in check["triggers"]):
        scores.caption = f"attention triggers need {check['min_attention_tokens']} tokens in scope"
    console.print(scores)
    if compressions:
        comp = Table(title="compressions", title_justify="left")
        for col in ("activity", "tokens", "triggers", "undo with", "attention"):
            comp.add_column(col)
        for c in compressions:
            ratio = f" ({c['ratio']:.2f})" if isinstance(c.get("ratio"), float) else ""
            comp.add_row(escape(str(c.get("activity_id"))), f"{c.get('tokens_before')} → {c.get('tokens_after')}{ratio}",
                         ", ".join(c.get("triggers") or []), escape(f"--snapshot {c.get('snapshot_id')}"),
                         _attention_delta(c))
        console.print(comp)
    if prompt_doc is not None:
        if not prompt_doc["requests"]:
            console.print("prompts: no model calls recorded")
        else:
            mean = prompt_doc["mean_stability"]
            pt = Table(title="model requests" + (f" · mean prefix stability {mean:.3f}" if mean is not None else ""),
                       title_justify="left")
            for col in ("request", "task", "agent", "attempt", "status"):
                pt.add_column(col)
            for col in ("tokens", "prefix", "stability"):
                pt.add_column(col, justify="right")
            for r in prompt_doc["requests"]:
                pt.add_row(*(escape(cell) for cell in _prompt_cells(r)))
            console.print(pt)
    console.print("tokens " + " ".join(f"{k}={v}" for k, v in ctx.token_report().items()), highlight=False)


@main.command()
@click.argument("instance_id")
@click.option("--context", "context_name", default=None, help="only this context (default: all, by time)")
@click.option("--kind", default=None, help="event kind or note (write, denied, complete, split, join, conflict, ...)")
@click.option("--activity", default=None, help="events of this activity (BPMN id)")
@click.option("--key", default=None, help="events that change this key")
@click.option("--branch", default=None, help="events of this branch id")
@click.option("--since", type=click.IntRange(min=0), default=None,
              help="from this sequence number (each context numbers its own tape from 1)")
@click.option("--limit", type=click.IntRange(min=1), default=None,
              help="at most this many events, the first ones (as REST's tape?limit=)")
@click.option("--offset", type=click.IntRange(min=0), default=0,
              help="skip this many of the selected events (pages through several contexts; REST's tape?offset=)")
@_store_option
@_json_option
def tape(instance_id: str, context_name: str | None, kind: str | None, activity: str | None, key: str | None,
         branch: str | None, since: int | None, limit: int | None, offset: int, store: str | None,
         as_json: bool) -> None:
    """The events of an instance's tape(s), filtered."""
    engine = _engine(store, None, _Out(as_json), as_json, create=False)
    instance = _acting_on(_load(engine, instance_id, as_json))
    if context_name:  # a context name or a branch id, as inspect and snapshot take it
        names = [_branch_context(_service(store, as_json), instance, context_name, as_json).name]
    else:
        names = list(instance.contexts)
    events = tape_rows(instance, names, kind=kind, activity=activity, branch=branch, key=key, since=since,
                       limit=limit, offset=offset)
    if not events and offset:
        click.echo(f"layerflow: offset {offset} is past the end of the events the filters select", err=True)
    elif not events:  # a typo in a filter, or filters that exclude each other: say which (REST: the note)
        miss, _ = tape_miss(instance, names, kind=kind, activity=activity, branch=branch, key=key, since=since)
        click.echo(f"layerflow: {miss}", err=True)
    if as_json:
        _Out(True).doc([event_document(name, e) for name, e in events])
        return
    for name, e in events:
        note = e.data.get("note") if e.data else None
        what = f"{e.kind}{':' + note if note else ''}"
        changes = ", ".join(f"L{c[0]}.{c[1]}" for c in e.changes[:6]) + (" …" if len(e.changes) > 6 else "")
        snap = (e.data or {}).get("snapshot_id") or (e.data or {}).get("snapshot")
        if isinstance(snap, str):  # the id `rollback --snapshot` takes, where one was taken or restored
            label = (e.data or {}).get("label")
            changes = f"{snap}{' (' + label + ')' if isinstance(label, str) else ''}" + (f"\t{changes}" if changes else "")
        if note and not changes:  # a note changes nothing: what it decided is the line's point
            changes = _note_detail(e.data)
        elif e.kind == EventKind.RESTORE and (e.data or {}).get("reason"):  # why, for the audit trail
            changes += f"\treason={_short(e.data['reason'])}"
        elif e.kind == EventKind.DENIED and e.data and "key" in e.data:  # what was refused, where
            changes = (f"{e.data.get('op', 'write')} L{e.data.get('effective')}.{e.data['key']} refused"
                       f" (requested L{e.data.get('requested')})")
        click.echo(f"{name}#{e.seq}\t{what}\t{e.actor}\t{e.activity or ''}\t{changes}".rstrip())


# What an auditor reads first in a note, in this order; the rest is in `tape --json`.
_NOTE_FIELDS = ("key", "conflicting_values", "resolver", "outcome", "confirmation_id", "value", "branch",
                "decided_by", "branches", "conflicts", "detail")
# notes of their own: an operator's changes (what was injected: its writes are the lines before; refused or
# reconfigured, and why), and a retrieval's lookup
_NOTE_FIELDS_BY_NOTE = {
    "governance": ("op", "layer", "keys", "reason"),
    "governance_denied": ("op", "key", "requested_layer", "effective_layer", "reason"),
    "config_change": ("activity_id", "config_version", "mode", "change", "reason"),
    # a refused answer or payload: whose, and what was refused (a form's fields, an engine key)
    "answer_refused": ("task_id", "instance", "key", "problems", "reason"),
    "model_answer_refused": ("key", "reason"),
    "event_refused": ("event", "caught_at", "key", "reason"),
    # what was looked up and found: a misspelt collection or template key finds nothing
    "retrieval": ("collections", "query", "kept", "dropped", "missing", "absent"),
}


def _note_detail(data: Mapping[str, Any]) -> str:
    fields = _NOTE_FIELDS_BY_NOTE.get(str(data.get("note")), _NOTE_FIELDS)
    return ", ".join(f"{f}={_short(data[f])}" for f in fields if data.get(f) is not None)


@main.command()
@click.argument("instance_id")
@click.argument("until_arg", metavar="[SEQ]", type=int, required=False)
@click.option("--until", "until", type=int, default=None,
              help="the sequence number to stop at (inclusive; or give it as the second argument; "
                   "default: the end of the tape)")
@click.option("--context", "context_name", default=None, help="a branch context (default: main)")
@_store_option
@_json_option
def replay(instance_id: str, until_arg: int | None, until: int | None, context_name: str | None,
           store: str | None, as_json: bool) -> None:
    """The context as it was at a sequence number of its tape (default: its end), rebuilt from the tape."""
    engine = _engine(store, None, _Out(as_json), as_json, create=False)
    # found first: a refused sequence number shows the instance as it is (`--json`)
    instance = _acting_on(_load(engine, instance_id, as_json))
    if until is not None and until_arg is not None and until != until_arg:
        _fail(f"two sequence numbers given: {until_arg} and --until {until}; name one", as_json=as_json)
    until = until if until is not None else until_arg
    if until is not None and until < 0:
        _fail(f"--until {until}: a tape sequence number counts from 1 (0: before the first event); "
              f"`layerflow tape {instance.id}` lists them", as_json=as_json)
    # a context name or a branch id, as inspect and snapshot take it
    ctx = _branch_context(_service(store, as_json), instance, context_name, as_json)
    end = ctx.tape[-1].seq if len(ctx.tape) else 0
    asked = until
    # the whole tape without `--until`; past its end, its last state: `until` is where the state
    # stands, as REST replay gives it, and `until_requested` what was asked
    until = end if asked is None else min(asked, end)
    rebuilt = LayeredContext.replay(ctx.tape, until=until, name=ctx.name)
    layers = rebuilt.as_dict()
    # the tape's end under both names, this one's and REST replay's (``tape_last_seq``)
    doc = {"instance_id": instance.id, "context": ctx.name, "until": until, "until_requested": asked,
           "tape_end": end, "tape_last_seq": end, "layers": layers, "tokens": rebuilt.token_report()}
    if as_json:
        _Out(True).doc(doc)
        return
    past = f" (the tape ends at #{end}: this is its last state)" if asked is not None and asked > end else ""
    click.echo(f"context {ctx.name} of {instance.id} at #{until}{past}")
    for layer, values in layers.items():
        for k, v in values.items():
            click.echo(f"{layer}\t{k}\t{_short(v)}")


def _snapshot_lines(snapshots: list[dict[str, Any]]) -> list[str]:
    return [f"{s['snapshot_id']}\t{s['context']}#{s['seq']}\t{s['label'] or ''}".rstrip() for s in snapshots]


@main.command()
@click.argument("instance_id")
@click.argument("snapshot_arg", metavar="[SNAPSHOT_ID_OR_LABEL]", required=False)
@click.option("--snapshot", "snapshot_id", default=None, metavar="SNAPSHOT_ID",
              help="the snapshot to go back to, by id or by a label only it has (`layerflow snapshot ID --list` "
                   "shows them all with their labels; `layerflow tape "
                   "ID --kind snapshot` those of splits, compressions and operators, `--kind begin` the one each "
                   "activity took as it began); may be given as the second argument instead")
@click.option("--context", "context_name", default=None,
              help="the context that took the snapshot (default: the one that did)")
@click.option("--layers", "--layer", "layers", default=None, metavar="L3,L4",
              help="only these layers (default: KNOWLEDGE..EPHEMERAL; SYSTEM and PROCESS never roll back)")
@click.option("--reason", default=None, help="why, for the audit trail on the tape")
@_store_option
@_json_option
def rollback(instance_id: str, snapshot_arg: str | None, snapshot_id: str | None, context_name: str | None,
             layers: str | None, reason: str | None, store: str | None, as_json: bool) -> None:
    """Put a context's layers back to a snapshot: a restore event on the tape; nothing is deleted."""
    from pydantic import ValidationError

    from .governance import RollbackArgs, recent_snapshots, snapshot_id_of, snapshot_list

    if snapshot_arg is not None and snapshot_id is not None and snapshot_arg != snapshot_id:
        _fail(f"two snapshots given: {snapshot_arg!r} and --snapshot {snapshot_id!r}; name one",
              as_json=as_json, details={"instance_id": instance_id})
    snapshot_id = snapshot_id or snapshot_arg

    service = _service(store, as_json)
    instance = _acting_on(_load(service.engine, instance_id, as_json))
    ctx = _branch_context(service, instance, context_name, as_json) if context_name else None
    known = snapshot_list(instance, ctx)
    where = f" context {ctx.name!r} of" if ctx is not None else ""
    details = {**_named(instance), "recent_snapshots": known[:5]}
    if not snapshot_id:
        _fail(f"name the snapshot: --snapshot SNAPSHOT_ID; recent snapshots of{where} instance {instance.id}: "
              f"{recent_snapshots(known)}", as_json=as_json, details=details)
    try:  # its id, or a label only that snapshot has
        snapshot_id = snapshot_id_of(instance, snapshot_id, ctx)
    except LayerflowError as err:
        _fail(str(err), as_json=as_json, kind=err.kind, details={**details, **err.to_dict()})
    chosen = [x.strip() for x in layers.split(",") if x.strip()] if layers is not None else None
    if chosen is not None:
        try:
            parsed = [Layer.parse(x) for x in chosen]
        except ValueError as err:
            _fail(f"--layers {layers}: {err}", as_json=as_json)
        fixed = [str(x) for x in parsed if x < Layer.KNOWLEDGE]
        if fixed:
            _fail(f"--layers {layers}: {', '.join(fixed)}: SYSTEM and PROCESS never roll back (SYSTEM is frozen, "
                  "PROCESS only grows); name layers among L2..L5, or leave --layers out for all of them",
                  as_json=as_json)
    try:
        args = RollbackArgs(snapshot_id=snapshot_id, layers=chosen, context=ctx.name if ctx else None, reason=reason)
        result = service.rollback(instance.id, args, actor="cli")
    except ValidationError as err:
        _fail(f"rollback: {_args_problem(err)}", as_json=as_json)
    except LayerflowError as err:
        _governance_fail(err, as_json, prefix="rollback: ", instance=instance)
    if as_json:
        _Out(True).doc(result)
        return
    before, after = result["tokens_before"]["total"], result["tokens_after"]["total"]
    click.echo(f"context {result['context']} of {result['instance_id']} rolled back to {snapshot_id} "
               f"({', '.join(result['restored_layers'])}) by tape event #{result['event_seq']}; tokens {before} -> {after}")
    if result.get("activity_ended"):
        click.echo(f"activity {result['activity_ended']} was open and began after that snapshot: it ended (its "
                   f"conversation with the model dropped); `layerflow resume {result['instance_id']}` runs it again")


@main.command()
@click.argument("instance_id")
@click.option("--context", "context_name", default=None, help="a context name or branch id (default: main)")
@click.option("--label", default=None,
              help="a label shown beside the snapshot's id (`snapshot ID --list`, `tape`); rollback takes its id, "
                   "or the label while no other snapshot has it")
@click.option("--list", "list_them", is_flag=True, help="list the instance's snapshots instead of taking one")
@_store_option
@_json_option
def snapshot(instance_id: str, context_name: str | None, label: str | None, list_them: bool, store: str | None,
             as_json: bool) -> None:
    """Take a snapshot of a context (all six layers) and print its id."""
    from .governance import SnapshotArgs, snapshot_list

    service = _service(store, as_json)
    instance = _acting_on(_load(service.engine, instance_id, as_json))
    ctx = _branch_context(service, instance, context_name, as_json)
    if list_them:
        known = snapshot_list(instance, ctx if context_name else None)
        if as_json:
            _Out(True).doc({"instance_id": instance.id, "snapshots": known})
        else:
            click.echo("\n".join(_snapshot_lines(known)) or "no snapshots")
        return
    from pydantic import ValidationError

    try:
        result = service.snapshot(instance.id, SnapshotArgs(label=label, context=ctx.name), actor="cli")
    except ValidationError as err:
        _fail(f"snapshot: {_args_problem(err)}", as_json=as_json)
    except LayerflowError as err:
        _governance_fail(err, as_json, prefix="snapshot: ", instance=instance)
    if as_json:
        _Out(True).doc(result)
    else:
        click.echo(result["snapshot_id"])


@main.command()
@click.option("--json", "as_json", is_flag=True, help="the same one JSON document (taken as every command takes it)")
def schema(as_json: bool) -> None:
    """The JSON Schema of an activity's config (ActivityExtensionConfig), for editors and CI."""
    from context_layers.config import config_json_schema

    if as_json:  # the one document on the real stdout, as every --json command gives it
        _Out(True).doc(config_json_schema())
        return
    click.echo(json.dumps(config_json_schema(), indent=2, ensure_ascii=False))


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

importlib.import_module(".cli_worker", __package__)  # `layerflow worker`, `layerflow submit`: Redis workers

if __name__ == "__main__":  # pragma: no cover
    # `python -m engine.cli` runs this file as __main__; cli_worker registered its commands on
    # the importable engine.cli.main, so run that one (else `worker`/`submit` are missing)
    from engine.cli import main as _registered_main

    _registered_main(prog_name="layerflow")
