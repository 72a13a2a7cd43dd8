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
