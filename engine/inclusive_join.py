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

A loop back through the gateway has the same effect: SpiffWorkflow looks for tokens and
arrivals from the root of the task tree and stops at the gateway's earlier firing, below
which every task of the next pass is. It sees none of them, so each arrival fires alone.

``may_fire`` answers the same question over every path, for the tokens and arrivals of
this pass: the READY and WAITING tasks above the gateway, as SpiffWorkflow takes them,
looked for below the gateway's previous firing when there is one, and the STARTED ones (a
running sub-process holds its token: SpiffWorkflow missed it and fired without waiting
for the sub-process). The
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


def _this_pass(gateway: Any, my_task: Any) -> list[Any]:
    """Where the tokens of this activation are: below the gateway's previous firing when a loop
    brought the flow back through it (SpiffWorkflow looks from the root, stops at that firing
    and sees none of them, so in a loop's second pass every arrival fired on its own)."""
    task = my_task.parent
    while task is not None:
        if task.task_spec == gateway and task.state == TaskState.COMPLETED:
            return list(task.children)
        task = task.parent
    return [my_task.workflow.task_tree]


def may_fire(gateway: Any, my_task: Any) -> bool:
    """Whether the joining inclusive ``gateway`` fires for ``my_task`` now."""
    arrivals, sources = [], []
    for root in _this_pass(gateway, my_task):
        for task in my_task.workflow.get_tasks(first_task=root, end_at_spec=gateway.name):
            if task.task_spec == gateway:
                arrivals.append(task)
            elif task.has_state(TaskState.READY | TaskState.WAITING | TaskState.STARTED):
                # (STARTED: a sub-process or call activity still running holds its token)
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
