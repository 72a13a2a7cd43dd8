"""Three of SpiffWorkflow's chores, without the work nobody reads.

Every task SpiffWorkflow runs passes through the first two, several times, for layerflow and for a
plain SpiffWorkflow user alike; on the loan demo the three took about 5% of a run. (``engine.spiff``
also checks its parallel joins and process ends without SpiffWorkflow's iterator: ``_parallel_may_fire``,
``_end_may_fire``.)

* ``Task._set_state`` logs every state change (INFO on ``spiff.task``; a state set again: DEBUG)
  and builds the record's message and ``extra`` before ``logger.info`` looks at the level:
  ``TaskState.get_name`` (two dicts built at every call) and ``collect_log_extras`` (eight fields,
  the parent looked up by its UUID). Unless the application turns that logger on, all of it is
  thrown away, at every change of every task (FUTURE, READY, STARTED, COMPLETED). The twin
  changes the state exactly as the stock method does and builds a record only when the logger
  would emit it: with ``spiff.task`` at INFO or DEBUG the log is the same, record for record.
* ``Workflow.update_waiting_tasks`` (after every completed task) walks the task tree with a
  ``TaskIterator``, which keeps a depth for ``max_depth`` (``engine.deep_trees`` lifts that
  limit, so it decides nothing) by looking parents up again on the way back up from every leaf.
  The twin walks the same tasks in the same order, lazily as the iterator does (a task's
  children are read when the walk reaches the task, after the updates of the tasks before it),
  and updates the WAITING ones.
* ``Workflow._mark_complete`` (a workflow or sub-workflow ends) logs "Workflow completed" with
  ``collect_log_extras``, which lists every task of the workflow (a walk of the whole tree)
  whenever ``spiff.workflow`` has no level of its own, as it has not unless set. The twin builds
  the record only when the logger would emit it, and marks the workflow complete as the stock
  method does.

``install()`` (run when ``engine.spiff`` is imported) puts the three twins in place. Like
``engine.deep_trees`` they hold for every SpiffWorkflow workflow in the process; ``STOCK`` keeps
the methods they replaced.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from typing import Any

from SpiffWorkflow.task import Task
from SpiffWorkflow.task import logger as _task_logger
from SpiffWorkflow.util.task import TaskState
from SpiffWorkflow.workflow import Workflow
from SpiffWorkflow.workflow import logger as _workflow_logger

__all__ = ["STOCK", "install", "waiting_tasks"]

#: the methods ``install`` replaced, as SpiffWorkflow defines them: (owner, name) -> function
STOCK: dict[tuple[type, str], Any] = {}

_WAITING, _FUTURE = TaskState.WAITING, TaskState.FUTURE


def _set_state(self: Task, value: int) -> None:
    """Force set the state on a task (SpiffWorkflow's ``Task._set_state``, its log record built
    only when ``spiff.task`` emits it)."""
    if value != self.state:
        elapsed = time.time() - self.last_state_change
        self.last_state_change = time.time()
        self._state = value
        if _task_logger.isEnabledFor(logging.INFO):
            _task_logger.info(f'State changed to {TaskState.get_name(value)}',
                              extra=self.collect_log_extras({'elapsed': elapsed}))
    elif _task_logger.isEnabledFor(logging.DEBUG):
        _task_logger.debug(f'State set to {TaskState.get_name(value)}', extra=self.collect_log_extras())


def waiting_tasks(root: Task) -> Iterator[Task]:
    """``TaskIterator(root, state=TaskState.WAITING)`` with ``max_depth`` lifted: depth first, a
    task before its children, below a task only when its state is FUTURE or later; each task's
    children read as the walk reaches it."""
    stack = [root]
    pop, push = stack.pop, stack.extend
    while stack:
        task = pop()
        if task._children and task.state >= _FUTURE:
            push(reversed(task.children))
        if task._state & _WAITING and task.last_state_change >= 0:  # TaskFilter(state=WAITING).matches
            yield task


def _update_waiting_tasks(self: Workflow) -> None:
    """Update all tasks in the WAITING state"""
    for task in waiting_tasks(self.task_tree):
        task.task_spec._update(task)


def _mark_complete(self: Workflow, task: Task) -> None:
    """SpiffWorkflow's ``Workflow._mark_complete``, its log record built only when ``spiff.workflow``
    emits it."""
    if _workflow_logger.isEnabledFor(logging.INFO):
        _workflow_logger.info('Workflow completed', extra=self.collect_log_extras())
    self.data.update(task.data)
    self.completed = True


_TWINS: tuple[tuple[type, str, Any], ...] = (
    (Task, "_set_state", _set_state),
    (Workflow, "update_waiting_tasks", _update_waiting_tasks),
    (Workflow, "_mark_complete", _mark_complete),
)


def install() -> None:
    """Put the twins in place (idempotent)."""
    for owner, name, twin in _TWINS:
        STOCK.setdefault((owner, name), vars(owner)[name])
        setattr(owner, name, twin)
