"""When an inclusive gateway joins: BPMN's rule, for SpiffWorkflow's inclusive gateway.

BPMN 2.0 (section 13.3.5, quoted in SpiffWorkflow's ``InclusiveGateway``) activates a
joining inclusive gateway once a token has arrived and no token anywhere can still reach
one of its empty incoming flows, unless that token can also reach a flow that already
holds one. SpiffWorkflow 3.2 asks "can this token reach that input" with a walk that
follows only the first incoming flow of every element on the way back, and shares its
visited set between the inputs it checks. A branch that splits and merges again (an
exclusive choice inside a branch) hides its second path. The join then fires before that
branch arrives, and fires again when it does, running everything after it twice. The
workflow ends "completed" with no error.

``may_fire`` answers the same question over every path. It uses the same tokens as
SpiffWorkflow (the READY and WAITING tasks above the gateway) and the same arrivals. The
layerflow twin of the inclusive gateway asks it instead of SpiffWorkflow's walk.
"""

from __future__ import annotations

from typing import Any

from SpiffWorkflow.util.task import TaskState

__all__ = ["may_fire"]


def _reach(start: Any, gateway: Any) -> set[Any]:
    """The specs reachable from ``start`` (itself included) without passing ``gateway``."""
    seen = {start}
    todo = [start]
    while todo:
        for nxt in todo.pop().outputs:
            if nxt is not gateway and nxt not in seen:
                seen.add(nxt)
                todo.append(nxt)
    return seen


def may_fire(gateway: Any, my_task: Any) -> bool:
    """Whether the joining inclusive ``gateway`` fires for ``my_task`` now."""
    arrivals, sources = [], []
    for task in my_task.workflow.get_tasks(end_at_spec=gateway.name):
        if task.task_spec == gateway:
            arrivals.append(task)
        elif task.has_state(TaskState.READY | TaskState.WAITING):
            sources.append(task.task_spec)
    filled = {t.parent.task_spec for t in arrivals if t.parent.state == TaskState.COMPLETED}
    # an input whose task is on its way (a definite task not yet finished) is not there yet
    if any(t.parent.has_state(TaskState.DEFINITE_MASK) and t.parent.task_spec not in filled for t in arrivals):
        return False
    empty = {spec for spec in gateway.inputs if spec not in filled}
    if not empty:
        return True
    for source in dict.fromkeys(sources):
        reach = _reach(source, gateway)
        if reach & empty and not reach & filled:
            return False
    return True
