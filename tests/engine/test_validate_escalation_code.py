"""`escalation_without_code`: a thrown bpmn:escalation with no escalationCode is a warning (every
catch that names such an escalation, and every catch-all, catches it); the process still runs."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from engine_helpers import cli_in_a_tmp_store, flow, run_json, script_task, write_elements

from engine.validate import validate_process

cli = cli_in_a_tmp_store  # the fixture "cli", here too


def _escalating(tmp_path: Path, escalation: str | None, *, throw: bool = True) -> Path:
    """A sub-process ``work`` that (with ``throw``) throws escalation ``heads_up`` and ends; a
    non-interrupting catch-all boundary event (no escalationRef) on it runs ``side``."""
    code = "" if escalation is None else f' escalationCode="{escalation}"'
    inside = ('<bpmn:intermediateThrowEvent id="raise_it"><bpmn:escalationEventDefinition escalationRef="heads_up"/>'
              '</bpmn:intermediateThrowEvent>' + flow("work_start", "raise_it") + flow("raise_it", "work_end")
              if throw else flow("work_start", "work_end"))
    return write_elements(tmp_path, "escalating", [
        '<bpmn:startEvent id="start"/>',
        '<bpmn:subProcess id="work"><bpmn:startEvent id="work_start"/>' + inside
        + '<bpmn:endEvent id="work_end"/></bpmn:subProcess>',
        '<bpmn:boundaryEvent id="noticed" attachedToRef="work" cancelActivity="false">'
        '<bpmn:escalationEventDefinition/></bpmn:boundaryEvent>',
        script_task("side", "noted = True"), '<bpmn:endEvent id="side_end"/>', '<bpmn:endEvent id="end"/>',
        flow("start", "work"), flow("noticed", "side"), flow("side", "side_end"), flow("work", "end"),
    ], f'  <bpmn:escalation id="heads_up" name="heads up"{code}/>\n')


def _warnings(path: Path) -> list[Any]:
    report = validate_process(path)
    assert report.ok, report.format_report()
    return [p for p in report.warnings if p.code == "escalation_without_code"]


def test_a_thrown_escalation_without_a_code_is_a_warning_and_still_runs(tmp_path: Path, cli: Any) -> None:
    path = _escalating(tmp_path, None)
    [warning] = _warnings(path)
    assert (warning.element_id, warning.field, warning.file) == ("heads_up", "escalationCode", str(path))
    assert "raise_it" in warning.message and "escalationCode" in warning.message
    assert "catch-all" in warning.message
    doc = run_json(cli, "run", str(path))
    assert doc["status"] == "completed" and doc["error"] is None


def test_no_warning_with_a_code_or_for_a_catch_all_alone(tmp_path: Path) -> None:
    assert _warnings(_escalating(_dir(tmp_path, "coded"), "H1")) == []
    assert _warnings(_escalating(_dir(tmp_path, "catch_only"), None, throw=False)) == []


def _dir(tmp_path: Path, name: str) -> Path:
    (tmp_path / name).mkdir()
    return tmp_path / name
