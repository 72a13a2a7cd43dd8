"""Outsider round 24: an employee onboarding modelled as SpiffArena models it (tests/engine/onboarding24/),
run through the README as written: validate, run, answers, resume, inspect, tape, replay.

employee_onboarding (onboarding.bpmn, SpiffArena export):
  `collect_details`, a user task with a JSON Schema form (formJsonSchemaFilename) whose department
  options come from the task's spiffworkflow:preScript (options_from_task_data_var:departments), and a
  postScript that derives `employee_id`; `choose_equipment`, a business rule task (equipment.dmn beside
  it, spiffworkflow:calledDecisionId); `provision_accounts`, a call activity of `account_provisioning`
  (accounts.bpmn: a script task with pre- and postScript, an escalation NO_MANAGER thrown when no
  manager is known, an error end event ACCOUNT_FAILED when the address is not the company's), caught by
  an error boundary event (`accounts_failed` -> IT sets the accounts up by hand) and a non-interrupting
  escalation boundary event (`manager_missing` -> HR is asked); a parallel split where one branch prints
  the badge (a script task with pre- and postScript) and throws the signal `badge_printed` that the other
  branch waits for; the first-day check-in, with an interrupting boundary timer of three days.

Expected before anything ran:
- `validate` accepts the files (exit 0) and warns of nothing: SpiffArena's pre/postScript on a script
  task run under layerflow (README, "Activities that throw BPMN errors");
- the run waits for the form (exit 3) with the preScript's options; an answer the schema refuses is
  bad input (exit 2) and the task still waits;
- an answers file drives it to the end; the DMN writes `laptop`, the scripts run pre, script, post;
- each caught event leaves an `event:<catch element id>` record, also when it carries no payload
  (the error end, the escalation, the signal), with the error's / escalation's `code`; `error_code` and
  `error_message` are set only by an activity raising engine.BpmnError, not by an error end event;
- the timer runs on the engine's clock (`Engine(clock=...)`); the CLI's is the wall clock.

Found: `validate` warned `script_extension_ignored` ("it never runs here") of the pre/postScripts that
ran; the error end, the escalation and the signal, carrying no payload, left no record in the context.
"""

from __future__ import annotations

import json
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from context_layers import LayeredContext
from engine import Engine, load_process

from engine_helpers import cli_in_a_tmp_store, run_json, variables
from test_contracts_cli import check_run_document

cli = cli_in_a_tmp_store  # the fixture "cli", here too

HERE = Path(__file__).resolve().parent / "onboarding24"
MAIN, CALLED = HERE / "onboarding.bpmn", HERE / "accounts.bpmn"
FILES = [str(MAIN), str(CALLED)]
GRACE = {"full_name": "Grace Hopper", "email": "grace@acme.example", "department": "sales",
         "start_date": "2026-02-02", "manager": "Ann"}
ADA = {"full_name": "Ada Lovelace", "email": "ada@gmail.com", "department": "eng", "start_date": "2026-01-05"}


def _answers(tmp_path: Path, details: dict[str, Any], **more: dict[str, Any]) -> str:
    path = tmp_path / "answers.json"
    path.write_text(json.dumps({"user_tasks": {"collect_details": details, **more}}), encoding="utf-8")
    return str(path)


def _record(doc: dict[str, Any], key: str) -> dict[str, Any]:
    record: dict[str, Any] = doc["layers"]["L3"][key]
    return record


def test_validate_accepts_the_spiffarena_files_and_warns_of_nothing(cli: Any) -> None:
    result = cli("validate", *FILES)
    assert result.exit_code == 0, result.output
    assert "is valid" in result.output and "warning" not in result.output, result.output
    assert "equipment.dmn" in result.output   # the DMN beside the BPMN was found


def test_the_run_waits_for_the_form_with_the_prescripts_options(cli: Any) -> None:
    doc = run_json(cli, "run", *FILES, "--data", '{"hire_ref": "H-7"}', code=3)
    check_run_document(doc)
    [item] = doc["waiting_for"]
    assert (item["kind"], item["task_id"]) == ("user_task", "collect_details")
    assert item["instructions"] == "Use the work e-mail, not a personal one."
    assert item["documentation"] == "HR enters the new hire as on the signed offer."
    fields = {f["id"]: f for f in item["form"]["fields"]}
    assert item["form"]["source"] == "new-hire-schema.json"
    assert fields["department"]["options_from"] == "departments"
    assert fields["department"]["options"] == [{"id": "eng", "name": "Engineering"}, {"id": "sales", "name": "Sales"}]
    assert {k for k, f in fields.items() if f["required"]} == {"full_name", "email", "department", "start_date"}
    # the preScript ran as the task became ready: a step of its own, "prepared"
    assert _record(doc, "activity:collect_details")["status"] == "prepared"
    assert doc["layers"]["L1"] == {"hire_ref": "H-7"}


def test_an_answer_the_schema_refuses_is_bad_input_and_the_task_still_waits(cli: Any) -> None:
    iid = run_json(cli, "run", *FILES, code=3)["instance_id"]
    bad = dict(GRACE, email="not an address", department="legal")
    doc = run_json(cli, "resume", iid, "--answer", f"collect_details={json.dumps(bad)}", code=2)
    assert doc["error"]["kind"] == "invalid_answer"
    assert {p["field"] for p in doc["error"]["problems"]} == {"email", "department"}
    again = run_json(cli, "inspect", iid)
    assert [w["task_id"] for w in again["waiting_for"]] == ["collect_details"]
    assert "full_name" not in again["layers"]["L3"]
    # a script task is no user task: an answer for it is a typo, bad input
    doc = run_json(cli, "resume", iid, "--answer", 'print_badge={"x": 1}', code=2)
    assert "'print_badge'" in doc["error"]["message"] and "collect_details" in doc["error"]["message"]


def test_an_answers_file_drives_the_happy_path_to_the_end(cli: Any, tmp_path: Path) -> None:
    answers = _answers(tmp_path, GRACE, first_day_checkin={"arrived": True})
    doc = run_json(cli, "run", *FILES, "--answers", answers, code=0)
    check_run_document(doc)
    history = doc["layers"]["L3"]
    assert doc["status"] == "completed" and doc["waiting_for"] == []
    assert (history["laptop"], history["monitor_count"]) == ("MacBook Air", 1)        # the DMN's FIRST rule
    assert history["employee_id"] == "E-HOPPER"                                         # the form's postScript
    assert (history["domain"], history["accounts_ok"], history["account_names"]) == (   # pre, script, post
        "acme.example", True, ["e-hopper@acme.example"])
    assert history["badge_printed_for"] == "GRACE HOPPER / B-E-HOPPER"
    assert history["badge_handed_over"] is True and history["arrived"] is True
    # nothing went wrong: no error, no escalation was caught; the signal was
    assert "event:accounts_failed" not in history and "event:manager_missing" not in history
    assert "hr_ticket" not in history and "accounts_created_by" not in history
    signal = _record(doc, "event:wait_badge")
    assert (signal["event"], signal["event_kind"], signal["sent_by"]) == ("badge_printed", "signal", "process")
    assert "code" not in signal


def test_the_error_end_of_the_called_process_leaves_a_record_with_its_code(cli: Any, tmp_path: Path) -> None:
    """An error end event with no payload, caught by the call activity's boundary event: the
    catch is recorded as ``event:accounts_failed`` with the error's code. No error_code key: that
    comes only from an activity raising engine.BpmnError."""
    doc = run_json(cli, "run", *FILES, "--answers", _answers(tmp_path, dict(ADA, manager="Ann")), code=3)
    assert [w["task_id"] for w in doc["waiting_for"]] == ["it_manual_setup"]
    record = _record(doc, "event:accounts_failed")
    assert (record["event"], record["event_kind"], record["code"], record["sent_by"]) == (
        "Accounts failed", "error", "ACCOUNT_FAILED", "process")
    history = doc["layers"]["L3"]
    assert "error_code" not in history and "error_message" not in history
    assert history["accounts_ok"] is False        # what the called process did before its error end stays
    done = run_json(cli, "resume", doc["instance_id"], "--answer", 'it_manual_setup={"accounts_created_by": "it-ann"}',
                    "--answer", 'first_day_checkin={"arrived": true}', code=0)
    assert done["layers"]["L3"]["accounts_created_by"] == "it-ann"
    assert done["layers"]["L3"]["event:accounts_failed"] == record


def test_the_escalation_without_a_manager_is_caught_beside_the_call_and_recorded(cli: Any, tmp_path: Path) -> None:
    answers = _answers(tmp_path, dict(GRACE, manager=""), first_day_checkin={"arrived": True})
    doc = run_json(cli, "run", *FILES, "--answers", answers, code=0)
    side = [name for name, c in doc["contexts"].items() if c["branch_id"] == "manager_missing"]
    assert len(side) == 1
    history = doc["layers"]["L3"]
    # the reminder path ended at an end event of its own: it merged as the process ended
    assert history["hr_ticket"] == "HR-E-HOPPER"
    record = _record(doc, "event:manager_missing")
    assert (record["event"], record["event_kind"], record["code"]) == ("No manager", "escalation", "NO_MANAGER")
    assert "event:accounts_failed" not in history      # non-interrupting: the accounts were made
    assert history["account_names"] == ["e-hopper@acme.example"]


def test_tape_inspect_and_replay_show_the_catches(cli: Any, tmp_path: Path) -> None:
    answers = _answers(tmp_path, ADA, it_manual_setup={"accounts_created_by": "it-bob"},
                       first_day_checkin={"arrived": True})
    iid = run_json(cli, "run", *FILES, "--answers", answers, code=0)["instance_id"]
    shown = cli("inspect", iid, "--layer", "L3")
    assert shown.exit_code == 0
    for key in ("event:accounts_failed", "event:manager_missing", "event:wait_badge"):
        assert key in shown.output, key
    for catch in ("accounts_failed", "manager_missing", "wait_badge"):   # each catch is a step on the tape
        tape = json.loads(cli("tape", iid, "--activity", catch, "--json").stdout)
        [done] = [e for e in tape if e["kind"] == "complete"]
        assert done["data"]["record_key"] == f"event:{catch}", (catch, tape)
    whole = run_json(cli, "replay", iid)
    assert whole["layers"] == run_json(cli, "inspect", iid)["layers"]


def test_the_timer_runs_on_the_engines_clock(tmp_path: Path) -> None:
    """README: the due time is fixed by the engine's clock; ``Engine(clock=...)`` moves it in Python."""
    now = [datetime(2026, 1, 5, 9, 0).timestamp()]
    engine = Engine(f"sqlite:///{tmp_path / 'timer.db'}", clock=lambda: now[0])
    process = load_process(FILES)
    instance = engine.run(process, {}, answers={"user_tasks": {"collect_details": GRACE}})
    assert instance.status == "waiting"
    [timer] = [w for w in instance.waiting_for if w["kind"] == "timer"]
    assert timer["task_id"] == "no_show" and timer["due"].startswith("2026-01-08T")
    assert engine.due_timers() == []
    now[0] += 3 * 86400 + 1
    assert [d["task_id"] for d in engine.due_timers()] == ["no_show"]
    done = engine.resume(instance.id, answers={"user_tasks": {"first_day_checkin": {"arrived": True}}})
    assert done.status == "completed"
    data = variables(done.main)
    assert data["no_show_reported"] is True and "arrived" not in data   # the timer came first
    assert any("first_day_checkin" in n for n in done.notices)           # the answer was not used


def test_the_cli_timer_is_on_the_wall_clock(cli: Any, tmp_path: Path) -> None:
    before = time.time()
    doc = run_json(cli, "run", *FILES, "--answers", _answers(tmp_path, GRACE), code=3)
    [timer] = [w for w in doc["waiting_for"] if w["kind"] == "timer"]
    due = datetime.fromisoformat(timer["due"]).timestamp()
    assert before + 3 * 86400 - 5 <= due <= time.time() + 3 * 86400 + 5
    listed = cli("timers", "--json")
    assert listed.exit_code == 0 and json.loads(listed.stdout) == {"due": [], "fired": []}


def test_the_python_api_replays_every_context_byte_for_byte(tmp_path: Path) -> None:
    engine = Engine("memory://")
    instance = engine.run(load_process(FILES), {}, answers={"user_tasks": {
        "collect_details": dict(ADA, manager=""), "it_manual_setup": {"accounts_created_by": "it-cy"},
        "first_day_checkin": {"arrived": True}}})
    assert instance.status == "completed", instance.error
    for ctx in instance.contexts.values():
        assert LayeredContext.replay(ctx.tape) == ctx
    assert instance.main.resolve("event:wait_badge")["event_kind"] == "signal"


@pytest.mark.parametrize("which", ["preScript", "postScript"])
def test_a_script_tasks_pre_and_post_script_errors_name_the_script(tmp_path: Path, which: str) -> None:
    """A slip in SpiffArena's preScript / postScript of a script task fails at that task, naming the
    script, as they run (not ignored)."""
    text = MAIN.read_text(encoding="utf-8")
    broken = {"preScript": "badge_name = full_name.upper()", "postScript": 'badge_printed_for = badge_name + " / " + badge_number'}
    path = tmp_path / "onboarding.bpmn"
    path.write_text(text.replace(broken[which], "nope = undefined_name"), encoding="utf-8")
    (tmp_path / "accounts.bpmn").write_text(CALLED.read_text(encoding="utf-8"), encoding="utf-8")
    for extra in ("equipment.dmn", "new-hire-schema.json", "new-hire-uischema.json"):
        (tmp_path / extra).write_text((HERE / extra).read_text(encoding="utf-8"), encoding="utf-8")
    instance = Engine("memory://").run(load_process([path, tmp_path / "accounts.bpmn"]), {},
                                       answers={"user_tasks": {"collect_details": GRACE}})
    assert instance.status == "error"
    assert instance.error["task_id"] == "print_badge"
    assert which in instance.error["message"] and "undefined_name" in instance.error["message"]


SIGNAL_IN_BRANCHES = '''<?xml version="1.0" encoding="UTF-8"?>
<bpmn:definitions xmlns:bpmn="http://www.omg.org/spec/BPMN/20100524/MODEL"
    xmlns:spiffworkflow="http://spiffworkflow.org/bpmn/schema/1.0/core" id="d" targetNamespace="b">
  <bpmn:signal id="S" name="badge_printed"><bpmn:extensionElements>
    <spiffworkflow:payloadExpression>{"badge": "B-1"}</spiffworkflow:payloadExpression>VARIABLE
  </bpmn:extensionElements></bpmn:signal>
  <bpmn:process id="sig" isExecutable="true">
    <bpmn:startEvent id="start"/>
    <bpmn:parallelGateway id="fork"/>
    <bpmn:intermediateCatchEvent id="wait"><bpmn:signalEventDefinition signalRef="S"/></bpmn:intermediateCatchEvent>
    <bpmn:intermediateThrowEvent id="throw"><bpmn:signalEventDefinition signalRef="S"/></bpmn:intermediateThrowEvent>
    <bpmn:parallelGateway id="join"/>
    <bpmn:endEvent id="end"/>
    <bpmn:sequenceFlow id="f1" sourceRef="start" targetRef="fork"/>
    <bpmn:sequenceFlow id="f2" sourceRef="fork" targetRef="wait"/>
    <bpmn:sequenceFlow id="f3" sourceRef="fork" targetRef="throw"/>
    <bpmn:sequenceFlow id="f4" sourceRef="wait" targetRef="join"/>
    <bpmn:sequenceFlow id="f5" sourceRef="throw" targetRef="join"/>
    <bpmn:sequenceFlow id="f6" sourceRef="join" targetRef="end"/>
  </bpmn:process>
</bpmn:definitions>
'''


@pytest.mark.parametrize("variable", [None, "printed"])
def test_a_thrown_payload_needs_a_variable_to_reach_the_catch(tmp_path: Path, variable: str | None) -> None:
    """README: without a variableName the payload is dropped at the catch (as in SpiffWorkflow) and the
    record says so (``"keys": []``); with one it is kept under it."""
    path = tmp_path / "sig.bpmn"
    named = f"<spiffworkflow:variableName>{variable}</spiffworkflow:variableName>" if variable else ""
    path.write_text(SIGNAL_IN_BRANCHES.replace("VARIABLE", named), encoding="utf-8")
    instance = Engine("memory://").run(load_process(path), {})
    assert instance.status == "completed", instance.error
    record = instance.main.resolve("event:wait")
    assert (record["event"], record["event_kind"], record["sent_by"]) == ("badge_printed", "signal", "process")
    assert record["keys"] == ([variable] if variable else [])
    assert variables(instance.main) == ({variable: {"badge": "B-1"}} if variable else {})
