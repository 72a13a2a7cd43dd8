"""BPMN errors thrown by the scripts SpiffWorkflow runs around a task (``spiffworkflow:preScript`` /
``postScript``) and by the body of a loop: a sub-process's, a call activity's, a multi-instance
activity's (on the activity, or on each instance with ``spiffworkflow:scriptsOnInstances``), a
standard loop's, a user, manual, send or receive task's. Each reaches the error boundary event of
its activity (or the error event sub-process of its scope) as a task's own script's does
(``test_bpmn_errors``): the script's writes dropped, an ``activity:X`` record with status
``error_thrown``, the code and message in the catching path's context.

SpiffWorkflow 3.2 itself routes no script error to an event (a failing script puts its task in
ERROR); the nearest it has is an error end event, and the last test compares with it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from context_layers import Layer, LayeredContext, thaw
from engine import Engine, Instance, load_process
from engine_helpers import path_of, run_plain_files, variables

HEAD = """<?xml version="1.0" encoding="UTF-8"?>
<bpmn:definitions xmlns:bpmn="http://www.omg.org/spec/BPMN/20100524/MODEL"
  xmlns:spiffworkflow="http://spiffworkflow.org/bpmn/schema/1.0/core" id="defs" targetNamespace="https://layerflow.dev/tests">
  <bpmn:error id="err_boom" name="Boom" errorCode="boom"/>
"""
RAISE = 'pre_wrote = 1\nraise BpmnError("boom", "from script")'
ON_THIRD = 'n = n + 1\nif n == 3:\n    raise BpmnError("boom", "from script")'
ON_SECOND = 'n = n + 1\nif n == 2:\n    raise BpmnError("boom", "from script")'
MI = ('<bpmn:multiInstanceLoopCharacteristics isSequential="{seq}" {attr}><bpmn:loopDataInputRef>items'
      '</bpmn:loopDataInputRef><bpmn:inputDataItem id="item"/></bpmn:multiInstanceLoopCharacteristics>')
ON_INSTANCES = 'spiffworkflow:scriptsOnInstances="true"'
LOOP = '<bpmn:standardLoopCharacteristics {attr}><bpmn:loopCondition>n &lt; 3</bpmn:loopCondition></bpmn:standardLoopCharacteristics>'


def scripts(pre: str | None = None, post: str | None = None) -> str:
    body = (f"<spiffworkflow:preScript>{pre}</spiffworkflow:preScript>" if pre else "") + \
        (f"<spiffworkflow:postScript>{post}</spiffworkflow:postScript>" if post else "")
    return f"<bpmn:extensionElements>{body}</bpmn:extensionElements>"


def inner(script: str) -> str:
    return ('<bpmn:startEvent id="i_start"/><bpmn:scriptTask id="inner"><bpmn:script>' + script +
            '</bpmn:script></bpmn:scriptTask><bpmn:endEvent id="i_end"/>'
            '<bpmn:sequenceFlow id="i1" sourceRef="i_start" targetRef="inner"/>'
            '<bpmn:sequenceFlow id="i2" sourceRef="inner" targetRef="i_end"/>')


CALLEE = '<bpmn:process id="callee" isExecutable="true">' + inner("inner = True") + "</bpmn:process>"
BOUNDARY = ('<bpmn:boundaryEvent id="caught" attachedToRef="X"><bpmn:errorEventDefinition errorRef="err_boom"/>'
            '</bpmn:boundaryEvent><bpmn:sequenceFlow id="e1" sourceRef="caught" targetRef="on_err"/>')
EVENT_SUBPROCESS = ('<bpmn:subProcess id="esp" triggeredByEvent="true"><bpmn:startEvent id="caught">'
                    '<bpmn:errorEventDefinition errorRef="err_boom"/></bpmn:startEvent>'
                    '<bpmn:sequenceFlow id="e1" sourceRef="caught" targetRef="on_err"/>{handler}</bpmn:subProcess>')
HANDLER = ('<bpmn:scriptTask id="on_err"><bpmn:script>{script}</bpmn:script></bpmn:scriptTask>'
           '<bpmn:endEvent id="end_err"/><bpmn:sequenceFlow id="e2" sourceRef="on_err" targetRef="end_err"/>')


def process(x: str, *, extra: str = "", catcher: str = "boundary", ask_first: bool = False,
            on_err: str = 'handled = error_code + ":" + str(error_message)') -> str:
    """start -> prep -> [ask ->] X -> next -> end_ok; the error "boom" caught on X (``catcher``:
    its boundary event "caught", or the process's error event sub-process, start "caught")
    leads to on_err -> end_err."""
    handler = HANDLER.format(script=on_err)
    catching = BOUNDARY + handler if catcher == "boundary" else EVENT_SUBPROCESS.format(handler=handler)
    before = '<bpmn:userTask id="ask"/>' if ask_first else ""
    first = "ask" if ask_first else "X"
    flows = ('<bpmn:sequenceFlow id="f0" sourceRef="ask" targetRef="X"/>' if ask_first else "")
    return HEAD + f"""<bpmn:process id="p" isExecutable="true"><bpmn:startEvent id="start"/>
<bpmn:scriptTask id="prep"><bpmn:script>n = 0
items = ["a", "b"]</bpmn:script></bpmn:scriptTask>{before}
{x}
<bpmn:scriptTask id="next"><bpmn:script>after = "normal"</bpmn:script></bpmn:scriptTask><bpmn:endEvent id="end_ok"/>
{catching}
<bpmn:sequenceFlow id="f1" sourceRef="start" targetRef="prep"/><bpmn:sequenceFlow id="f2" sourceRef="prep" targetRef="{first}"/>{flows}
<bpmn:sequenceFlow id="f3" sourceRef="X" targetRef="next"/><bpmn:sequenceFlow id="f4" sourceRef="next" targetRef="end_ok"/>
</bpmn:process>{extra}</bpmn:definitions>"""


def count_up(ctx: Any) -> dict[str, Any]:
    return {"n": ctx.context.resolve("n") + 1}


# case -> (the element X, the other process it calls, what the context holds besides items and the error)
CASES: dict[str, tuple[str, str, dict[str, Any]]] = {
    "user_task_pre": (f'<bpmn:userTask id="X">{scripts(pre=RAISE)}</bpmn:userTask>', "", {"n": 0}),
    "manual_task_pre": (f'<bpmn:manualTask id="X">{scripts(pre=RAISE)}</bpmn:manualTask>', "", {"n": 0}),
    "send_task_pre": (f'<bpmn:sendTask id="X">{scripts(pre=RAISE)}</bpmn:sendTask>', "", {"n": 0}),
    "receive_task_pre": (f'<bpmn:receiveTask id="X">{scripts(pre=RAISE)}</bpmn:receiveTask>', "", {"n": 0}),
    "sub_process_pre": (f'<bpmn:subProcess id="X">{scripts(pre=RAISE)}{inner("inner = True")}</bpmn:subProcess>',
                        "", {"n": 0}),
    # the sub-process's own steps completed before its postScript threw: what they wrote stays
    "sub_process_post": (f'<bpmn:subProcess id="X">{scripts(post=RAISE)}{inner("inner = True")}</bpmn:subProcess>',
                         "", {"n": 0, "inner": True}),
    "call_activity_pre": (f'<bpmn:callActivity id="X" calledElement="callee">{scripts(pre=RAISE)}</bpmn:callActivity>',
                          CALLEE, {"n": 0}),
    "call_activity_post": (f'<bpmn:callActivity id="X" calledElement="callee">{scripts(post=RAISE)}'
                           '</bpmn:callActivity>', CALLEE, {"n": 0, "inner": True}),
    # a multi-instance activity is one activity: all its instances wrote is dropped with it
    "multi_instance_pre": (f'<bpmn:serviceTask id="X">{scripts(pre=RAISE)}{MI.format(seq="false", attr="")}'
                           '</bpmn:serviceTask>', "", {"n": 0}),
    "multi_instance_post": (f'<bpmn:serviceTask id="X">{scripts(post=RAISE)}{MI.format(seq="false", attr="")}'
                            '</bpmn:serviceTask>', "", {"n": 0}),
    "multi_instance_sub_process_pre": (f'<bpmn:subProcess id="X">{scripts(pre=RAISE)}{MI.format(seq="false", attr="")}'
                                       f'{inner("inner = True")}</bpmn:subProcess>', "", {"n": 0}),
    "multi_instance_sub_process_post": (f'<bpmn:subProcess id="X">{scripts(post=RAISE)}'
                                        f'{MI.format(seq="false", attr="")}{inner("inner = True")}</bpmn:subProcess>',
                                        "", {"n": 0}),
    "multi_instance_sub_process_instance_pre": (
        f'<bpmn:subProcess id="X">{scripts(pre=RAISE)}{MI.format(seq="false", attr=ON_INSTANCES)}'
        f'{inner("inner = True")}</bpmn:subProcess>', "", {"n": 0}),
    "multi_instance_sub_process_instance_post": (
        f'<bpmn:subProcess id="X">{scripts(post=RAISE)}{MI.format(seq="true", attr=ON_INSTANCES)}'
        f'{inner("inner = True")}</bpmn:subProcess>', "", {"n": 0}),
    # a standard loop: the passes before the one that threw completed (n counts them)
    "loop_body": (f'<bpmn:scriptTask id="X">{LOOP.format(attr="")}<bpmn:script>{ON_SECOND}</bpmn:script>'
                  '</bpmn:scriptTask>', "", {"n": 1}),
    "loop_pre": (f'<bpmn:serviceTask id="X">{scripts(pre=RAISE)}{LOOP.format(attr="")}</bpmn:serviceTask>', "",
                 {"n": 0}),
    "loop_post": (f'<bpmn:serviceTask id="X">{scripts(post=RAISE)}{LOOP.format(attr="")}</bpmn:serviceTask>', "",
                  {"n": 3}),
    "loop_instance_pre": (f'<bpmn:serviceTask id="X">{scripts(pre=ON_THIRD)}{LOOP.format(attr=ON_INSTANCES)}'
                          '</bpmn:serviceTask>', "", {"n": 2}),
    "loop_sub_process_body": (f'<bpmn:subProcess id="X">{LOOP.format(attr="")}{inner(ON_SECOND)}</bpmn:subProcess>',
                              "", {"n": 1}),
    "loop_sub_process_pre": (f'<bpmn:subProcess id="X">{scripts(pre=RAISE)}{LOOP.format(attr="")}'
                             f'{inner("n = n + 1")}</bpmn:subProcess>', "", {"n": 0}),
}


def run_case(tmp_path: Path, name: str, **kw: Any) -> Instance:
    x, extra, _ = CASES[name]
    path = tmp_path / f"{name}.bpmn"
    path.write_text(process(x, extra=extra, **kw), encoding="utf-8")
    eng = Engine(handlers={"X": count_up} if "serviceTask" in x else None)  # (a handler runs instead of a script)
    return eng.run(eng.start(load_process(path, process_id="p"), {}))


def assert_replays(instance: Instance) -> None:
    for ctx in instance.contexts.values():
        again = LayeredContext.replay(ctx.tape)
        assert again == ctx
        assert json.dumps({str(x): thaw(dict(again.layer(x).items())) for x in Layer}, sort_keys=True) == \
            json.dumps({str(x): thaw(dict(ctx.layer(x).items())) for x in Layer}, sort_keys=True)


@pytest.mark.parametrize("name", list(CASES))
def test_a_bpmn_error_from_a_script_around_a_task_reaches_its_boundary_event(name: str, tmp_path: Path) -> None:
    instance = run_case(tmp_path, name)

    assert instance.status == "completed", instance.error
    assert path_of(instance.workflow)[-3:] == ["caught", "on_err", "end_err"]
    assert "next" not in path_of(instance.workflow)
    assert variables(instance.main) == {**CASES[name][2], "items": ["a", "b"], "error_code": "boom",
                                        "error_message": "from script", "handled": "boom:from script"}
    thrower = "inner" if name == "loop_sub_process_body" else "X"  # (a step inside the loop's sub-process)
    (thrown,) = [thaw(v) for k, v in instance.main.resolved().items()
                 if k.startswith("activity:") and thaw(v)["status"] == "error_thrown"]
    assert (thrown["activity"], thrown["error_code"], thrown["error_message"], thrown["caught_by"]) == (
        thrower, "boom", "from script", ["caught"])
    aborts = [e for ctx in instance.contexts.values() for e in ctx.tape
              if e.kind.value == "abort" and e.activity == thrower]
    assert len(aborts) == 1 and "boom" in aborts[0].data["reason"]
    assert_replays(instance)


@pytest.mark.parametrize("name", ["sub_process_pre", "call_activity_pre", "multi_instance_pre", "user_task_pre",
                                  "loop_body", "sub_process_post"])
def test_the_error_event_sub_process_of_the_scope_catches_it_when_no_boundary_event_does(name: str,
                                                                                        tmp_path: Path) -> None:
    instance = run_case(tmp_path, name, catcher="event_sub_process")

    assert instance.status == "completed", instance.error
    assert path_of(instance.workflow)[-4:] == ["caught", "on_err", "end_err", "esp"]
    assert "next" not in path_of(instance.workflow)
    assert variables(instance.main) == {**CASES[name][2], "items": ["a", "b"], "error_code": "boom",
                                        "error_message": "from script", "handled": "boom:from script"}


def test_a_pre_script_throws_the_same_tape_events_as_a_task_s_own_script(tmp_path: Path) -> None:
    own = tmp_path / "own.bpmn"
    own.write_text(process(f'<bpmn:scriptTask id="X"><bpmn:script>{RAISE}</bpmn:script></bpmn:scriptTask>'),
                   encoding="utf-8")
    eng = Engine()
    by_own_script = eng.run(eng.start(load_process(own, process_id="p"), {}))
    by_pre_script = run_case(tmp_path, "sub_process_pre")

    def events_of_x(instance: Instance) -> list[tuple[str, Any]]:
        return [(e.kind.value, e.data.get("key", e.data.get("status"))) for e in instance.main.tape if e.activity == "X"]

    assert events_of_x(by_pre_script) == events_of_x(by_own_script) == [
        ("begin", None), ("abort", None), ("begin", None), ("complete", "error_thrown")]
    assert "pre_wrote" not in by_pre_script.main and "pre_wrote" not in by_own_script.main


def test_a_pre_script_that_throws_as_a_person_s_answer_readies_its_task(tmp_path: Path) -> None:
    """The answer runs the user task, and the sub-process after it becomes ready in that run
    (``complete_user_task``, not the engine's step): its preScript's error is caught all the same."""
    path = tmp_path / "ask.bpmn"
    path.write_text(process(CASES["sub_process_pre"][0], ask_first=True), encoding="utf-8")
    eng = Engine()
    waiting = eng.run(eng.start(load_process(path, process_id="p"), {}))
    assert [w["task_id"] for w in waiting.waiting_for] == ["ask"]
    done = eng.complete_user_task(waiting, waiting.waiting_for[0]["id"], {"answer": 1})

    assert done.status == "completed", done.error
    assert path_of(done.workflow)[-3:] == ["caught", "on_err", "end_err"]
    assert variables(done.main)["handled"] == "boom:from script"


def test_a_pre_script_error_nothing_catches_fails_the_instance_and_resume_runs_it_again(tmp_path: Path) -> None:
    path = tmp_path / "lost.bpmn"
    path.write_text(process(CASES["sub_process_pre"][0]).replace('errorRef="err_boom"', 'errorRef="err_other"')
                    .replace('<bpmn:error id="err_boom"', '<bpmn:error id="err_other" errorCode="other"/>'
                             '<bpmn:error id="err_boom"'), encoding="utf-8")
    eng = Engine()
    failed = eng.run(eng.start(load_process(path, process_id="p"), {}))

    assert failed.status == "error" and failed.error is not None
    assert (failed.error["task_id"], failed.error["error_code"]) == ("X", "boom")
    assert "activity 'X' threw BPMN error 'boom' (from script) and nothing catches it" in failed.error["message"]
    assert "pre_wrote" not in failed.main
    again = eng.resume(failed)
    assert again.status == "error" and again.error is not None and again.error["error_code"] == "boom"
    assert sum(1 for e in again.main.tape if e.kind.value == "abort" and e.activity == "X") == 2


def test_the_path_is_the_one_spiffworkflow_takes_for_an_error_end_event_in_the_sub_process(tmp_path: Path) -> None:
    """Plain SpiffWorkflow 3.2 runs no layerflow script; the same sub-process whose first step is
    an error end event takes the same boundary path there as the preScript's error here."""
    thrower = tmp_path / "pre.bpmn"
    thrower.write_text(process(CASES["sub_process_pre"][0], on_err='handled = "yes"'), encoding="utf-8")
    end_event = tmp_path / "end_event.bpmn"
    end_event.write_text(process(
        '<bpmn:subProcess id="X"><bpmn:startEvent id="i_start"/><bpmn:endEvent id="i_boom">'
        '<bpmn:errorEventDefinition errorRef="err_boom"/></bpmn:endEvent>'
        '<bpmn:sequenceFlow id="i1" sourceRef="i_start" targetRef="i_boom"/></bpmn:subProcess>',
        on_err='handled = "yes"'), encoding="utf-8")
    eng = Engine()
    ours = eng.run(eng.start(load_process(thrower, process_id="p"), {}))
    plain = run_plain_files([end_event], "p")

    assert ours.status == "completed" and plain.is_completed()
    assert path_of(ours.workflow)[-3:] == path_of(plain)[-3:] == ["caught", "on_err", "end_err"]
    assert plain.last_task.data["handled"] == variables(ours.main)["handled"] == "yes"
