"""Helpers shared by the engine tests: example paths, plain-SpiffWorkflow runs, paths taken."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from SpiffWorkflow.bpmn.workflow import BpmnWorkflow
from SpiffWorkflow.spiff.parser.process import SpiffBpmnParser
from SpiffWorkflow.util.task import TaskState

from context_layers import thaw

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "bpmn_examples"
LOAN = EXAMPLES / "loan_approval.bpmn"

LOAN_FAST = {"amount": 20000, "applicant_id": "APP003", "purpose": "equipment", "industry": "bakery"}
LOAN_FULL = {"amount": 120000, "applicant_id": "APP002", "purpose": "warehouse expansion", "industry": "logistics"}
LOAN_CONFLICT = {"amount": 120000, "applicant_id": "APP001", "purpose": "business loan", "industry": "gambling"}


def path_of(wf: Any) -> list[str]:
    """BPMN ids of the completed tasks, in completion order."""
    done = [t for t in wf.get_tasks(state=TaskState.COMPLETED) if getattr(t.task_spec, "bpmn_id", None)]
    return [t.task_spec.bpmn_id for t in sorted(done, key=lambda t: t.last_state_change)]


def run_plain(path: Path, data: dict[str, Any], user_tasks: dict[str, dict[str, Any]]) -> tuple[Any, dict[str, Any]]:
    """Run a BPMN file with stock SpiffWorkflow; return the workflow and the final task data."""
    parser = SpiffBpmnParser()
    parser.add_bpmn_file(str(path))
    pid = parser.get_process_ids()[0]
    wf = BpmnWorkflow(parser.get_spec(pid), parser.get_subprocess_specs(pid))
    wf.task_tree.data.update(data)
    wf.do_engine_steps()
    while not wf.is_completed():
        ready = wf.get_tasks(state=TaskState.READY, manual=True)
        assert ready, "plain run is stuck"
        task = ready[0]
        task.data.update(user_tasks[task.task_spec.bpmn_id])
        task.run()
        wf.do_engine_steps()
    return wf, dict(wf.last_task.data)


def run_plain_files(paths: list[Path], pid: str) -> BpmnWorkflow:
    """Run process ``pid`` of several files (a caller and the processes it calls) with stock
    SpiffWorkflow, as far as its engine steps go."""
    parser = SpiffBpmnParser()
    parser.add_bpmn_files([str(p) for p in paths])
    wf = BpmnWorkflow(parser.get_spec(pid), parser.get_subprocess_specs(pid))
    wf.do_engine_steps()
    return wf


def patch_spiff_timer_clock(monkeypatch: pytest.MonkeyPatch, start: datetime) -> list[datetime]:
    """Plain SpiffWorkflow's timers read ``now[0]`` of the returned list from here on (move it to
    move their clock; ``refresh_timers()`` then fires what came due)."""
    from SpiffWorkflow.bpmn.specs.event_definitions import timer as spiff_timer

    now = [start]

    class PatchedDatetime(datetime):
        @classmethod
        def now(cls, tz: Any = None) -> Any:  # type: ignore[override]
            return now[0]

    monkeypatch.setattr(spiff_timer, "datetime", PatchedDatetime)
    return now


def variables(ctx: Any) -> dict[str, Any]:
    """A context's resolved data keys, as a script would see them (no records, no branch keys)."""
    return {k: thaw(v) for k, v in ctx.resolved().items()
            if not k.startswith(("_", "activity:", "kb:", "compaction:", "summary:", "tool:", "event:"))}


BPMN_HEAD = """<?xml version="1.0" encoding="UTF-8"?>
<bpmn:definitions xmlns:bpmn="http://www.omg.org/spec/BPMN/20100524/MODEL"
                  xmlns:xsi="http://www.w3.org/2001/XMLSchema-instance"
                  xmlns:layerflow="https://layerflow.dev/bpmn"
                  id="defs" targetNamespace="https://layerflow.dev/tests">
  <bpmn:process id="{pid}" isExecutable="true">
"""


def chain_bpmn(pid: str, tasks: list[str]) -> str:
    """start -> the given task elements (XML, in order, each with an id="...") -> end."""
    import re

    ids = [re.search(r'id="([^"]+)"', t).group(1) for t in tasks]  # type: ignore[union-attr]
    nodes = ["start", *ids, "end"]
    flows = "".join(f'    <bpmn:sequenceFlow id="f{i}" sourceRef="{a}" targetRef="{b}"/>\n'
                    for i, (a, b) in enumerate(zip(nodes, nodes[1:])))
    body = '    <bpmn:startEvent id="start"/>\n' + "".join(f"    {t}\n" for t in tasks) + '    <bpmn:endEvent id="end"/>\n'
    return BPMN_HEAD.format(pid=pid) + body + flows + "  </bpmn:process>\n</bpmn:definitions>\n"


def script_task(task_id: str, script: str) -> str:
    from xml.sax.saxutils import escape

    return f'<bpmn:scriptTask id="{task_id}"><bpmn:script>{escape(script)}</bpmn:script></bpmn:scriptTask>'


def write_process(tmp_path: Path, pid: str, tasks: list[str], config: str | None = None) -> Path:
    path = tmp_path / f"{pid}.bpmn"
    path.write_text(chain_bpmn(pid, tasks), encoding="utf-8")
    if config is not None:
        (tmp_path / f"{pid}.layerflow.yaml").write_text(config, encoding="utf-8")
    return path


HEAD = """<?xml version="1.0" encoding="UTF-8"?>
<bpmn:definitions xmlns:bpmn="http://www.omg.org/spec/BPMN/20100524/MODEL"
                  xmlns:spiffworkflow="http://spiffworkflow.org/bpmn/schema/1.0/core"
                  id="test_defs" targetNamespace="https://layerflow.dev/tests">
"""


def flow(source: str, target: str, condition: str | None = None) -> str:
    """A sequence flow ``<source>_to_<target>``, with a condition expression when given."""
    from xml.sax.saxutils import escape

    if condition is None:
        return f'<bpmn:sequenceFlow id="{source}_to_{target}" sourceRef="{source}" targetRef="{target}"/>'
    return (f'<bpmn:sequenceFlow id="{source}_to_{target}" sourceRef="{source}" targetRef="{target}">'
            f'<bpmn:conditionExpression>{escape(condition)}</bpmn:conditionExpression></bpmn:sequenceFlow>')


def write_elements(tmp_path: Path, pid: str, elements: list[str], extra: str = "") -> Path:
    """A file holding process ``pid`` made of ``elements`` (XML, flows included), then ``extra``."""
    body = "\n    ".join(elements)
    path = tmp_path / f"{pid}.bpmn"
    path.write_text(f'{HEAD}  <bpmn:process id="{pid}" isExecutable="true">\n    {body}\n  </bpmn:process>\n'
                    f"{extra}</bpmn:definitions>\n", encoding="utf-8")
    return path


@pytest.fixture(name="cli")
def cli_in_a_tmp_store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    """``cli(*args)``: the ``layerflow`` CLI in this process (click's runner), on a sqlite store of the
    test's own; import it into a test module to have the fixture there."""
    from click.testing import CliRunner

    from engine.cli import main

    monkeypatch.setenv("LAYERFLOW_STORE", f"sqlite:///{tmp_path / 'forms.db'}")
    runner = CliRunner()

    def invoke(*args: str) -> Any:
        return runner.invoke(main, list(args), catch_exceptions=False)
    return invoke


def without_due(items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``waiting_for`` items without the ``due`` time a confirmation with a timeout carries (when its
    timeout rule applies), for tests about something else."""
    return [{k: v for k, v in item.items() if k != "due"} for item in items]


def run_json(cli: Any, *args: str, code: int = 0) -> dict[str, Any]:
    """``cli(*args, "--json")`` (the ``cli`` fixture of a module that returns click's result): its
    exit code checked, its stdout as the one JSON document."""
    result = cli(*args, "--json")
    assert result.exit_code == code, (result.stdout, result.stderr)
    doc: dict[str, Any] = json.loads(result.stdout)
    return doc


@contextmanager
def redis_scratch(url: str, name: str) -> Iterator[str]:
    """A key prefix of its own (``NAME-<random>``) on the Redis server at ``url``, its keys deleted
    afterwards; the test is skipped when no Redis answers there."""
    redis = pytest.importorskip("redis")
    client = redis.Redis.from_url(url)
    try:
        client.ping()
    except redis.exceptions.ConnectionError:
        pytest.skip(f"no Redis at {url}")
    prefix = f"{name}-{uuid.uuid4().hex[:10]}"
    try:
        yield prefix
    finally:
        keys = list(client.scan_iter(match=f"{prefix}*", count=1000))
        if keys:
            client.delete(*keys)
        client.close()


def stop_all(procs: list[Any]) -> None:
    """Kill what of the processes a test started still runs, and reap every one of them."""
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=10)


@contextmanager
def store_url(kind: str, sqlite_file: Path, redis_url: str, name: str) -> Iterator[str]:
    """A store URL of ``kind``: ``sqlite`` (the file), or ``redis`` (a key prefix of its own on the
    database ``redis_url`` names, see ``redis_scratch``) for a test parametrised over both."""
    if kind == "sqlite":
        yield f"sqlite:///{sqlite_file}"
        return
    with redis_scratch(redis_url, name) as prefix:
        yield f"{redis_url}?prefix={prefix}"


def wait_until_served(log: Path, proc: Any, *, seconds: float = 60) -> str:
    """The URL a ``layerflow serve --port 0`` started as ``proc`` names on its stderr (written to
    ``log``), once it answers ``/api/health``; fails with the log when the server exits or is late."""
    import re
    import time

    import httpx

    import local_http

    deadline = time.monotonic() + seconds
    while True:
        found = re.search(r"on (http://[0-9.]+:\d+)", log.read_text())
        try:
            if found and local_http.get(f"{found.group(1)}/api/health", timeout=1).status_code == 200:
                return found.group(1)
        except httpx.HTTPError:
            pass
        assert proc.poll() is None and time.monotonic() < deadline, log.read_text()
        time.sleep(0.1)


@contextmanager
def serving_catalog(catalog: Path, store: str, log: Path, token: str, *args: str, **env: str) -> Iterator[Any]:
    """``layerflow serve --port 0 --catalog CATALOG --store STORE`` (extra ``args`` and environment), as
    a user starts it; yields an ``httpx.Client`` on its URL that carries the bearer ``token``. Only the
    server's own process group is stopped afterwards."""
    import os
    import signal
    import subprocess
    import sys

    import httpx

    root = Path(__file__).resolve().parents[2]
    with log.open("w") as err:
        proc = subprocess.Popen([sys.executable, "-m", "engine.cli", "serve", "--host", "127.0.0.1", "--port", "0",
                                 "--catalog", str(catalog), "--store", store, *args],
                                env=dict(os.environ, PYTHONPATH=str(root), LAYERFLOW_API_TOKEN=token, **env),
                                cwd=root, stdout=subprocess.DEVNULL, stderr=err, start_new_session=True)
    try:
        url = wait_until_served(log, proc)
        with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {token}"}, timeout=60) as api:
            yield api
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=10)
