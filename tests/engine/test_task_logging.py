"""engine.task_logging: a task's state change builds no log record unless ``spiff.task`` emits it,
and with the logger on, the records are SpiffWorkflow's own, one for one."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest
from SpiffWorkflow.task import Task
from SpiffWorkflow.util.task import TaskState

from engine import Engine, load_process, task_logging

EXAMPLES = Path(__file__).resolve().parents[2] / "bpmn_examples"
LOAN_DATA = {"amount": 120000, "applicant_id": "APP002", "purpose": "warehouse expansion", "industry": "logistics"}


def _run_loan() -> Any:
    process = load_process(EXAMPLES / "loan_approval.bpmn")
    engine = Engine("memory://", save="stop")
    instance = engine.run(engine.start(process, LOAN_DATA))
    assert instance.status == "completed", instance.error
    return instance


def test_the_twin_is_in_place_once_engine_is_imported() -> None:
    assert Task._set_state is task_logging._set_state
    assert task_logging.STOCK["_set_state"] is not task_logging._set_state
    task_logging.install()  # idempotent: the stock method stays the one SpiffWorkflow defines
    assert task_logging.STOCK["_set_state"].__module__ == "SpiffWorkflow.task"


def test_no_log_record_is_built_while_the_logger_is_off(monkeypatch: pytest.MonkeyPatch) -> None:
    built: list[str] = []
    stock_extras = Task.collect_log_extras

    def counting(self: Task, dct: Any = None) -> dict[str, Any]:
        built.append(self.task_spec.name)
        return stock_extras(self, dct)

    monkeypatch.setattr(Task, "collect_log_extras", counting)
    _at_level(logging.getLogger("spiff.task"), logging.WARNING, monkeypatch)
    _run_loan()
    assert built == []


def _at_level(logger: logging.Logger, level: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """``logger.setLevel(level)`` until the test ends (``setLevel``, not the attribute: it also
    clears the loggers' cache of which levels are enabled)."""
    monkeypatch.setattr(logger, "disabled", False)
    _RESTORE.append((logger, logger.level))
    logger.setLevel(level)


_RESTORE: list[tuple[logging.Logger, int]] = []


@pytest.fixture(autouse=True)
def _restore_levels() -> Any:
    yield
    while _RESTORE:
        logger, was = _RESTORE.pop()
        logger.setLevel(was)


def _records(set_state: Any, level: int, monkeypatch: pytest.MonkeyPatch) -> tuple[list[tuple[Any, ...]], Any]:
    """The ``spiff.task`` records of a loan run with ``set_state`` as ``Task._set_state``, and the
    instance (each record as what does not depend on time or ids)."""
    seen: list[logging.LogRecord] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            seen.append(record)

    logger = logging.getLogger("spiff.task")
    handler = Keep(level)
    monkeypatch.setattr(Task, "_set_state", set_state)
    _at_level(logger, level, monkeypatch)
    logger.addHandler(handler)
    try:
        instance = _run_loan()
    finally:
        logger.removeHandler(handler)
    return [(r.levelno, r.getMessage(), r.task_spec, r.task_type, r.state, r.workflow_spec,  # type: ignore[attr-defined]
             r.parent is None, "elapsed" in r.__dict__) for r in seen], instance  # type: ignore[attr-defined]


@pytest.mark.parametrize("level", [logging.INFO, logging.DEBUG])
def test_with_the_logger_on_the_records_are_spiffworkflows_own(level: int, monkeypatch: pytest.MonkeyPatch) -> None:
    stock, stock_instance = _records(task_logging.STOCK["_set_state"], level, monkeypatch)
    twin, twin_instance = _records(task_logging._set_state, level, monkeypatch)
    assert stock and any(r[1].startswith("State changed to") for r in stock)
    assert twin == stock
    # and the run itself is the same: every task ends in the same state, the contexts are equal
    states = [(t.task_spec.name, TaskState.get_name(t.state)) for t in stock_instance.workflow.get_tasks()]
    assert [(t.task_spec.name, TaskState.get_name(t.state)) for t in twin_instance.workflow.get_tasks()] == states
    assert twin_instance.to_document()["layers"] == stock_instance.to_document()["layers"]
