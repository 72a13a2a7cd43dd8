"""BPMN shapes people draw that the examples do not: empty branches, flows straight to the join."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from engine.cli import main

from engine_helpers import flow, write_elements


def _run(tmp_path: Path, *args: str) -> tuple[int, dict]:
    result = CliRunner().invoke(main, [*args, "--store", f"sqlite:///{tmp_path / 'shapes.db'}", "--json"],
                                catch_exceptions=False)
    return result.exit_code, json.loads(result.stdout)


@pytest.mark.parametrize("kind", ["parallelGateway", "inclusiveGateway"])
def test_two_empty_branches_straight_to_the_join_split_and_merge(tmp_path: Path, kind: str) -> None:
    """Two outgoing flows of a split that both go straight to its join are two branches with
    the same first element: each gets a context of its own (the second named ``join#2``) instead of
    the run failing with "branch ids must be unique"."""
    condition = "a > 0" if kind == "inclusiveGateway" else None
    path = write_elements(tmp_path, "empty_branches", [
        '<bpmn:startEvent id="start"/>',
        f'<bpmn:{kind} id="split"/>',
        '<bpmn:scriptTask id="work"><bpmn:script>x = a + 1</bpmn:script></bpmn:scriptTask>',
        f'<bpmn:{kind} id="join"/>',
        '<bpmn:endEvent id="end"/>',
        flow("start", "split"), flow("split", "work", condition), flow("work", "join"), flow("join", "end"),
        flow("split", "join", condition),
        flow("split", "join", condition).replace('id="split_to_join"', 'id="split_to_join_2"'),
    ])
    code, doc = _run(tmp_path, "run", str(path), "--data", '{"a": 1}')
    assert doc["error"] is None, doc["error"]
    assert code == 0 and doc["status"] == "completed"
    assert doc["layers"]["L3"]["x"] == 2 and doc["conflicts"] == []
