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

# a vote of N voters, then a count (bench/bench_scale.py runs it at larger N)
BPMN = Path(__file__).parent / "fixtures" / "scale54_votes.bpmn"


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


def _waiting(voters: int) -> Any:
    engine = Engine("memory://")
    instance = engine.run(load_process(BPMN), {"voters": [f"v{i}" for i in range(voters)]})
    assert instance.status == "waiting" and len(instance.waiting_for) == voters
    return engine, instance


def _settle_cost(voters: int, looked_up: list[int]) -> int:
    _, instance = _waiting(voters)
    before = instance.waiting_for
    looked_up[0] = 0
    _runtime_of(instance).settle()
    assert instance.waiting_for == before
    return looked_up[0]


def test_working_out_what_many_instances_wait_for_grows_with_them_not_their_square(
        looked_up: list[int]) -> None:
    small, large = _settle_cost(10, looked_up), _settle_cost(40, looked_up)
    assert large < 8 * small, (small, large)  # 4 times the voters: 16 times the work was the square


def test_each_waiting_instance_keeps_its_number_and_input() -> None:
    engine, instance = _waiting(12)
    items = instance.waiting_for
    assert [w["instance"] for w in items] == list(range(1, 13))
    assert [w["input"] for w in items] == [{"voter": f"v{i}"} for i in range(12)]
    done = engine.resume(instance.id, answers={"user_tasks": {items[3]["id"]: {"ballot": "yes"}}})
    assert [w["instance"] for w in done.waiting_for] == [1, 2, 3, *range(5, 13)]
    done = engine.resume(instance.id, answers={"user_tasks": {"vote": {"ballot": "no"}}})
    assert done.status == "completed"
    assert done.contexts["main"].resolve("votes") == ["no", "no", "no", "yes", *["no"] * 8]
