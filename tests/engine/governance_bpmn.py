"""Small BPMN processes written for the governance-config tests: a chain of script (or user)
tasks, and a split/join of script branches (parallel or inclusive), each element
configurable through ``<spiffworkflow:activityConfig>`` JSON."""

from __future__ import annotations

import contextlib
import json
import traceback
from pathlib import Path
from typing import Any
from xml.sax.saxutils import escape

ROOT = Path(__file__).resolve().parents[2]

_HEAD = ('<?xml version="1.0" encoding="UTF-8"?>\n'
         '<bpmn:definitions xmlns:bpmn="http://www.omg.org/spec/BPMN/20100524/MODEL" '
         'xmlns:spiffworkflow="http://spiffworkflow.org/bpmn/schema/1.0/core" '
         'id="defs" targetNamespace="https://example.org/governance">\n'
         '<bpmn:process id="{pid}" isExecutable="true">\n')
_TAIL = '</bpmn:process>\n</bpmn:definitions>\n'
USER = object()  # a chain step that is a user task


def _ext(cfg: dict[str, Any] | None) -> str:
    if not cfg:
        return ""
    return ("<bpmn:extensionElements><spiffworkflow:activityConfig>" + escape(json.dumps(cfg))
            + "</spiffworkflow:activityConfig></bpmn:extensionElements>")


def _task(tid: str, code: Any, inc: str, out: str, cfg: dict[str, Any] | None) -> str:
    flows = f"<bpmn:incoming>{inc}</bpmn:incoming><bpmn:outgoing>{out}</bpmn:outgoing>"
    if code is USER:
        return f'<bpmn:userTask id="{tid}">{_ext(cfg)}{flows}</bpmn:userTask>\n'
    return f'<bpmn:scriptTask id="{tid}">{_ext(cfg)}{flows}<bpmn:script>{escape(code)}</bpmn:script></bpmn:scriptTask>\n'


def _flow(fid: str, source: str, target: str, condition: str | None = None) -> str:
    if condition is None:
        return f'<bpmn:sequenceFlow id="{fid}" sourceRef="{source}" targetRef="{target}"/>\n'
    return (f'<bpmn:sequenceFlow id="{fid}" sourceRef="{source}" targetRef="{target}">'
            f"<bpmn:conditionExpression>{escape(condition)}</bpmn:conditionExpression></bpmn:sequenceFlow>\n")


def chain(pid: str, steps: list[tuple[str, Any]], configs: dict[str, dict[str, Any]] | None = None) -> str:
    """start -> steps in order -> end; a step is (id, script) or (id, USER)."""
    configs = configs or {}
    body = '<bpmn:startEvent id="start"><bpmn:outgoing>f0</bpmn:outgoing></bpmn:startEvent>\n'
    prev = "start"
    for n, (tid, code) in enumerate(steps):
        body += _task(tid, code, f"f{n}", f"f{n + 1}", configs.get(tid)) + _flow(f"f{n}", prev, tid)
        prev = tid
    body += f'<bpmn:endEvent id="end"><bpmn:incoming>f{len(steps)}</bpmn:incoming></bpmn:endEvent>\n'
    body += _flow(f"f{len(steps)}", prev, "end")
    return _HEAD.format(pid=pid) + body + _TAIL


def fork(pid: str, prepare: str, branches: list[tuple[str, str]], *, after: str = "done = True",
         kind: str = "parallel", conditions: dict[str, str] | None = None,
         configs: dict[str, dict[str, Any]] | None = None) -> str:
    """start -> prepare -> split -> one script per branch -> join -> after -> end; the
    gateways are ``split`` and ``join`` (``kind``: parallel or inclusive)."""
    configs, conditions = configs or {}, conditions or {}
    gw = {"parallel": "parallelGateway", "inclusive": "inclusiveGateway"}[kind]
    outs = "".join(f"<bpmn:outgoing>to_{b}</bpmn:outgoing>" for b, _ in branches)
    ins = "".join(f"<bpmn:incoming>from_{b}</bpmn:incoming>" for b, _ in branches)
    body = '<bpmn:startEvent id="start"><bpmn:outgoing>f_s</bpmn:outgoing></bpmn:startEvent>\n'
    body += _task("prepare", prepare, "f_s", "f_p", configs.get("prepare"))
    body += f'<bpmn:{gw} id="split">{_ext(configs.get("split"))}<bpmn:incoming>f_p</bpmn:incoming>{outs}</bpmn:{gw}>\n'
    for b, code in branches:
        body += _task(b, code, f"to_{b}", f"from_{b}", configs.get(b))
        body += _flow(f"to_{b}", "split", b, conditions.get(b)) + _flow(f"from_{b}", b, "join")
    body += f'<bpmn:{gw} id="join">{_ext(configs.get("join"))}{ins}<bpmn:outgoing>f_j</bpmn:outgoing></bpmn:{gw}>\n'
    body += _task("after", after, "f_j", "f_a", configs.get("after"))
    body += '<bpmn:endEvent id="end"><bpmn:incoming>f_a</bpmn:incoming></bpmn:endEvent>\n'
    body += _flow("f_s", "start", "prepare") + _flow("f_p", "prepare", "split")
    body += _flow("f_j", "join", "after") + _flow("f_a", "after", "end")
    return _HEAD.format(pid=pid) + body + _TAIL


def write(folder: Path, name: str, xml: str, yaml_text: str | None = None) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    bpmn = folder / f"{name}.bpmn"
    bpmn.write_text(xml)
    if yaml_text is not None:
        (folder / f"{name}.layerflow.yaml").write_text(yaml_text)
    return bpmn


def cli(*args: str, cwd: Path | None = None) -> tuple[int, Any, str]:
    """``layerflow ARGS``: exit code, the stdout JSON (or None), stderr.

    In this process (click's runner, empty stdin that is no terminal): what these tests check
    is the governance config the command applies, not the process boundary, which
    tests/test_contracts_cli.py crosses. An exception the command lets out is on stderr with
    its traceback and exit code 1, as ``python -m engine.cli`` would show it."""
    from click.testing import CliRunner

    from engine.cli import main

    with contextlib.chdir(cwd) if cwd is not None else contextlib.nullcontext():
        result = CliRunner().invoke(main, list(args), prog_name="layerflow")
    stderr = result.stderr
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        stderr += "".join(traceback.format_exception(result.exception))
    try:
        doc = json.loads(result.stdout)
    except ValueError:
        doc = None
    return result.exit_code, doc, stderr


def data_keys(layer: dict[str, Any]) -> dict[str, Any]:
    """A layer without the engine's records and bookkeeping."""
    return {k: v for k, v in layer.items() if ":" not in k and not k.startswith("_")}
