"""A newcomer's content-moderation appeal, built from the README alone: an LLM triage step run by
its offline handler (a file beside the BPMN, named in the config file beside it), a moderator's user
task, an inclusive gateway, and a parallel split whose branches disagree at the join, settled by a
person. Run through the CLI as the README shows it; each test is a place where the README's promise
and what a newcomer met differed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]

APPEAL_BPMN = """<?xml version="1.0" encoding="UTF-8"?>
<bpmn:definitions xmlns:bpmn="http://www.omg.org/spec/BPMN/20100524/MODEL"
                  xmlns:xsi="http://www.w3.org/2001/XMLSchema-instance"
                  id="appeal_defs" targetNamespace="https://example.org/appeal">
  <bpmn:process id="moderation_appeal" name="Content moderation appeal" isExecutable="true">
    <bpmn:startEvent id="start"/>
    <bpmn:serviceTask id="triage" name="LLM triage"/>
    <bpmn:userTask id="moderator_review" name="Moderator review"/>
    <bpmn:inclusiveGateway id="followups" default="f_notify"/>
    <bpmn:scriptTask id="legal_check"><bpmn:script>legal_flag = severity == "high"</bpmn:script></bpmn:scriptTask>
    <bpmn:scriptTask id="restore_content"><bpmn:script>restored = True</bpmn:script></bpmn:scriptTask>
    <bpmn:scriptTask id="notify_user"><bpmn:script>notified = True</bpmn:script></bpmn:scriptTask>
    <bpmn:inclusiveGateway id="followups_done"/>
    <bpmn:parallelGateway id="final_split"/>
    <bpmn:scriptTask id="policy_team"><bpmn:script>final_status = "removed"</bpmn:script></bpmn:scriptTask>
    <bpmn:scriptTask id="community_team"><bpmn:script>final_status = "restored"</bpmn:script></bpmn:scriptTask>
    <bpmn:parallelGateway id="final_join"/>
    <bpmn:scriptTask id="close_appeal"><bpmn:script>appeal_outcome = final_status</bpmn:script></bpmn:scriptTask>
    <bpmn:endEvent id="end"/>
    <bpmn:sequenceFlow id="f1" sourceRef="start" targetRef="triage"/>
    <bpmn:sequenceFlow id="f2" sourceRef="triage" targetRef="moderator_review"/>
    <bpmn:sequenceFlow id="f3" sourceRef="moderator_review" targetRef="followups"/>
    <bpmn:sequenceFlow id="f_legal" sourceRef="followups" targetRef="legal_check">
      <bpmn:conditionExpression xsi:type="bpmn:tFormalExpression">severity == "high"</bpmn:conditionExpression>
    </bpmn:sequenceFlow>
    <bpmn:sequenceFlow id="f_restore" sourceRef="followups" targetRef="restore_content">
      <bpmn:conditionExpression xsi:type="bpmn:tFormalExpression">decision == "overturn"</bpmn:conditionExpression>
    </bpmn:sequenceFlow>
    <bpmn:sequenceFlow id="f_notify" sourceRef="followups" targetRef="notify_user"/>
    <bpmn:sequenceFlow id="f4" sourceRef="legal_check" targetRef="followups_done"/>
    <bpmn:sequenceFlow id="f5" sourceRef="restore_content" targetRef="followups_done"/>
    <bpmn:sequenceFlow id="f6" sourceRef="notify_user" targetRef="followups_done"/>
    <bpmn:sequenceFlow id="f7" sourceRef="followups_done" targetRef="final_split"/>
    <bpmn:sequenceFlow id="f8" sourceRef="final_split" targetRef="policy_team"/>
    <bpmn:sequenceFlow id="f9" sourceRef="final_split" targetRef="community_team"/>
    <bpmn:sequenceFlow id="f10" sourceRef="policy_team" targetRef="final_join"/>
    <bpmn:sequenceFlow id="f11" sourceRef="community_team" targetRef="final_join"/>
    <bpmn:sequenceFlow id="f12" sourceRef="final_join" targetRef="close_appeal"/>
    <bpmn:sequenceFlow id="f13" sourceRef="close_appeal" targetRef="end"/>
  </bpmn:process>
</bpmn:definitions>
"""

APPEAL_CONFIG = """system:
  policy: Removed content is restored when the appeal shows it broke no rule.
triage:
  handler: appeal_handlers.py:triage
  llm:
    instructions: Triage the appeal. Answer severity (low/high), triage_verdict and triage_reason.
    outputKeys: [severity, triage_verdict, triage_reason]
  preserveKeys: [severity]
final_join:
  humanConfirm: {timeout: 3600, message: Policy and community teams disagree on the final status.}
"""

# the README's handler shape: ``ctx[key]`` reads the context, the dict returned is written to WORKING
TRIAGE = """def triage(ctx):
    severity = "high" if "threat" in str(ctx.get("appeal_text", "")).lower() else "low"
    return {"severity": severity, "triage_verdict": "review", "triage_reason": "appeal of " + ctx["post_id"]}
"""


@pytest.fixture
def appeal(tmp_path: Path) -> Path:
    (tmp_path / "appeal.bpmn").write_text(APPEAL_BPMN)
    (tmp_path / "appeal.layerflow.yaml").write_text(APPEAL_CONFIG)
    (tmp_path / "appeal_handlers.py").write_text(TRIAGE)
    return tmp_path


def cli(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "LAYERFLOW_STORE": f"sqlite:///{cwd / 'runs.db'}"}
    env.pop("LAYERFLOW_MODEL_API_BASE", None)
    return subprocess.run([sys.executable, "-m", "engine.cli", *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=120, stdin=subprocess.DEVNULL)


def doc_of(result: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    return json.loads(result.stdout)


def test_the_appeal_runs_to_its_end_on_answers_given_in_advance(appeal: Path) -> None:
    """The moderator's answer and the join's question answered with `--answers FILE`, as DESIGN's shape has them."""
    (appeal / "answers.json").write_text(json.dumps({
        "user_tasks": {"moderator_review": {"decision": "overturn"}},
        "confirmations": {"final_join/final_status": "restored"}}))
    done = cli(appeal, "run", "appeal.bpmn", "--data", '{"post_id": "P-77", "appeal_text": "satire, no threat"}',
               "--answers", "answers.json", "--json")
    assert done.returncode == 0, done.stderr
    doc = doc_of(done)
    assert doc["layers"]["L3"]["appeal_outcome"] == "restored" and doc["layers"]["L3"]["restored"] is True
    # "`run` names the store on stderr": with --json too (stdout holds the document alone)
    assert f"instance {doc['instance_id']} of moderation_appeal started (store sqlite:///{appeal / 'runs.db'}" \
        in done.stderr, done.stderr
    assert [(c["key"], c["resolution"]["resolver"]) for c in doc["conflicts"]] == [("final_status", "human")]
    # inspect scores the context against DESIGN's default thresholds and marks density "fires"; no
    # compression ran, nor will: close_appeal's config asks for none, and inspect says so
    assert doc["compressions"] == []
    inspect = cli(appeal, "inspect", doc["instance_id"], "--json")
    check = doc_of(inspect)["attention_check"]
    assert check["activity_id"] == "close_appeal" and check["compresses_after"] is False
    assert "density" in check["would_trigger"]
    plain = cli(appeal, "inspect", doc["instance_id"]).stdout
    assert "close_appeal has no config, so no compression runs after it" in plain, plain


def test_a_handler_reading_a_key_the_context_lacks_says_where_to_give_it_and_how_to_go_on(appeal: Path) -> None:
    """`ctx["post_id"]` in a handler, with no post_id in the start data: the instance failed with
    kind `not_found` (read as "instance not found") and "key 'post_id' is in no layer", with no
    word of where the key comes from and no `resume` line, where a script reading the same key
    says both."""
    result = cli(appeal, "run", "appeal.bpmn", "--data", '{"appeal_text": "fine"}')
    assert result.returncode == 1, result.stderr
    assert "error [activity_failed] at triage: " in result.stdout, result.stdout
    assert "no key 'post_id' here" in result.stdout and "the start data" in result.stdout, result.stdout
    assert "ctx.get('post_id')" in result.stdout, result.stdout
    iid = result.stdout.split()[1]
    assert f"`layerflow resume {iid}` runs triage again" in result.stdout, result.stdout


def test_a_handler_refused_by_the_layer_rules_is_shown_how_to_go_on(appeal: Path) -> None:
    """A failed activity of any kind (here a handler writing a SYSTEM key) is told how to go on, as
    the worker's log tells it: fix the cause, then `layerflow resume ID` runs the activity again."""
    (appeal / "appeal.layerflow.yaml").write_text("system: {policy: p}\ntriage: {handler: appeal_handlers.py:triage}\n")
    (appeal / "appeal_handlers.py").write_text("def triage(ctx):\n    return {'policy': 'mine'}\n")
    result = cli(appeal, "run", "appeal.bpmn", "--data", '{"post_id": "P-1"}')
    assert result.returncode == 1, result.stderr
    assert "error [permission_denied] at triage" in result.stdout
    iid = result.stdout.split()[1]
    assert f"`layerflow resume {iid}` runs triage again" in result.stdout, result.stdout


def test_a_condition_reading_a_key_a_formless_answer_left_out_names_that_user_task(appeal: Path) -> None:
    """The moderator answered `desicion` (a typo) to a user task with no form; the inclusive
    gateway's condition then read `decision`. A script names the user task answered last; the
    condition only said to give the key in the start data or an earlier task's output."""
    result = cli(appeal, "run", "appeal.bpmn", "--data", '{"post_id": "P-2"}',
                 "--answer", 'moderator_review={"desicion": "overturn"}', "--json")
    assert result.returncode == 1, result.stderr
    error = doc_of(result)["error"]
    assert error["task_id"] == "followups"
    assert "user task 'moderator_review'" in error["message"], error["message"]
    assert "the context holds 'desicion'" in error["message"], error["message"]
