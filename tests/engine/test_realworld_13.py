"""Shapes met in public BPMN files, round 13: SpiffWorkflow's own test processes not used before
(sartography/SpiffWorkflow, ``tests/SpiffWorkflow/bpmn/data``: ``call_activity_with_message.bpmn``,
``boundary_timer_on_task.bpmn``) and the reminder-and-deadline pair of timer boundary events that
Camunda 7's docs draw on an activity, here on a call activity whose called process waits for a
person. Each is redrawn small in ``tests/engine/realworld13/`` (the file says where it comes from);
where plain SpiffWorkflow 3.2 runs a shape as BPMN means it, a case runs it there too and the path
and the variables must agree; where it does not, what plain SpiffWorkflow does is asserted too, so
a SpiffWorkflow that changes shows."""

from __future__ import annotations

import time
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest
from SpiffWorkflow.bpmn.util.event import BpmnEvent
from SpiffWorkflow.bpmn.workflow import BpmnWorkflow
from SpiffWorkflow.spiff.parser.process import SpiffBpmnParser
from SpiffWorkflow.spiff.specs.event_definitions import MessageEventDefinition
from SpiffWorkflow.util.task import TaskState

from engine import Engine, load_process
from engine.validate import validate_process

from engine_helpers import path_of, variables

HERE = Path(__file__).resolve().parent / "realworld13"
HOUR = 3600.0


def problems(path: Path) -> list[tuple[str, str, str | None]]:
    return [(p.code, p.severity, p.element_id) for p in validate_process([path]).problems]


class Clock:
    def __init__(self) -> None:
        self.now = float(int(time.time()))

    def __call__(self) -> float:
        return self.now


def plain_workflow(path: Path, pid: str) -> BpmnWorkflow:
    parser = SpiffBpmnParser()
    parser.add_bpmn_file(str(path))
    wf = BpmnWorkflow(parser.get_spec(pid), parser.get_subprocess_specs(pid))
    wf.do_engine_steps()
    return wf


def waiting(instance: Any, task_id: str) -> str:
    [item] = [w["id"] for w in instance.waiting_for if w["task_id"] == task_id]
    return str(item)


# -- call_activity_with_message.bpmn: a called process that asks outside and loops until yes ------

APPROVAL = HERE / "call_activity_with_message.bpmn"


def test_a_called_process_that_messages_out_and_waits_for_the_answer_runs_as_in_plain_spiffworkflow() -> None:
    """The called process sends its plan (messagePayload) and waits for the answer (messageVariable
    Approved); "No" loops back to the person, "Yes" ends the called process by its terminate end
    event, and the caller files the plan. Expected, as in plain SpiffWorkflow: two requests out
    ("v1", "v2"), the caller completes with filed == "v2 (Yes)"."""
    assert problems(APPROVAL) == []
    engine = Engine(store="memory://")
    instance = engine.run(engine.start(load_process([APPROVAL]), {}))
    sent = []
    for plan, answer in (("v1", "No"), ("v2", "Yes")):
        instance = engine.complete_user_task(instance, waiting(instance, "Activity_EnterPlan"), {"plan_details": plan})
        assert [w["task_id"] for w in instance.waiting_for] == ["Event_Get_Approval_Response"]
        sent = [(m["name"], m["payload"]) for m in instance.messages_out()]
        instance = engine.send_event(instance, "ApprovalResponse", answer)
    assert sent == [("ApprovalRequest", "v1"), ("ApprovalRequest", "v2")]
    assert instance.status == "completed", instance.error

    wf = plain_workflow(APPROVAL, "Caller")
    plain_sent = []
    for plan, answer in (("v1", "No"), ("v2", "Yes")):
        [task] = wf.get_tasks(state=TaskState.READY, manual=True)
        task.data["plan_details"] = plan
        task.run()
        wf.do_engine_steps()
        plain_sent += [(e.event_definition.name, e.payload) for e in wf.get_events()]
        wf.catch(BpmnEvent(MessageEventDefinition("ApprovalResponse"), answer))
        wf.do_engine_steps()
    assert wf.is_completed() and plain_sent == sent
    assert path_of(instance.workflow) == path_of(wf)
    assert variables(instance.main) == dict(wf.last_task.data) == {
        "plan_details": "v2", "Approved": "Yes", "filed": "v2 (Yes)"}


# -- a reminder cycle and a deadline on a call activity -------------------------------------------

TIMERS = HERE / "call_activity_timers.bpmn"


def _contract(clock: Clock, by_phone: bool = False) -> tuple[Engine, Any]:
    engine = Engine(store="memory://", clock=clock)
    return engine, engine.run(engine.start(load_process([TIMERS]), {"by_phone": by_phone}))


@pytest.mark.parametrize("hours, reminders", [(0.5, []), (1.5, ["mail"]), (2.5, ["mail", "mail"])],
                         ids=["no-reminder", "one-reminder", "both-reminders"])
def test_each_reminder_a_cycle_sent_while_the_review_ran_stays_once_the_review_is_done(
        hours: float, reminders: list[str]) -> None:
    """R2/PT1H fires an hour after the call started and an hour after that; each repetition's
    path (a script that appends "mail") runs to its end event beside the called review. Expected:
    once the review is done and the contract signed, every reminder sent is in ``reminders``; the
    second reads what the first wrote (it starts an hour after the first one ended).

    It was lost when the review ended before the cycle's last repetition (one reminder: ``[]``):
    SpiffWorkflow cancels the waiting cycle event with its activity, and the cancel dropped the end
    its path waited at, so the process's end never merged the path. With both repetitions fired
    the event had completed, and each path, forked from the flow, brought back ``["mail"]``."""
    assert problems(TIMERS) == []
    clock = Clock()
    engine, instance = _contract(clock)
    for _ in range(int(hours)):
        clock.now += HOUR
        instance = engine.run(instance)
    clock.now += (hours - int(hours)) * HOUR
    instance = engine.run(instance)
    instance = engine.complete_user_task(instance, waiting(instance, "review"), {"verdict": "ok"})
    assert instance.status == "completed", instance.error
    assert path_of(instance.workflow).count("send_reminder") == len(reminders)
    assert variables(instance.main) == {"by_phone": False, "reminders": reminders, "verdict": "ok",
                                        "outcome": "signed"}


def test_a_reminder_call_a_person_still_makes_waits_after_the_review_is_done() -> None:
    """The reminder goes by phone: a person's task on the repetition's path. The review is done
    while that call waits. BPMN: a non-interrupting boundary event's path is a token of its own;
    the activity's end stops the cycle's later repetitions, not a path already running. Expected:
    the instance waits for call_reviewer, then completes with the call's writes.

    Under layerflow (and plain SpiffWorkflow 3.2) the call was cancelled with the cycle event and
    the instance completed without it: a person's task dropped without a word."""
    clock = Clock()
    engine, instance = _contract(clock, by_phone=True)
    clock.now += 1.5 * HOUR
    instance = engine.run(instance)
    assert sorted(w["task_id"] for w in instance.waiting_for if w["kind"] == "user_task") == ["call_reviewer", "review"]
    instance = engine.complete_user_task(instance, waiting(instance, "review"), {"verdict": "ok"})
    assert instance.status == "waiting", instance.error
    assert [w["task_id"] for w in instance.waiting_for] == ["call_reviewer"]
    instance = engine.complete_user_task(instance, waiting(instance, "call_reviewer"), {"reached": "yes"})
    assert instance.status == "completed", instance.error
    assert variables(instance.main) == {"by_phone": True, "reminders": [], "verdict": "ok", "outcome": "signed",
                                        "reached": "yes"}


def test_plain_spiffworkflow_drops_the_reminder_call_with_the_cycle(monkeypatch: pytest.MonkeyPatch) -> None:
    """What plain SpiffWorkflow 3.2 does with the shape above (on a patched clock): the review done,
    the workflow completes and call_reviewer is gone from its tree."""
    from SpiffWorkflow.bpmn.specs.event_definitions import timer as spiff_timer

    now = [datetime.now(timezone.utc)]

    class PatchedDatetime(datetime):
        @classmethod
        def now(cls, tz: Any = None) -> Any:  # type: ignore[override]
            return now[0]

    monkeypatch.setattr(spiff_timer, "datetime", PatchedDatetime)
    parser = SpiffBpmnParser()
    parser.add_bpmn_file(str(TIMERS))
    wf = BpmnWorkflow(parser.get_spec("Contract"), parser.get_subprocess_specs("Contract"))
    wf.task_tree.data["by_phone"] = True
    wf.do_engine_steps()
    now[0] += timedelta(hours=1.5)
    wf.refresh_timers()
    wf.do_engine_steps()
    assert sorted(t.task_spec.bpmn_id for t in wf.get_tasks(state=TaskState.READY, manual=True)) == ["call_reviewer", "review"]
    [review] = wf.get_tasks(state=TaskState.READY, manual=True, spec_name="review")
    review.data["verdict"] = "ok"
    review.run()
    wf.do_engine_steps()
    assert wf.is_completed() and wf.get_tasks(spec_name="call_reviewer") == []


def test_the_deadline_cancels_the_called_review_after_the_reminders_due_before_it() -> None:
    """Reached only after 3.5 hours: the reminders due at 1 h and 2 h fire, then the deadline at
    3 h cancels the call (its person's task with it) and escalates. layerflow (as SpiffWorkflow
    after ``refresh_timers()``) fires one reminder and the deadline in that run: the 2 h one was due
    before the deadline and is missed."""
    clock = Clock()
    engine, instance = _contract(clock)
    clock.now += 3.5 * HOUR
    instance = engine.run(instance)
    assert instance.status == "completed", instance.error
    taken = path_of(instance.workflow)
    assert "review" not in taken and {"escalate", "timed_out"} <= set(taken)
    assert taken.count("send_reminder") == 2, taken
    assert taken.index("give_up") > [i for i, t in enumerate(taken) if t == "how"][1], taken
    assert variables(instance.main)["outcome"] == "no review"
