"""Event sub-processes started by an error or an escalation (an "Error Start Event" or
"Escalation Start Event" inside an event sub-process, as Camunda Modeler draws it).

SpiffWorkflow 3.2 does not run them (its StartEventParser reads no such trigger, and the event
sub-process would start at once, with no event), so the expectations here are BPMN's: an error
end event (or an escalation throw or end event) in a scope starts the matching event
sub-process of that scope, or else of the scope around it (same code, or one that names no
code); an error, and an interrupting escalation, cancel the rest of that scope; a
non-interrupting escalation starts its event sub-process each time, beside the scope, which
goes on. The event sub-process reads the scope's context as it was when the event was thrown
(the throwing path's writes included) and its writes reach the scope's context."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from SpiffWorkflow.util.task import TaskState

from context_layers import LayeredContext
from engine import Engine, Instance, load_process
from engine import spiff
from engine.validate import validate_process

from engine_helpers import path_of, variables

MODELER = Path(__file__).resolve().parent / "fixtures" / "modeler" / "payment_error_event_subprocess.bpmn"

HEAD = """<?xml version="1.0" encoding="UTF-8"?>
<bpmn:definitions xmlns:bpmn="http://www.omg.org/spec/BPMN/20100524/MODEL" id="d" targetNamespace="https://layerflow.dev/tests">
  <bpmn:error id="e_bad" name="bad" errorCode="bad"/>
  <bpmn:error id="e_other" name="other" errorCode="other"/>
  <bpmn:escalation id="esc" name="esc" escalationCode="esc"/>
  <bpmn:process id="p" isExecutable="true">
"""
TAIL = "  </bpmn:process>\n</bpmn:definitions>\n"
ERROR = '<bpmn:errorEventDefinition errorRef="e_bad"/>'
OTHER_ERROR = '<bpmn:errorEventDefinition errorRef="e_other"/>'
ANY_ERROR = "<bpmn:errorEventDefinition/>"
ESCALATION = '<bpmn:escalationEventDefinition escalationRef="esc"/>'


def fl(*pairs: str) -> str:
    return "".join(f'<bpmn:sequenceFlow id="fl_{a}_{b}" sourceRef="{a}" targetRef="{b}"/>\n'
                   for a, b in (p.split(">") for p in pairs))


def script(eid: str, text: str) -> str:
    return f'<bpmn:scriptTask id="{eid}"><bpmn:script>{text}</bpmn:script></bpmn:scriptTask>\n'


def event_sub(eid: str, trigger: str, body: str, *, interrupting: bool = True) -> str:
    """An event sub-process: its start (``trigger``), one script task, its end."""
    flag = "" if interrupting else ' isInterrupting="false"'
    return (f'<bpmn:subProcess id="{eid}" triggeredByEvent="true">\n'
            f'<bpmn:startEvent id="{eid}_start"{flag}>{trigger}</bpmn:startEvent>\n'
            + script(f"{eid}_do", body) + f'<bpmn:endEvent id="{eid}_end"/>\n'
            + fl(f"{eid}_start>{eid}_do", f"{eid}_do>{eid}_end") + "</bpmn:subProcess>\n")


def sub_throwing(inner_handlers: str = "", thrown: str = ERROR) -> str:
    """Sub-process S: ``a`` writes, then an error end event (``thrown``) ends it."""
    return ('<bpmn:subProcess id="S"><bpmn:startEvent id="s_start"/>\n' + script("a", "a = 1")
            + f'<bpmn:endEvent id="boom">{thrown}</bpmn:endEvent>\n' + fl("s_start>a", "a>boom")
            + inner_handlers + "</bpmn:subProcess>\n")


def write(tmp_path: Path, name: str, body: str) -> Path:
    path = tmp_path / f"{name}.bpmn"
    path.write_text(HEAD + body + TAIL, encoding="utf-8")
    return path


def run(path: Path, data: dict[str, Any] | None = None) -> Instance:
    engine = Engine()
    return engine.run(engine.start(load_process(path), data or {}))


def states(instance: Instance, bpmn_id: str) -> list[str]:
    tasks = [t for t in instance.workflow.get_tasks() if spiff.bpmn_id_of(t) == bpmn_id]
    for sub in instance.workflow.subprocesses.values():
        tasks += [t for t in sub.get_tasks() if spiff.bpmn_id_of(t) == bpmn_id and t not in tasks]
    return [TaskState.get_name(t.state) for t in tasks]


# ----- a process as a modeler draws it ----------------------------------------------------------

def test_a_modeler_drawn_error_event_sub_process_waits_for_a_person_across_a_save(tmp_path: Path) -> None:
    """Payment fails in the sub-process "Take payment" (an error end event); the event sub-process
    "Payment failed" of the process catches the error by its code: the order is never shipped, a
    person is asked, the instance is saved and loaded by another engine, and the answer finishes
    it. The event sub-process read what the sub-process wrote before the error."""
    report = validate_process(MODELER)
    assert report.ok and report.problems == (), report.problems
    url = f"sqlite:///{tmp_path / 'store.sqlite'}"
    engine = Engine(url)
    waiting = engine.run(engine.start(load_process(MODELER), {"amount": 500}))

    assert waiting.status == "waiting", waiting.error
    assert [w["task_id"] for w in waiting.waiting_for] == ["Activity_call"]
    assert states(waiting, "Activity_payment") == ["CANCELLED"]  # interrupted: it did not end
    assert states(waiting, "Activity_ship") in ([], ["CANCELLED"])

    loaded = Engine(url).load(waiting.id)
    [start] = [t for t in loaded.workflow.subprocesses[next(iter(
        t.id for t in loaded.workflow.get_tasks() if spiff.bpmn_id_of(t) == "Activity_payment_failed"))].get_tasks()
        if spiff.bpmn_id_of(t) == "Event_payment_failed"]
    # the spec classes layerflow's parser made survive the save (the error start, interrupting)
    assert isinstance(start.task_spec, spiff.LayerflowInterruptingEventStart)
    assert isinstance(start.task_spec.event_definition, spiff.EngineErrorEventDefinition)
    assert start.task_spec.event_definition.code == "PAYMENT_DECLINED"
    done = Engine(url).complete_user_task(loaded, "Activity_call", {"note": "card expired"})

    assert done.status == "completed", done.error
    assert variables(done.main) == {"amount": 500, "reserved": False, "charge_attempts": 1, "declined": True,
                                    "note": "card expired", "status": "cancelled after 1 attempt(s): card expired"}
    assert path_of(done.workflow) == [
        "StartEvent_1", "Activity_reserve", "Event_payment_start", "Activity_charge", "Gateway_declined",
        "Event_declined", "Event_payment_failed", "Activity_call", "Activity_cancel", "Event_cancelled",
        "Activity_payment_failed"]
    # the event sub-process's writes are on the tape: in its own context, then merged into main,
    # with the record of the error its start caught (no payload: the record is all it leaves)
    merged = [e for e in done.main.tape if e.kind == "changes" and e.data.get("note") == "side_merge"]
    assert [sorted(k for _, k, _ in e.changes if not k.startswith("activity:")) for e in merged] == [
        ["event:Event_payment_failed", "note", "reserved", "status"]]
    caught = done.main.resolve("event:Event_payment_failed")
    assert (caught["event_kind"], caught["code"], caught["keys"]) == ("error", "PAYMENT_DECLINED", [])
    assert LayeredContext.replay(done.main.tape) == done.main

    paid = engine.run(engine.start(load_process(MODELER), {"amount": 50}))
    assert paid.status == "completed", paid.error
    assert variables(paid.main) == {"amount": 50, "reserved": True, "charge_attempts": 1, "declined": False,
                                    "shipped": True}
    assert "Activity_call" not in path_of(paid.workflow) and "Event_payment_failed" not in path_of(paid.workflow)


# ----- where the error is thrown, and who catches it --------------------------------------------

AFTER = script("after", "after = 1") + '<bpmn:endEvent id="end"/>\n'

CASES = {
    # thrown at the top level, a catch-all event sub-process of the process: it reads what the
    # throwing path wrote
    "top_level_catch_all": (
        '<bpmn:startEvent id="start"/>' + script("set", "x = 1") + f'<bpmn:endEvent id="boom">{ERROR}</bpmn:endEvent>'
        + fl("start>set", "set>boom") + event_sub("h", ANY_ERROR, "handled = x + 1"),
        ["start", "set", "boom", "h_start", "h_do", "h_end", "h"], {"x": 1, "handled": 2}),
    # thrown in sub-process S, caught by code in the process: S and what follows it never go on
    "from_sub_process": (
        '<bpmn:startEvent id="start"/>' + sub_throwing() + AFTER + fl("start>S", "S>after", "after>end")
        + event_sub("h", ERROR, "handled = a + 1"),
        ["start", "s_start", "a", "boom", "h_start", "h_do", "h_end", "h"], {"a": 1, "handled": 2}),
    # an event sub-process of S itself catches first (the process's catch-all does not run); S then
    # ends, and the process goes on after it
    "inside_the_sub_process": (
        '<bpmn:startEvent id="start"/>' + sub_throwing(event_sub("h", ERROR, "handled = a + 1")) + AFTER
        + fl("start>S", "S>after", "after>end") + event_sub("outer", ANY_ERROR, "outer = 1"),
        ["start", "s_start", "a", "boom", "h_start", "h_do", "h_end", "h", "S", "after", "end"],
        {"a": 1, "handled": 2, "after": 1}),
    # an event sub-process for another error code: the error is not caught, as today (S ends)
    "other_code_unmatched": (
        '<bpmn:startEvent id="start"/>' + sub_throwing() + AFTER + fl("start>S", "S>after", "after>end")
        + event_sub("h", OTHER_ERROR, "handled = 1"),
        ["start", "s_start", "a", "boom", "S", "after", "end"], {"a": 1, "after": 1}),
    # an interrupting escalation from an intermediate throw event: the rest of S never runs
    "interrupting_escalation": (
        '<bpmn:startEvent id="start"/><bpmn:subProcess id="S"><bpmn:startEvent id="s_start"/>' + script("a", "a = 1")
        + f'<bpmn:intermediateThrowEvent id="up">{ESCALATION}</bpmn:intermediateThrowEvent>'
        + script("never", "never = 1") + '<bpmn:endEvent id="s_end"/>'
        + fl("s_start>a", "a>up", "up>never", "never>s_end") + "</bpmn:subProcess>" + AFTER
        + fl("start>S", "S>after", "after>end") + event_sub("h", ESCALATION, "handled = a"),
        ["start", "s_start", "a", "up", "h_start", "h_do", "h_end", "h"], {"a": 1, "handled": 1}),
    # a non-interrupting escalation (an escalation end event of S): S and the process go on
    "non_interrupting_escalation": (
        '<bpmn:startEvent id="start"/>' + sub_throwing(thrown=ESCALATION) + AFTER
        + fl("start>S", "S>after", "after>end") + event_sub("h", ESCALATION, "handled = a", interrupting=False),
        ["start", "s_start", "a", "boom", "h_start", "S", "h_do", "h_end", "after", "end"],
        {"a": 1, "handled": 1, "after": 1}),
}


@pytest.mark.parametrize("case", list(CASES))
def test_the_matching_event_sub_process_of_the_nearest_scope_starts(tmp_path: Path, case: str) -> None:
    body, path, final = CASES[case]
    process = write(tmp_path, case, body)
    assert validate_process(process).ok

    instance = run(process)

    assert instance.status == "completed", instance.error
    assert path_of(instance.workflow) == path
    assert variables(instance.main) == final


def test_an_unmatched_error_runs_as_without_the_event_sub_process(tmp_path: Path) -> None:
    """An event sub-process for another error changes nothing: the same path and context as the
    process without it."""
    without = run(write(tmp_path, "without", '<bpmn:startEvent id="start"/>' + sub_throwing() + AFTER
                        + fl("start>S", "S>after", "after>end")))
    body, _, _ = CASES["other_code_unmatched"]
    with_other = run(write(tmp_path, "with_other", body))
    assert path_of(with_other.workflow) == path_of(without.workflow)
    assert variables(with_other.main) == variables(without.main)


@pytest.mark.parametrize("thrown", ["error_end", "escalation_throw"])
def test_the_event_interrupts_parallel_branches_and_reads_the_throwing_one(tmp_path: Path, thrown: str) -> None:
    """A split's branch throws: the other branch is cancelled before it goes on (its unmerged writes
    dropped, as a terminate end event drops them), and the event sub-process reads the throwing
    branch's writes."""
    if thrown == "error_end":
        throw, trigger, rest = f'<bpmn:endEvent id="boom">{ERROR}</bpmn:endEvent>', ERROR, ""
    else:
        throw = f'<bpmn:intermediateThrowEvent id="boom">{ESCALATION}</bpmn:intermediateThrowEvent>'
        trigger, rest = ESCALATION, script("b1_more", "never = 1") + fl("boom>b1_more", "b1_more>join")
    body = ('<bpmn:startEvent id="start"/><bpmn:parallelGateway id="split"/>' + script("b1", "one = 1") + throw
            + script("b2", "two = 2") + script("b3", "three = 3") + rest
            + '<bpmn:parallelGateway id="join"/><bpmn:endEvent id="end"/>'
            + fl("start>split", "split>b1", "b1>boom", "split>b2", "b2>b3", "b3>join", "join>end")
            + event_sub("h", trigger, "seen = [one, 'two' in dir()]"))
    instance = run(write(tmp_path, "parallel", body))

    assert instance.status == "completed", instance.error
    assert path_of(instance.workflow) == ["start", "split", "b1", "b2", "boom", "h_start", "h_do", "h_end", "h"]
    assert variables(instance.main) == {"one": 1, "seen": [1, False]}


def test_an_error_from_a_sub_process_in_a_branch_reaches_the_event_sub_process_with_that_branch(
        tmp_path: Path) -> None:
    """Sub-process S runs in a branch of a split of the process and throws; the process's event
    sub-process reads what that branch wrote before and inside S, not the other branch's writes
    (cancelled with its branch), as when the branch throws itself."""
    body = ('<bpmn:startEvent id="start"/><bpmn:parallelGateway id="split"/>' + script("pre", "pre = 1") + sub_throwing()
            + script("b2", "two = 2") + '<bpmn:parallelGateway id="join"/><bpmn:endEvent id="end"/>'
            + fl("start>split", "split>pre", "pre>S", "S>join", "split>b2", "b2>join", "join>end")
            + event_sub("h", ERROR, "seen = ['pre' in dir(), 'a' in dir(), 'two' in dir()]"))
    instance = run(write(tmp_path, "branch", body))

    assert instance.status == "completed", instance.error
    assert path_of(instance.workflow) == ["start", "split", "pre", "b2", "s_start", "a", "boom", "h_start", "h_do",
                                          "h_end", "h"]
    assert variables(instance.main) == {"pre": 1, "a": 1, "seen": [True, True, False]}


MULTI = ('<bpmn:multiInstanceLoopCharacteristics isSequential="{sequential}"><bpmn:loopCardinality>3'
         "</bpmn:loopCardinality></bpmn:multiInstanceLoopCharacteristics>")


@pytest.mark.parametrize("sequential", ["false", "true"])
def test_each_instance_of_a_multi_instance_sub_process_catches_its_own_error(tmp_path: Path, sequential: str) -> None:
    """Each instance's event sub-process catches that instance's error and interrupts that instance
    only: the activity completes once every instance has, and the process goes on. (An interrupting
    event sub-process closed the multi-instance activity itself, open in the process's context, and
    the instance failed with "its activity is not open".)"""
    body = ('<bpmn:startEvent id="start"/><bpmn:subProcess id="S">' + MULTI.format(sequential=sequential)
            + '<bpmn:startEvent id="s_start"/>' + script("a", "a = 1") + f'<bpmn:endEvent id="boom">{ERROR}</bpmn:endEvent>'
            + fl("s_start>a", "a>boom") + event_sub("h", ERROR, "handled = a + 1") + "</bpmn:subProcess>"
            + AFTER + fl("start>S", "S>after", "after>end"))
    instance = run(write(tmp_path, "multi", body))

    assert instance.status == "completed", instance.error
    done = path_of(instance.workflow)
    assert done.count("h_do") == 3 and done.count("a") == 3 and done[-2:] == ["after", "end"]
    assert variables(instance.main) == {"a": 1, "handled": 2, "after": 1}


def test_an_interrupting_timer_event_sub_process_in_a_multi_instance_sub_process_interrupts_its_instance(
        tmp_path: Path) -> None:
    """The same for a timer: each waiting instance is interrupted, the activity around them goes on."""
    timer = '<bpmn:timerEventDefinition><bpmn:timeDuration>"PT1H"</bpmn:timeDuration></bpmn:timerEventDefinition>'
    body = ('<bpmn:startEvent id="start"/><bpmn:subProcess id="S">' + MULTI.format(sequential="false")
            + '<bpmn:startEvent id="s_start"/><bpmn:userTask id="u"/><bpmn:endEvent id="s_end"/>'
            + fl("s_start>u", "u>s_end") + event_sub("t", timer, "late = 1") + "</bpmn:subProcess>"
            + AFTER + fl("start>S", "S>after", "after>end"))
    now = [1_000_000.0]
    engine = Engine(clock=lambda: now[0])
    waiting = engine.run(engine.start(load_process(write(tmp_path, "timer", body)), {}))
    assert [w["task_id"] for w in waiting.waiting_for].count("u") == 3
    now[0] += 7200
    done = engine.run(waiting)

    assert done.status == "completed", done.error
    assert path_of(done.workflow).count("t_do") == 3 and "u" not in path_of(done.workflow)
    assert variables(done.main) == {"late": 1, "after": 1}


def test_an_event_sub_process_of_a_sibling_sub_process_does_not_catch_the_error(tmp_path: Path) -> None:
    """An error goes up its scopes only: a catch-all event sub-process of a sub-process beside the one
    that threw it does not start (SpiffWorkflow hands an error nothing on the way up caught to any
    event of the instance that catches it: it interrupted the sibling, whose person was never asked)."""
    body = ('<bpmn:startEvent id="start"/><bpmn:parallelGateway id="split"/>'
            + '<bpmn:subProcess id="S1"><bpmn:startEvent id="s1_start"/>' + script("a", "a = 1")
            + f'<bpmn:endEvent id="boom">{ERROR}</bpmn:endEvent>' + fl("s1_start>a", "a>boom") + "</bpmn:subProcess>"
            + '<bpmn:subProcess id="S2"><bpmn:startEvent id="s2_start"/><bpmn:userTask id="u"/><bpmn:endEvent id="s2_end"/>'
            + fl("s2_start>u", "u>s2_end") + event_sub("h", ANY_ERROR, "wrong = 1") + "</bpmn:subProcess>"
            + '<bpmn:parallelGateway id="join"/><bpmn:endEvent id="end"/>'
            + fl("start>split", "split>S1", "split>S2", "S1>join", "S2>join", "join>end"))
    engine = Engine()
    waiting = engine.run(engine.start(load_process(write(tmp_path, "siblings", body)), {}))
    assert [w["task_id"] for w in waiting.waiting_for] == ["u"]
    done = engine.complete_user_task(waiting, "u", {"ok": True})

    assert done.status == "completed", done.error
    assert "h_do" not in path_of(done.workflow)
    assert variables(done.main) == {"a": 1, "ok": True}


def test_an_event_sub_process_waits_for_its_error_across_a_save(tmp_path: Path) -> None:
    body = ('<bpmn:startEvent id="start"/><bpmn:subProcess id="S"><bpmn:startEvent id="s_start"/><bpmn:userTask id="review"/>'
            + f'<bpmn:endEvent id="boom">{ERROR}</bpmn:endEvent>' + fl("s_start>review", "review>boom")
            + event_sub("h", ERROR, "handled = verdict") + "</bpmn:subProcess>" + AFTER
            + fl("start>S", "S>after", "after>end"))
    url = f"sqlite:///{tmp_path / 'store.sqlite'}"
    engine = Engine(url)
    waiting = engine.run(engine.start(load_process(write(tmp_path, "listening", body)), {}))
    assert [w["task_id"] for w in waiting.waiting_for] == ["review"]  # the error start is no waiting event
    done = Engine(url).complete_user_task(Engine(url).load(waiting.id), "review", {"verdict": "bad"})

    assert done.status == "completed", done.error
    assert path_of(done.workflow) == ["start", "s_start", "review", "boom", "h_start", "h_do", "h_end", "h", "S",
                                      "after", "end"]
    assert variables(done.main) == {"verdict": "bad", "handled": "bad", "after": 1}


def test_the_error_payload_reaches_the_event_sub_process_under_its_variable(tmp_path: Path) -> None:
    """The error's ``spiffworkflow:payloadExpression`` (evaluated over the thrower's context) goes
    into the event sub-process's context under its ``spiffworkflow:variableName``, recorded as an
    event the process threw itself."""
    head = HEAD.replace('xmlns:bpmn=', 'xmlns:spiffworkflow="http://spiffworkflow.org/bpmn/schema/1.0/core" xmlns:bpmn=')
    head = head.replace('<bpmn:error id="e_bad" name="bad" errorCode="bad"/>', (
        '<bpmn:error id="e_bad" name="bad" errorCode="bad"><bpmn:extensionElements>'
        '<spiffworkflow:payloadExpression>{"reason": why}</spiffworkflow:payloadExpression>'
        "<spiffworkflow:variableName>err</spiffworkflow:variableName></bpmn:extensionElements></bpmn:error>"))
    body = ('<bpmn:startEvent id="start"/>' + script("set", "why = 'no stock'")
            + f'<bpmn:endEvent id="boom">{ERROR}</bpmn:endEvent>' + fl("start>set", "set>boom")
            + event_sub("h", ERROR, "handled = err['reason']"))
    path = tmp_path / "payload.bpmn"
    path.write_text(head + body + TAIL, encoding="utf-8")
    instance = run(path)

    assert instance.status == "completed", instance.error
    assert variables(instance.main) == {"why": "no stock", "err": {"reason": "no stock"}, "handled": "no stock"}
    record = instance.main.resolve("event:h_start")
    assert (record["event"], record["event_kind"], record["sent_by"]) == ("bad", "error", "process")
    assert record["summary"] == "error 'bad' caught at h_start: err"


def test_a_listening_error_start_is_nothing_the_instance_waits_for(tmp_path: Path) -> None:
    """A process stuck at a parallel join that can never fire is reported stuck, as without the
    event sub-process: its error start waits for what the process itself throws, which no one can
    send (it was listed as the one event the instance waited for)."""
    body = ('<bpmn:startEvent id="start"/><bpmn:exclusiveGateway id="x" default="fl_x_a"/>' + script("a", "a = 1")
            + script("b", "b = 1") + '<bpmn:parallelGateway id="j"/><bpmn:endEvent id="end"/>'
            + fl("start>x", "x>a", "a>j", "b>j", "j>end") + event_sub("h", ERROR, "handled = 1")
            + '<bpmn:sequenceFlow id="never" sourceRef="x" targetRef="b">'
              "<bpmn:conditionExpression>False</bpmn:conditionExpression></bpmn:sequenceFlow>")
    instance = run(write(tmp_path, "stuck", body))

    assert instance.status == "error" and instance.waiting_for == []
    assert instance.error is not None and instance.error["task_id"] == "j"
    assert "neither completed nor waits for anything" in instance.error["message"]


# ----- the same scope throws again ----------------------------------------------------------------

def test_a_loop_through_a_sub_process_throws_each_pass_and_its_event_sub_process_runs_each_time(
        tmp_path: Path) -> None:
    """Each pass makes S again with its event sub-process, which catches that pass's error (SpiffWorkflow's
    spec is not changed by a catch: a later pass does not wait at S's end)."""
    body = ('<bpmn:startEvent id="start"/>' + script("init", "n = 0\nlog = []")
            + '<bpmn:subProcess id="S"><bpmn:startEvent id="s_start"/>' + script("a", "n = n + 1")
            + f'<bpmn:endEvent id="boom">{ERROR}</bpmn:endEvent>' + fl("s_start>a", "a>boom")
            + event_sub("h", ERROR, "log = log + [n]") + "</bpmn:subProcess>"
            + '<bpmn:exclusiveGateway id="again" default="fl_again_end"/><bpmn:endEvent id="end"/>'
            + fl("start>init", "init>S", "S>again", "again>end")
            + '<bpmn:sequenceFlow id="back" sourceRef="again" targetRef="S">'
              "<bpmn:conditionExpression>n &lt; 3</bpmn:conditionExpression></bpmn:sequenceFlow>")
    process = load_process(write(tmp_path, "loop", body))
    engine = Engine()
    for _ in range(2):  # a second instance of the same loaded process, in the same Python process
        instance = engine.run(engine.start(process, {}))

        assert instance.status == "completed", instance.error
        one_pass = ["s_start", "a", "boom", "h_start", "h_do", "h_end", "h", "S", "again"]
        assert path_of(instance.workflow) == ["start", "init", *one_pass * 3, "end"]
        assert variables(instance.main) == {"n": 3, "log": [1, 2, 3]}


def test_a_non_interrupting_escalation_thrown_twice_starts_its_event_sub_process_twice(tmp_path: Path) -> None:
    """Each run of the event sub-process reads what the one before it wrote."""
    body = ('<bpmn:startEvent id="start"/>' + script("init", "n = 0\nseen = []") + script("inc", "n = n + 1")
            + f'<bpmn:intermediateThrowEvent id="raise">{ESCALATION}</bpmn:intermediateThrowEvent>'
            + '<bpmn:exclusiveGateway id="again" default="fl_again_end"/><bpmn:endEvent id="end"/>'
            + fl("start>init", "init>inc", "inc>raise", "raise>again", "again>end")
            + '<bpmn:sequenceFlow id="back" sourceRef="again" targetRef="inc">'
              "<bpmn:conditionExpression>n &lt; 2</bpmn:conditionExpression></bpmn:sequenceFlow>"
            + event_sub("h", ESCALATION, "seen = seen + [n]", interrupting=False))
    instance = run(write(tmp_path, "twice", body))

    assert instance.status == "completed", instance.error
    assert path_of(instance.workflow) == ["start", "init", "inc", "raise", "h_start", "h_do", "h_end", "again",
                                          "inc", "raise", "h_start", "h_do", "h_end", "again", "end"]
    assert variables(instance.main) == {"n": 2, "seen": [1, 2]}
    assert instance.conflicts == []


def test_a_non_interrupting_event_sub_process_that_waits_for_a_person_keeps_its_process_open(tmp_path: Path) -> None:
    """The escalation's path waits for a person while the rest of the process ends: the process
    completes once that path has."""
    body = ('<bpmn:startEvent id="start"/>' + script("set", "x = 1")
            + f'<bpmn:intermediateThrowEvent id="raise">{ESCALATION}</bpmn:intermediateThrowEvent>'
            + script("more", "more = 1") + '<bpmn:endEvent id="end"/>' + fl("start>set", "set>raise", "raise>more", "more>end")
            + '<bpmn:subProcess id="h" triggeredByEvent="true"><bpmn:startEvent id="h_start" isInterrupting="false">'
            + ESCALATION + '</bpmn:startEvent><bpmn:userTask id="ask"/>' + script("h_do", "got = answer + str(x)")
            + '<bpmn:endEvent id="h_end"/>' + fl("h_start>ask", "ask>h_do", "h_do>h_end") + "</bpmn:subProcess>")
    engine = Engine()
    waiting = engine.run(engine.start(load_process(write(tmp_path, "beside", body)), {}))
    assert waiting.status == "waiting" and [w["task_id"] for w in waiting.waiting_for] == ["ask"]
    assert path_of(waiting.workflow) == ["start", "set", "raise", "h_start", "more", "end"]
    done = engine.complete_user_task(waiting, "ask", {"answer": "A"})

    assert done.status == "completed", done.error
    assert variables(done.main) == {"x": 1, "more": 1, "answer": "A", "got": "A1"}


def test_two_instances_of_one_loaded_process_each_catch_their_own_error(tmp_path: Path) -> None:
    process = load_process(MODELER)
    outputs_before = [s.name for s in process.spec.start.outputs]
    engine = Engine()
    first = engine.run(engine.start(process, {"amount": 500}))
    second = engine.run(engine.start(process, {"amount": 900}))
    assert [w["task_id"] for w in first.waiting_for] == [w["task_id"] for w in second.waiting_for] == ["Activity_call"]
    second = engine.complete_user_task(second, "Activity_call", {"note": "two"})
    first = engine.complete_user_task(first, "Activity_call", {"note": "one"})
    third = engine.run(engine.start(process, {"amount": 10}))

    assert (first.status, second.status, third.status) == ("completed", "completed", "completed")
    assert first.main.resolve("status") == "cancelled after 1 attempt(s): one"
    assert second.main.resolve("status") == "cancelled after 1 attempt(s): two"
    assert third.main.resolve("shipped") is True and "status" not in third.main
    assert [s.name for s in process.spec.start.outputs] == outputs_before  # the shared spec is as parsed


@pytest.mark.parametrize("where", ["called", "caller"])
def test_an_error_of_a_called_process_starts_the_event_sub_process_of_the_nearest_scope(tmp_path: Path,
                                                                                      where: str) -> None:
    """The called process's own event sub-process catches its error first (the call then ends and the
    caller goes on); without one, the caller's does, and the caller stops there."""
    handler = event_sub("h", ERROR, "recovered = worked + 1")
    called = ('<bpmn:startEvent id="c_start"/>' + script("c_work", "worked = 1")
              + f'<bpmn:endEvent id="c_boom">{ERROR}</bpmn:endEvent>' + fl("c_start>c_work", "c_work>c_boom")
              + (handler if where == "called" else ""))
    text = (HEAD + '<bpmn:startEvent id="start"/><bpmn:callActivity id="call" calledElement="called"/>' + AFTER
            + fl("start>call", "call>after", "after>end") + (handler if where == "caller" else "") + "</bpmn:process>\n"
            + '<bpmn:process id="called" isExecutable="true">' + called + TAIL)
    path = tmp_path / "calls.bpmn"
    path.write_text(text, encoding="utf-8")
    engine = Engine()
    instance = engine.run(engine.start(load_process(path, "p"), {}))

    assert instance.status == "completed", instance.error
    handled = ["c_boom", "h_start", "h_do", "h_end", "h"]
    if where == "called":
        assert path_of(instance.workflow) == ["start", "c_start", "c_work", *handled, "call", "after", "end"]
        assert variables(instance.main) == {"worked": 1, "recovered": 2, "after": 1}
    else:
        assert path_of(instance.workflow) == ["start", "c_start", "c_work", *handled]
        assert variables(instance.main) == {"worked": 1, "recovered": 2}


# ----- a script that raises -----------------------------------------------------------------------

@pytest.mark.parametrize("catcher", ["boundary", "event_sub_process"])
def test_a_script_exception_is_no_bpmn_error_and_starts_no_catch_all(tmp_path: Path, catcher: str) -> None:
    """A technical error is not a BPMN error: SpiffWorkflow's catch-all error boundary event does not
    catch a script's exception (the instance fails, the task can be retried), and neither does a
    catch-all error event sub-process."""
    raising = ('<bpmn:startEvent id="s_start"/>' + script("risky", "q = 10 / (fix if 'fix' in dir() else 0)")
               + '<bpmn:endEvent id="s_end"/>')
    if catcher == "boundary":
        body = (f'<bpmn:startEvent id="start"/><bpmn:subProcess id="S">{raising}{fl("s_start>risky", "risky>s_end")}'
                f'</bpmn:subProcess><bpmn:boundaryEvent id="caught" attachedToRef="S">{ANY_ERROR}</bpmn:boundaryEvent>'
                + script("h_do", "handled = 1") + AFTER + '<bpmn:endEvent id="h_end"/>'
                + fl("start>S", "S>after", "after>end", "caught>h_do", "h_do>h_end"))
    else:
        body = (f'<bpmn:startEvent id="start"/><bpmn:subProcess id="S">{raising}{fl("s_start>risky", "risky>s_end")}'
                "</bpmn:subProcess>" + AFTER + fl("start>S", "S>after", "after>end")
                + event_sub("h", ANY_ERROR, "handled = 1"))
    path = write(tmp_path, catcher, body)
    engine = Engine()
    failed = engine.run(engine.start(load_process(path), {}))

    assert failed.status == "error"
    assert failed.error is not None and failed.error["task_id"] == "risky"
    assert "ZeroDivisionError" in failed.error["message"]
    assert "handled" not in failed.main and "h_do" not in path_of(failed.workflow)

    done = engine.resume(engine.inject(failed, {"fix": 2}))  # retried with the cause fixed
    assert done.status == "completed", done.error
    assert variables(done.main) == {"fix": 2, "q": 5.0, "after": 1}
    assert "h_do" not in path_of(done.workflow)


# ----- validate -------------------------------------------------------------------------------------

@pytest.mark.parametrize(("trigger", "warned"), [(ERROR, False), (ANY_ERROR, False), (OTHER_ERROR, True)])
def test_an_error_end_event_an_event_sub_process_catches_is_no_uncaught_error(tmp_path: Path, trigger: str,
                                                                               warned: bool) -> None:
    body = ('<bpmn:startEvent id="start"/>' + script("set", "x = 1") + f'<bpmn:endEvent id="boom">{ERROR}</bpmn:endEvent>'
            + fl("start>set", "set>boom") + event_sub("h", trigger, "handled = x"))
    report = validate_process(write(tmp_path, "top", body))
    assert report.ok
    assert [(p.code, p.element_id) for p in report.problems] == ([("error_end_uncaught", "boom")] if warned else [])


def test_an_error_start_marked_non_interrupting_interrupts_and_validate_says_so(tmp_path: Path) -> None:
    """BPMN's error start event always interrupts its scope: ``isInterrupting="false"`` on it is a
    warning, and the scope is interrupted all the same."""
    body = ('<bpmn:startEvent id="start"/>' + sub_throwing() + AFTER + fl("start>S", "S>after", "after>end")
            + event_sub("h", ERROR, "handled = a", interrupting=False))
    path = write(tmp_path, "marked", body)
    report = validate_process(path)
    assert report.ok
    [problem] = report.problems
    assert (problem.code, problem.element_id, problem.severity) == ("error_start_non_interrupting", "h_start", "warning")
    assert 'isInterrupting="false"' in problem.message and "escalation" in problem.message

    instance = run(path)
    assert instance.status == "completed", instance.error
    assert path_of(instance.workflow) == ["start", "s_start", "a", "boom", "h_start", "h_do", "h_end", "h"]
    assert variables(instance.main) == {"a": 1, "handled": 1}
