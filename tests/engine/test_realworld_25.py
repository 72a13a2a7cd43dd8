"""Public models, round 25, each in ``tests/engine/realworld25/`` (the file's header comment names its
source; ``realworld25/SOURCES.md`` lists repositories, paths, commits and licences): Flowable's engine test
models of signal event sub-processes (interrupting and not, one running an embedded sub-process, two
without ids), a signal boundary event on a user task and a terminate end event in an event sub-process,
and jBPM's ... Each is validated as given (validate says what is wrong, naming the element and what to
write), then, edited as validate says, run, and its path and data are checked against plain
SpiffWorkflow's and against what BPMN says."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from engine import Engine, load_process
from engine.validate import validate_process

from engine_helpers import path_of, variables
from test_realworld_17 import said

HERE = Path(__file__).resolve().parent / "realworld25"


def errors(path: Path) -> list[tuple[str, str | None]]:
    return [(p.code, p.element_id) for p in validate_process([path]).problems if p.severity == "error"]


def with_flow_ids(tmp_path: Path, source: Path, pairs: tuple[tuple[str, str], ...] = ()) -> Path:
    """``source`` with an id on each sequence flow (as validate says: flow1, flow2, ...) and each text of
    ``pairs`` replaced."""
    count = iter(range(1, 100))
    text = re.sub(r"<sequenceFlow (?!id=)", lambda m: f'<sequenceFlow id="flow{next(count)}" ', source.read_text())
    for old, new in pairs:
        assert old in text, old
        text = text.replace(old, new)
    out = tmp_path / source.name
    out.write_text(text)
    return out


def waits(instance: Any) -> list[str]:
    return sorted(w["task_id"] for w in instance.waiting_for)


# -- Flowable: signal event sub-processes without ids ---------------------------------------------

NESTED = HERE / "flowable_signal_interrupting_nested_subprocess.bpmn"
TWO = HERE / "flowable_two_interrupting_signal_event_subprocesses.bpmn"


def test_an_event_sub_process_without_an_id_is_refused_naming_its_start_event(tmp_path: Path) -> None:
    """The event sub-process has no id (BPMN requires one; Flowable makes one up). validate said the
    file was valid once its flows had ids, and starting it crashed in SpiffWorkflow's serializer with
    KeyError 'Duplicate task spec name: None' (plain SpiffWorkflow crashes as its signal arrives)."""
    fixed = with_flow_ids(tmp_path, NESTED)
    [problem] = [p for p in validate_process([fixed]).problems if p.severity == "error"]
    assert (problem.code, problem.element_id, problem.field, problem.line) == ("node_id_missing", None, "id", 21)
    text = str(problem)
    assert "the event sub-process starting at 'eventProcessStart' has no id" in text
    assert 'give it an id unique in the file, e.g. id="eventProcessStart_subprocess"' in text


def test_two_event_sub_processes_without_ids_are_each_named_and_spiffs_duplicate_none_is_not() -> None:
    """SpiffWorkflow refused the file with "Duplicate process ID: None (at bpmn:subProcess)", naming no
    line and no element: the reader had to guess that None was a missing id. Each sub-process is
    named by its start event, with the line and the id to write; the None is not repeated."""
    refused = said(TWO)
    assert "Duplicate process ID" not in "".join(refused.values())
    problems = [p for p in validate_process([TWO]).problems if p.code == "node_id_missing"]
    assert [(p.line, p.field) for p in problems] == [(22, "id"), (32, "id")]
    assert 'e.g. id="eventProcessStart2_subprocess"' in str(problems[1])
    assert sorted(code for code, _ in errors(TWO)) == ["flow_id_missing"] * 6 + ["node_id_missing"] * 2
