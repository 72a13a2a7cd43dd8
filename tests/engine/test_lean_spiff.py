"""engine.lean_spiff: SpiffWorkflow's per-task chores without the work nobody reads.

A task's state change builds no log record unless ``spiff.task`` emits it (and with the logger
on, the records are SpiffWorkflow's own, one for one); the refresh of waiting tasks after every
completed task visits the tasks ``TaskIterator`` visits, in its order, and runs end as with the
stock method."""

from __future__ import annotations

import logging
import sys
from pathlib import Path
from typing import Any

import pytest
from SpiffWorkflow.bpmn.specs.control import _EndJoin
from SpiffWorkflow.bpmn.specs.mixins.parallel_gateway import ParallelGateway
from SpiffWorkflow.task import Task
from SpiffWorkflow.util.task import TaskIterator, TaskState
from SpiffWorkflow.workflow import Workflow

from engine import Engine, lean_spiff, load_process, spiff

from engine_helpers import EXAMPLES, LOAN, LOAN_FULL, flow, path_of, script_task, variables, write_elements

STOCK_SET_STATE = lean_spiff.STOCK[(Task, "_set_state")]
STOCK_UPDATE = lean_spiff.STOCK[(Workflow, "update_waiting_tasks")]
STOCK_MARK_COMPLETE = lean_spiff.STOCK[(Workflow, "_mark_complete")]

# examples with tasks that wait: joins (parallel, inclusive, nested, in a sub-process), a user task
# beside a branch, a boundary timer, a call activity, multi-instance, a loop
CASES: list[tuple[str, dict[str, Any], dict[str, dict[str, Any]]]] = [
    ("nested_parallel", {}, {}),
    ("inclusive_gateway", {"need_credit": True, "need_identity": False, "need_address": True}, {}),
    ("parallel_user_task", {"title": "Q3 report"}, {"review": {"approved": True, "reviewer": "ann"}}),
    ("timer_boundary", {}, {"approve": {"approved": False}}),
    ("subprocess_parallel", {"amount": 120000}, {}),
    ("call_activity", {"amount": 120000}, {}),
    ("multi_instance_parallel", {}, {}),
    ("xor_loop", {"batch_size": 4}, {}),
]


def _run(name: str, data: dict[str, Any], user_tasks: dict[str, dict[str, Any]]) -> Any:
    path = LOAN if name == "loan_approval" else EXAMPLES / f"{name}.bpmn"
    engine = Engine("memory://", save="stop")
    instance = engine.run(engine.start(load_process(path), data), answers={"user_tasks": user_tasks})
    assert instance.status == "completed", instance.error
    return instance


def test_the_twins_are_in_place_once_engine_is_imported() -> None:
    assert Task._set_state is lean_spiff._set_state
    assert Workflow.update_waiting_tasks is lean_spiff._update_waiting_tasks
    assert Workflow._mark_complete is lean_spiff._mark_complete
    lean_spiff.install()  # idempotent: what it keeps is what SpiffWorkflow defines
    assert STOCK_SET_STATE.__module__ == "SpiffWorkflow.task"
    assert STOCK_UPDATE.__module__ == STOCK_MARK_COMPLETE.__module__ == "SpiffWorkflow.workflow"


# ----- state changes and their log records ---------------------------------------------------------


_RESTORE: list[tuple[logging.Logger, int]] = []


@pytest.fixture(autouse=True)
def _restore_levels() -> Any:
    yield
    while _RESTORE:
        logger, was = _RESTORE.pop()
        logger.setLevel(was)


def _at_level(logger: logging.Logger, level: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """``logger.setLevel(level)`` until the test ends (``setLevel``, not the attribute: it also
    clears the loggers' cache of which levels are enabled)."""
    monkeypatch.setattr(logger, "disabled", False)
    _RESTORE.append((logger, logger.level))
    logger.setLevel(level)


def test_no_log_record_is_built_while_the_logger_is_off(monkeypatch: pytest.MonkeyPatch) -> None:
    built: list[str] = []
    stock_extras = Task.collect_log_extras

    def counting(self: Task, dct: Any = None) -> dict[str, Any]:
        built.append(self.task_spec.name)
        return stock_extras(self, dct)

    monkeypatch.setattr(Task, "collect_log_extras", counting)
    _at_level(logging.getLogger("spiff.task"), logging.WARNING, monkeypatch)
    _run("loan_approval", LOAN_FULL, {})
    assert built == []


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
        instance = _run("loan_approval", LOAN_FULL, {})
    finally:
        logger.removeHandler(handler)
    return [(r.levelno, r.getMessage(), r.task_spec, r.task_type, r.state, r.workflow_spec,  # type: ignore[attr-defined]
             r.parent is None, "elapsed" in r.__dict__) for r in seen], instance  # type: ignore[attr-defined]


@pytest.mark.parametrize("level", [logging.INFO, logging.DEBUG])
def test_with_the_logger_on_the_records_are_spiffworkflows_own(level: int, monkeypatch: pytest.MonkeyPatch) -> None:
    stock, stock_instance = _records(STOCK_SET_STATE, level, monkeypatch)
    twin, twin_instance = _records(lean_spiff._set_state, level, monkeypatch)
    assert stock and any(r[1].startswith("State changed to") for r in stock)
    assert twin == stock
    # and the run itself is the same: every task ends in the same state, the contexts are equal
    states = [(t.task_spec.name, TaskState.get_name(t.state)) for t in stock_instance.workflow.get_tasks()]
    assert [(t.task_spec.name, TaskState.get_name(t.state)) for t in twin_instance.workflow.get_tasks()] == states
    assert twin_instance.to_document()["layers"] == stock_instance.to_document()["layers"]


# ----- the refresh of waiting tasks -------------------------------------------------------------------


@pytest.mark.parametrize(("name", "data", "user_tasks"), [*CASES, ("loan_approval", LOAN_FULL, {})],
                         ids=lambda v: v if isinstance(v, str) else "")
def test_the_walk_finds_the_waiting_tasks_the_iterator_finds(name: str, data: dict[str, Any],
                                                            user_tasks: dict[str, dict[str, Any]],
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """At every refresh of every workflow and sub-workflow: the same tasks, in the same order."""
    compared: list[int] = []

    def checked(self: Workflow) -> None:
        expected = list(TaskIterator(self.task_tree, state=TaskState.WAITING))
        assert list(lean_spiff.waiting_tasks(self.task_tree)) == expected
        compared.append(len(expected))
        lean_spiff._update_waiting_tasks(self)

    monkeypatch.setattr(Workflow, "update_waiting_tasks", checked)
    _run(name, data, user_tasks)
    assert compared  # it ran
    if name not in ("call_activity", "multi_instance_parallel", "xor_loop"):
        assert any(compared)  # and found tasks waiting (a join, a user task beside a branch, a timer)


@pytest.mark.parametrize(("name", "data", "user_tasks"), CASES, ids=lambda v: v if isinstance(v, str) else "")
def test_a_run_takes_the_path_it_takes_with_the_stock_refresh(name: str, data: dict[str, Any],
                                                             user_tasks: dict[str, dict[str, Any]],
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """The updates happen as the walk goes (a join that fires changes what comes after it)."""
    twin = _run(name, data, user_tasks)
    monkeypatch.setattr(Workflow, "update_waiting_tasks", STOCK_UPDATE)
    stock = _run(name, data, user_tasks)
    assert path_of(twin.workflow) == path_of(stock.workflow)
    assert variables(twin.main) == variables(stock.main)
    assert [(t.task_spec.name, t.state) for t in twin.workflow.get_tasks()] == \
        [(t.task_spec.name, t.state) for t in stock.workflow.get_tasks()]


# ----- a workflow's completion and its log record -------------------------------------------------------


def test_a_completion_lists_no_tasks_for_a_log_record_while_the_logger_is_off(monkeypatch: pytest.MonkeyPatch) -> None:
    callers: list[str] = []
    stock_extras = Workflow.collect_log_extras

    def noting(self: Workflow, dct: Any = None) -> dict[str, Any]:
        callers.append(sys._getframe(1).f_code.co_name)
        return stock_extras(self, dct)

    monkeypatch.setattr(Workflow, "collect_log_extras", noting)
    _at_level(logging.getLogger("spiff.workflow"), logging.WARNING, monkeypatch)
    instance = _run("subprocess_parallel", {"amount": 120000}, {})
    assert instance.workflow.completed and "_mark_complete" not in callers


def _completion_records(mark_complete: Any, level: int, monkeypatch: pytest.MonkeyPatch) -> list[tuple[Any, ...]]:
    seen: list[logging.LogRecord] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            seen.append(record)

    logger = logging.getLogger("spiff.workflow")
    monkeypatch.setattr(Workflow, "_mark_complete", mark_complete)
    _at_level(logger, level, monkeypatch)
    handler = Keep(level)
    logger.addHandler(handler)
    try:
        instance = _run("subprocess_parallel", {"amount": 120000}, {})
    finally:
        logger.removeHandler(handler)
    assert instance.workflow.completed
    return [(r.getMessage(), r.workflow_spec, r.success, r.completed, len(getattr(r, "tasks", ())))  # type: ignore[attr-defined]
            for r in seen]


@pytest.mark.parametrize("level", [logging.INFO, logging.DEBUG])
def test_with_the_logger_on_a_completion_logs_what_spiffworkflow_logs(level: int, monkeypatch: pytest.MonkeyPatch) -> None:
    stock = _completion_records(STOCK_MARK_COMPLETE, level, monkeypatch)
    assert [r[0] for r in stock].count("Workflow completed") == 2  # the process and its sub-process
    assert _completion_records(lean_spiff._mark_complete, level, monkeypatch) == stock


# ----- a parallel join's check: the gateway's tasks found without the iterator -----------------------------

def _checked(monkeypatch: pytest.MonkeyPatch, name: str, stock: Any) -> list[bool]:
    """``spiff.<name>`` checked against SpiffWorkflow's ``stock`` check at every call; its answers."""
    answers: list[bool] = []
    fast = getattr(spiff, name)

    def checked(spec: Any, my_task: Any) -> bool:
        ours = fast(spec, my_task)
        assert ours == stock(spec, my_task)
        answers.append(ours)
        return bool(ours)

    monkeypatch.setattr(spiff, name, checked)
    return answers


LOOP_THROUGH_JOIN = [  # a loop back through a parallel split and join: each pass adds a pair of branches
    '<bpmn:startEvent id="start"/>', script_task("init", "count = 0"), '<bpmn:parallelGateway id="split"/>',
    script_task("a", "count = count + 1"), script_task("b", "seen = count"), '<bpmn:parallelGateway id="join"/>',
    '<bpmn:exclusiveGateway id="more" default="more_to_end"/>', '<bpmn:endEvent id="end"/>',
    flow("start", "init"), flow("init", "split"), flow("split", "a"), flow("split", "b"), flow("a", "join"),
    flow("b", "join"), flow("join", "more"), flow("more", "split", "count < 4"), flow("more", "end")]


@pytest.mark.parametrize("name", ["loan_approval", "nested_parallel", "parallel_scripts", "parallel_user_task",
                                  "subprocess_parallel", "loop_through_join"])
def test_a_parallel_join_decides_as_spiffworkflows_check(name: str, tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """At every check of every parallel join (a loop through one included): the answer of SpiffWorkflow's
    own ``ParallelGateway._check_threshold_unstructured``."""
    answers = _checked(monkeypatch, "_parallel_may_fire", ParallelGateway._check_threshold_unstructured)
    if name == "loop_through_join":
        path = write_elements(tmp_path, name, LOOP_THROUGH_JOIN)
        engine = Engine("memory://", save="stop")
        instance = engine.run(engine.start(load_process(path)))
        assert instance.status == "completed", instance.error
        assert instance.main.get("count") == 4
    else:
        data, user_tasks = next(((d, u) for n, d, u in CASES if n == name), (LOAN_FULL if name == "loan_approval" else {},
                                                                                 {}))
        _run(name, data, user_tasks)
    assert True in answers and (name == "subprocess_parallel" or False in answers)  # it waited, then fired


TWO_ENDS = [  # two branches, each to an end event of its own: the first to end waits for the other
    '<bpmn:startEvent id="start"/>', '<bpmn:parallelGateway id="split"/>', script_task("a", "x = 1"),
    '<bpmn:endEvent id="end_a"/>', script_task("b1", "y = 1"), '<bpmn:userTask id="b2"/>', '<bpmn:endEvent id="end_b"/>',
    flow("start", "split"), flow("split", "a"), flow("a", "end_a"), flow("split", "b1"), flow("b1", "b2"),
    flow("b2", "end_b")]


@pytest.mark.parametrize("name", ["loan_approval", "nested_parallel", "parallel_user_task", "subprocess_parallel",
                                  "call_activity", "timer_boundary", "multi_instance_parallel", "xor_loop", "two_ends"])
def test_an_end_decides_as_spiffworkflows_check(name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """At every check of the end of a process or sub-process: the answer of SpiffWorkflow's own
    ``_EndJoin._check_threshold_unstructured``."""
    answers = _checked(monkeypatch, "_end_may_fire", _EndJoin._check_threshold_unstructured)
    if name == "two_ends":
        engine = Engine("memory://", save="stop")
        instance = engine.run(engine.start(load_process(write_elements(tmp_path, name, TWO_ENDS))),
                              answers={"user_tasks": {"b2": {"z": 1}}})
        assert instance.status == "completed", instance.error
        assert False in answers and answers[-1] is True  # end_a waited for b2; the last check ended the process
    else:
        data, user_tasks = next(((d, u) for n, d, u in CASES if n == name),
                                (LOAN_FULL if name == "loan_approval" else {}, {}))
        _run(name, data, user_tasks)
        assert True in answers
