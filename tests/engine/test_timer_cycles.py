"""Repeating timers (``timeCycle``: "R3/PT1H", "R/PT10M") on the engine's clock.

SpiffWorkflow 3.2's semantics, measured with plain SpiffWorkflow on a patched clock
(``test_repetitions_match_plain_spiffworkflow`` keeps the measurement honest):

* "R<n>/<duration>" fires n times, the first one duration after the wait starts, then every
  duration after the previous due time (the schedule is kept, not restarted from "now");
  "R/<duration>" repeats without end.
* each repetition starts the path after the event once; the event itself completes after
  the last repetition: a non-interrupting boundary event leaves its activity waiting, an
  interrupting one cancels its activity only then; an intermediate catch event and a start
  event run their path once per repetition.
* a run or resume after several periods fires every missed repetition, one after another
  (plain SpiffWorkflow does the same in one ``refresh_timers(); do_engine_steps()``).

One difference, kept from layerflow's other timers: a repetition is due when the engine's
clock reaches its time (SpiffWorkflow: once the wall clock has passed it).

Under layerflow the times come from ``Engine(clock=...)``; the tests move that clock and
never sleep. The clock starts at the wall clock's time because SpiffWorkflow compares the
other timers with the wall clock too."""

from __future__ import annotations

import time
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any
from xml.sax.saxutils import escape

import pytest
from SpiffWorkflow.util.task import TaskState

from context_layers import Layer, LayeredContext
from context_layers.errors import ProcessError
from engine import Engine, load_process
from engine.governance import InstanceStateError

from engine_helpers import patch_spiff_timer_clock, path_of

HOUR = 3600.0
HEAD = """<?xml version="1.0" encoding="UTF-8"?>
<bpmn:definitions xmlns:bpmn="http://www.omg.org/spec/BPMN/20100524/MODEL"
                  id="cycle_defs" targetNamespace="https://layerflow.dev/tests">
"""


class Clock:
    def __init__(self) -> None:
        self.now = float(int(time.time()))

    def __call__(self) -> float:
        return self.now


def cycle(text: str) -> str:
    return (f"<bpmn:timerEventDefinition><bpmn:timeCycle>{escape(text)}</bpmn:timeCycle>"
            "</bpmn:timerEventDefinition>")


def flow(source: str, target: str) -> str:
    return f'<bpmn:sequenceFlow id="{source}_to_{target}" sourceRef="{source}" targetRef="{target}"/>'


def script(task_id: str, text: str) -> str:
    return f'<bpmn:scriptTask id="{task_id}"><bpmn:script>{escape(text)}</bpmn:script></bpmn:scriptTask>'


def write(tmp_path: Path, pid: str, elements: list[str]) -> Path:
    path = tmp_path / f"{pid}.bpmn"
    path.write_text(f'{HEAD}<bpmn:process id="{pid}" isExecutable="true">{"".join(elements)}'
                    "</bpmn:process></bpmn:definitions>", encoding="utf-8")
    return path


def reminders(tmp_path: Path, expression: str = '"R3/PT1H"', interrupting: bool = False) -> Path:
    """A person reviews; a cycle timer on the review reminds them each time it fires."""
    return write(tmp_path, "review_reminders", [
        '<bpmn:startEvent id="start"/>', '<bpmn:userTask id="review"/>', '<bpmn:endEvent id="done"/>',
        f'<bpmn:boundaryEvent id="tick" attachedToRef="review" cancelActivity="{str(interrupting).lower()}">'
        f"{cycle(expression)}</bpmn:boundaryEvent>",
        script("remind", "sent = sent + 1 if 'sent' in dir() else 1"), '<bpmn:endEvent id="reminded"/>',
        flow("start", "review"), flow("review", "done"), flow("tick", "remind"), flow("remind", "reminded"),
    ])


def catch(tmp_path: Path, expression: str = '"R3/PT1H"') -> Path:
    return write(tmp_path, "polling", [
        '<bpmn:startEvent id="start"/>', f'<bpmn:intermediateCatchEvent id="tick">{cycle(expression)}'
        "</bpmn:intermediateCatchEvent>", script("poll", "polls = polls + 1 if 'polls' in dir() else 1"),
        '<bpmn:endEvent id="polled"/>', flow("start", "tick"), flow("tick", "poll"), flow("poll", "polled"),
    ])


def start_cycle(tmp_path: Path, expression: str = '"R2/PT1H"') -> Path:
    return write(tmp_path, "scheduled", [
        f'<bpmn:startEvent id="tick">{cycle(expression)}</bpmn:startEvent>',
        script("poll", "polls = 1"), '<bpmn:endEvent id="polled"/>', flow("tick", "poll"), flow("poll", "polled"),
    ])


def timers(instance: Any) -> list[dict[str, Any]]:
    return [w for w in instance.waiting_for if w["kind"] == "timer"]


def count(instance: Any, bpmn_id: str) -> int:
    """Completed runs of a task (``get_tasks(state=...)`` does not look below a waiting cycle timer)."""
    return sum(t.state == TaskState.COMPLETED for t in instance.workflow.get_tasks(spec_name=bpmn_id))


def due_in(clock: Clock, item: dict[str, Any]) -> float:
    return (datetime.fromisoformat(item["due"]) - datetime.fromtimestamp(clock.now, timezone.utc)).total_seconds()


@pytest.fixture()
def clock() -> Clock:
    return Clock()


def later(engine: Engine, instance: Any, clock: Clock, hours: float) -> Any:
    clock.now += hours * HOUR
    return engine.resume(engine.load(instance.id))


def test_a_cycle_boundary_timer_waits_on_the_engine_clock(tmp_path: Path, clock: Clock) -> None:
    engine = Engine(clock=clock)
    instance = engine.run(engine.start(load_process(reminders(tmp_path)), {}))
    assert instance.status == "waiting"
    (item,) = timers(instance)
    assert item["task_id"] == "tick" and item["repetitions_left"] == 3
    assert due_in(clock, item) == HOUR

    instance = later(engine, instance, clock, 0.5)  # not yet
    assert count(instance, "remind") == 0 and due_in(clock, timers(instance)[0]) == HOUR / 2


def test_a_non_interrupting_cycle_fires_each_repetition_and_leaves_the_activity(tmp_path: Path,
                                                                               clock: Clock) -> None:
    engine = Engine(clock=clock)
    instance = engine.run(engine.start(load_process(reminders(tmp_path)), {}))
    seen = []
    for _ in range(3):
        instance = later(engine, instance, clock, 1)
        seen.append((count(instance, "remind"), [(w["repetitions_left"], due_in(clock, w))
                                                 for w in timers(instance)]))
    assert seen == [(1, [(2, HOUR)]), (2, [(1, HOUR)]), (3, [])]
    assert instance.status == "waiting"
    assert [w["kind"] for w in instance.waiting_for] == ["user_task"]  # the review still waits, no timer
    assert instance.main.resolve("sent") == 3  # each repetition's path wrote into the context
    instance = later(engine, instance, clock, 5)
    assert count(instance, "remind") == 3


def test_an_interrupting_cycle_cancels_its_activity_after_the_last_repetition(tmp_path: Path,
                                                                              clock: Clock) -> None:
    engine = Engine(clock=clock)
    instance = engine.run(engine.start(load_process(reminders(tmp_path, interrupting=True)), {}))
    instance = later(engine, instance, clock, 1)
    instance = later(engine, instance, clock, 1)
    assert instance.status == "waiting" and count(instance, "remind") == 2
    assert [w["kind"] for w in instance.waiting_for] == ["user_task", "timer"]
    instance = later(engine, instance, clock, 1)
    assert instance.status == "completed", instance.error
    assert count(instance, "remind") == 3 and "review" not in path_of(instance.workflow)


def test_a_resume_after_several_periods_fires_every_missed_repetition(tmp_path: Path, clock: Clock) -> None:
    engine = Engine(clock=clock)
    instance = engine.run(engine.start(load_process(reminders(tmp_path, '"R5/PT1H"')), {}))
    instance = later(engine, instance, clock, 3.5)
    assert count(instance, "remind") == 3
    (item,) = timers(instance)
    # the schedule is kept: the next is due at hour 4, not an hour after the resume
    assert item["repetitions_left"] == 2 and due_in(clock, item) == HOUR / 2
    assert instance.main.resolve("sent") == 3


def test_an_endless_cycle_has_no_repetitions_left(tmp_path: Path, clock: Clock) -> None:
    engine = Engine(clock=clock)
    instance = engine.run(engine.start(load_process(reminders(tmp_path, '"R/PT10M"')), {}))
    (item,) = timers(instance)
    assert item["repetitions_left"] is None and due_in(clock, item) == 600
    instance = later(engine, instance, clock, 1)
    assert count(instance, "remind") == 6
    (item,) = timers(instance)
    assert item["repetitions_left"] is None and due_in(clock, item) == 600


def test_an_intermediate_cycle_catch_runs_its_path_each_repetition(tmp_path: Path, clock: Clock) -> None:
    engine = Engine(clock=clock)
    instance = engine.run(engine.start(load_process(catch(tmp_path)), {}))
    assert [(w["task_id"], w["repetitions_left"]) for w in timers(instance)] == [("tick", 3)]
    instance = later(engine, instance, clock, 1)
    assert instance.status == "waiting" and count(instance, "poll") == 1
    instance = later(engine, instance, clock, 2)
    assert instance.status == "completed", instance.error
    assert count(instance, "poll") == 3 and instance.main.resolve("polls") == 3


def test_a_cycle_start_event_starts_its_path_each_repetition(tmp_path: Path, clock: Clock) -> None:
    engine = Engine(clock=clock)
    instance = engine.run(engine.start(load_process(start_cycle(tmp_path)), {}))
    assert [(w["task_id"], w["repetitions_left"]) for w in timers(instance)] == [("tick", 2)]
    instance = later(engine, instance, clock, 1)
    assert count(instance, "poll") == 1 and instance.status == "waiting"
    instance = later(engine, instance, clock, 1)
    assert instance.status == "completed", instance.error
    assert count(instance, "poll") == 2


def test_the_count_survives_save_and_load(tmp_path: Path, clock: Clock) -> None:
    engine = Engine(clock=clock)
    instance = engine.run(engine.start(load_process(reminders(tmp_path)), {}))
    instance = later(engine, instance, clock, 1)
    loaded = engine.load(instance.id)
    assert timers(loaded) == timers(instance) and timers(loaded)[0]["repetitions_left"] == 2
    instance = later(engine, loaded, clock, 2)
    assert count(instance, "remind") == 3 and timers(instance) == []


def test_a_cycle_with_a_start_date_fires_from_that_date(tmp_path: Path, clock: Clock) -> None:
    first = datetime.fromtimestamp(clock.now, timezone.utc) + timedelta(hours=2)
    engine = Engine(clock=clock)
    path = reminders(tmp_path, f'"R2/{first.isoformat()}/PT1H"')
    instance = engine.run(engine.start(load_process(path), {}))
    (item,) = timers(instance)
    assert due_in(clock, item) == 2 * HOUR and item["repetitions_left"] == 2
    instance = later(engine, instance, clock, 3)
    assert count(instance, "remind") == 2 and timers(instance) == []


def test_each_repetition_is_on_the_tape(tmp_path: Path, clock: Clock) -> None:
    """Each repetition's path is an activity like any other: begun and completed on the tape,
    with a record of its own."""
    engine = Engine(clock=clock)
    instance = engine.run(engine.start(load_process(reminders(tmp_path)), {}))
    instance = later(engine, instance, clock, 2)
    begun = [e for e in instance.main.tape if str(getattr(e.kind, "value", e.kind)) == "begin"]
    assert [e.activity for e in begun] == ["remind", "remind"]
    history = instance.main.layer(Layer.HISTORY)
    assert [k for k in history if k.startswith("activity:")] == ["activity:remind", "activity:remind#2"]
    assert history["sent"] == 2
    assert LayeredContext.replay(instance.main.tape) == instance.main


# ----- against plain SpiffWorkflow, its clock patched ------------------------------------------------

def _plain_runs(path: Path, monkeypatch: pytest.MonkeyPatch, start: float,
                steps: list[float]) -> list[tuple[int, int | None]]:
    """Plain SpiffWorkflow on ``path``, its timer clock moved by ``steps`` hours, each followed
    by ``refresh_timers(); do_engine_steps()``: after each step, how often ``remind`` ran and
    the cycles SpiffWorkflow has left."""
    from SpiffWorkflow.bpmn.workflow import BpmnWorkflow
    from SpiffWorkflow.spiff.parser.process import SpiffBpmnParser

    now = patch_spiff_timer_clock(monkeypatch, datetime.fromtimestamp(start, timezone.utc))
    parser = SpiffBpmnParser()
    parser.add_bpmn_file(str(path))
    wf = BpmnWorkflow(parser.get_spec(parser.get_process_ids()[0]))
    wf.do_engine_steps()
    seen = []
    for hours in steps:
        now[0] += timedelta(hours=hours)
        wf.refresh_timers()
        wf.do_engine_steps()
        (tick,) = wf.get_tasks(spec_name="tick")
        value = tick.internal_data.get("event_value")
        left = None if tick.state == TaskState.COMPLETED else value["cycles"]
        seen.append((sum(t.state == TaskState.COMPLETED for t in wf.get_tasks(spec_name="remind")), left))
    return seen


@pytest.mark.parametrize("expression, steps", [
    ('"R3/PT1H"', [0.5, 0.6, 1, 1, 1]),          # one repetition per period, then no more
    ('"R5/PT1H"', [3.5, 0.4, 5]),                  # a late run catches up every missed period
    ('"R/PT10M"', [0.25, 1]),                      # endless
])
def test_repetitions_match_plain_spiffworkflow(tmp_path: Path, clock: Clock, monkeypatch: pytest.MonkeyPatch,
                                               expression: str, steps: list[float]) -> None:
    path = reminders(tmp_path, expression)
    engine = Engine(clock=clock)
    instance = engine.run(engine.start(load_process(path), {}))
    ours = []
    for hours in steps:
        instance = later(engine, instance, clock, hours)
        left = [w["repetitions_left"] for w in timers(instance)]
        ours.append((count(instance, "remind"), (left[0] if left[0] is not None else -1) if left else None))
    plain = _plain_runs(path, monkeypatch, clock.now - sum(steps) * HOUR, steps)
    # SpiffWorkflow counts an endless cycle down from -1; layerflow says None (-1 above)
    assert [(runs, left if left is None or left >= 0 else -1) for runs, left in plain] == ours


def test_a_cycle_that_is_no_repeating_interval_stops_the_instance_naming_the_timer(tmp_path: Path,
                                                                                  clock: Clock) -> None:
    """Written in the file, validate refuses it before anything runs; read from the context, it
    can only be found when the timer is reached."""
    with pytest.raises(ProcessError, match="timer 'tick': timeCycle \"R3/soon\" is no ISO 8601 repeating interval"):
        load_process(reminders(tmp_path, '"R3/soon"'))
    engine = Engine(clock=clock)
    instance = engine.run(engine.start(load_process(reminders(tmp_path, "every")), {"every": "R3/soon"}))
    assert instance.status == "error"
    assert instance.error["task_id"] == "tick" and "timer 'tick'" in instance.error["message"]


def test_an_event_sent_to_a_cycle_timer_is_refused_with_what_it_waits_for(tmp_path: Path, clock: Clock) -> None:
    engine = Engine(clock=clock)
    instance = engine.run(engine.start(load_process(reminders(tmp_path)), {}))
    with pytest.raises(InstanceStateError) as refused:
        engine.send_event(instance, "tick", {})
    assert "timer tick (due " in str(refused.value) and "3 repetition(s) left)" in str(refused.value)


def test_a_cycle_reminds_beside_a_multi_instance_activity_that_waits_for_people(tmp_path: Path,
                                                                                clock: Clock) -> None:
    """The activity is open while its instances wait: each repetition's path runs in a branch of
    its own (as a non-interrupting boundary path does), not in the context the activity holds."""
    path = write(tmp_path, "votes", [
        '<bpmn:startEvent id="start"/>', script("init", "voters = ['ann', 'bob']"),
        '<bpmn:userTask id="vote"><bpmn:multiInstanceLoopCharacteristics>'
        "<bpmn:loopDataInputRef>voters</bpmn:loopDataInputRef><bpmn:loopDataOutputRef>ballots</bpmn:loopDataOutputRef>"
        '<bpmn:inputDataItem id="voter" name="voter"/><bpmn:outputDataItem id="ballot" name="ballot"/>'
        "</bpmn:multiInstanceLoopCharacteristics></bpmn:userTask>",
        f'<bpmn:boundaryEvent id="tick" attachedToRef="vote" cancelActivity="false">{cycle(chr(34) + "R2/PT1H" + chr(34))}'
        "</bpmn:boundaryEvent>", script("remind", "reminded = True"), '<bpmn:endEvent id="end_reminded"/>',
        script("count", "outcome = 'counted ' + str(len(ballots))"), '<bpmn:endEvent id="end"/>',
        flow("start", "init"), flow("init", "vote"), flow("vote", "count"), flow("count", "end"),
        flow("tick", "remind"), flow("remind", "end_reminded"),
    ])
    engine = Engine(clock=clock)
    instance = engine.run(engine.start(load_process(path), {}))
    instance = later(engine, instance, clock, 2)
    assert instance.status == "waiting", instance.error
    assert count(instance, "remind") == 2 and [w["kind"] for w in instance.waiting_for] == ["user_task"] * 2
    for item in list(instance.waiting_for):
        instance = engine.complete_user_task(instance, item["id"], {"ballot": "yes"})
    assert instance.status == "completed", instance.error
    assert instance.main.resolve("outcome") == "counted 2" and instance.main.resolve("reminded") is True


def test_a_cycle_whose_path_waits_for_a_person_completes_after_its_last_repetition(tmp_path: Path,
                                                                                   clock: Clock) -> None:
    path = write(tmp_path, "checks", [
        '<bpmn:startEvent id="start"/>', f'<bpmn:intermediateCatchEvent id="tick">{cycle(chr(34) + "R2/PT1H" + chr(34))}'
        '</bpmn:intermediateCatchEvent>', '<bpmn:userTask id="check"/>', '<bpmn:endEvent id="checked"/>',
        flow("start", "tick"), flow("tick", "check"), flow("check", "checked"),
    ])
    engine = Engine(clock=clock)
    instance = engine.run(engine.start(load_process(path), {}))
    instance = later(engine, instance, clock, 2)
    # two checks wait; the timer is done (it is not listed without a due time)
    assert [(w["kind"], w["task_id"]) for w in instance.waiting_for] == [("user_task", "check")] * 2
    assert count(instance, "tick") == 1


def test_an_endless_cycle_with_no_period_stops_the_instance_instead_of_hanging(tmp_path: Path,
                                                                                 clock: Clock) -> None:
    """"R/PT0S" would fire without end at one instant (the run never returned)."""
    engine = Engine("memory://", clock=clock)
    instance = engine.run(engine.start(load_process(reminders(tmp_path, '"R/PT0S"')), {}))
    assert instance.status == "error" and instance.error["task_id"] == "tick"
    assert "repeats without end with no time between repetitions" in instance.error["message"]
    counted = engine.run(engine.start(load_process(reminders(tmp_path, '"R2/PT0S"')), {}))
    assert counted.status == "waiting" and count(counted, "remind") == 2  # a count ends it
