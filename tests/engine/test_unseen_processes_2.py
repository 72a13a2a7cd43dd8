"""More processes as modelers save them (diagram included), in shapes ``test_unseen_processes``
does not draw: collaborations of several pools where the executable one is not the first,
lanes and message flows, data object references with states and input/output associations,
signals and messages thrown and caught inside one process, conditional and escalation
intermediate events, terminate end events inside a (multi-instance) sub-process, a transaction
with a cancel end event, a standard loop with ``loopMaximum``, a sequential multi-instance call
activity with a completion condition, call activities nested across three files, Camunda 7 and
Camunda 8 exports, ids and names in German with umlauts and line breaks.

Each runs through ``layerflow validate``, ``layerflow run --json`` (``--answers``, ``send``,
``resume``), the Python API, and plain SpiffWorkflow 3.2 with the same data, answers and events:
the path (completed tasks' BPMN ids, in order) and the final variables must be SpiffWorkflow's,
except where plain SpiffWorkflow drops what an interrupted scope wrote (``KEPT``). What
SpiffWorkflow 3.2 cannot run (compensation) or reads otherwise (another engine's expressions
and settings) is refused by ``validate`` with the element's id and what to write instead.
The files are in ``tests/engine/unseen2/``."""

from __future__ import annotations

import json
from pathlib import Path
from types import FunctionType, ModuleType
from typing import Any, NamedTuple

import pytest
from click.testing import CliRunner
from SpiffWorkflow.bpmn.util import BpmnEvent
from SpiffWorkflow.bpmn.workflow import BpmnWorkflow
from SpiffWorkflow.spiff.parser.process import SpiffBpmnParser
from SpiffWorkflow.util.task import TaskState

from engine import Engine, load_process
from engine.cli import main

from engine_helpers import path_of, variables, without_due
from test_unseen_processes import _check_document, _data_keys, _plain_waiting_for

UNSEEN = Path(__file__).resolve().parent / "unseen2"


class Case(NamedTuple):
    files: list[str]  # the first holds the process run; its file name is the process id
    data: dict[str, Any]
    answers: dict[str, dict[str, Any]]  # user task id -> what the person enters
    events: list[tuple[str, str, Any]]  # (kind, name, payload), sent as soon as something waits for it


CASES: dict[str, Case] = {
    "a signal thrown in one branch is caught in the other": Case(["stock_signal"], {}, {}, []),
    "terminate end event inside a sub-process cancels the waiting person there only": Case(
        ["quality_terminate"], {"samples": [3, 12]}, {"Activity_0lab": {"lab": "ok"}}, []),
    "the sub-process's branches meet when nothing terminates": Case(
        ["quality_terminate"], {"samples": [3, 1]}, {"Activity_0lab": {"lab": "ok"}}, []),
    "transaction completes": Case(["payment_transaction"], {"amount": 10}, {}, []),
    "cancel end event in a transaction, caught by its cancel boundary event": Case(
        ["payment_transaction"], {"amount": 5000}, {}, []),
    "a person signs in one branch of a transaction while the other completes it": Case(
        ["signed_payment"], {"amount": 10}, {"Activity_0sign": {"signed": True}}, []),
    "a cancel end event in one branch of a transaction cancels the person waiting in the other": Case(
        ["signed_payment"], {"amount": 5000}, {"Activity_0sign": {"signed": True}}, []),
    "an escalation end event in one branch of a sub-process, caught by an interrupting boundary event": Case(
        ["fraud_escalation"], {"amount": 5000}, {"Activity_0sign": {"signed": True}}, []),
    "three pools, the executable one second, lanes, a message from the supplier's pool": Case(
        ["purchase_order"], {}, {"Activity_0fill": {"items": [{"price": 2000, "qty": 3}]},
                                 "Activity_0head": {"head_ok": True}}, [("message", "supplier_conf", {"eta": "2026-12-10"})]),
    "the same order under the head's limit": Case(
        ["purchase_order"], {}, {"Activity_0fill": {"items": [{"price": 20, "qty": 3}]}},
        [("message", "supplier_conf", {"eta": "2026-12-01"})]),
    "Camunda 7 export: form data, assignee expression, async flags": Case(
        ["camunda_claim"], {}, {"Activity_0assess": {"payout": 900, "fraud_suspected": False}}, []),
    "Camunda 7 export, the other way": Case(
        ["camunda_claim"], {}, {"Activity_0assess": {"payout": 900, "fraud_suspected": True}}, []),
    "standard loop ended by its condition, sequential loopCardinality with a completion condition": Case(
        ["retry_loop"], {"succeed_at": 2}, {"Activity_0review": {"ok": False}}, []),
    "standard loop ended by loopMaximum": Case(["retry_loop"], {"succeed_at": 9}, {"Activity_0review": {"ok": True}}, []),
    "call activities nested across three files": Case(
        ["customer_onboarding", "kyc_check", "sanctions_screen"], {"name": "Zoë", "age": 30}, {}, []),
    "an error end event two calls deep, caught on the outer call activity": Case(
        ["customer_onboarding", "kyc_check", "sanctions_screen"], {"name": "Mallory", "age": 30}, {}, []),
    "receive task, data object references with a state, data input and output associations, a group": Case(
        ["invoice_data"], {}, {}, [("message", "invoice_msg", {"no": "R-17", "net": 100.0})]),
    "non-interrupting escalation thrown mid-way, a message thrown to the other branch": Case(
        ["repair_job"], {"hours": 5}, {}, []),
    "German ids with umlauts, conditional event, signal to a non-interrupting boundary event": Case(
        ["wartung_ablauf"], {}, {"Aufgabe_Prüfen": {"befund": "Lager defekt"}}, []),
    "sequential multi-instance call activity of another file with a completion condition": Case(
        ["bid_round", "ask_offer"], {"budget": 750, "markup": 1.0}, {}, []),
    "event-based gateway: a receive task wins over a signal and a timer": Case(
        ["approval_race"], {}, {}, [("message", "approval", {"by": "Ana"})]),
    "event-based gateway: the signal wins": Case(["approval_race"], {}, {}, [("signal", "veto", {})]),
    "event-based gateway: a timeDate already past wins at once": Case(["approval_overdue"], {}, {}, []),
    "message start event beside a signal start, a script task with an ioSpecification": Case(
        ["recall_run"], {"lot": "L-77"}, {}, [("message", "complaint", {"reporter": "shop 4"})]),
    "the signal start event": Case(["recall_run"], {"lot": "L-12"}, {}, [("signal", "recall", {})]),
    "a signal from a called process, a timer boundary event interrupting the call activity": Case(
        ["field_service", "technician_visit"], {}, {}, []),
    "a data object read inside a looping sub-process whose message interrupts a person in the other branch": Case(
        ["warranty_claim"], {"serial": "SN-1"}, {"Activity_0inspect": {"ok": True}}, []),
    "terminate end event in one instance of a parallel multi-instance sub-process": Case(
        ["parcel_batch"], {"parcels": [{"id": 1, "kg": 3}, {"id": 2, "kg": 45}, {"id": 3, "kg": 7}]}, {}, []),
}

# what layerflow keeps that plain SpiffWorkflow loses: case -> {key: (plain value, layerflow value)}
KEPT: dict[str, dict[str, tuple[Any, Any]]] = {
    # what the transaction wrote before its cancel end event (SpiffWorkflow drops the scope's data)
    "cancel end event in a transaction, caught by its cancel boundary event": {"reserved": (None, 5000)},
    # what the branch that reached the cancel end event wrote (as for an error end event in a branch)
    "a cancel end event in one branch of a transaction cancels the person waiting in the other": {
        "reserved": (None, 5000)},
    "an escalation end event in one branch of a sub-process, caught by an interrupting boundary event": {
        "reserved": (None, 5000)},
    # what the called processes wrote before the error end event interrupted them
    "an error end event two calls deep, caught on the outer call activity": {
        "blocked": (None, ["Mallory", "Eve"]), "hits": (None, ["Mallory"])},
    # SpiffWorkflow replaces the data of a task with an ioSpecification by its data outputs (what the
    # process knew before is gone, its start data included); layerflow drops only what the task wrote
    # beyond its outputs. And it keeps the payload of a message that names no messageVariable.
    "message start event beside a signal start, a script task with an ioSpecification": {
        "lot": (None, "L-77"), "reporter": (None, "shop 4")},
    "the signal start event": {"lot": (None, "L-12")},
}
# a data object is a context key under layerflow; plain SpiffWorkflow keeps it in workflow.data_objects
DATA_OBJECTS = {"receive task, data object references with a state, data input and output associations, a group",
                "a data object read inside a looping sub-process whose message interrupts a person in the other branch"}


def _paths(files: list[str]) -> list[Path]:
    return [UNSEEN / f"{name}.bpmn" for name in files]


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
        definition = _plain_waiting_for(wf, pending[0][1]) if pending else None
        if definition is not None:
            wf.send_event(BpmnEvent(definition, pending.pop(0)[2]))
        elif ready:
            ready[0].data.update(answers[ready[0].task_spec.bpmn_id])
            ready[0].run()
        else:
            raise AssertionError(f"plain SpiffWorkflow is stuck at {path_of(wf)}")
        wf.do_engine_steps()
    assert not pending, f"nothing waited for {pending}"
    return wf, {k: v for k, v in wf.last_task.data.items() if not isinstance(v, (ModuleType, type, FunctionType))}


def _run_ours(case: str) -> Any:
    files, data, answers, events = CASES[case]
    engine = Engine()
    instance = engine.run(engine.start(load_process(_paths(files)), data))
    pending = list(events)
    while instance.status == "waiting":
        waits = instance.waiting_for
        if pending and any(w["kind"] == "event" and w["event"] == pending[0][1] for w in waits):
            kind, name, payload = pending.pop(0)
            instance = engine.send_event(instance, name, payload, kind=kind)
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
    assert instance.status == "completed", instance.error or instance.waiting_for
    ours = variables(instance.main)
    wf, plain = _run_plain(case)
    assert path_of(instance.workflow) == path_of(wf)
    for key, (plain_value, our_value) in KEPT.get(case, {}).items():
        assert plain.pop(key, None) == plain_value, key
        assert ours.pop(key) == our_value, key
    if case in DATA_OBJECTS:
        objects = {k: ours.pop(k) for k in list(ours) if k.startswith("DataObject_")}
        assert objects == wf.data_objects and objects
    assert ours == plain


@pytest.mark.parametrize("case", list(CASES))
def test_run_json_gives_the_documented_document_and_the_python_api_result(case: str, tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    files, data, answers, events = CASES[case]
    monkeypatch.chdir(tmp_path)
    store = f"sqlite:///{tmp_path / 'cli.db'}"
    (tmp_path / "answers.json").write_text(json.dumps({"user_tasks": answers}, ensure_ascii=False))
    runner = CliRunner()
    result = runner.invoke(main, ["run", *map(str, _paths(files)), "--json", "--store", store, "--data",
                                  json.dumps(data), *([] if events else ["--answers", "answers.json"])])
    doc = json.loads(result.stdout)  # exactly one document
    _check_document(doc, result.exit_code, files[0])
    pending = list(events)
    while doc["status"] == "waiting":
        if pending and any(w["kind"] == "event" and w["event"] == pending[0][1] for w in doc["waiting_for"]):
            kind, name, payload = pending.pop(0)
            command = ["send", doc["instance_id"], name, "--json-payload", json.dumps(payload),
                       *(["--signal"] if kind == "signal" else [])]
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


MAIN_FILES = sorted({tuple(case.files) for case in CASES.values()})


@pytest.mark.parametrize("files", MAIN_FILES, ids=[f[0] for f in MAIN_FILES])
def test_validate_accepts_every_process_without_a_warning(files: tuple[str, ...]) -> None:
    result = CliRunner().invoke(main, ["validate", *map(str, _paths(list(files)))])
    assert result.exit_code == 0, result.output
    # The only warning allowed: a payload on the bpmn:message, which SpiffWorkflow 3.2 reads but deprecates.
    warned = [line for line in result.output.splitlines() if ": warning: " in line]
    assert all("a place SpiffWorkflow 3.2 still reads but deprecates" in line for line in warned), result.output
    assert f"process {files[0]!r} is valid" in result.output


# ----- what validate refuses, naming the element and what to write ----------------------------------


def _validate(tmp_path: Path, name: str, replace: tuple[tuple[str, str], ...] = (), *others: str) -> tuple[int, str, Path]:
    """``layerflow validate`` on a copy of ``name`` with the given replacements (each must match once)."""
    text = (UNSEEN / f"{name}.bpmn").read_text(encoding="utf-8")
    for old, new in replace:
        assert text.count(old) == 1, old
        text = text.replace(old, new)
    path = tmp_path / f"{name}.bpmn"
    path.write_text(text, encoding="utf-8")
    result = CliRunner().invoke(main, ["validate", str(path), *(str(UNSEEN / f"{o}.bpmn") for o in others)])
    return result.exit_code, result.output, path


def _problem(output: str, element: str, path: Path) -> str:
    """The report line about ``element``; it starts with the file and a line number."""
    row = next((r for r in output.splitlines() if f"element {element!r}" in r and "warning" not in r), None)
    assert row is not None, output
    assert row.startswith(f"{path}:") and row[len(str(path)) + 1:].split(":", 1)[0].isdigit(), row
    return row


def test_compensation_is_refused_with_what_to_draw_instead(tmp_path: Path) -> None:
    """SpiffWorkflow 3.2 has no compensation: its parser fails on the boundary event with an XML dump
    ("Unsupported Catch Event"), and reads the throw event as a plain one."""
    code, output, path = _validate(tmp_path, "trip_booking")
    assert code == 2, output
    for element in ("Event_0hotelcomp", "Event_1undo"):
        row = _problem(output, element, path)
        assert "compensation" in row and "runs no compensation" in row and "'Activity_0cancelhotel'" in row, row
        assert "isForCompensation" in row and "error boundary event" in row, row
    assert "Unsupported Catch Event" not in output and "<bpmn:" not in output
    run = CliRunner().invoke(main, ["run", str(path), "--json", "--store", "memory://"])
    assert run.exit_code == 2 and "Event_0hotelcomp" in json.loads(run.stdout)["error"]["message"]


def test_a_compensation_throw_alone_is_refused_not_run_past(tmp_path: Path) -> None:
    """Without the boundary event SpiffWorkflow loads the process and completes it through the
    throw as if the hotel had been cancelled: the undo never runs."""
    boundary = (UNSEEN / "trip_booking.bpmn").read_text(encoding="utf-8")
    start = boundary.index('    <bpmn:boundaryEvent id="Event_0hotelcomp"')
    end = boundary.index("</bpmn:boundaryEvent>", start) + len("</bpmn:boundaryEvent>\n")
    association = boundary[boundary.index('    <bpmn:association id="Association_0comp"'):]
    association = association[:association.index("\n") + 1]
    code, output, path = _validate(tmp_path, "trip_booking", ((boundary[start:end], ""), (association, "")))
    parser = SpiffBpmnParser()
    parser.add_bpmn_file(str(path))
    plain = BpmnWorkflow(parser.get_spec("trip_booking"))
    plain.task_tree.data["seats"] = 0
    plain.do_engine_steps()
    assert plain.is_completed() and plain.last_task.data["hotel"] == "booked"  # never compensated
    assert code == 2, output
    row = _problem(output, "Event_1undo", path)
    assert "no compensation handler runs" in row and "'Activity_0cancelhotel'" in row, row


def test_a_payload_the_message_element_shadows_is_an_error(tmp_path: Path) -> None:
    """A messageVariable left on the bpmn:message (where older SpiffArena wrote it) makes SpiffWorkflow
    read the message's settings only: the throw's messagePayload is dropped, the catch gets an empty
    payload, and the invoice step fails on a missing key."""
    catch_variable = ("""        <bpmn:extensionElements>
          <spiffworkflow:messageVariable>quote</spiffworkflow:messageVariable>
        </bpmn:extensionElements>
      </bpmn:messageEventDefinition>""", "      </bpmn:messageEventDefinition>")
    on_message = ('<bpmn:message id="Message_quote" name="quote"/>', """<bpmn:message id="Message_quote" name="quote">
    <bpmn:extensionElements>
      <spiffworkflow:messageVariable>quote</spiffworkflow:messageVariable>
    </bpmn:extensionElements>
  </bpmn:message>""")
    code, output, path = _validate(tmp_path, "repair_job", (catch_variable, on_message))
    parser = SpiffBpmnParser()
    parser.add_bpmn_file(str(path))
    plain = BpmnWorkflow(parser.get_spec("repair_job"), parser.get_subprocess_specs("repair_job"))
    plain.task_tree.data["hours"] = 5
    with pytest.raises(Exception, match="cost"):
        plain.do_engine_steps()
    assert code == 2, output
    row = _problem(output, "Event_0tellcustomer", path)
    for words in ("spiffworkflow:messagePayload '{\"cost\": cost}' is never read", "bpmn:message 'Message_quote'",
                  "spiffworkflow:messageVariable 'quote'", "empty payload", "move the bpmn:message's"):
        assert words in row, (words, row)


@pytest.mark.parametrize(("condition", "write"), [
    ("=total &gt; 1000", "write 'total > 1000'"),
    ("= count(items) &gt; 3", "write 'len(items) > 3'"),
    ("${execution.getVariable(\"total\") &gt; 1000 &amp;&amp; !rush}", "write 'total > 1000 and not rush'"),
    ("= contains(name, \"x\")", "FEEL's contains(): write 'PART in TEXT'"),
    ("${nrOfCompletedInstances &gt;= 2}", "nrOfCompletedInstances is a multi-instance counter"),
    # a Camunda 7 JavaScript or Groovy condition: valid Python that calls Camunda's API
    ("execution.getVariable(\"total\") &gt; 1000", "calls execution.getVariable, Camunda's process API"),
    ("execution.getVariable(\"total\") &gt; 1000", "write 'total > 1000'"),
    ("execution.getVariable(\"total\") &gt; 1000 &amp;&amp; !rush", "write 'total > 1000 and not rush'"),
])
def test_another_engines_condition_names_the_flow_and_the_python_to_write(tmp_path: Path, condition: str,
                                                                         write: str) -> None:
    code, output, path = _validate(tmp_path, "zeebe_order", (("=total &gt; 1000", condition),))
    assert code == 2, output
    engine = Engine()
    with pytest.raises(Exception, match="Flow_3"):  # nothing starts
        engine.start(load_process(path), {"total": 2000, "rush": False, "items": [], "name": "x"})
    row = _problem(output, "Flow_3", path)
    assert "conditionExpression" in row and write in row, row
    # the service task's Zeebe job type is reported, as a warning, with what to do instead; its input
    # mapping runs (``test_realworld_7``)
    warning = next(r for r in output.splitlines() if "'Activity_0credit'" in r and "zeebe:taskDefinition" in r)
    assert "warning" in warning and "zeebe:ioMapping" not in warning and "handler" in warning


def test_a_camunda_multi_instance_collection_is_one_error_that_writes_the_bpmn(tmp_path: Path) -> None:
    code, output, path = _validate(tmp_path, "camunda_mi")
    assert code == 2, output
    rows = [r for r in output.splitlines() if "element 'Activity_0each'" in r and "warning" not in r]
    assert len(rows) == 2, output  # the loop, the completion condition; not SpiffWorkflow's own message
    assert "must specify a cardinality" not in output
    loop = next(r for r in rows if "loopDataInputRef" in r.split(":", 3)[-1][:40])
    assert "camunda:collection='${lines}'" in loop
    assert '<bpmn:loopDataInputRef>lines</bpmn:loopDataInputRef>' in loop and '<bpmn:inputDataItem id="line"' in loop
    # written as the messages say, it runs
    fixed = path.read_text(encoding="utf-8").replace(
        '<bpmn:multiInstanceLoopCharacteristics camunda:collection="${lines}" camunda:elementVariable="line">',
        '<bpmn:multiInstanceLoopCharacteristics><bpmn:loopDataInputRef>lines</bpmn:loopDataInputRef>'
        '<bpmn:loopDataOutputRef>seen</bpmn:loopDataOutputRef><bpmn:inputDataItem id="line" name="line"/>'
        '<bpmn:outputDataItem id="out" name="out"/>').replace(
        "${nrOfCompletedInstances &gt;= 2}", "len(seen) &gt;= 2").replace("seen = line", "out = line * 10")
    path.write_text(fixed, encoding="utf-8")
    engine = Engine()
    instance = engine.run(engine.start(load_process(path), {"lines": [1, 2, 3]}))
    assert instance.status == "completed", instance.error
    assert variables(instance.main)["seen"][:2] == [10, 20]


def test_camunda_settings_no_one_runs_are_named_and_the_run_stops_at_the_task(tmp_path: Path) -> None:
    """camunda:expression, camunda:class, an external task: each a warning naming the element and what
    to do; the run stops at the first task that needs one, naming it. The script task's
    camunda:inputOutput runs (``test_realworld_7``): nothing is said of it, and the run passes it."""
    result = CliRunner().invoke(main, ["validate", str(UNSEEN / "camunda_io.bpmn")])
    assert result.exit_code == 0, result.output
    for element, setting in (("Activity_0notify", "camunda:expression"),
                             ("Activity_0bill", "camunda:class"), ("Activity_0ext", "camunda:topic")):
        assert any(f"element {element!r}" in r and setting in r and "warning" in r for r in result.output.splitlines()), \
            (element, result.output)
    assert not any("'Activity_0calc'" in r for r in result.output.splitlines()), result.output
    run = CliRunner().invoke(main, ["run", str(UNSEEN / "camunda_io.bpmn"), "--json", "--store", "memory://",
                                    "--data", '{"amount": 100}'])
    doc = json.loads(run.stdout)
    _check_document(doc, run.exit_code, "camunda_io")
    assert (doc["status"], doc["error"]["task_id"]) == ("error", "Activity_0notify")
    assert (doc["layers"]["L3"]["base"], doc["layers"]["L3"]["fee"]) == (100, 2.0)


def test_a_call_activity_two_levels_down_whose_process_is_missing(tmp_path: Path) -> None:
    result = CliRunner().invoke(main, ["validate", str(UNSEEN / "customer_onboarding.bpmn"),
                                       str(UNSEEN / "kyc_check.bpmn")])
    assert result.exit_code == 2, result.output
    row = _problem(result.output, "Activity_0sanctions", UNSEEN / "kyc_check.bpmn")
    assert "calledElement='sanctions_screen'" in row and "add the BPMN file that defines it" in row
    # the file beside that defines it, and the command that gives it
    beside = UNSEEN / "sanctions_screen.bpmn"
    assert (f"({beside} defines it: `layerflow run {UNSEEN / 'customer_onboarding.bpmn'} {UNSEEN / 'kyc_check.bpmn'} "
            f"{beside}`)") in row, row


def test_the_run_command_the_hint_gives_runs_as_written_from_a_folder_with_a_space(tmp_path: Path) -> None:
    import re
    import shlex

    folder = tmp_path / "process models"
    folder.mkdir()
    for name in ("customer_onboarding", "kyc_check", "sanctions_screen"):
        (folder / f"{name}.bpmn").write_text((UNSEEN / f"{name}.bpmn").read_text(encoding="utf-8"), encoding="utf-8")
    result = CliRunner().invoke(main, ["validate", str(folder / "customer_onboarding.bpmn"),
                                       str(folder / "kyc_check.bpmn")])
    assert result.exit_code == 2, result.output
    command = re.search(r"`(layerflow run [^`]*)`", result.output)
    assert command is not None, result.output
    words = shlex.split(command.group(1))
    assert words[2:] == [str(folder / f"{n}.bpmn") for n in ("customer_onboarding", "kyc_check", "sanctions_screen")]
    again = CliRunner().invoke(main, ["validate", *words[2:]])
    assert again.exit_code == 0, again.output


def test_a_called_process_nowhere_beside_gets_no_hint(tmp_path: Path) -> None:
    for name in ("customer_onboarding", "kyc_check"):
        (tmp_path / f"{name}.bpmn").write_text((UNSEEN / f"{name}.bpmn").read_text(encoding="utf-8"), encoding="utf-8")
    result = CliRunner().invoke(main, ["validate", str(tmp_path / "customer_onboarding.bpmn"),
                                       str(tmp_path / "kyc_check.bpmn")])
    assert result.exit_code == 2, result.output
    row = _problem(result.output, "Activity_0sanctions", tmp_path / "kyc_check.bpmn")
    assert "add the BPMN file that defines it to the files validated and run, or fix the id" in row, row


def test_a_camunda_8_export_is_refused_with_the_bpmn_to_write_and_runs_once_written(tmp_path: Path) -> None:
    """zeebe:calledElement, zeebe:loopCharacteristics, a FEEL timer and a zeebe:script: each message
    says what to write; written so, the process runs (and waits for its timer)."""
    code, output, path = _validate(tmp_path, "zeebe_more", (), "ask_offer")
    assert code == 2, output
    rows = output.splitlines()
    loop = next(r for r in rows if "element 'Activity_0call'" in r and "loopDataInputRef" in r)
    for words in ("zeebe:loopCharacteristics inputCollection='=bidders'",
                  "<bpmn:loopDataInputRef>bidders</bpmn:loopDataInputRef>", '<bpmn:inputDataItem id="bidder"',
                  "<bpmn:loopDataOutputRef>offers</bpmn:loopDataOutputRef>", '<bpmn:outputDataItem id="offer"'):
        assert words in loop, (words, loop)
    assert any("element 'Activity_0call'" in r and 'calledElement="ask_offer"' in r for r in rows), output
    assert any("element 'Event_0wait'" in r and "write '\"PT1M\"'" in r for r in rows), output
    assert any("element 'Activity_0sum'" in r and "write 'c = a + b' as its bpmn:script" in r for r in rows), output
    assert "must specify a cardinality" not in output
    text = path.read_text(encoding="utf-8")
    for old, new in (('<bpmn:callActivity id="Activity_0call" name="Call">',
                      '<bpmn:callActivity id="Activity_0call" name="Call" calledElement="ask_offer">'),
                     ("<bpmn:multiInstanceLoopCharacteristics>",
                      "<bpmn:multiInstanceLoopCharacteristics><bpmn:loopDataInputRef>bidders</bpmn:loopDataInputRef>"
                      "<bpmn:loopDataOutputRef>offers</bpmn:loopDataOutputRef>"
                      '<bpmn:inputDataItem id="bidder" name="bidder"/><bpmn:outputDataItem id="offer" name="offer"/>'),
                     ('=duration("PT1M")', '"PT1M"'),
                     ("<bpmn:outgoing>Flow_2</bpmn:outgoing>\n    </bpmn:scriptTask>",
                      "<bpmn:outgoing>Flow_2</bpmn:outgoing>\n      <bpmn:script>c = a + b</bpmn:script>\n"
                      "    </bpmn:scriptTask>")):
        assert text.count(old) == 1, old
        text = text.replace(old, new)
    path.write_text(text, encoding="utf-8")
    result = CliRunner().invoke(main, ["validate", str(path), str(UNSEEN / "ask_offer.bpmn")])
    assert result.exit_code == 0, result.output
    engine = Engine()
    instance = engine.run(engine.start(load_process([path, UNSEEN / "ask_offer.bpmn"]), {
        "a": 1, "b": 2, "markup": 2, "bidders": [{"name": "Acme", "base": 10}, {"name": "Bolt", "base": 7}]}))
    assert [(w["kind"], w["task_id"]) for w in instance.waiting_for] == [("timer", "Event_0wait")], instance.error
    got = variables(instance.main)
    assert got["c"] == 3 and got["offers"] == [{"name": "Acme", "price": 20}, {"name": "Bolt", "price": 14}]


# ----- branch ids: the BPMN id of the branch's first element, boundary events or not --------------------


def test_a_branch_that_starts_with_an_activity_with_a_boundary_event_is_named_by_that_activity(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """SpiffWorkflow enters an activity with boundary events through a split of its own
    (``Aufgabe_Prüfen.BoundaryEventSplit``); the conflict named that as the branch, a branch's
    contextInject keyed by the activity's id was never given to it, and branchPriority could not
    name it. DESIGN: branch ids are the BPMN ids of the first element of each outgoing branch."""
    monkeypatch.chdir(tmp_path)
    text = (UNSEEN / "wartung_ablauf.bpmn").read_text(encoding="utf-8").replace(
        "<bpmn:script>temperatur = 93</bpmn:script>", "<bpmn:script>temperatur = 93\nbefund = \"heiß\"</bpmn:script>")
    (tmp_path / "wartung_ablauf.bpmn").write_text(text, encoding="utf-8")
    (tmp_path / "wartung_ablauf.layerflow.yaml").write_text(
        "Gabelung_1:\n  branches:\n    - id: Aufgabe_Prüfen\n      contextInject: {vor_ort: true}\n"
        "    - id: Aufgabe_Messen\n      contextInject: {vor_ort: false}\n", encoding="utf-8")
    (tmp_path / "answers.json").write_text(json.dumps({"user_tasks": {
        "Aufgabe_Prüfen": {"befund": "gut"}}}), encoding="utf-8")
    runner = CliRunner()
    store = f"sqlite:///{tmp_path / 'w.db'}"
    result = runner.invoke(main, ["run", "wartung_ablauf.bpmn", "--answers", "answers.json", "--json", "--store", store])
    doc = json.loads(result.stdout)
    _check_document(doc, result.exit_code, "wartung_ablauf")
    [conflict] = doc["conflicts"]
    assert (conflict["gateway_id"], conflict["key"]) == ("Zusammenführung_1", "befund")
    assert conflict["values"] == {"Aufgabe_Prüfen": "gut", "Aufgabe_Messen": "heiß"}
    assert without_due(doc["waiting_for"]) == [{"kind": "confirmation", "id": "Zusammenführung_1/befund",
                                   "task_id": "Zusammenführung_1", "key": "befund", "context": "main"}]
    # --yes has nothing to take (no policy, no model, no default): stderr says why it still waits
    result = runner.invoke(main, ["resume", doc["instance_id"], "--yes", "--json", "--store", store])
    assert result.exit_code == 3 and json.loads(result.stdout)["waiting_for"] == doc["waiting_for"]
    assert ("--yes: confirmation 'Zusammenführung_1/befund' has no suggestion to take" in result.stderr
            and "--answer 'Zusammenführung_1/befund=VALUE' (VALUE: \"gut\" | \"heiß\"" in result.stderr), result.stderr
    result = runner.invoke(main, ["resume", doc["instance_id"], "--answer", "Zusammenführung_1/befund=gut", "--json",
                                  "--store", store])
    doc = json.loads(result.stdout)
    _check_document(doc, result.exit_code, "wartung_ablauf")
    assert doc["status"] == "completed" and doc["layers"]["L3"]["bericht"] == "gut, 93 °C"
    # each branch got its own contextInject, keyed by its first element's BPMN id
    tape = json.loads(runner.invoke(main, ["tape", doc["instance_id"], "--json", "--store", store]).stdout)
    forks = {e["branch"]: {c[1]: c[2] for c in e["changes"] if len(c) == 3} for e in tape if e["kind"] == "fork"}
    assert {branch: values.get("vor_ort") for branch, values in forks.items()} == {
        "Aufgabe_Prüfen": True, "Aufgabe_Messen": False}, forks


def _with_head_deadline(tmp_path: Path, *replace: tuple[str, str]) -> Path:
    """purchase_order with a timer boundary event on the head's approval (the XOR's target)."""
    text = (UNSEEN / "purchase_order.bpmn").read_text(encoding="utf-8")
    boundary = """    <bpmn:boundaryEvent id="Event_0headlate" name="2 days" attachedToRef="Activity_0head">
      <bpmn:outgoing>Flow_late</bpmn:outgoing>
      <bpmn:timerEventDefinition id="TimerEventDefinition_0hl">
        <bpmn:timeDuration xsi:type="bpmn:tFormalExpression">"P2D"</bpmn:timeDuration>
      </bpmn:timerEventDefinition>
    </bpmn:boundaryEvent>
    <bpmn:sequenceFlow id="Flow_late" sourceRef="Event_0headlate" targetRef="Gateway_1merge"/>
  </bpmn:process>"""
    for old, new in (("  </bpmn:process>\n  <bpmn:message", boundary + "\n  <bpmn:message"),
                     ("<bpmn:incoming>Flow_p5</bpmn:incoming>",
                      "<bpmn:incoming>Flow_p5</bpmn:incoming>\n      <bpmn:incoming>Flow_late</bpmn:incoming>"),
                     *replace):
        assert text.count(old) == 1, old
        text = text.replace(old, new)
    path = tmp_path / "purchase_order.bpmn"
    path.write_text(text, encoding="utf-8")
    return path


def test_a_failing_flow_condition_names_the_flow_s_target_even_with_a_boundary_event(tmp_path: Path) -> None:
    path = _with_head_deadline(tmp_path)
    engine = Engine()
    instance = engine.run(engine.start(load_process(path)), answers={"user_tasks": {"Activity_0fill": {"items": 5}}})
    assert instance.status == "error" and instance.error["task_id"] == "Gateway_0amount"
    assert "of the flow to 'Activity_0head' at 'Gateway_0amount' failed: TypeError" in instance.error["message"]


def test_no_condition_holding_names_the_flows_by_their_targets_even_with_a_boundary_event(tmp_path: Path) -> None:
    path = _with_head_deadline(tmp_path, (' default="Flow_p4"', ""), (
        '<bpmn:sequenceFlow id="Flow_p4" name="no" sourceRef="Gateway_0amount" targetRef="Gateway_1merge"/>',
        '<bpmn:sequenceFlow id="Flow_p4" name="no" sourceRef="Gateway_0amount" targetRef="Gateway_1merge">'
        '<bpmn:conditionExpression xsi:type="bpmn:tFormalExpression">urgent == "no"</bpmn:conditionExpression>'
        '</bpmn:sequenceFlow>'), ('sum(i["price"] * i["qty"] for i in items) &gt; 5000', 'urgent == "yes"'))
    engine = Engine()
    instance = engine.run(engine.start(load_process(path), {"urgent": "maybe"}),
                          answers={"user_tasks": {"Activity_0fill": {"items": []}}})
    assert instance.status == "error" and instance.error["task_id"] == "Gateway_0amount", instance.error
    message = instance.error["message"]
    assert "to 'Activity_0head': urgent == \"yes\"" in message and "BoundaryEventSplit" not in message, message


def test_a_branch_sentence_reaches_the_model_for_a_target_with_a_boundary_event(tmp_path: Path) -> None:
    """The config's sentence for branch 'fast' (the gateway's target, an activity with a timer
    boundary event) was matched against '<id>.BoundaryEventSplit' and never asked: offline and
    with a model alike the default branch was taken."""
    from test_gateway_engine import FakeChooser, _unconditioned, notes

    bpmn = _unconditioned(tmp_path)
    text = bpmn.read_text(encoding="utf-8").replace('    <bpmn:endEvent id="end"/>', """    <bpmn:boundaryEvent id="fast_late" attachedToRef="fast">
      <bpmn:timerEventDefinition><bpmn:timeDuration>"P1D"</bpmn:timeDuration></bpmn:timerEventDefinition>
    </bpmn:boundaryEvent>
    <bpmn:sequenceFlow id="f_late" sourceRef="fast_late" targetRef="end"/>
    <bpmn:endEvent id="end"/>""")
    bpmn.write_text(text, encoding="utf-8")
    engine = Engine(chooser=FakeChooser("fast"))
    instance = engine.run(engine.start(load_process(bpmn), {"amount": 9000}))
    assert instance.status == "completed", instance.error
    assert instance.main.resolve("path") == "fast"
    [decision] = notes(instance, "condition_decision")
    assert decision["decided_by"] == "model" and decision["conditions"]["fast"].startswith("If the risk")


@pytest.mark.parametrize(("priority", "winner"), [(["Activity_0legal", "Activity_0medical"], "low"),
                                                  (["Activity_0medical", "Activity_0legal"], "high")])
def test_branch_priority_names_a_branch_whose_sub_process_has_a_boundary_event(tmp_path: Path, priority: list[str],
                                                                              winner: str) -> None:
    """The medical branch starts with a sub-process with an error boundary event: it was the branch
    'Activity_0medical.BoundaryEventSplit', which branchPriority could not name, so the legal
    branch won even where the medical one ranked first."""
    text = (UNSEEN / "triage_incl.bpmn").read_text(encoding="utf-8")
    text = text.replace('"branchPriority": ["Activity_0legal", "Activity_0medical"]', f'"branchPriority": {json.dumps(priority)}')
    path = tmp_path / "triage_incl.bpmn"
    path.write_text(text, encoding="utf-8")
    assert CliRunner().invoke(main, ["validate", str(path)]).exit_code == 0
    engine = Engine()
    instance = engine.run(engine.start(load_process(path), {"injured": True, "lawsuit": True}),
                          answers={"user_tasks": {"Activity_0legal": {"priority": "low", "notes": ["legal"]}}})
    assert instance.status == "completed", instance.error
    [conflict] = instance.conflicts
    assert conflict["values"] == {"Activity_0medical": "high", "Activity_0legal": "low"}
    assert conflict["resolution"]["value"] == winner and conflict["resolution"]["resolver"] == "strategy"
    got = variables(instance.main)
    assert got["priority"] == winner and sorted(got["notes"]) == ["legal", "medical"]


@pytest.mark.parametrize("script_format", ["javascript", "groovy", "python"])
def test_a_camunda_script_that_parses_as_python_but_calls_camunda_s_api_is_an_error(tmp_path: Path,
                                                                                     script_format: str) -> None:
    """``execution.setVariable("fee", execution.getVariable("amount") * 0.02)`` is JavaScript, Groovy
    and (Jython) Python at once: it passed validate (a warning for the script format) and stopped
    the run with NameError: name 'execution' is not defined."""
    code, output, path = _validate(tmp_path, "camunda_io", (
        ('scriptFormat="python">', f'scriptFormat="{script_format}">'),
        ("<bpmn:script>result = base * 0.02</bpmn:script>",
         '<bpmn:script>execution.setVariable("fee", execution.getVariable("amount") * 0.02);\n'
         'execution.setVariable(\'checked\', true)</bpmn:script>')))
    assert code == 2, output
    row = _problem(output, "Activity_0calc", path)
    assert "calls execution.getVariable, execution.setVariable, Camunda's process API" in row, row
    assert "write it as 'fee = amount * 0.02\\nchecked = True'" in row, row
    assert "warning" not in row
