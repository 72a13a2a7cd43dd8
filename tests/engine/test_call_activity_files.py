"""A process whose call activity names a process in another file: ``layerflow run`` takes
every file, and the saved instance remembers them all (``resume`` in a new process)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from engine_helpers import ROOT

MAIN = """<?xml version="1.0" encoding="UTF-8"?>
<bpmn:definitions xmlns:bpmn="http://www.omg.org/spec/BPMN/20100524/MODEL" id="m" targetNamespace="t">
  <bpmn:process id="order" isExecutable="true">
    <bpmn:startEvent id="start"/>
    <bpmn:scriptTask id="price"><bpmn:script>net = qty * 12</bpmn:script></bpmn:scriptTask>
    <bpmn:callActivity id="approve_call" calledElement="approval"/>
    <bpmn:scriptTask id="close"><bpmn:script>state = "shipped" if approved else "cancelled"</bpmn:script></bpmn:scriptTask>
    <bpmn:endEvent id="end"/>
    <bpmn:sequenceFlow id="f1" sourceRef="start" targetRef="price"/>
    <bpmn:sequenceFlow id="f2" sourceRef="price" targetRef="approve_call"/>
    <bpmn:sequenceFlow id="f3" sourceRef="approve_call" targetRef="close"/>
    <bpmn:sequenceFlow id="f4" sourceRef="close" targetRef="end"/>
  </bpmn:process>
</bpmn:definitions>
"""

CALLED = """<?xml version="1.0" encoding="UTF-8"?>
<bpmn:definitions xmlns:bpmn="http://www.omg.org/spec/BPMN/20100524/MODEL" id="c" targetNamespace="t">
  <bpmn:process id="approval" isExecutable="true">
    <bpmn:startEvent id="a_start"/>
    <bpmn:userTask id="sign_off" name="Sign off"/>
    <bpmn:endEvent id="a_end"/>
    <bpmn:sequenceFlow id="g1" sourceRef="a_start" targetRef="sign_off"/>
    <bpmn:sequenceFlow id="g2" sourceRef="sign_off" targetRef="a_end"/>
  </bpmn:process>
</bpmn:definitions>
"""


def _layerflow(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "engine.cli", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=120, env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin", "HOME": str(cwd)})


def test_run_takes_every_file_and_resume_finds_them(tmp_path: Path) -> None:
    (tmp_path / "order.bpmn").write_text(MAIN, encoding="utf-8")
    (tmp_path / "approval.bpmn").write_text(CALLED, encoding="utf-8")
    (tmp_path / "data.json").write_text('{"qty": 3}', encoding="utf-8")
    store = f"sqlite:///{tmp_path / 'runs.db'}"

    first = _layerflow("run", "order.bpmn", "approval.bpmn", "--data", "data.json", "--store", store, "--json",
                       cwd=tmp_path)
    assert first.returncode == 3, first.stderr  # waiting for the called process's user task
    doc = json.loads(first.stdout)
    assert doc["process_id"] == "order"  # the process no other file calls
    assert doc["waiting_for"][0]["task_id"] == "sign_off"
    assert doc["layers"]["L3"]["net"] == 36

    (tmp_path / "answers.json").write_text('{"user_tasks": {"sign_off": {"approved": true}}}', encoding="utf-8")
    second = _layerflow("resume", doc["instance_id"], "--answers", "answers.json", "--store", store, "--json",
                        cwd=tmp_path)
    assert second.returncode == 0, second.stderr
    done = json.loads(second.stdout)
    assert done["status"] == "completed"
    assert done["layers"]["L3"]["state"] == "shipped"


def test_run_without_the_called_file_names_what_is_missing(tmp_path: Path) -> None:
    (tmp_path / "order.bpmn").write_text(MAIN, encoding="utf-8")
    out = _layerflow("run", "order.bpmn", "--store", "memory://", "--json", cwd=tmp_path)
    assert out.returncode == 2, (out.stdout, out.stderr)
    error = json.loads(out.stdout)["error"]
    assert "approval" in error["message"] and "order.bpmn" in error["message"]
