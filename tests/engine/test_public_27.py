"""Public models, each in ``tests/engine/public27/`` (``public27/README.md`` names its repository, path and
licence): the BPMN MIWG's A.2.1 (conditional flows out of tasks, BonitaSoft), SpiffWorkflow's own test
models (an escalation with a payload, a multi-instance task with pre/post scripts, an event-based gateway in
a loop, a message boundary event with two lanes, an ioSpecification on a task, a collaboration with a black-box
pool and a correlation key) and Operaton's examples (event sub-processes, a compensation saga). Each is
validated as given (what layerflow refuses is named with the element and what to write), then run, edited as
validate says, and its path and data are compared with plain SpiffWorkflow's where plain SpiffWorkflow is
right."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from SpiffWorkflow.bpmn.util.event import BpmnEvent
from SpiffWorkflow.bpmn.workflow import BpmnWorkflow
from SpiffWorkflow.spiff.parser.process import SpiffBpmnParser
from SpiffWorkflow.util.task import TaskState

from engine import BpmnError, Engine, load_process
from engine.validate import validate_process

from engine_helpers import path_of, run_plain_files, variables

HERE = Path(__file__).resolve().parent / "public27"
COLLABORATION = HERE / "spiff_collaboration_black_box_pool.bpmn"


def problems(path: Path) -> list[tuple[str, str | None, str]]:
    return [(p.severity, p.element_id, str(p)) for p in validate_process([path]).problems]


def edited(tmp_path: Path, path: Path, *changes: tuple[str, str]) -> Path:
    text = path.read_text()
    for old, new in changes:
        assert old in text, old
        text = text.replace(old, new)
    out = tmp_path / path.name
    out.write_text(text)
    return out


# -- SpiffWorkflow's collaboration: a correlation property read over a payload key named 'from' ----------------

def test_a_payload_key_that_is_a_python_keyword_is_named_with_the_rewrite_that_reads_it() -> None:
    """'from.name' is no Python (plain SpiffWorkflow stops with a bare SyntaxError when the response
    comes); validate said only 'fix the correlation retrieval expression'."""
    found = problems(COLLABORATION)
    said = [text for severity, element, text in found if (severity, element) == ("error", "lover_name")
            and "from.name" in text]
    assert len(said) == 1, found
    text = said[0]
    assert "'from' is a Python keyword" in text
    assert "a key named 'from' cannot be read by its name" in text
    assert "write \"globals()['from']['name']\"" in text
    assert "fix the correlation retrieval expression" not in text


def test_the_rewritten_correlation_reads_the_key_and_the_response_is_caught(tmp_path: Path) -> None:
    fixed = edited(tmp_path, COLLABORATION, (">lover.name<", ">lover['name']<"),
                   (">from.name<", ">globals()['from']['name']<"))
    assert [p for p in validate_process([fixed]).problems if p.severity == "error"] == []
    engine = Engine(store="memory://")
    instance = engine.run(engine.start(load_process([fixed]), {"lover": {"name": "Peggy"}}))
    assert [(w["task_id"], w["event"]) for w in instance.waiting_for] == [("EventReceiveLetter",
                                                                           "Love Letter Response")]
    instance = engine.send_event(instance, "Love Letter Response", {"from": {"name": "Peggy"}})
    assert instance.status == "completed"
    assert variables(instance.context) == {"lover": {"name": "Peggy"}, "from": {"name": "Peggy"}}
