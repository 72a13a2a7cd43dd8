"""Process shapes that once ran differently under layerflow than under plain SpiffWorkflow.

Each test runs a small BPMN written here under both and compares the path taken (the
completed tasks' BPMN ids, in order), the status and the variables, except where layerflow
keeps what plain SpiffWorkflow loses at a join (then both values are asserted)."""

from __future__ import annotations

from pathlib import Path
from typing import Any
from xml.sax.saxutils import escape

from engine import Engine, load_process

from engine_helpers import path_of, run_plain, variables

HEAD = """<?xml version="1.0" encoding="UTF-8"?>
<bpmn:definitions xmlns:bpmn="http://www.omg.org/spec/BPMN/20100524/MODEL"
                  xmlns:spiffworkflow="http://spiffworkflow.org/bpmn/schema/1.0/core"
                  id="conformance_defs" targetNamespace="https://layerflow.dev/tests">
"""


def script(task_id: str, text: str) -> str:
    return f'<bpmn:scriptTask id="{task_id}"><bpmn:script>{escape(text)}</bpmn:script></bpmn:scriptTask>'


def flow(source: str, target: str, condition: str | None = None) -> str:
    if condition is None:
        return f'<bpmn:sequenceFlow id="{source}_to_{target}" sourceRef="{source}" targetRef="{target}"/>'
    return (f'<bpmn:sequenceFlow id="{source}_to_{target}" sourceRef="{source}" targetRef="{target}">'
            f'<bpmn:conditionExpression>{escape(condition)}</bpmn:conditionExpression></bpmn:sequenceFlow>')


def write(tmp_path: Path, pid: str, elements: list[str], extra: str = "") -> Path:
    body = "\n    ".join(elements)
    path = tmp_path / f"{pid}.bpmn"
    path.write_text(f'{HEAD}  <bpmn:process id="{pid}" isExecutable="true">\n    {body}\n  </bpmn:process>\n'
                    f"{extra}</bpmn:definitions>\n", encoding="utf-8")
    return path


def run_ours(path: Path, data: dict[str, Any] | None = None, engine: Engine | None = None) -> Any:
    engine = engine or Engine()
    return engine.run(engine.start(load_process(path), data or {}))


# ----- a parallel split and join inside a loop ---------------------------------------------------

def test_a_parallel_split_and_join_inside_a_loop(tmp_path: Path) -> None:
    """Each pass forks and joins again. SpiffWorkflow keeps the join instances of the earlier
    passes (the ones each firing cancelled); the second pass once took their branches, merged
    back already, for branches of another split and failed."""
    path = write(tmp_path, "fork_in_loop", [
        '<bpmn:startEvent id="start"/>', script("init", "i = 0\nseen = []"),
        '<bpmn:exclusiveGateway id="again"/>', '<bpmn:parallelGateway id="fork"/>',
        script("collect", "seen = seen + ['pass ' + str(i)]"), script("double", "doubled = i * 2"),
        '<bpmn:parallelGateway id="join"/>', script("next", "i += 1"),
        '<bpmn:exclusiveGateway id="more" default="more_to_end"/>', '<bpmn:endEvent id="end"/>',
        flow("start", "init"), flow("init", "again"), flow("again", "fork"), flow("fork", "collect"),
        flow("fork", "double"), flow("collect", "join"), flow("double", "join"), flow("join", "next"),
        flow("next", "more"), flow("more", "again", "i < 3"),
        '<bpmn:sequenceFlow id="more_to_end" sourceRef="more" targetRef="end"/>',
    ])
    plain_wf, plain_vars = run_plain(path, {}, {})
    instance = run_ours(path)

    assert instance.status == "completed", instance.error
    assert path_of(instance.workflow) == path_of(plain_wf)
    assert path_of(plain_wf).count("join") == 3
    ours = variables(instance.main)
    # "double" arrives last at every join: plain SpiffWorkflow keeps its stale copy of `seen`
    assert plain_vars.pop("seen") == [] and ours.pop("seen") == ["pass 0", "pass 1", "pass 2"]
    assert ours == plain_vars == {"i": 3, "doubled": 4}
    assert {info["status"] for info in instance.branches.values()} == {"joined"}
    assert len(instance.branches) == 6
