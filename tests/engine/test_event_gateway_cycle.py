"""A timer cycle on a branch of an event-based gateway: SpiffWorkflow 3.2 never starts it (the
run waits for the other branches only, and no due-timers lists it), so validate warns,
``cycle_branch_never_fires``, naming the event, its cycle and the gateway, and saying what to model."""

from __future__ import annotations

import time
from pathlib import Path

from engine import Engine, load_process
from engine.validate import validate_process
from test_due_timers import Clock

HERE = Path(__file__).parent
RACE = HERE / "gaps22" / "cycle_race.bpmn"  # gw: message ok (ok_in) | timeCycle "R3/PT1H" (hourly)


def test_validate_warns_of_a_cycle_branch_of_an_event_based_gateway() -> None:
    report = validate_process([RACE])
    found = [p for p in report.problems if p.code == "cycle_branch_never_fires"]
    assert [(p.element_id, p.severity, p.field) for p in found] == [("hourly", "warning", None)], found
    [problem] = found
    assert problem.file and problem.file.endswith("cycle_race.bpmn") and problem.line
    assert "'gw'" in problem.message and "R3/PT1H" in problem.message and "SpiffWorkflow 3.2" in problem.message
    assert "timeDuration" in problem.message and "boundary" in problem.message  # what to model instead
    assert report.ok  # a warning: the other branches still run


def test_what_the_warning_says_holds_the_cycle_never_fires() -> None:
    clock = Clock(float(int(time.time())))
    engine = Engine("memory://", clock=clock)
    instance = engine.run(engine.start(load_process(RACE), {}))
    assert instance.status == "waiting"
    clock.now += 4 * 3600  # past every repetition of R3/PT1H
    assert engine.due_timers() == []
    instance = engine.run(engine.load(instance.id))
    assert instance.status == "waiting"
    assert not [w for w in instance.waiting_for if w.get("kind") == "timer"]


def test_a_duration_branch_is_not_warned(tmp_path: Path) -> None:
    duration = RACE.read_text().replace('<bpmn:timeCycle>"R3/PT1H"</bpmn:timeCycle>',
                                        '<bpmn:timeDuration>"PT1H"</bpmn:timeDuration>')
    assert duration != RACE.read_text()
    path = tmp_path / "duration_race.bpmn"
    path.write_text(duration)
    assert not [p for p in validate_process([path]).problems if p.code == "cycle_branch_never_fires"]
