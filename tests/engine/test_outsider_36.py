"""Outsider round 36: processes nobody here had seen, written from README.md and DESIGN.md only
(tests/engine/outsider36/, saved as Camunda Modeler and bpmn.io save them, with their diagrams), driven
through the Python API, the CLI, a real ``layerflow serve`` and two Redis workers.

insurance_claim: a start form, a triage agent (an ``llm:`` step run by its offline handler), an inclusive
  gateway fanning out to a fraud check, a coverage agent and an adjuster (a user task with a 4-hour SLA
  timer that hands the claim to a senior adjuster); the fraud check and the adjuster disagree on
  ``claim_status`` at the join, settled by the policy (``insurance_claim.layerflow.yaml``) or by a person
  (``insurance_claim_confirm.layerflow.yaml``); the decision letter's step compresses on attention scores.

content_moderation: a queue of items worked in a loop (an exclusive gateway's back edge), each labelled by
  a classifier agent and voted on by a sequential multi-instance user task over the reviewers; decisions
  are preserved through the compressions the loop fires; a publisher's appeal arrives as a message from
  outside; the context is rolled back to a snapshot mid-loop and replayed.

vendor_onboarding: a call activity into vendor_checks.bpmn (a second file) whose error end event is caught
  by an error boundary event and whose escalation (documents missing) by a non-interrupting one; a manual
  task to sign the contract; run by two Redis workers and the REST server.

Expected before anything ran: as README and DESIGN say, and so it was, but for:
- insurance_claim: the adjuster's form is a required enum (approve / deny / investigate) over the key the
  triage agent had set to ``"open"``. An answer that left the decision out was accepted: the field counted
  as given with the context's ``"open"``, a value the field does not offer, and the join went on as if the
  adjuster had decided (a SpiffArena JSON Schema form refused the same answer: its schema sees the value).
  The value a form starts from is now checked as the answer's own would be (exit 2, REST 400,
  ``FormAnswerInvalid`` naming the field, the value and its options).
- content_moderation: the appeal's ``spiffworkflow:messageVariable`` written in the catch event's own
  extensionElements (not in its ``bpmn:messageEventDefinition``, where SpiffWorkflow reads it) was never
  read: ``validate`` called the process valid, the payload's keys were written one by one (``items`` then
  clashed with a PROCESS key), and a list payload was refused telling the user to add the messageVariable
  "on the message event", which they had done. ``validate`` now refuses it
  (``message_extension_misplaced``, naming the event and where to move it), and the refusal says where
  SpiffWorkflow reads the variable.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from engine import Engine, load_process
from engine.forms import check_answer

from engine_helpers import cli_in_a_tmp_store, run_json
from test_contracts_cli import check_run_document

cli = cli_in_a_tmp_store  # the fixture "cli", here too

HERE = Path(__file__).resolve().parent / "outsider36"
CLAIM = HERE / "insurance_claim.bpmn"
CONFIRM = HERE / "insurance_claim_confirm.layerflow.yaml"
MODERATION = HERE / "content_moderation.bpmn"
VENDOR = HERE / "vendor_onboarding.bpmn"
CHECKS = HERE / "vendor_checks.bpmn"
STORM = {"claim_id": "CL-1042", "policy_no": "HP-77", "amount": 12000, "incident": "storm damage again to roof"}


# ----------------------------------------------------------------------------- the adjuster's form


def test_a_required_decision_left_to_a_value_its_form_does_not_offer_is_refused() -> None:
    engine = Engine("memory://")
    instance = engine.run(load_process(CLAIM), STORM)
    [adjuster] = [w for w in instance.waiting_for if w["kind"] == "user_task"]
    [decision] = [f for f in adjuster["form"]["fields"] if f["id"] == "claim_status"]
    assert decision["value"] == "open" and decision["required"]  # the triage agent's status, shown as the form's
    from engine import FormAnswerInvalid

    layers = instance.to_document()["layers"]
    with pytest.raises(FormAnswerInvalid) as refused:
        engine.complete_user_task(instance, "Activity_adjuster", {"adjuster_note": "photos look fine"})
    message = str(refused.value)
    assert "'claim_status'" in message and '"open"' in message and "approve, deny, investigate" in message
    assert [p[0] if isinstance(p, tuple) else p["field"] for p in refused.value.problems] == ["claim_status"]
    again = engine.load(instance.id)
    assert again.to_document()["layers"] == layers and [w["task_id"] for w in again.waiting_for if w["kind"] == "user_task"] == [
        "Activity_adjuster"]
    done = engine.complete_user_task(again, "Activity_adjuster", {"claim_status": "approve"})
    assert done.status == "completed" and done.main.resolve("claim_status") == "investigate"  # the policy's


@pytest.mark.parametrize(("prefilled", "problems"), [
    ({"claim_status": "open"}, ["claim_status"]),     # a value the enum does not offer
    ({"claim_status": "deny"}, []),                   # one it offers counts as given, as README says
    ({"claim_status": None}, ["claim_status"]),       # nothing: required and missing
])
def test_the_value_a_form_starts_from_is_checked_as_an_answer_is(prefilled: dict[str, Any], problems: list[str]) -> None:
    form = {"fields": [{"id": "claim_status", "type": "enum", "required": True, "default": None,
                        "options": [{"id": "approve", "name": "Approve"}, {"id": "deny", "name": "Deny"}]}]}
    answer, found = check_answer(form, {}, prefilled)
    assert [f for f, _ in found] == problems and "claim_status" not in answer


def test_the_claim_through_the_cli_refuses_the_omitted_decision_and_keeps_the_instance(cli: Any) -> None:
    doc = run_json(cli, "run", str(CLAIM), "--data", json.dumps(STORM), code=3)
    iid = doc["instance_id"]
    refused = run_json(cli, "resume", iid, "--answer", 'Activity_adjuster={"adjuster_note": "fine"}', code=2)
    assert refused["status"] == "error" and refused["error"]["kind"] == "invalid_answer"
    assert refused["error"]["instance_status"] == "waiting"
    assert [p["field"] for p in refused["error"]["problems"]] == ["claim_status"]
    assert refused["layers"] == doc["layers"] and refused["tape_length"] == doc["tape_length"] + 1  # answer_refused
    done = run_json(cli, "resume", iid, "--answer", 'Activity_adjuster={"claim_status": "approve"}')
    check_run_document(done)
    assert done["status"] == "completed"


# ----------------------------------------------------------------------------- the appeal's variable


def misplaced(tmp_path: Path) -> Path:
    """The moderation process with the appeal's messageVariable where a hand edit (or an older Spiff
    modeler) leaves it: in the catch event's own extensionElements."""
    text = MODERATION.read_text()
    definition = re.search(r"<bpmn:messageEventDefinition id=\"MessageEventDefinition_0ap\".*?</bpmn:messageEventDefinition>",
                           text, re.S).group(0)
    moved = text.replace(definition, '<bpmn:messageEventDefinition id="MessageEventDefinition_0ap" messageRef="Message_appeal" />')
    moved = moved.replace('<bpmn:intermediateCatchEvent id="Event_appeal" name="Publisher appeal window">',
                          '<bpmn:intermediateCatchEvent id="Event_appeal" name="Publisher appeal window">\n'
                          '      <bpmn:extensionElements>\n'
                          '        <spiffworkflow:messageVariable>appeal</spiffworkflow:messageVariable>\n'
                          '      </bpmn:extensionElements>')
    assert moved.count("messageVariable>appeal<") == 1 and "<bpmn:extensionElements>\n        <spiffworkflow:messageVariable" in moved
    path = tmp_path / "content_moderation.bpmn"
    path.write_text(moved)
    (tmp_path / "content_moderation.layerflow.yaml").write_text((HERE / "content_moderation.layerflow.yaml").read_text())
    (tmp_path / "moderation_agents.py").write_text((HERE / "moderation_agents.py").read_text())
    return path


def test_validate_refuses_a_message_variable_the_catch_event_never_reads(tmp_path: Path, cli: Any) -> None:
    path = misplaced(tmp_path)
    result = cli("validate", str(path), "--json")
    assert result.exit_code == 2, result.stdout
    report = json.loads(result.stdout)
    [problem] = [p for p in report["problems"] if p["code"] == "message_extension_misplaced"]
    assert problem["element_id"] == "Event_appeal" and problem["field"] == "messageVariable"
    assert "'appeal'" in problem["message"] and "bpmn:messageEventDefinition" in problem["message"]
    assert cli("validate", str(MODERATION)).exit_code == 0  # where SpiffWorkflow reads it: valid


def test_a_process_with_the_misplaced_variable_does_not_load_and_a_list_payload_says_where_it_goes(
        tmp_path: Path) -> None:
    from engine.governance import BadRequest
    from context_layers.errors import ProcessError

    with pytest.raises(ProcessError) as not_loaded:
        load_process(misplaced(tmp_path))
    assert "message_extension_misplaced" in str(not_loaded.value) or "messageEventDefinition" in str(not_loaded.value)
    # with no variable at all, a payload that is no object is refused, saying where the variable is read
    bare = tmp_path / "bare" / "content_moderation.bpmn"
    bare.parent.mkdir()
    bare.write_text(re.sub(r"<bpmn:extensionElements>\s*<spiffworkflow:messageVariable>appeal</spiffworkflow:messageVariable>"
                           r"\s*</bpmn:extensionElements>", "", MODERATION.read_text()))
    for name in ("content_moderation.layerflow.yaml", "moderation_agents.py"):
        (bare.parent / name).write_text((HERE / name).read_text())
    engine = Engine("memory://")
    instance = engine.run(load_process(bare), BATCH, answers={"user_tasks": {"Activity_review": {"vote": "keep"}}})
    assert [w["task_id"] for w in instance.waiting_for] == ["Event_appeal"]
    with pytest.raises(BadRequest) as refused:
        engine.send_event(instance, "publisher_appeal", ["i2"])
    assert "bpmn:messageEventDefinition" in str(refused.value) and "Event_appeal" in str(refused.value)


BATCH = {"batch_id": "B-7", "reviewers": ["ann", "bo", "cy"], "items": [
    {"id": "i1", "text": "Great recipe, thanks"}, {"id": "i2", "text": "BUY NOW cheap watches"},
    {"id": "i3", "text": "you idiot"}, {"id": "i4", "text": "nice photo"}]}
