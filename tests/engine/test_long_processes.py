"""Long processes (many elements in sequence), as opposed to long runs (test_deep_trees.py).

SpiffWorkflow 3.2 parses a process by following its flows recursively (three Python frames
per element) and predicts a new workflow's or sub-process's steps recursively (one per step):
with Python's default limit of 1,000 frames a sequence of about 320 elements could not be
loaded, and validate blamed an element that had nothing wrong with it. ``deep_trees.make_room``
gives the parser and the engine the frames the process needs.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from engine import Engine, deep_trees, load_process
from engine.validate import validate_process

from engine_helpers import ROOT, flow, script_task, write_elements

LENGTH = 400  # elements in sequence: beyond what the default limit let SpiffWorkflow parse (~320)
SUB_LENGTH = 1_100  # steps of a sub-process: beyond what it let SpiffWorkflow predict (~980)


def steps(prefix: str, n: int) -> tuple[list[str], list[str]]:
    """``n`` script tasks ``{prefix}0..`` counting ``x`` up from 1, and the flows between them."""
    ids = [f"{prefix}{i}" for i in range(n)]
    return ([script_task(i, "x = x + 1" if k else "x = 1") for k, i in enumerate(ids)],
            [flow(a, b) for a, b in zip(ids, ids[1:])])


@pytest.fixture
def default_limit() -> Iterator[None]:
    """Python's default recursion limit for the test (as a fresh process has it), restored after."""
    before = sys.getrecursionlimit()
    sys.setrecursionlimit(1000)
    try:
        yield
    finally:
        sys.setrecursionlimit(max(before, sys.getrecursionlimit()))


def test_a_sequence_of_400_activities_validates_and_runs(tmp_path: Path, default_limit: None) -> None:
    tasks, flows = steps("t", LENGTH)
    path = write_elements(tmp_path, "long_chain", ['<bpmn:startEvent id="start"/>', *tasks, '<bpmn:endEvent id="end"/>',
                                                   flow("start", "t0"), *flows, flow(f"t{LENGTH - 1}", "end")])
    report = validate_process(path)
    assert not report.problems, [p.message for p in report.problems]  # was: 't3xx': RecursionError, fix the element
    eng = Engine(store="memory://", save="stop")
    inst = eng.run(eng.start(load_process(path), {}))
    assert inst.status == "completed", inst.error
    assert inst.main.get("x") == LENGTH
    assert inst.activities == LENGTH


def test_a_long_sub_process_starts_in_a_process_that_only_loaded_the_instance(tmp_path: Path) -> None:
    """The instance waits on a user task before a sub-process of 1,100 steps; another Python process
    (one that never parsed the BPMN: a worker, a server) loads it from the store and completes the
    task, and SpiffWorkflow predicts the sub-process's steps as it starts it. (Its steps are tasks a
    person does, so the instance stops at the first: running 1,100 scripts would take seconds.)"""
    ids = [f"s{i}" for i in range(SUB_LENGTH)]
    sub = ('<bpmn:subProcess id="long_sub"><bpmn:startEvent id="sub_start"/>' +
           "".join(f'<bpmn:task id="{i}"/>' for i in ids) + '<bpmn:endEvent id="sub_end"/>' + flow("sub_start", "s0") +
           "".join(flow(a, b) for a, b in zip(ids, ids[1:])) + flow(ids[-1], "sub_end") + "</bpmn:subProcess>")
    path = write_elements(tmp_path, "wait_then_long_sub", [
        '<bpmn:startEvent id="start"/>', '<bpmn:userTask id="approve"/>', sub, '<bpmn:endEvent id="end"/>',
        flow("start", "approve"), flow("approve", "long_sub"), flow("long_sub", "end")])
    store = f"sqlite:///{tmp_path / 'store.db'}"
    eng = Engine(store=store, save="stop")
    inst = eng.run(eng.start(load_process(path), {}))
    assert inst.status == "waiting" and [w["task_id"] for w in inst.waiting_for] == ["approve"]

    script = (
        "import json, sys\n"
        "from engine import Engine\n"
        "assert sys.getrecursionlimit() == 1000, sys.getrecursionlimit()\n"
        f"eng = Engine(store={store!r}, save='stop')\n"
        f"inst = eng.complete_user_task(eng.load({inst.id!r}), 'approve', {{'ok': True}})\n"
        "print(json.dumps({'status': inst.status, 'error': inst.error,\n"
        "                  'waiting_for': [w['task_id'] for w in inst.waiting_for]}))\n")
    done = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, capture_output=True, text=True, timeout=120,
                          env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads(done.stdout.strip().splitlines()[-1]) == {"status": "waiting", "error": None,
                                                                 "waiting_for": ["s0"]}


def test_make_room_only_raises_the_limit_and_is_bounded(default_limit: None) -> None:
    deep_trees.make_room(3 * 150)  # an ordinary process: nothing changes
    assert sys.getrecursionlimit() == 1000
    deep_trees.make_room(5_000)
    assert sys.getrecursionlimit() == deep_trees.HEADROOM + 5_000
    deep_trees.make_room(2_000)  # never lowered: another thread may be parsing a larger process
    assert sys.getrecursionlimit() == deep_trees.HEADROOM + 5_000
    deep_trees.make_room(10**9)
    assert sys.getrecursionlimit() == deep_trees.MAX_FRAMES
