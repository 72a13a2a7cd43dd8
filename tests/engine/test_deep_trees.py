"""Loops of any length: SpiffWorkflow 3.2 adds a task-tree level per task a loop runs again,
sees no task deeper than 1,000 levels and recurses once per level (engine.deep_trees)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest
from SpiffWorkflow.bpmn.serializer import BpmnWorkflowSerializer
from SpiffWorkflow.bpmn.workflow import BpmnWorkflow
from SpiffWorkflow.bpmn.parser import BpmnParser
from SpiffWorkflow.task import Task
from SpiffWorkflow.util.task import TaskIterator, TaskState
from SpiffWorkflow.workflow import Workflow

from engine import Engine, load_process
from engine import deep_trees

from engine_helpers import EXAMPLES, flow, script_task, write_elements

# a two-step pass (work, gateway) adds two levels: past 500 passes the tree is deeper than
# the 1,000 levels stock SpiffWorkflow looks at
PASSES = 520

LOOP = ['<bpmn:startEvent id="start"/>', script_task("init", "count = 0"), script_task("work", "count = count + 1"),
        '<bpmn:exclusiveGateway id="more" default="more_to_after"/>',
        flow("start", "init"), flow("init", "work"), flow("work", "more"), flow("more", "work", "count < n"),
        flow("more", "after")]


def _engine(tmp_path: Path | None = None) -> Engine:
    return Engine(store=f"sqlite:///{tmp_path}/s.db" if tmp_path else "memory://", save="stop")


def test_a_loop_of_more_than_500_passes_runs_to_its_end() -> None:
    eng = _engine()
    inst = eng.run(eng.start(load_process(EXAMPLES / "xor_loop.bpmn"), {"batch_size": PASSES}))
    assert inst.status == "completed", inst.error
    assert inst.main.get("count") == PASSES  # stock SpiffWorkflow 3.2 stops at 499 and calls it completed
    assert inst.main.get("result") == sum(i * i for i in range(1, PASSES + 1))  # the step after the loop ran
    assert inst.main.get(f"activity:work#{PASSES}") is not None


def test_a_parallel_join_after_a_long_loop_merges(tmp_path: Path) -> None:
    path = write_elements(tmp_path, "loop_then_parallel", LOOP + [
        '<bpmn:parallelGateway id="after"/>', script_task("a", "x = count"), script_task("b", "y = 2"),
        '<bpmn:parallelGateway id="join"/>', script_task("fin", "z = x + y"), '<bpmn:endEvent id="end"/>',
        flow("after", "a"), flow("after", "b"), flow("a", "join"), flow("b", "join"), flow("join", "fin"),
        flow("fin", "end")])
    eng = _engine()
    inst = eng.run(eng.start(load_process(path), {"n": PASSES}))
    # the join walked the tree by recursion, once per level: RecursionError past ~1,000
    assert inst.status == "completed", inst.error
    assert inst.main.get("z") == PASSES + 2


def test_a_user_task_after_a_long_loop_waits_survives_a_reload_and_completes(tmp_path: Path) -> None:
    path = write_elements(tmp_path, "loop_then_user", LOOP + [
        '<bpmn:userTask id="after"/>', script_task("fin", "done = count + extra"), '<bpmn:endEvent id="end"/>',
        flow("after", "fin"), flow("fin", "end")])
    eng = _engine(tmp_path)
    inst = eng.run(eng.start(load_process(path), {"n": PASSES}))
    assert inst.status == "waiting"  # stock: "completed", the user task never reached
    assert [w["task_id"] for w in inst.waiting_for] == ["after"]
    back = eng.load(inst.id)
    done = eng.complete_user_task(back, "after", {"extra": 1})
    assert done.status == "completed", done.error
    assert done.main.get("done") == PASSES + 1


def test_an_instance_deep_in_a_long_loop_can_be_cancelled(tmp_path: Path) -> None:
    path = write_elements(tmp_path, "loop_then_wait", LOOP + ['<bpmn:userTask id="after"/>', '<bpmn:endEvent id="end"/>',
                                                              flow("after", "end")])
    eng = _engine(tmp_path)
    inst = eng.run(eng.start(load_process(path), {"n": PASSES}))
    cancelled = eng.cancel(eng.load(inst.id), reason="no longer needed")
    assert cancelled.status == "cancelled"
    assert not cancelled.workflow.get_tasks(state=TaskState.NOT_FINISHED_MASK)


def test_the_iterators_default_depth_is_unbounded() -> None:
    wf = _plain_workflow(Path(EXAMPLES / "xor_loop.bpmn"), {"batch_size": 3})
    assert TaskIterator(wf.task_tree).max_depth == sys.maxsize
    assert deep_trees.STOCK_MAX_DEPTH == 1000


# ----- the iterative twins do what SpiffWorkflow's recursive originals do -----------------------

def _plain_workflow(path: Path, data: dict[str, Any]) -> BpmnWorkflow:
    parser = BpmnParser()
    parser.add_bpmn_file(str(path))
    pid = parser.get_process_ids()[0]
    wf = BpmnWorkflow(parser.get_spec(pid), parser.get_subprocess_specs(pid))
    wf.task_tree.data.update(data)
    return wf


@pytest.fixture
def half_run(tmp_path: Path) -> str:
    """A workflow stopped halfway: finished, waiting, ready and predicted tasks, two branches."""
    path = write_elements(tmp_path, "half", [
        '<bpmn:startEvent id="start"/>', script_task("init", "count = 0"), '<bpmn:parallelGateway id="split"/>',
        script_task("work", "count = count + 1"), '<bpmn:exclusiveGateway id="more" default="more_to_join"/>',
        '<bpmn:userTask id="ask"/>', script_task("after_ask", "asked = True"),
        '<bpmn:parallelGateway id="join"/>', '<bpmn:endEvent id="end"/>',
        flow("start", "init"), flow("init", "split"), flow("split", "work"), flow("split", "ask"),
        flow("work", "more"), flow("more", "work", "count < 4"), flow("more", "join"), flow("ask", "after_ask"),
        flow("after_ask", "join"), flow("join", "end")])
    wf = _plain_workflow(path, {})
    wf.do_engine_steps()
    assert not wf.is_completed()
    return str(BpmnWorkflowSerializer().serialize_json(wf))


def _copy(text: str) -> BpmnWorkflow:
    wf = BpmnWorkflowSerializer().deserialize_json(text)
    assert isinstance(wf, BpmnWorkflow)
    return wf


def _shape(wf: Workflow) -> list[tuple[str, str, int, list[str]]]:
    return sorted((str(t.id), t.task_spec.name, t.state, [str(c) for c in t._children]) for t in wf.tasks.values())


def _stock(owner: type, name: str) -> Any:
    return deep_trees.STOCK[(owner, name)]


def test_is_descendant_of_and_find_ancestor_agree_with_the_originals(half_run: str) -> None:
    wf = _copy(half_run)
    tasks = list(wf.tasks.values())
    names = sorted({t.task_spec.name for t in tasks})
    for t in tasks:
        for other in tasks:
            assert t.is_descendant_of(other) == _stock(Task, "is_descendant_of")(t, other)
        for name in names:
            assert t.find_ancestor(name) is _stock(Task, "find_ancestor")(t, name)


def _removals(wf: Workflow) -> list[str]:
    gone: list[str] = []
    wf.task_removed_event.connect(lambda _wf, task: gone.append(str(task.id)))
    return gone


def test_cancel_leaves_the_tree_as_the_original_does(half_run: str) -> None:
    mine, theirs = _copy(half_run), _copy(half_run)
    mine_gone, theirs_gone = _removals(mine), _removals(theirs)
    mine.task_tree.cancel()
    _stock(Task, "cancel")(theirs.task_tree)
    assert _shape(mine) == _shape(theirs)
    assert mine_gone == theirs_gone  # the same tasks removed, in the same order


@pytest.mark.parametrize("force", [False, True])
def test_drop_children_removes_what_the_original_removes(half_run: str, force: bool) -> None:
    mine, theirs = _copy(half_run), _copy(half_run)
    mine_gone, theirs_gone = _removals(mine), _removals(theirs)
    start = next(t for t in mine.tasks.values() if t.task_spec.name == "split")
    mine.tasks[start.id]._drop_children(force=force)
    _stock(Task, "_drop_children")(theirs.tasks[start.id], force=force)
    assert _shape(mine) == _shape(theirs)
    assert mine_gone == theirs_gone
    assert mine_gone  # something was removed: the check compares real work


def test_remove_task_removes_a_subtree_as_the_original_does(half_run: str) -> None:
    mine, theirs = _copy(half_run), _copy(half_run)
    mine_gone, theirs_gone = _removals(mine), _removals(theirs)
    split = next(t for t in mine.tasks.values() if t.task_spec.name == "split")
    branch = split._children[0]
    mine._remove_task(branch)
    _stock(Workflow, "_remove_task")(theirs, branch)
    assert _shape(mine) == _shape(theirs)
    assert len(mine_gone) > 1 and mine_gone == theirs_gone  # a subtree, children first, in order


def test_the_twins_replace_the_methods_they_were_written_against() -> None:
    """The twins mirror SpiffWorkflow 3.2's recursive methods line by line; a release that
    changes one of them fails here, so the twin is reviewed rather than silently kept."""
    import hashlib
    import inspect

    reviewed = {("Task", "is_descendant_of"): "e3322602ff369793", ("Task", "find_ancestor"): "2c421b50e170644c",
                ("Task", "cancel"): "16a6cc6f7ea48468", ("Task", "_drop_children"): "eca5081a4b520d8d",
                ("Workflow", "_remove_task"): "3be421d7182884f3"}
    found = {(owner.__name__, name): hashlib.sha256(inspect.getsource(fn).encode()).hexdigest()[:16]
             for (owner, name), fn in deep_trees.STOCK.items()}
    assert found == reviewed
