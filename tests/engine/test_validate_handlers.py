"""validate's ``handler_not_found``: a config's ``handler: file.py:function`` (or
``package.module:function``) whose file, module or function is not there, named with the element,
the field and what to do; a handler file is read for every reference to it, as it is now."""

from __future__ import annotations

from pathlib import Path

from engine.validate import validate_process

BPMN = """<?xml version="1.0" encoding="UTF-8"?>
<bpmn:definitions xmlns:bpmn="http://www.omg.org/spec/BPMN/20100524/MODEL" id="d" targetNamespace="x">
  <bpmn:process id="vh" isExecutable="true">
    <bpmn:startEvent id="s"><bpmn:outgoing>f1</bpmn:outgoing></bpmn:startEvent>
    <bpmn:task id="score"><bpmn:incoming>f1</bpmn:incoming><bpmn:outgoing>f2</bpmn:outgoing></bpmn:task>
    <bpmn:task id="decide"><bpmn:incoming>f2</bpmn:incoming><bpmn:outgoing>f3</bpmn:outgoing></bpmn:task>
    <bpmn:endEvent id="e"><bpmn:incoming>f3</bpmn:incoming></bpmn:endEvent>
    <bpmn:sequenceFlow id="f1" sourceRef="s" targetRef="score"/>
    <bpmn:sequenceFlow id="f2" sourceRef="score" targetRef="decide"/>
    <bpmn:sequenceFlow id="f3" sourceRef="decide" targetRef="e"/>
  </bpmn:process>
</bpmn:definitions>
"""

HANDLERS = """from engine import activity

RATE = 3

@activity("decide_it")
def registered(ctx):
    return {}

def score_it(ctx):
    return {}
"""


def _process(tmp_path: Path, score: str, decide: str, handlers: str | None = HANDLERS) -> Path:
    bpmn = tmp_path / "vh.bpmn"
    bpmn.write_text(BPMN)
    (tmp_path / "vh.layerflow.yaml").write_text(f"score:\n  handler: {score}\ndecide:\n  handler: {decide}\n")
    if handlers is not None:
        (tmp_path / "handlers.py").write_text(handlers)
    return bpmn


def _not_found(bpmn: Path) -> dict[str, str]:
    report = validate_process(bpmn)
    return {p.element_id: p.message for p in report.problems if p.code == "handler_not_found"
            if p.element_id is not None and p.field == "handler" and p.file.endswith("vh.layerflow.yaml")}


def test_functions_a_file_defines_or_registers_are_found(tmp_path: Path) -> None:
    assert _not_found(_process(tmp_path, "handlers.py:score_it", "handlers.py:decide_it")) == {}
    # a top-level name the file assigns is a callable it may hold too
    assert _not_found(_process(tmp_path, "handlers.py:RATE", "handlers.py:registered")) == {}


def test_a_missing_function_is_named_with_the_one_meant_and_the_functions_there(tmp_path: Path) -> None:
    found = _not_found(_process(tmp_path, "handlers.py:score_itt", "handlers.py:decide_it"))
    assert list(found) == ["score"]
    assert "handlers.py defines no 'score_itt'" in found["score"]
    assert "did you mean 'score_it'" in found["score"]
    assert "its functions: registered, score_it" in found["score"]


def test_every_reference_reads_the_file_as_it_is_now(tmp_path: Path) -> None:
    bpmn = _process(tmp_path, "handlers.py:score_it", "handlers.py:decide_it")
    assert _not_found(bpmn) == {}
    (tmp_path / "handlers.py").write_text(HANDLERS.replace("def score_it", "def score_other"))
    found = _not_found(bpmn)
    assert list(found) == ["score"] and "defines no 'score_it'" in found["score"]
    (tmp_path / "handlers.py").write_text(HANDLERS)
    assert _not_found(bpmn) == {}


def test_a_missing_file_a_syntax_error_and_a_missing_module_say_what_to_do(tmp_path: Path) -> None:
    found = _not_found(_process(tmp_path, "nowhere.py:score_it", "no_such_package.handlers:decide_it"))
    assert "nowhere.py not found; paths are relative to the process folder" in found["score"]
    assert "no module 'no_such_package.handlers' can be imported; check the name" in found["decide"]
    found = _not_found(_process(tmp_path, "handlers.py:score_it", "handlers.py:decide_it",
                                handlers="def score_it(ctx):\n    return {\n"))
    assert set(found) == {"score", "decide"}
    assert all("handlers.py line 2:" in m and "fix the handler file" in m for m in found.values()), found


def test_a_star_import_cannot_be_told_without_running_it(tmp_path: Path) -> None:
    assert _not_found(_process(tmp_path, "handlers.py:anything", "handlers.py:decide_it",
                               handlers="from os.path import *\n")) == {}
