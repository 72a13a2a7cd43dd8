"""Branches that end without a joining gateway.

Every (sub-)process ends in an implicit join of its end events (SpiffWorkflow's
``_EndJoin``): branches of a split that end in end events of their own merge there, as
SpiffWorkflow merges their data. A terminate end event merges the branch that reached it
and drops the branches it cancels.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from engine import Engine, load_process

from engine_helpers import path_of, run_plain, variables

HEAD = """<?xml version="1.0" encoding="UTF-8"?>
<bpmn:definitions xmlns:bpmn="http://www.omg.org/spec/BPMN/20100524/MODEL" id="d" targetNamespace="t">
  <bpmn:process id="{pid}" isExecutable="true">
"""
TAIL = "  </bpmn:process>\n</bpmn:definitions>\n"


def _flows(*pairs: str) -> str:
    return "".join(f'    <bpmn:sequenceFlow id="f{i}" sourceRef="{a}" targetRef="{b}"/>\n'
                   for i, (a, b) in enumerate(p.split("->") for p in pairs))


def _script(task_id: str, script: str) -> str:
    return f'    <bpmn:scriptTask id="{task_id}"><bpmn:script>{script}</bpmn:script></bpmn:scriptTask>\n'


def _write(tmp_path: Path, pid: str, body: str) -> Path:
    path = tmp_path / f"{pid}.bpmn"
    path.write_text(HEAD.format(pid=pid) + body + TAIL, encoding="utf-8")
    return path


def _run(path: Path, data: dict[str, Any] | None = None, user_tasks: dict[str, Any] | None = None) -> Any:
    engine = Engine()
    instance = engine.run(engine.start(load_process(path), data or {}), answers={"user_tasks": user_tasks or {}})
    assert instance.status == "completed", instance.error
    return instance


SEPARATE_ENDS = (
    '    <bpmn:startEvent id="start"/>\n    <bpmn:parallelGateway id="fork"/>\n'
    + _script("a", "a = base + 1") + _script("b", "b = base + 2")
    + '    <bpmn:endEvent id="end_a"/>\n    <bpmn:endEvent id="end_b"/>\n'
    + _flows("start->fork", "fork->a", "fork->b", "a->end_a", "b->end_b"))


def test_branches_ending_in_their_own_end_events_merge_at_the_process_end(tmp_path: Path) -> None:
    path = _write(tmp_path, "separate_ends", SEPARATE_ENDS)
    plain_wf, plain_vars = run_plain(path, {"base": 10}, {})
    instance = _run(path, {"base": 10})

    assert path_of(instance.workflow) == path_of(plain_wf)
    assert variables(instance.main) == plain_vars == {"base": 10, "a": 11, "b": 12}
    assert {info["status"] for info in instance.branches.values()} == {"joined"}
    # what each branch's activity recorded is in the main context's HISTORY too
    assert instance.main.get("activity:a")["keys"][0] == "a"


def test_two_flows_into_one_end_event_merge_too(tmp_path: Path) -> None:
    body = ('    <bpmn:startEvent id="start"/>\n    <bpmn:parallelGateway id="fork"/>\n'
            + _script("a", "a = 1") + _script("b", "b = 2") + '    <bpmn:endEvent id="end"/>\n'
            + _flows("start->fork", "fork->a", "fork->b", "a->end", "b->end"))
    path = _write(tmp_path, "one_end", body)
    plain_wf, plain_vars = run_plain(path, {}, {})
    instance = _run(path)
    assert variables(instance.main) == plain_vars == {"a": 1, "b": 2}


def test_a_branch_waiting_for_a_person_holds_the_end_until_answered(tmp_path: Path) -> None:
    body = ('    <bpmn:startEvent id="start"/>\n    <bpmn:parallelGateway id="fork"/>\n'
            + _script("a", "a = 1") + '    <bpmn:userTask id="sign"/>\n'
            + '    <bpmn:endEvent id="end_a"/>\n    <bpmn:endEvent id="end_b"/>\n'
            + _flows("start->fork", "fork->a", "fork->sign", "a->end_a", "sign->end_b"))
    path = _write(tmp_path, "wait_end", body)
    engine = Engine()
    instance = engine.run(engine.start(load_process(path), {}))
    assert instance.status == "waiting"
    # saved and loaded again (the end join's spec is layerflow's, and survives serialization)
    instance = engine.load(instance.id)
    instance = engine.complete_user_task(instance, "sign", {"signed_by": "ann"})
    assert instance.status == "completed", instance.error
    assert variables(instance.main) == {"a": 1, "signed_by": "ann"}


def _conflict_end(tmp_path: Path) -> Path:
    """Two branches end in end events of their own, having set ``status`` differently."""
    body = ('    <bpmn:startEvent id="start"/>\n    <bpmn:parallelGateway id="fork"/>\n'
            + _script("init", "status = 'pending'")
            + _script("a", "status = 'approved'") + _script("b", "status = 'rejected'")
            + '    <bpmn:endEvent id="end_a"/>\n    <bpmn:endEvent id="end_b"/>\n'
            + _flows("start->init", "init->fork", "fork->a", "fork->b", "a->end_a", "b->end_b"))
    return _write(tmp_path, "conflict_end", body)


def test_conflicting_branches_are_resolved_at_the_process_end(tmp_path: Path) -> None:
    engine = Engine()
    instance = engine.run(engine.start(load_process(_conflict_end(tmp_path)), {}))
    # nothing is silently lost: with no policy for the key, a person decides
    assert instance.status == "waiting"
    [item] = instance.waiting_for
    assert item["kind"] == "confirmation" and item["task_id"] == "conflict_end.EndJoin"
    [conflict] = instance.conflicts
    assert conflict["key"] == "status" and conflict["values"] == {"a": "approved", "b": "rejected"}

    instance = engine.run(engine.load(instance.id), answers={"confirmations": {"conflict_end.EndJoin/status": "rejected"}})
    assert instance.status == "completed", instance.error
    assert instance.main.resolve("status") == "rejected"
    assert instance.conflicts[0]["resolution"]["resolver"] == "human"


def test_a_join_conflict_is_stamped_by_the_engine_clock(tmp_path: Path) -> None:
    """The conflict kept in the context (``_mergedConflicts``) once took the wall clock, while the
    confirmation it asks for took the engine's: a run on a given clock was not reproducible."""
    engine = Engine(clock=lambda: 1_700_000_000.0)
    instance = engine.run(engine.start(load_process(_conflict_end(tmp_path)), {}))
    assert instance.confirmations[0]["created"] == 1_700_000_000.0
    instance = engine.answer_confirmation(instance, "conflict_end.EndJoin/status", "rejected")
    assert instance.status == "completed", instance.error
    [merged] = instance.main.resolve("_mergedConflicts")
    assert merged["time"] == "2023-11-14T22:13:20.000Z"


def test_separate_ends_inside_a_sub_process_merge_before_the_process_goes_on(tmp_path: Path) -> None:
    body = ('    <bpmn:startEvent id="start"/>\n    <bpmn:subProcess id="sub">\n'
            '    <bpmn:startEvent id="s_start"/>\n    <bpmn:parallelGateway id="s_fork"/>\n'
            + _script("s_a", "a = 1") + _script("s_b", "b = 2")
            + '    <bpmn:endEvent id="s_end_a"/>\n    <bpmn:endEvent id="s_end_b"/>\n'
            + _flows("s_start->s_fork", "s_fork->s_a", "s_fork->s_b", "s_a->s_end_a", "s_b->s_end_b").replace('id="f', 'id="sf')
            + '    </bpmn:subProcess>\n' + _script("after", "total = a + b") + '    <bpmn:endEvent id="end"/>\n'
            + _flows("start->sub", "sub->after", "after->end"))
    path = _write(tmp_path, "sub_ends", body)
    plain_wf, plain_vars = run_plain(path, {}, {})
    instance = _run(path)
    assert path_of(instance.workflow) == path_of(plain_wf)
    assert variables(instance.main) == plain_vars == {"a": 1, "b": 2, "total": 3}


def test_terminate_end_event_keeps_its_branch_and_drops_the_cancelled_one(tmp_path: Path) -> None:
    body = ('    <bpmn:startEvent id="start"/>\n    <bpmn:parallelGateway id="fork"/>\n'
            + _script("a", "a = 1") + '    <bpmn:userTask id="sign"/>\n'
            + '    <bpmn:endEvent id="kill"><bpmn:terminateEventDefinition/></bpmn:endEvent>\n'
            + '    <bpmn:endEvent id="end"/>\n'
            + _flows("start->fork", "fork->a", "fork->sign", "a->kill", "sign->end"))
    path = _write(tmp_path, "terminate", body)
    plain_wf, plain_vars = run_plain(path, {}, {})
    instance = _run(path)
    assert path_of(instance.workflow) == path_of(plain_wf) == ["start", "fork", "a", "kill"]
    assert variables(instance.main) == plain_vars == {"a": 1}
    statuses = {info["branch_id"]: info["status"] for info in instance.branches.values()}
    assert statuses == {"a": "joined", "sign": "cancelled"}
    assert instance.waiting_for == []
