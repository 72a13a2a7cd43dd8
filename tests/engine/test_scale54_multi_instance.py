"""Round 54, at scale: a multi-instance user task over many items.

Working out what an instance waits for (``settle``) numbered each waiting instance by listing
all of its siblings again, so one ``settle`` cost the square of the items, and a ``resume`` that
answers them all (one settle per answered instance) their cube: answering 1,000 voters with one
``--answer vote=...`` took minutes. Measured here without a clock: by how many child tasks
SpiffWorkflow is asked for, which must grow with the items, not with their square.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterator

import pytest
from SpiffWorkflow.task import Task

from engine import Engine, load_process
from engine.runtime import _runtime_of

BPMN = """<?xml version="1.0" encoding="UTF-8"?>
<bpmn:definitions xmlns:bpmn="http://www.omg.org/spec/BPMN/20100524/MODEL" id="d" targetNamespace="x">
  <bpmn:process id="votes" isExecutable="true">
    <bpmn:startEvent id="start"/>
    <bpmn:userTask id="vote">
      <bpmn:multiInstanceLoopCharacteristics isSequential="false">
        <bpmn:loopDataInputRef>voters</bpmn:loopDataInputRef>
        <bpmn:loopDataOutputRef>votes</bpmn:loopDataOutputRef>
        <bpmn:inputDataItem id="voter" name="voter"/>
        <bpmn:outputDataItem id="ballot" name="ballot"/>
      </bpmn:multiInstanceLoopCharacteristics>
    </bpmn:userTask>
    <bpmn:scriptTask id="count"><bpmn:script>total = len(votes)</bpmn:script></bpmn:scriptTask>
    <bpmn:endEvent id="end"/>
    <bpmn:sequenceFlow id="f1" sourceRef="start" targetRef="vote"/>
    <bpmn:sequenceFlow id="f2" sourceRef="vote" targetRef="count"/>
    <bpmn:sequenceFlow id="f3" sourceRef="count" targetRef="end"/>
  </bpmn:process>
</bpmn:definitions>
"""


@pytest.fixture()
def looked_up(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[int]]:
    """How many child tasks ``Task.children`` handed out."""
    seen = [0]
    stock = Task.children

    def counting(task: Task) -> list[Task]:
        kids: list[Task] = stock.fget(task)  # type: ignore[attr-defined]
        seen[0] += len(kids)
        return kids

    monkeypatch.setattr(Task, "children", property(counting, stock.fset))
    yield seen


def _waiting(tmp_path: Path, voters: int) -> Any:
    tmp_path.mkdir(exist_ok=True)
    path = tmp_path / "votes.bpmn"
    path.write_text(BPMN)
    engine = Engine("memory://")
    instance = engine.run(load_process(path), {"voters": [f"v{i}" for i in range(voters)]})
    assert instance.status == "waiting" and len(instance.waiting_for) == voters
    return engine, instance


def _settle_cost(tmp_path: Path, voters: int, looked_up: list[int]) -> int:
    _, instance = _waiting(tmp_path / str(voters), voters)
    before = instance.waiting_for
    looked_up[0] = 0
    _runtime_of(instance).settle()
    assert instance.waiting_for == before
    return looked_up[0]


def test_working_out_what_many_instances_wait_for_grows_with_them_not_their_square(
        tmp_path: Path, looked_up: list[int]) -> None:
    small, large = _settle_cost(tmp_path, 10, looked_up), _settle_cost(tmp_path, 40, looked_up)
    assert large < 8 * small, (small, large)  # 4 times the voters: 16 times the work was the square


def test_each_waiting_instance_keeps_its_number_and_input(tmp_path: Path) -> None:
    engine, instance = _waiting(tmp_path, 12)
    items = instance.waiting_for
    assert [w["instance"] for w in items] == list(range(1, 13))
    assert [w["input"] for w in items] == [{"voter": f"v{i}"} for i in range(12)]
    done = engine.resume(instance.id, answers={"user_tasks": {items[3]["id"]: {"ballot": "yes"}}})
    assert [w["instance"] for w in done.waiting_for] == [1, 2, 3, *range(5, 13)]
    done = engine.resume(instance.id, answers={"user_tasks": {"vote": {"ballot": "no"}}})
    assert done.status == "completed"
    assert done.contexts["main"].resolve("votes") == ["no", "no", "no", "yes", *["no"] * 8]
