"""Task trees of any depth: a loop back through a gateway runs as long as its condition says.

SpiffWorkflow 3.2 adds a level to the task tree for every task a loop runs again (a pass
through ``work -> gateway`` adds two), and two of its habits assume shallow trees:

* ``TaskIterator`` (and ``BpmnTaskIterator``) stop descending at ``max_depth=1000`` unless
  a caller passes another limit, and almost no caller does (``get_tasks``, ``is_completed``,
  the joins, the waiting-task refresh). A task deeper than that is invisible: after about
  500 passes of a two-step loop the next READY task is never found, nothing else is
  unfinished as far as ``is_completed`` can see, and the workflow reports itself completed
  with the loop cut short and every step after it skipped. Silently, in plain SpiffWorkflow
  as in an engine built on it.
* ``Task.is_descendant_of``, ``find_ancestor``, ``cancel``, ``_drop_children`` and
  ``Workflow._remove_task`` recurse once per level, so past Python's recursion limit (1,000
  frames) a parallel join after a long loop raises ``RecursionError``.

``lift()`` (run when ``engine.spiff`` is imported) sets the iterators' default depth to
unbounded and gives those five methods iterative twins that visit the same tasks in the
same order. Both changes hold for every SpiffWorkflow workflow in the process (they only
make deep trees work; shallow ones run exactly as before). Each pass of a loop still stays
in the tree, so a step costs time in proportion to the passes before it: a loop meant for
thousands of passes is better written as a multi-instance activity or a called process.

Long processes (as opposed to long runs) need room on Python's stack instead: SpiffWorkflow's
parser follows the flows recursively (three frames per element: a sequence of about 320
elements exhausted the default limit of 1,000 frames), and a new workflow (or sub-process)
predicts the steps ahead recursively (a frame per step). ``make_room(frames)`` raises the
limit to what the process needs; the parser and the engine call it with a bound taken from
the size of the process.
"""

from __future__ import annotations

import inspect
import sys
import threading
from typing import Any, Optional

from SpiffWorkflow.bpmn.util.task import BpmnTaskIterator
from SpiffWorkflow.task import Task
from SpiffWorkflow.util.task import TaskIterator, TaskState
from SpiffWorkflow.workflow import Workflow

__all__ = ["STOCK", "STOCK_MAX_DEPTH", "lift", "make_room"]

STOCK_MAX_DEPTH = 1000  # SpiffWorkflow 3.2's default


def _unbounded_default(cls: type) -> None:
    """Set the default of ``cls.__init__``'s ``max_depth`` to unbounded (where it is the stock 1,000)."""
    init = cls.__init__  # type: ignore[misc]
    params = [p for p in inspect.signature(init).parameters.values()
              if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    defaults = list(init.__defaults__ or ())
    names = [p.name for p in params][len(params) - len(defaults):]
    if "max_depth" in names and defaults[names.index("max_depth")] == STOCK_MAX_DEPTH:
        defaults[names.index("max_depth")] = sys.maxsize
        init.__defaults__ = tuple(defaults)


def _is_descendant_of(self: Task, task: Task) -> bool:
    """Whether ``task`` is an ancestor of this task."""
    parent = self.parent
    while parent is not None:
        if parent == task:
            return True
        parent = parent.parent
    return False


def _find_ancestor(self: Task, spec_name: str) -> Optional[Task]:
    """The nearest ancestor whose spec has this name, or None."""
    parent = self.parent
    while parent is not None:
        if parent.task_spec.name == spec_name:
            return parent
        parent = parent.parent
    return None


def _cancel(self: Task) -> None:
    """Cancel the task if it is not finished; else cancel its children (depth first, in order)."""
    stack = [self]
    while stack:
        task = stack.pop()
        if task.has_state(TaskState.FINISHED_MASK):
            stack.extend(reversed(task.children))
        else:
            task._set_state(TaskState.CANCELLED)
            task._drop_children()
            task.task_spec._on_cancel(task)


def _drop_children(self: Task, force: bool = False) -> None:
    """Remove the task's unfinished children (all of them with ``force``) from the tree, and
    those of its finished descendants; each task's are removed once its finished children
    were visited, as the recursive original does."""
    frames: list[tuple[Task, Any, list[Task], bool]] = [(self, iter(self.children), [], force)]
    while frames:
        task, children, drop, forced = frames[-1]
        for child in children:
            if forced or child.has_state(TaskState.NOT_FINISHED_MASK):
                drop.append(child)
            else:
                frames.append((child, iter(child.children), [], False))
                break
        else:
            frames.pop()
            for gone in drop:
                task.workflow._remove_task(gone.id)


def _remove_task(self: Workflow, task_id: Any) -> None:
    """Remove a task and its descendants (children first, in order) from the workflow."""
    frames = [(self.tasks[task_id], iter(self.tasks[task_id].children))]
    while frames:
        task, children = frames[-1]
        child = next(children, None)
        if child is not None:
            frames.append((child, iter(child.children)))
            continue
        frames.pop()
        task.parent._children.remove(task.id)
        self.tasks.pop(task.id)
        self._task_removed_notify(task)


# the methods lift() replaces, as SpiffWorkflow defines them: (owner, name) -> function
STOCK: dict[tuple[type, str], Any] = {}
_TWINS: tuple[tuple[type, str, Any], ...] = (
    (Task, "is_descendant_of", _is_descendant_of),
    (Task, "find_ancestor", _find_ancestor),
    (Task, "cancel", _cancel),
    (Task, "_drop_children", _drop_children),
    (Workflow, "_remove_task", _remove_task),
)


def lift() -> None:
    """Lift the depth limit and put the iterative twins in place (idempotent)."""
    _unbounded_default(TaskIterator)
    _unbounded_default(BpmnTaskIterator)
    for owner, name, twin in _TWINS:
        STOCK.setdefault((owner, name), vars(owner)[name])
        setattr(owner, name, twin)


_room_lock = threading.Lock()
#: frames left for whatever calls the parser or the engine (a web server's stack, a test runner's)
HEADROOM = 500
#: the most ``make_room`` grants (about 10,000 elements in sequence): a process needing more meets a
#: RecursionError. Some C code recurses on the C stack up to the same limit (``repr`` of a nested
#: list crashed the interpreter at 60,000 in a thread here; ``json`` and ``repr`` held at 40,000)
MAX_FRAMES = 30_000


def make_room(frames: int) -> None:
    """Let Python's stack hold ``frames`` frames beyond ``HEADROOM`` (up to ``MAX_FRAMES`` in all).

    A process of ordinary size needs less than Python's default limit of 1,000 and changes
    nothing. The limit only ever goes up: it is one for every thread of the process, and lowering
    it again as one parse ends could break another thread's parse of a larger process halfway."""
    want = min(HEADROOM + max(0, frames), MAX_FRAMES)
    if want <= sys.getrecursionlimit():
        return
    with _room_lock:
        if want > sys.getrecursionlimit():
            sys.setrecursionlimit(want)
