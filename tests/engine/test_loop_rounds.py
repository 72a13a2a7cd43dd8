"""A user task on a standard loop waits once per round under one BPMN id: its ``waiting_for`` item
says which round it is (``round``, from 1), as a multi-instance task's item says its ``instance``, so
the person answering (CLI, REST, console) knows where the loop stands."""

from __future__ import annotations

from pathlib import Path

from engine import Engine, load_process

BPMN = """<?xml version="1.0" encoding="UTF-8"?>
<bpmn:definitions xmlns:bpmn="http://www.omg.org/spec/BPMN/20100524/MODEL" id="d" targetNamespace="t">
  <bpmn:process id="ask_until_done" isExecutable="true">
    <bpmn:startEvent id="start"/>
    <bpmn:userTask id="ask" name="Ask the customer">
      <bpmn:standardLoopCharacteristics loopMaximum="4">
        <bpmn:loopCondition>not finished</bpmn:loopCondition>
      </bpmn:standardLoopCharacteristics>
    </bpmn:userTask>
    <bpmn:userTask id="other" name="Other"/>
    <bpmn:endEvent id="end"/>
    <bpmn:sequenceFlow id="f1" sourceRef="start" targetRef="ask"/>
    <bpmn:sequenceFlow id="f2" sourceRef="ask" targetRef="other"/>
    <bpmn:sequenceFlow id="f3" sourceRef="other" targetRef="end"/>
  </bpmn:process>
</bpmn:definitions>
"""


def test_a_user_task_on_a_standard_loop_says_its_round(tmp_path: Path) -> None:
    path = tmp_path / "ask.bpmn"
    path.write_text(BPMN, encoding="utf-8")
    engine = Engine("memory://")
    instance = engine.run(load_process(path), {"customer": "C-1"})
    assert [(w["task_id"], w.get("round")) for w in instance.waiting_for] == [("ask", 1)]
    instance = engine.complete_user_task(instance, "ask", {"finished": False})
    assert [(w["task_id"], w.get("round")) for w in instance.waiting_for] == [("ask", 2)]
    assert instance.completed_user_task is not None and instance.completed_user_task.get("round") == 1
    reloaded = engine.load(instance.id)  # the round is worked out from the saved task tree, not kept aside
    assert [(w["task_id"], w.get("round")) for w in reloaded.waiting_for] == [("ask", 2)]
    instance = engine.complete_user_task(reloaded, "ask", {"finished": True})
    # a task on no loop has no round, as it has no instance
    assert [(w["task_id"], "round" in w, "instance" in w) for w in instance.waiting_for] == [("other", False, False)]


def test_the_cli_waiting_line_names_the_round(tmp_path: Path) -> None:
    from click.testing import CliRunner

    from engine.cli import main

    path = tmp_path / "ask.bpmn"
    path.write_text(BPMN, encoding="utf-8")
    store = f"sqlite:///{tmp_path / 'runs.db'}"
    result = CliRunner().invoke(main, ["run", str(path), "--store", store, "--answer", 'ask={"finished": false}'])
    assert result.exit_code == 3, result.output
    # the standing answer answered every round up to loopMaximum (4); the next task waits
    assert "at other:" in result.output
    result = CliRunner().invoke(main, ["run", str(path), "--store", store])
    assert result.exit_code == 3 and "at ask (round 1): `layerflow resume" in result.output, result.output
