"""Public models, round 24, each in ``tests/engine/realworld24/`` (the file's header comment names its
source; ``realworld24/SOURCES.md`` lists repositories, paths, commits and licences): Operaton's (Camunda 7's
Apache-2.0 fork's) engine test models of cycle timers (an ISO 8601 cycle on a boundary and a start event, a
cron cycle on a non-interrupting event sub-process), a conditional start event, compensation (a
compensation event sub-process, a compensated multi-instance sub-process) and a transaction cancelled
beside compensation handlers. Each is validated as given (validate says what is wrong, naming the element
and what to write), then, edited as validate says, run, and its path and data are checked against what
BPMN says."""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Any

from engine import Engine, load_process
from engine.validate import validate_process

from engine_helpers import path_of, variables
from test_realworld_4 import rewritten
from test_realworld_17 import said

HERE = Path(__file__).resolve().parent / "realworld24"


def errors(path: Path) -> list[tuple[str, str | None]]:
    return [(p.code, p.element_id) for p in validate_process([path]).problems if p.severity == "error"]


class Clock:
    def __init__(self) -> None:
        self.now = float(int(time.time()))

    def __call__(self) -> float:
        return self.now


def engine_with(handlers: dict[str, Any], clock: Clock | None = None) -> Engine:
    engine = Engine(store="memory://", clock=clock) if clock else Engine(store="memory://")
    for task_id, handler in handlers.items():
        engine.handlers.register(task_id, handler)
    return engine


def waits(instance: Any) -> list[str]:
    return sorted(w["task_id"] for w in instance.waiting_for)


# -- Operaton: a transaction cancelled beside compensation handlers and conditional events ---------

TRANSACTION = HERE / "operaton_transaction_compensation_conditionals.bpmn"


def test_a_service_task_whose_expression_is_a_literal_is_not_said_to_name_a_java_bean() -> None:
    """operaton:expression="${true}" evaluates the literal true and does nothing else: the step does no
    work in the other engine. validate said it named 'true', "a Java bean of the other engine's
    application that does the step's work", and asked for that work in Python: there is none."""
    warning = said(TRANSACTION)["Task_1alr7zc"]
    assert "Java bean" not in warning and "naming 'true'" not in warning
    assert "operaton:expression='${true}' is a JUEL literal (true): the other engine evaluates it and " \
           "does nothing else, so the step does no work there" in warning
    assert "make it a bpmn:scriptTask whose script is `pass` (a bpmn:task waits for a person)" in warning


# -- Operaton: a cron cycle on a non-interrupting timer event sub-process --------------------------

CRON = HERE / "operaton_cron_cycle_event_subprocess.bpmn"


def test_a_cron_cycle_of_every_few_minutes_is_refused_with_the_iso_cycle_it_is() -> None:
    """validate said SpiffWorkflow has no cron and gave two unrelated examples ("R/PT1H", a daily
    cycle): the reader had to work out that '0 0/5 * * * ?' (Quartz: second 0 of every fifth minute)
    is a cycle of five minutes. It names the cycle to write."""
    [problem] = validate_process([CRON]).problems
    assert (problem.code, problem.element_id, problem.field) == ("timer_expression", "subprocessStartEvent",
                                                                 "timeCycle")
    text = str(problem)
    assert "'0 0/5 * * * ?' is a cron expression" in text
    assert 'it fires every 5 minutes: write "R/PT5M" (with the quotes)' in text
    assert "counted from when the timer starts, not from the clock's whole minutes" in text


def test_the_event_sub_process_edited_as_said_runs_once_per_period_beside_the_main_task(tmp_path: Path) -> None:
    fixed = rewritten(tmp_path, CRON, [("<timeCycle>0 0/5 * * * ?</timeCycle>", '<timeCycle>"R/PT5M"</timeCycle>')])
    assert errors(fixed) == []
    clock = Clock()
    engine = engine_with({}, clock)
    instance = engine.run(engine.start(load_process([fixed]), {}))
    assert waits(instance) == ["subprocessStartEvent", "userTask"]
    clock.now += 5 * 60
    instance = engine.resume(instance)
    assert waits(instance) == ["subprocessStartEvent", "userTask", "userTask2"]
    instance = engine.run(instance, answers={"user_tasks": {"userTask2": {"reminded": 1}}})
    assert waits(instance) == ["subprocessStartEvent", "userTask"]
    # the main path's end ends the instance: the non-interrupting cycle waits no longer
    instance = engine.run(instance, answers={"user_tasks": {"userTask": {"done": True}}})
    assert instance.status == "completed", instance.error
    assert path_of(instance.workflow) == ["startEvent", "userTask2", "subprocessEndEvent", "userTask", "endEvent"]
    assert variables(instance.contexts["main"]) == {"reminded": 1, "done": True}


def test_a_cron_calendar_schedule_keeps_the_general_advice() -> None:
    from engine.validate import _cron_every
    assert [_cron_every(t) for t in ("0 0/5 * * * ?", "0/5 0/1 * 1/1 * ?", "*/10 * * * *", "0 0 */2 * * ?",
                                     "0 0 9 * * ?", "0 15 10 ? * MON-FRI", "0 0/5 9 * * ?")] == [
        (5, "M", "minute"), (5, "S", "second"), (10, "M", "minute"), (2, "H", "hour"), None, None, None]
