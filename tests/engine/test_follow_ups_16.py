"""Follow-ups of round 16.

(1) ``layerflow validate`` warns (``join_reentered_in_loop``) of a parallel join inside a loop whose flow
    back re-enters the section between a parallel split and that join (a second split feeding the
    branches again, or a flow into one branch): the join cannot pair its tokens with one split, and the
    run stops there after running the steps of the wrong pass. A loop around the whole split/join pair,
    and a loop inside one branch, are fine and get no warning.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from engine import Engine, load_process
from engine.validate import validate_process

from engine_helpers import ROOT, flow, write_elements
from engine_helpers import script_task as script


def _reentered(tmp_path: Path, shape: str) -> Path:
    """A parallel section split -> (manual | backbone) -> join -> plan -> gate, and a way back."""
    head = [
        '<bpmn:startEvent id="start"/>', script("init", "runs = 0"), '<bpmn:exclusiveGateway id="round"/>',
        '<bpmn:parallelGateway id="split"/>',
        script("backbone", "b = 1"), '<bpmn:exclusiveGateway id="merge_manual" default="merge_manual_to_join"/>',
        '<bpmn:exclusiveGateway id="merge_backbone" default="merge_backbone_to_join"/>',
        '<bpmn:parallelGateway id="join"/>', script("plan", "runs = runs + 1"),
        '<bpmn:exclusiveGateway id="gate" default="gate_to_end"/>', '<bpmn:endEvent id="end"/>',
        flow("start", "init"), flow("init", "round"), flow("round", "split"), flow("split", "merge_manual"), flow("split", "backbone"),
        flow("backbone", "merge_backbone"), flow("merge_manual", "join"), flow("merge_backbone", "join"),
        flow("join", "plan"), flow("plan", "gate"), flow("gate", "end"),
    ]
    back = {
        # SpiffWorkflow's parallel_join_in_loop: a second split feeds both branches again
        "second split": ['<bpmn:parallelGateway id="again"/>', '<bpmn:userTask id="assess"/>',
                         flow("gate", "again", "runs < 3"), flow("again", "assess"), flow("again", "merge_backbone"),
                         flow("assess", "merge_manual")],
        # the loop goes back into one branch only: the join waits for the other for ever
        "one branch": [flow("gate", "merge_backbone", "runs < 3")],
        # fine: round the whole split/join pair
        "whole pair": [flow("gate", "round", "runs < 3")],
    }[shape]
    return write_elements(tmp_path, "rounds", [*head, *back]).resolve()


@pytest.mark.parametrize(("shape", "flow_id"), [("second split", "again_to_merge_backbone"),
                                                ("one branch", "gate_to_merge_backbone")])
def test_a_loop_back_into_a_parallel_section_is_a_validate_warning(tmp_path: Path, shape: str, flow_id: str) -> None:
    path = _reentered(tmp_path, shape)
    report = validate_process([path])
    found = [p for p in report.problems if p.code == "join_reentered_in_loop"]

    assert report.ok
    assert [(p.severity, p.file, p.element_id) for p in found] == [("warning", str(path), "join")], report.problems
    message = found[0].message
    assert repr(flow_id) in message and "'split'" in message, message
    assert "move the flow back" in message, message


def test_a_loop_round_the_whole_parallel_section_is_no_warning_and_runs(tmp_path: Path) -> None:
    path = _reentered(tmp_path, "whole pair")
    assert [p for p in validate_process([path]).problems if p.code == "join_reentered_in_loop"] == []
    engine = Engine()
    instance = engine.run(engine.start(load_process(path)))
    assert instance.status == "completed", instance.error


def test_the_shipped_examples_get_no_reentered_join_warning() -> None:
    for path in sorted((ROOT / "bpmn_examples").rglob("*.bpmn")):
        found = [p for p in validate_process([path]).problems if p.code == "join_reentered_in_loop"]
        assert found == [], (path, found)
