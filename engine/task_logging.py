"""SpiffWorkflow's task state changes, without log records nobody reads.

SpiffWorkflow 3.2's ``Task._set_state`` logs every state change (INFO on ``spiff.task``; a
state set again, DEBUG) and builds the record's message and ``extra`` before ``logger.info``
looks at the level: ``TaskState.get_name`` (two dicts built at every call, twice per change)
and ``collect_log_extras`` (a dict of eight fields, the parent looked up by its UUID). Unless
the application turns that logger on, all of it is thrown away, for every task at every
change (a task passes FUTURE, READY, STARTED, COMPLETED): on the loan demo about 3% of a run.

``install()`` (run when ``engine.spiff`` is imported) puts in a twin that changes the state
exactly as the stock method does and builds a record only when the logger would emit it: with
``spiff.task`` at INFO or DEBUG the log is the same, record for record. Like ``engine.deep_trees``
it holds for every SpiffWorkflow workflow in the process; ``STOCK`` keeps the method it replaced.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from SpiffWorkflow.task import Task
from SpiffWorkflow.task import logger as _task_logger
from SpiffWorkflow.util.task import TaskState

__all__ = ["STOCK", "install"]

#: ``Task._set_state`` as SpiffWorkflow defines it (set by ``install``)
STOCK: dict[str, Any] = {}


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


def install() -> None:
    """Put the twin in place (idempotent)."""
    STOCK.setdefault("_set_state", vars(Task)["_set_state"])
    Task._set_state = _set_state  # type: ignore[method-assign]
