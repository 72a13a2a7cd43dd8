"""Processes as a modeler saves them (diagram included), of shapes a business user draws, run
the way an outside check runs them: ``layerflow validate``, ``layerflow run --json``, the
Python API, and plain SpiffWorkflow 3.2 on the same file with the same data and answers.

The files are in ``tests/engine/unseen/``. For each case the path (the completed tasks' BPMN
ids, in order) and the final variables must be SpiffWorkflow's, except where plain
SpiffWorkflow loses a value layerflow keeps (``KEPT``: the last branch at a parallel join
overwrites, a non-interrupting boundary path's writes are lost, a sub-process interrupted by an
error drops what it wrote); there both values are asserted."""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from types import FunctionType, ModuleType
from typing import Any

import pytest
from click.testing import CliRunner
from SpiffWorkflow.bpmn.util import BpmnEvent
from SpiffWorkflow.bpmn.workflow import BpmnWorkflow
from SpiffWorkflow.spiff.parser.process import SpiffBpmnParser
from SpiffWorkflow.util.task import TaskState

from engine import Engine, load_process
from engine.cli import main

from engine_helpers import LOAN, LOAN_FAST, path_of, variables, without_due
from stores.conftest import REDIS_URL, drop_prefix, redis_or_skip

UNSEEN = Path(__file__).resolve().parent / "unseen"

# name: (files (the first holds the process run), data, user task answers, events sent while it waits)
CASES: dict[str, tuple[list[str], dict[str, Any], dict[str, dict[str, Any]], list[tuple[str, Any]]]] = {
    "nested sub-processes, XOR default": (["expense_report"], {}, {
        "manager_review": {"approved": False, "comment": "hotel too dear"}}, []),
    "call activity of another file in a parallel branch": (["order_fulfilment", "shipping_quote"], {}, {}, []),
    "interrupting timer PT0S on a user task": (["sla_escalation"], {}, {}, []),
    "non-interrupting timer on a user task": (["offer_reminder"], {}, {"prepare_offer": {"price": 20, "qty": 3}}, []),
    "error end event caught on the sub-process": (["claim_documents"], {
        "required": ["form", "receipt", "photo"], "docs": ["form"]}, {}, []),
    "sub-process without the error": (["claim_documents"], {"required": ["form"], "docs": ["form", "photo"]}, {}, []),
    "escalation caught non-interrupting": (["contract_escalation"], {}, {}, []),
    "user task done before the message": (["payment_or_cancel"], {}, {"wait_for_payment": {"paid": True}}, []),
    "message boundary interrupts a user task": (["payment_or_cancel"], {}, {}, [
        ("cancel_order", {"reason": "found cheaper"})]),
    "event-based gateway, the timer first": (["quote_reply"], {}, {}, []),
    "timer catch between scripts using datetime and json": (["cooling_off"], {}, {}, []),
    "parallel multi-instance over a collection": (["price_lines"], {
        "lines": [{"qty": 2, "price": 9.99}, {"qty": 1, "price": 120.0}, {"qty": 10, "price": 0.5}],
        "discount": 0.1}, {}, []),
    "sequential multi-instance with a completion condition": (["vendor_bids"], {}, {}, []),
    "user task in a parallel multi-instance sub-process": (["panel_vote"], {}, {"cast_vote": {"vote": "yes"}}, []),
    "standard loop on a sub-process, then loopCardinality": (["delivery_attempts"], {}, {}, []),
    "inclusive split with three conditions true": (["risk_checks"], {
        "amount": 80000, "country": "FR", "is_new_customer": True}, {}, []),
    "parallel user tasks and a manual task (Camunda export)": (["employee_onboarding"], {"name": "Grace"}, {
        "it_setup": {"laptop": True}, "hr_paperwork": {"signed": True, "desk": "B-12"}, "hand_over_badge": {}}, []),
    "parallel split with a user task inside a loop": (["sprint_rounds"], {}, {"review_round": {"ok": True}}, []),
    "message start event": (["support_ticket"], {}, {}, [("ticket_opened", {"severity": 4, "product": "router"})]),
    "data objects between tasks": (["quote_data_objects"], {}, {}, []),
    "manual task, two true XOR conditions (diagram order)": (["order_routing"], {"amount": 150}, {"check_stock": {}}, []),
    "XOR default flow": (["order_routing"], {"amount": 5}, {"check_stock": {}}, []),
    "user task in a sub-process in a parallel branch": (["site_inspection"], {}, {"record_findings": {"defects": 1}}, []),
    "multi-instance call activity, error and escalation from a called process": (
        ["credit_line", "credit_checks"], {"fraud_threshold": 10000, "look_threshold": 1000}, {}, []),
    "called process ends in an error": (["credit_line", "credit_checks"], {
        "fraud_threshold": 100, "look_threshold": 1000}, {}, []),
    "non-interrupting message on a sub-process with a user task": (["permit_review"], {}, {
        "check_plans": {"plans_ok": False}}, [("objection_filed", {"from": "no. 12"})]),
    "loopCardinality user tasks, then the message of an event-based gateway": (["survey_reply"], {}, {
        "rate_survey": {"stars": 4}}, [("sponsor_answer", {"ok": True})]),
    "inclusive split of user tasks, standard loop on a user task": (["incident_response"], {
        "severity": 3, "customers_hit": 12}, {"ops_fix": {"fix": "restarted"}, "comms_notice": {"notice": "sent"},
                                             "verify_fix": {"verified": True}}, []),
    "a loop around a sub-process with a parallel split and a timer catch": (["batch_loop"], {}, {}, []),
    "terminate end event in a branch while the other waits for a person": (["order_abort"], {"credit_limit": 50}, {
        "pack_order": {"packed": True}}, []),
    "the branches meet at the join when nothing terminates": (["order_abort"], {"credit_limit": 500}, {
        "pack_order": {"packed": True}}, []),
    "escalation end event interrupts, timer event sub-process": (["budget_escalation"], {"budget": 10000}, {
        "cfo_approval": {"cfo_says": "yes"}}, []),
    "no escalation, timer event sub-process": (["budget_escalation"], {"budget": 20000}, {}, []),
    "a plain task, pre- and post-scripts on a user task": (["visit_report"], {}, {
        "drive_to_site": {}, "write_report": {"report": "Boiler pressure fine, valve 3 leaks slightly"}}, []),
    "call activity with data inputs and outputs, sequential multi-instance user task": (["payroll", "tax_calc"], {}, {
        "sign_payslip": {"signature": {"by": "clerk"}}}, []),
    "multi-instance sub-process holding a multi-instance task and a data object": (["warehouse_count"], {}, {}, []),
    "error with a payload caught on the sub-process": (["shipment_exception"], {"weight_kg": 2000}, {}, []),
    "no error, the person confirms": (["shipment_exception"], {"weight_kg": 20}, {
        "confirm_pickup": {"pickup": "9:00"}}, []),
    "pool, lanes, annotation, group, message flow to a second pool (SpiffArena export)": (["leave_request"], {}, {
        "fill_form": {"days": 12}, "manager_decides": {"manager_ok": True}, "head_decides": {"head_ok": True}}, []),
    "timer start event, non-interrupting cycle timer on a user task": (["nightly_sync"], {}, {
        "approve_sync": {"ok": True}}, []),
}

# what layerflow keeps that plain SpiffWorkflow loses: case -> {key: (plain value, layerflow value)}
KEPT: dict[str, dict[str, tuple[Any, Any]]] = {
    # the reminder path's write; SpiffWorkflow's boundary join keeps the user task path's stale copy
    "non-interrupting timer on a user task": {"reminders": (0, 1)},
    # the "estimate" branch arrives first at every join: SpiffWorkflow keeps the review branch's stale list
    "parallel split with a user task inside a loop": {"velocity": ([], [8, 9, 10])},
    # what the sub-process wrote before its error end event (SpiffWorkflow drops the sub-process's data,
    # and request_docs, which reads `missing`, fails there)
    "called process ends in an error": {"suspicious": (None, True), "odd": (None, True)},
    # the timer branch arrives last at the sub-process's join with the first pass's item count
    # (10 each pass): SpiffWorkflow books 25, 50, 75 where the batches were 25, 100 and 225
    "a loop around a sub-process with a parallel split and a timer catch": {
        "items_in_batch": (10, 30), "totals": ([25.0, 50.0, 75.0], [25.0, 100.0, 225.0]), "grand": (150.0, 350.0)},
    # what the sub-process wrote before its escalation end event interrupted it
    "escalation end event interrupts, timer event sub-process": {"cost": (None, 12000), "estimated": (None, True)},
    "error with a payload caught on the sub-process": {"offer": ("absent", None)},
    # each repetition's path counts its ping; SpiffWorkflow's boundary join keeps the user task path's 0
    "timer start event, non-interrupting cycle timer on a user task": {"pings": (0, 2)},
}
# a data object is a context key under layerflow; plain SpiffWorkflow keeps it in workflow.data_objects
DATA_OBJECTS = {"data objects between tasks"}
# plain SpiffWorkflow cannot run these: the writes of the sub-process an error interrupted are gone
PLAIN_FAILS = {"error end event caught on the sub-process": "name 'missing' is not defined"}


def _paths(files: list[str]) -> list[Path]:
    return [UNSEEN / f"{name}.bpmn" for name in files]


def _plain_waiting_for(wf: BpmnWorkflow, name: str) -> Any:
    """The definition of message ``name`` a task of plain SpiffWorkflow waits for (an
    event-based gateway waits for several), as SpiffWorkflow's own tests deliver it; else None."""
    for task in wf.get_tasks(state=TaskState.WAITING):
        definition = getattr(task.task_spec, "event_definition", None)
        for each in getattr(definition, "event_definitions", None) or [definition]:
            if getattr(each, "name", None) == name:
                return each
    return None


def _run_plain(case: str) -> tuple[BpmnWorkflow, dict[str, Any]]:
    """Events first, as soon as something waits for them; then the people, one task at a time."""
    files, data, answers, events = CASES[case]
    parser = SpiffBpmnParser()
    parser.add_bpmn_files([str(p) for p in _paths(files)])
    wf = BpmnWorkflow(parser.get_spec(files[0]), parser.get_subprocess_specs(files[0]))
    wf.task_tree.data.update(data)
    wf.do_engine_steps()
    pending = list(events)
    while not wf.is_completed():
        ready = wf.get_tasks(state=TaskState.READY, manual=True)
        definition = _plain_waiting_for(wf, pending[0][0]) if pending else None
        if definition is not None:
            wf.send_event(BpmnEvent(definition, pending.pop(0)[1]))
        elif ready:
            ready[0].data.update(answers[ready[0].task_spec.bpmn_id])
            ready[0].run()
        else:
            raise AssertionError(f"plain SpiffWorkflow is stuck at {path_of(wf)}")
        wf.do_engine_steps()
    assert not pending, f"nothing waited for {pending}"
    found = {k: v for k, v in wf.last_task.data.items()
             if not isinstance(v, (ModuleType, type, FunctionType))}  # `import json` in a script
    return wf, found


def _run_ours(case: str, engine: Engine | None = None) -> Any:
    """The same order as ``_run_plain``: an event as soon as the instance waits for it, else the answers."""
    files, data, answers, events = CASES[case]
    engine = engine or Engine()
    instance = engine.run(engine.start(load_process(_paths(files)), data))
    pending = list(events)
    while instance.status == "waiting":
        waits = instance.waiting_for
        if pending and any(w["kind"] == "event" and w["event"] == pending[0][0] for w in waits):
            instance = engine.send_event(instance, *pending.pop(0))
            continue
        before = [w["id"] for w in waits]
        instance = engine.run(instance, answers={"user_tasks": answers})
        if [w["id"] for w in instance.waiting_for] == before:
            break
    assert not pending, f"nothing waited for {pending}: {instance.waiting_for}"
    return instance


@pytest.mark.parametrize("case", list(CASES))
def test_it_runs_as_plain_spiffworkflow_runs_it(case: str) -> None:
    instance = _run_ours(case)
    assert instance.status == "completed", instance.error
    ours = variables(instance.main)
    if case in PLAIN_FAILS:
        with pytest.raises(Exception, match=PLAIN_FAILS[case]):
            _run_plain(case)
        assert ours["missing"] == ["receipt", "photo"] and ours["status"] == "documents requested"
        assert path_of(instance.workflow)[-3:] == ["docs_error", "request_docs", "claim_waiting_docs"]
        return
    wf, plain = _run_plain(case)
    assert path_of(instance.workflow) == path_of(wf)
    for key, (plain_value, our_value) in KEPT.get(case, {}).items():
        assert plain.pop(key, "absent" if plain_value == "absent" else None) == plain_value, key
        assert ours.pop(key) == our_value, key
    if case in DATA_OBJECTS:
        objects = {k: ours.pop(k) for k in list(ours) if k.startswith("DataObject_")}
        assert objects == wf.data_objects and objects
    assert ours == plain


def test_a_message_event_sub_process_interrupts_a_waiting_person() -> None:
    """Plain SpiffWorkflow 3.2 never waits for the message start of this event sub-process (it
    is not among the start task's children), so there is nothing to compare: the recall is
    caught, the waiting person's task is cancelled, the payload lands under its variable."""
    parser = SpiffBpmnParser()
    parser.add_bpmn_file(str(UNSEEN / "shipment_exception.bpmn"))
    plain = BpmnWorkflow(parser.get_spec("shipment_exception"), parser.get_subprocess_specs("shipment_exception"))
    plain.task_tree.data["weight_kg"] = 20
    plain.do_engine_steps()
    assert plain.waiting_events() == []
    engine = Engine()
    instance = engine.run(engine.start(load_process(UNSEEN / "shipment_exception.bpmn"), {"weight_kg": 20}))
    assert sorted((w["kind"], w["task_id"]) for w in instance.waiting_for) == [
        ("event", "recall_start"), ("user_task", "confirm_pickup")]
    instance = engine.send_event(instance, "recall", {"lot": "L-77"})
    assert instance.status == "completed", instance.error
    assert path_of(instance.workflow)[-4:] == ["recall_start", "stop_shipment", "recall_end", "recall"]
    assert "confirm_pickup" not in path_of(instance.workflow)
    assert variables(instance.main) == {"weight_kg": 20, "offer": 120, "recall_notice": {"lot": "L-77"},
                                        "stopped": "L-77"}


def test_a_person_answers_each_instance_of_a_multi_instance_sub_process_apart(tmp_path: Path) -> None:
    """A user task inside a multi-instance sub-process waits once per instance under one BPMN id;
    waiting_for tells which instance (and input item) each wait is for, so each member votes
    for themself, across a save and a load with another engine after each answer."""
    votes = {"ana": "yes", "ben": "no", "chloe": "no"}
    store = f"sqlite:///{tmp_path / 'votes.db'}"
    instance = Engine(store=store).run(Engine(store=store).start(load_process(UNSEEN / "panel_vote.bpmn")))
    waits = instance.waiting_for
    assert [(w["task_id"], w["instance"], w["input"]) for w in waits] == [
        ("cast_vote", 1, {"member": "ana"}), ("cast_vote", 2, {"member": "ben"}), ("cast_vote", 3, {"member": "chloe"})]
    for wait in reversed(waits):  # the last first: the ballots still land at their member's place
        engine = Engine(store=store)
        loaded = engine.load(instance.id)
        engine.complete_user_task(loaded, wait["id"], {"vote": votes[wait["input"]["member"]]})
    final = Engine(store=store).load(instance.id)
    assert final.status == "completed", final.error
    got = variables(final.main)
    assert got["ballots"] == [{"member": m, "vote": v} for m, v in votes.items()]
    assert (got["yes"], got["carried"]) == (1, False)


@pytest.mark.parametrize("store", ["sqlite", "redis"])
def test_a_wait_inside_a_sub_process_of_a_branch_survives_save_and_load(tmp_path: Path, store: str) -> None:
    """The user task waits inside a sub-process of one branch while the other branch is done:
    another engine loads the instance from the store, completes the task, and the join merges."""
    prefix = f"lftest-{uuid.uuid4().hex[:12]}"
    if store == "redis":
        redis_or_skip()
    url = f"sqlite:///{tmp_path / 'site.db'}" if store == "sqlite" else f"{REDIS_URL}?prefix={prefix}"
    try:
        first = Engine(store=url)
        waiting = first.run(first.start(load_process(UNSEEN / "site_inspection.bpmn")))
        assert waiting.status == "waiting"
        assert [(w["kind"], w["task_id"]) for w in waiting.waiting_for] == [("user_task", "record_findings")]
        second = Engine(store=url)
        done = second.complete_user_task(second.load(waiting.id), waiting.waiting_for[0]["id"], {"defects": 1})
        assert done.status == "completed", done.error
        wf, plain = _run_plain("user task in a sub-process in a parallel branch")
        reloaded = Engine(store=url).load(waiting.id)
        assert variables(reloaded.main) == plain
        assert path_of(reloaded.workflow) == path_of(wf)
    finally:
        if store == "redis":
            drop_prefix(REDIS_URL, prefix)


# ----- the CLI, as a script drives it --------------------------------------------------------------

DOC_FIELDS = {"instance_id", "process_id", "status", "error", "layers", "tokens", "conflicts", "compressions",
              "confirmations", "waiting_for", "tape_length"}
LAYERS = ["L0", "L1", "L2", "L3", "L4", "L5"]
EXIT = {"completed": 0, "waiting": 3, "error": 1}


def _check_document(doc: dict[str, Any], code: int, process_id: str) -> None:
    """DESIGN.md "Interfaces": every field, with its type; the exit code goes with the status."""
    assert DOC_FIELDS <= set(doc), DOC_FIELDS - set(doc)
    assert isinstance(doc["instance_id"], str) and doc["instance_id"] and doc["process_id"] == process_id
    assert code == EXIT[doc["status"]]
    if doc["status"] == "error":
        assert isinstance(doc["error"]["kind"], str) and isinstance(doc["error"]["message"], str)
        assert doc["error"]["task_id"] is None or isinstance(doc["error"]["task_id"], str)
    else:
        assert doc["error"] is None
    assert list(doc["layers"]) == LAYERS and all(isinstance(v, dict) for v in doc["layers"].values())
    assert list(doc["tokens"]) == [*LAYERS, "total"]
    assert all(type(v) is int and v >= 0 for v in doc["tokens"].values())
    assert doc["tokens"]["total"] == sum(doc["tokens"][layer] for layer in LAYERS)
    assert all(isinstance(doc[k], list) for k in ("conflicts", "compressions", "confirmations", "waiting_for"))
    assert (doc["status"] == "waiting") == bool(doc["waiting_for"])
    for wait in doc["waiting_for"]:
        assert wait["kind"] in ("user_task", "confirmation", "timer", "event")
        assert isinstance(wait["id"], str) and isinstance(wait["task_id"], str)
    assert type(doc["tape_length"]) is int and doc["tape_length"] > 0


def _data_keys(doc: dict[str, Any]) -> dict[str, Any]:
    """The variables of a completed run: every finished activity's writes are in HISTORY."""
    return {k: v for k, v in doc["layers"]["L3"].items()
            if not k.startswith(("_", "activity:", "event:"))} | doc["layers"]["L1"]


@pytest.mark.parametrize("case", list(CASES))
def test_run_json_gives_the_documented_document_and_the_python_api_result(case: str, tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    files, data, answers, events = CASES[case]
    monkeypatch.chdir(tmp_path)
    store = f"sqlite:///{tmp_path / 'cli.db'}"
    (tmp_path / "answers.json").write_text(json.dumps({"user_tasks": answers}))
    runner = CliRunner()
    # with events, the answers wait until the events came (as _run_ours and _run_plain run it)
    result = runner.invoke(main, ["run", *map(str, _paths(files)), "--json", "--store", store, "--data",
                                  json.dumps(data), *([] if events else ["--answers", "answers.json"])])
    doc = json.loads(result.stdout)  # exactly one document
    _check_document(doc, result.exit_code, files[0])
    pending = list(events)
    while doc["status"] == "waiting":
        if pending and any(w["kind"] == "event" and w["event"] == pending[0][0] for w in doc["waiting_for"]):
            name, payload = pending.pop(0)
            command = ["send", doc["instance_id"], name, "--json-payload", json.dumps(payload)]
        else:
            command = ["resume", doc["instance_id"], "--answers", "answers.json"]
        before = doc["waiting_for"]
        result = runner.invoke(main, [*command, "--json", "--store", store])
        doc = json.loads(result.stdout)
        _check_document(doc, result.exit_code, files[0])
        assert doc["waiting_for"] != before, before
    assert not pending
    assert (doc["status"], result.exit_code) == ("completed", 0), doc["error"] or doc["waiting_for"]
    assert _data_keys(doc) == variables(_run_ours(case).main)


def test_a_failing_script_is_exit_1_with_the_error_naming_the_task(tmp_path: Path) -> None:
    """Only the default branch runs, so `credit_score` was never written (plain SpiffWorkflow fails alike)."""
    result = CliRunner().invoke(main, ["run", str(UNSEEN / "risk_checks.bpmn"), "--json", "--store", "memory://",
                                       "--data", json.dumps({"amount": 500, "country": "DE", "is_new_customer": False})])
    doc = json.loads(result.stdout)
    _check_document(doc, result.exit_code, "risk_checks")
    assert (doc["status"], doc["error"]["task_id"]) == ("error", "decide")
    assert "credit_score" in doc["error"]["message"] and "line 1" in doc["error"]["message"]


# ----- validate: every file here is valid; a mistake names the file, line and element ---------------

MAIN_FILES = sorted({tuple(files) for files, *_ in CASES.values()})


@pytest.mark.parametrize("files", MAIN_FILES, ids=[f[0] for f in MAIN_FILES])
def test_validate_accepts_every_process_without_a_warning(files: tuple[str, ...]) -> None:
    result = CliRunner().invoke(main, ["validate", *map(str, _paths(list(files)))])
    assert result.exit_code == 0, result.output
    assert "warning" not in result.output and f"process {files[0]!r} is valid" in result.output


# (file, text, replaced by, element id named, words of the message that say what is wrong and what to do)
MISTAKES = [
    ("payment_or_cancel", 'messageRef="Message_cancel"', 'messageRef="Message_cancelled"', "cancelled_by_customer",
     ["messageRef='Message_cancelled'", "no bpmn:message", "did you mean 'Message_cancel'"]),
    ("claim_documents", 'id="ErrorEventDefinition_1" errorRef="Error_docs"', 'id="ErrorEventDefinition_1" errorRef="Error_doc"',
     "docs_missing_end", ["errorRef='Error_doc'", "no bpmn:error", 'add <bpmn:error id="Error_doc"']),
    ("contract_escalation", 'id="EscalationEventDefinition_1" escalationRef="Escalation_long"',
     'id="EscalationEventDefinition_1" escalationRef="Escalation_lng"', "notify_legal",
     ["escalationRef='Escalation_lng'", "no bpmn:escalation"]),
    ("sla_escalation", 'attachedToRef="approve_request"', 'attachedToRef="approve_requests"', "sla_breached",
     ["attachedToRef='approve_requests'", "no activity", "did you mean 'approve_request'", "attach it"]),
    ("permit_review", 'attachedToRef="desk_review">\n      <bpmn:outgoing>Flow_review_deadline',
     'attachedToRef="check_plans">\n      <bpmn:outgoing>Flow_review_deadline', "review_deadline",
     ["attachedToRef='check_plans'", "inside sub-process 'desk_review'", "drawn outside it"]),
    ("cooling_off", '"PT0S"', '"five minutes"', "cooling_period",
     ['timeDuration "five minutes" is no ISO 8601 duration', '"PT15M"']),
    ("sla_escalation", '"PT0S"', "PT0S", "sla_breached", ['write it as a string: "PT0S"']),
    ("order_routing", 'targetRef="routing_end"', 'targetRef="routing_ende"', "Flow_dispatch_routing_end",
     ["targetRef='routing_ende'", "did you mean 'routing_end'"]),
    ("order_routing", ' default="Flow_small"', "", "Flow_small", ["no condition", 'default="Flow_small"']),
    ("order_routing", "amount &gt; 100<", "${amount &gt; 100}<", "Flow_route_order_big_order",
     ["JUEL", "write 'amount > 100'"]),
    ("expense_report", "for i in items)\n", "for i in items\n", "total_up", ["not valid Python", "fix the script"]),
    ("delivery_attempts", ">not delivered<", ">not delivered =<", "attempt_delivery", ["loopCondition", "not valid"]),
]


@pytest.mark.parametrize(("source", "old", "new", "element", "words"), MISTAKES,
                         ids=[f"{m[0]}:{m[3]}:{i}" for i, m in enumerate(MISTAKES)])
def test_validate_names_file_line_and_element_of_a_mistake(tmp_path: Path, source: str, old: str, new: str,
                                                           element: str, words: list[str]) -> None:
    text = (UNSEEN / f"{source}.bpmn").read_text()
    assert text.count(old) == 1, old
    broken = tmp_path / f"{source}.bpmn"
    broken.write_text(text.replace(old, new))
    line = next(n for n, row in enumerate(broken.read_text().splitlines(), 1) if new and new.split()[0] in row) \
        if new.strip() else None
    result = CliRunner().invoke(main, ["validate", str(broken)])
    assert result.exit_code == 2, result.output
    problem = next((row for row in result.output.splitlines() if f"element {element!r}" in row), None)
    assert problem is not None, result.output
    assert problem.startswith(f"{broken}:"), problem
    reported = int(problem[len(str(broken)) + 1:].split(":", 1)[0])
    if line is not None:
        assert abs(reported - line) <= 2, (reported, line)  # the element's line or the attribute's own
    for word in words:
        assert word in problem, (word, problem)
    # and `run` refuses it with the same message, exit 2, nothing started
    run = CliRunner().invoke(main, ["run", str(broken), "--json", "--store", "memory://"])
    assert run.exit_code == 2 and words[0] in json.loads(run.stdout)["error"]["message"]


def test_two_reviewers_who_disagree_are_a_conflict_a_person_settles(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """Plain SpiffWorkflow keeps the verdict the last branch to arrive at the join carries; layerflow
    stops there (exit 3) with the conflict and its confirmation, and goes on with the answer.
    The send task inside one branch's sub-process reaches the receive task of the third branch."""
    monkeypatch.chdir(tmp_path)
    answers = {"legal_review": {"verdict": "approve"}, "finance_review": {"verdict": "reject"}}
    (tmp_path / "answers.json").write_text(json.dumps({"user_tasks": answers}))
    store = f"sqlite:///{tmp_path / 'review.db'}"
    runner = CliRunner()
    result = runner.invoke(main, ["run", str(UNSEEN / "dual_review.bpmn"), "--json", "--store", store,
                                  "--answers", "answers.json"])
    doc = json.loads(result.stdout)
    _check_document(doc, result.exit_code, "dual_review")
    assert without_due(doc["waiting_for"]) == [{"kind": "confirmation", "id": "join_review/verdict", "task_id": "join_review",
                                   "key": "verdict", "context": "main"}], (doc["status"], doc["error"], doc["conflicts"], result.stderr)
    [conflict] = doc["conflicts"]
    assert {k: conflict[k] for k in ("gateway_id", "key", "base_value", "values", "resolution")} == {
        "gateway_id": "join_review", "key": "verdict", "base_value": "pending",
        "values": {"legal_review": "approve", "finance_track": "reject"}, "resolution": None}
    assert conflict["layer"] in LAYERS
    [asked] = doc["confirmations"]
    assert asked["id"] == "join_review/verdict" and asked["answer"] is None and not asked["timed_out"]
    assert {"approve", "reject"} <= {option["value"] for option in asked["options"]}

    result = runner.invoke(main, ["resume", doc["instance_id"], "--answer", "join_review/verdict=reject", "--json",
                                  "--store", store])
    doc = json.loads(result.stdout)
    _check_document(doc, result.exit_code, "dual_review")
    assert doc["status"] == "completed"
    assert doc["conflicts"][0]["resolution"]["value"] == "reject"
    assert doc["conflicts"][0]["resolution"]["resolver"] == "human"

    parser = SpiffBpmnParser()
    parser.add_bpmn_file(str(UNSEEN / "dual_review.bpmn"))
    plain = BpmnWorkflow(parser.get_spec("dual_review"), parser.get_subprocess_specs("dual_review"))
    plain.do_engine_steps()
    while not plain.is_completed():
        task = plain.get_tasks(state=TaskState.READY, manual=True)[0]
        task.data.update(answers[task.task_spec.bpmn_id])
        task.run()
        plain.do_engine_steps()
    expected = dict(plain.last_task.data)
    # the audit branch arrives last with the verdict of before the split: both reviewers' are lost
    assert expected.pop("verdict") == "pending"
    expected.pop("outcome")
    ours = _data_keys(doc)
    assert (ours.pop("verdict"), ours.pop("outcome")) == ("reject", "C-12: reject")
    assert ours == expected


def test_resume_answers_each_instance_of_a_multi_instance_sub_process_by_its_waiting_for_id(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """What a script does: run, read waiting_for, answer each wait by its id with what fits its
    input item, resume once."""
    monkeypatch.chdir(tmp_path)
    store = f"sqlite:///{tmp_path / 'panel.db'}"
    runner = CliRunner()
    result = runner.invoke(main, ["run", str(UNSEEN / "panel_vote.bpmn"), "--json", "--store", store])
    doc = json.loads(result.stdout)
    _check_document(doc, result.exit_code, "panel_vote")
    votes = {"ana": "no", "ben": "yes", "chloe": "yes"}
    (tmp_path / "votes.json").write_text(json.dumps({"user_tasks": {
        w["id"]: {"vote": votes[w["input"]["member"]]} for w in doc["waiting_for"]}}))
    result = runner.invoke(main, ["resume", doc["instance_id"], "--answers", "votes.json", "--json", "--store", store])
    doc = json.loads(result.stdout)
    _check_document(doc, result.exit_code, "panel_vote")
    assert doc["status"] == "completed"
    assert doc["layers"]["L3"]["ballots"] == [{"member": m, "vote": v} for m, v in votes.items()]
    assert (doc["layers"]["L3"]["yes"], doc["layers"]["L3"]["carried"]) == (2, True)


def test_a_parallel_multi_instance_user_task_ends_when_its_completion_condition_holds() -> None:
    """Two of four board members voting yes is a quorum: the other two waits are cancelled and
    the output collection holds the two ballots given. Plain SpiffWorkflow evaluates the
    condition over the finishing instance's own copy of the data, where `votes` is the empty
    list of before the activity, so it never holds there and every member votes."""
    parser = SpiffBpmnParser()
    parser.add_bpmn_file(str(UNSEEN / "quorum_vote.bpmn"))
    plain = BpmnWorkflow(parser.get_spec("quorum_vote"))
    plain.do_engine_steps()
    while not plain.is_completed():
        task = plain.get_tasks(state=TaskState.READY, manual=True)[0]
        task.data["ballot"] = "yes"
        task.run()
        plain.do_engine_steps()
    assert plain.last_task.data["votes"] == ["yes"] * 4 and path_of(plain).count("vote") == 5

    engine = Engine()
    instance = engine.run(engine.start(load_process(UNSEEN / "quorum_vote.bpmn")))
    assert [(w["task_id"], w["input"]) for w in instance.waiting_for] == [("vote", {"member": m}) for m in "abcd"]
    while instance.status == "waiting":
        instance = engine.complete_user_task(instance, instance.waiting_for[0]["id"], {"ballot": "yes"})
    assert instance.status == "completed", instance.error
    assert variables(instance.main) == {"board": ["a", "b", "c", "d"], "votes": ["yes", "yes"], "result": 2}
    assert path_of(instance.workflow) == ["q_start", "invite", "vote", "vote", "vote", "tally", "q_end"]


def test_a_handler_file_of_another_process_does_not_run_for_a_task_of_the_same_id() -> None:
    """The loan example's handler file registers `finance_review` with @activity; once the loan
    process ran in this Python process (a server, a worker, a test session), the user task
    `finance_review` of this review process ran the loan's handler, which failed on a key of the
    loan ("key 'assessment_id' is in no layer"), instead of waiting for the person."""
    engine = Engine()
    loan = engine.run(engine.start(load_process(LOAN), LOAN_FAST))
    assert loan.status == "completed", loan.error  # the loan's own handlers still run by their ids
    review = engine.run(engine.start(load_process(UNSEEN / "dual_review.bpmn")))
    assert review.status == "waiting", review.error
    assert sorted(w["task_id"] for w in review.waiting_for if w["kind"] == "user_task") == [
        "finance_review", "legal_review"]
    answers = {"legal_review": {"verdict": "approve"}, "finance_review": {"verdict": "approve"}}
    review = engine.run(review, answers={"user_tasks": answers})
    assert review.status == "completed", review.error
    assert variables(review.main)["outcome"] == "C-12: approve"
