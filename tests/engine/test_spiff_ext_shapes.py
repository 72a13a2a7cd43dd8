"""SpiffWorkflow's own extensions (spiffworkflow: preScript/postScript, variableName, ...) in
shapes that once ran differently under layerflow than under plain SpiffWorkflow.

Each test runs a small BPMN written here under both and compares the status, the path taken
(the completed tasks' BPMN ids, in order) and the variables, as test_conformance.py does."""

from __future__ import annotations

from pathlib import Path
from typing import Any
from xml.sax.saxutils import escape

import pytest
from SpiffWorkflow.bpmn.workflow import BpmnWorkflow
from SpiffWorkflow.spiff.parser.process import SpiffBpmnParser
from SpiffWorkflow.util.task import TaskState

from engine import Engine, load_process

from engine_helpers import path_of, variables
from test_conformance import flow, run_ours, script, write


def _scripts(pre: str | None, post: str | None) -> str:
    parts = [f"<spiffworkflow:{tag}>{escape(text)}</spiffworkflow:{tag}>"
             for tag, text in (("preScript", pre), ("postScript", post)) if text is not None]
    return f"<bpmn:extensionElements>{''.join(parts)}</bpmn:extensionElements>"


def _plain(paths: list[Path], pid: str, data: dict[str, Any] | None = None,
           forms: dict[str, dict[str, Any]] | None = None) -> BpmnWorkflow:
    """Plain SpiffWorkflow; a ready user task gets its form the way SpiffWorkflow's own forms do."""
    parser = SpiffBpmnParser()
    parser.add_bpmn_files([str(p) for p in paths])
    wf = BpmnWorkflow(parser.get_spec(pid), parser.get_subprocess_specs(pid))
    wf.task_tree.data.update(data or {})
    wf.do_engine_steps()
    while not wf.is_completed():
        [task] = wf.get_tasks(state=TaskState.READY, manual=True)
        task.task_spec.add_data_from_form(task, (forms or {})[task.task_spec.bpmn_id])
        task.run()
        wf.do_engine_steps()
    return wf


# ----- the pre- and postScript of a sub-process or a call activity ------------------------------

def _packing(tmp_path: Path, kind: str) -> list[Path]:
    """The preScript prepares what the sub-process (or the called process) reads; the postScript
    reads what it produced."""
    pre, post = "weight_kg = grams / 1000", "label = 'PARCEL ' + tag"
    inner = [script("weigh", "tag = str(weight_kg) + ' kg'")]
    if kind == "call activity":
        called = write(tmp_path, "weigh_parcel", [
            '<bpmn:startEvent id="w_start"/>', *inner, '<bpmn:endEvent id="w_end"/>',
            flow("w_start", "weigh"), flow("weigh", "w_end")])
        activity = (f'<bpmn:callActivity id="pack" calledElement="weigh_parcel">{_scripts(pre, post)}'
                    "</bpmn:callActivity>")
        extra = [called]
    else:
        activity = (f'<bpmn:subProcess id="pack">{_scripts(pre, post)}<bpmn:startEvent id="w_start"/>{inner[0]}'
                    f'<bpmn:endEvent id="w_end"/>{flow("w_start", "weigh")}{flow("weigh", "w_end")}</bpmn:subProcess>')
        extra = []
    caller = write(tmp_path, "packing", [
        '<bpmn:startEvent id="start"/>', script("order", "grams = 2500"), activity, '<bpmn:endEvent id="end"/>',
        flow("start", "order"), flow("order", "pack"), flow("pack", "end")])
    return [caller, *extra]


@pytest.mark.parametrize("kind", ["call activity", "sub-process"])
def test_the_pre_and_post_script_of_a_sub_process_run_around_it(tmp_path: Path, kind: str) -> None:
    """SpiffWorkflow runs a sub-process's (call activity's) preScript before it starts and its
    postScript after it ends; under layerflow both were skipped, silently: the sub-process failed
    on a name the preScript sets, or the postScript's keys were missing."""
    paths = _packing(tmp_path, kind)
    plain = _plain(paths, "packing")
    engine = Engine()
    instance = engine.run(engine.start(load_process(paths)))

    assert instance.status == "completed", instance.error
    assert path_of(instance.workflow) == path_of(plain)
    assert variables(instance.main) == plain.last_task.data == {
        "grams": 2500, "weight_kg": 2.5, "tag": "2.5 kg", "label": "PARCEL 2.5 kg"}


def test_a_call_activity_pre_script_sets_the_called_process_data_input(tmp_path: Path) -> None:
    """The called process's ioSpecification needs ``net``, which only the call activity's
    preScript sets: the call was refused for a missing data input before the preScript ran."""
    called = write(tmp_path, "add_vat", [
        '<bpmn:ioSpecification><bpmn:dataInput id="net" name="net"/><bpmn:dataOutput id="gross" name="gross"/>'
        '<bpmn:inputSet id="vat_in"><bpmn:dataInputRefs>net</bpmn:dataInputRefs></bpmn:inputSet>'
        '<bpmn:outputSet id="vat_out"><bpmn:dataOutputRefs>gross</bpmn:dataOutputRefs></bpmn:outputSet>'
        "</bpmn:ioSpecification>",
        '<bpmn:startEvent id="v_start"/>', script("vat", "gross = net * 2"), '<bpmn:endEvent id="v_end"/>',
        flow("v_start", "vat"), flow("vat", "v_end")])
    caller = write(tmp_path, "bill", [
        '<bpmn:startEvent id="start"/>',
        f'<bpmn:callActivity id="price" calledElement="add_vat">{_scripts("net = amount", "total = gross")}'
        "</bpmn:callActivity>", '<bpmn:endEvent id="end"/>', flow("start", "price"), flow("price", "end")])
    plain = _plain([caller, called], "bill", {"amount": 21})
    engine = Engine()
    instance = engine.run(engine.start(load_process([caller, called]), {"amount": 21}))

    assert instance.status == "completed", instance.error
    assert path_of(instance.workflow) == path_of(plain)
    assert variables(instance.main) == plain.last_task.data == {"amount": 21, "net": 21, "gross": 42, "total": 42}


def test_a_failing_pre_script_of_a_sub_process_names_it(tmp_path: Path) -> None:
    path = write(tmp_path, "broken_pre", [
        '<bpmn:startEvent id="start"/>',
        f'<bpmn:subProcess id="inner">{_scripts("x = missing_name", None)}<bpmn:startEvent id="i_start"/>'
        f'<bpmn:endEvent id="i_end"/>{flow("i_start", "i_end")}</bpmn:subProcess>',
        '<bpmn:endEvent id="end"/>', flow("start", "inner"), flow("inner", "end")])
    instance = run_ours(path)
    assert instance.status == "error"
    assert instance.error["task_id"] == "inner"
    assert "preScript" in instance.error["message"] and "missing_name" in instance.error["message"]


# ----- a user task's spiffworkflow:variableName ---------------------------------------------------

def test_the_form_of_a_user_task_with_a_variable_name_lands_under_that_name(tmp_path: Path) -> None:
    """SpiffWorkflow keeps a user task's form under its ``spiffworkflow:variableName`` (one key);
    under layerflow the fields landed as keys of their own, and a script reading the variable failed."""
    path = write(tmp_path, "address_form", [
        '<bpmn:startEvent id="start"/>',
        '<bpmn:userTask id="ask_address"><bpmn:extensionElements><spiffworkflow:variableName>address'
        "</spiffworkflow:variableName></bpmn:extensionElements></bpmn:userTask>",
        script("label", "line = address['street'] + ', ' + address['city']"), '<bpmn:endEvent id="end"/>',
        flow("start", "ask_address"), flow("ask_address", "label"), flow("label", "end")])
    form = {"street": "Main St 1", "city": "Springfield"}
    plain = _plain([path], "address_form", forms={"ask_address": form})
    engine = Engine()
    instance = run_ours(path, engine=engine)
    instance = engine.complete_user_task(instance, "ask_address", form)

    assert instance.status == "completed", instance.error
    assert path_of(instance.workflow) == path_of(plain)
    assert variables(instance.main) == plain.last_task.data == {
        "address": form, "line": "Main St 1, Springfield"}


# ----- a multi-instance activity's preScript that fails ------------------------------------------

def test_a_failing_pre_script_of_a_multi_instance_activity_names_it(tmp_path: Path) -> None:
    """The preScript of a multi-instance activity runs once before its instances; a failure there
    once left the instance's error without a task id."""
    path = write(tmp_path, "mi_pre", [
        '<bpmn:startEvent id="start"/>',
        f'<bpmn:userTask id="rate">{_scripts("items = [i for i in missing_items]", None)}'
        "<bpmn:multiInstanceLoopCharacteristics><bpmn:loopDataInputRef>items</bpmn:loopDataInputRef>"
        '<bpmn:inputDataItem id="item" name="item"/></bpmn:multiInstanceLoopCharacteristics></bpmn:userTask>',
        '<bpmn:endEvent id="end"/>', flow("start", "rate"), flow("rate", "end")])
    instance = run_ours(path)
    assert instance.status == "error"
    assert instance.error["task_id"] == "rate"
    assert "missing_items" in instance.error["message"]


# ----- a catch event whose correlation reads a process variable ----------------------------------

def _awaiting_payment(tmp_path: Path) -> Path:
    """The catch event matches a payment to the order by ``spiffworkflow:processVariableCorrelation``
    (the order id, a variable an earlier task set)."""
    path = tmp_path / "await_payment.bpmn"
    path.write_text(f"""<?xml version="1.0" encoding="UTF-8"?>
<bpmn:definitions xmlns:bpmn="http://www.omg.org/spec/BPMN/20100524/MODEL"
                  xmlns:spiffworkflow="http://spiffworkflow.org/bpmn/schema/1.0/core"
                  id="await_defs" targetNamespace="https://layerflow.dev/tests">
  <bpmn:message id="m_paid" name="paid"/>
  <bpmn:correlationProperty id="order_ref" name="order_ref">
    <bpmn:correlationPropertyRetrievalExpression messageRef="m_paid">
      <bpmn:formalExpression>order</bpmn:formalExpression>
    </bpmn:correlationPropertyRetrievalExpression>
  </bpmn:correlationProperty>
  <bpmn:process id="await_payment" isExecutable="true">
    <bpmn:startEvent id="start"/>
    {script("place", "order_id = 'O-' + str(7 * 6)")}
    <bpmn:intermediateCatchEvent id="paid" spiffworkflow:isMatchingCorrelation="true">
      <bpmn:messageEventDefinition messageRef="m_paid"><bpmn:extensionElements>
        <spiffworkflow:messageVariable>payment</spiffworkflow:messageVariable>
        <spiffworkflow:processVariableCorrelation><spiffworkflow:propertyId>order_ref</spiffworkflow:propertyId>
          <spiffworkflow:expression>order_id</spiffworkflow:expression></spiffworkflow:processVariableCorrelation>
      </bpmn:extensionElements></bpmn:messageEventDefinition>
    </bpmn:intermediateCatchEvent>
    {script("book", "booked = payment['amount']")}
    <bpmn:endEvent id="end"/>
    {flow("start", "place")}{flow("place", "paid")}{flow("paid", "book")}{flow("book", "end")}
  </bpmn:process>
</bpmn:definitions>
""", encoding="utf-8")
    return path


def test_a_process_variable_correlation_reads_the_context(tmp_path: Path) -> None:
    """SpiffWorkflow evaluates the correlation's expression over task data as the event starts to
    wait; under layerflow (task data empty) that failed with a NameError naming no task."""
    from SpiffWorkflow.bpmn.util import BpmnEvent

    path = _awaiting_payment(tmp_path)
    payment = {"order": "O-42", "amount": 30}
    parser = SpiffBpmnParser()
    parser.add_bpmn_file(str(path))
    plain = BpmnWorkflow(parser.get_spec("await_payment"))
    plain.do_engine_steps()
    [waiting] = plain.get_tasks(state=TaskState.WAITING, spec_name="paid")
    assert plain.correlations == {"MainCorrelationKey": {"order_ref": "O-42"}}  # from the process variable
    definition = waiting.task_spec.event_definition
    plain.send_event(BpmnEvent(definition, payment, definition.get_correlations(waiting, payment)))
    plain.do_engine_steps()

    engine = Engine()
    instance = run_ours(path, engine=engine)
    assert instance.status == "waiting", instance.error
    assert instance.workflow.correlations == plain.correlations
    instance = engine.send_event(instance, "paid", payment)

    assert plain.is_completed() and instance.status == "completed", instance.error
    assert path_of(instance.workflow) == path_of(plain)
    assert variables(instance.main) == plain.last_task.data == {"order_id": "O-42", "payment": payment, "booked": 30}


# ----- a Camunda message payload (camunda:expression) that only Camunda's parser reads -----------

def test_a_camunda_message_payload_is_named_by_validate_and_the_rest_runs(tmp_path: Path) -> None:
    """SpiffWorkflow's CamundaParser sends a camunda:expression as the message's payload (the catching
    event holds it as ``<event id>_Response``); layerflow parses with SpiffWorkflow's own parser,
    which ignores it. The process runs the same path without the payload, and ``validate`` names
    the file, the event and what to write instead (it said the process was valid)."""
    from SpiffWorkflow.camunda.parser import CamundaParser

    from engine.validate import validate_process

    path = write(tmp_path, "tardy", [
        '<bpmn:startEvent id="start"/>', '<bpmn:parallelGateway id="fork"/>',
        '<bpmn:intermediateThrowEvent id="tell"><bpmn:messageEventDefinition messageRef="m_late" '
        'camunda:expression="&quot;running late&quot;"/></bpmn:intermediateThrowEvent>',
        '<bpmn:intermediateCatchEvent id="hear"><bpmn:messageEventDefinition messageRef="m_late"/>'
        "</bpmn:intermediateCatchEvent>", '<bpmn:parallelGateway id="join"/>', '<bpmn:endEvent id="end"/>',
        flow("start", "fork"), flow("fork", "hear"), flow("fork", "tell"), flow("tell", "join"),
        flow("hear", "join"), flow("join", "end"),
    ], '<bpmn:message id="m_late" name="late"/>\n')
    path.write_text(path.read_text(encoding="utf-8").replace(
        "<bpmn:definitions ", '<bpmn:definitions xmlns:camunda="http://camunda.org/schema/1.0/bpmn" ', 1),
        encoding="utf-8")
    parser = CamundaParser()
    parser.add_bpmn_file(str(path))
    plain = BpmnWorkflow(parser.get_spec("tardy"))
    plain.do_engine_steps()
    instance = run_ours(path)

    assert plain.is_completed() and instance.status == "completed", instance.error
    assert path_of(instance.workflow) == path_of(plain)
    assert plain.last_task.data == {"hear_Response": "running late"}
    assert variables(instance.main) == {}
    [warning] = [p for p in validate_process(path, discover_config=False).problems if p.code == "foreign_extension"]
    assert warning.severity == "warning" and warning.element_id == "tell" and warning.field == "camunda:expression"
    assert warning.file == str(path) and "spiffworkflow:messagePayload" in warning.message


def test_a_multi_instance_cardinality_that_is_no_number_names_the_activity(tmp_path: Path) -> None:
    """A Camunda file's loop counts a collection (``loopCardinality`` names a list, which Camunda's
    parser pairs with camunda:collection); SpiffWorkflow's own parser fails on it with a bare
    TypeError. Under layerflow the error named no task."""
    path = write(tmp_path, "count_each", [
        '<bpmn:startEvent id="start"/>',
        '<bpmn:task id="each"><bpmn:multiInstanceLoopCharacteristics><bpmn:loopCardinality>items'
        "</bpmn:loopCardinality></bpmn:multiInstanceLoopCharacteristics></bpmn:task>",
        '<bpmn:endEvent id="end"/>', flow("start", "each"), flow("each", "end")])
    parser = SpiffBpmnParser()
    parser.add_bpmn_file(str(path))
    plain = BpmnWorkflow(parser.get_spec("count_each"))
    plain.task_tree.data["items"] = ["a", "b"]
    with pytest.raises(TypeError):
        plain.do_engine_steps()
    engine = Engine()
    instance = engine.run(engine.start(load_process(path), {"items": ["a", "b"]}))

    assert instance.status == "error"
    assert instance.error["task_id"] == "each"
    assert "loopCardinality 'items'" in instance.error["message"] and "(list)" in instance.error["message"]


def test_a_message_for_other_correlation_values_is_refused_naming_them(tmp_path: Path) -> None:
    """Plain SpiffWorkflow refuses a message whose correlation values differ from the instance's;
    layerflow refused it too, but said the instance did not wait for the message while listing that
    very message as what it waits for."""
    from SpiffWorkflow.bpmn.util import BpmnEvent

    from engine.governance import InstanceStateError

    path = _awaiting_payment(tmp_path)
    other = {"order": "O-7", "amount": 30}
    parser = SpiffBpmnParser()
    parser.add_bpmn_file(str(path))
    plain = BpmnWorkflow(parser.get_spec("await_payment"))
    plain.do_engine_steps()
    [waiting] = plain.get_tasks(state=TaskState.WAITING, spec_name="paid")
    definition = waiting.task_spec.event_definition
    from SpiffWorkflow.exceptions import WorkflowException

    with pytest.raises(WorkflowException):  # "This process is not waiting for paid"
        plain.send_event(BpmnEvent(definition, other, definition.get_correlations(waiting, other)))
    assert waiting.state == TaskState.WAITING

    engine = Engine()
    instance = run_ours(path, engine=engine)
    with pytest.raises(InstanceStateError) as refused:
        engine.send_event(instance, "paid", other)
    message = str(refused.value)
    assert "other correlation values" in message and "'O-7'" in message and "'O-42'" in message
    assert engine.load(instance.id).status == "waiting"


@pytest.mark.parametrize("sequential", ["true", "false"])
def test_scripts_on_the_instances_of_a_multi_instance_sub_process_read_and_set_their_items(tmp_path: Path,
                                                                                          sequential: str) -> None:
    """With spiffworkflow:scriptsOnInstances each instance of a sub-process runs the preScript (its
    input item before the instance starts) and the postScript (its output item as it ends); under
    layerflow they once did not run, then failed: the items were not in the script's names."""
    path = write(tmp_path, "shifted_squares", [
        '<bpmn:startEvent id="start"/>', script("init", "numbers = [1, 2, 3]"),
        f'<bpmn:subProcess id="square">{_scripts("number = number + 10", "result = result + 1")}'
        f'<bpmn:multiInstanceLoopCharacteristics isSequential="{sequential}" spiffworkflow:scriptsOnInstances="true">'
        "<bpmn:loopDataInputRef>numbers</bpmn:loopDataInputRef><bpmn:loopDataOutputRef>squares</bpmn:loopDataOutputRef>"
        '<bpmn:inputDataItem id="number" name="number"/><bpmn:outputDataItem id="result" name="result"/>'
        '</bpmn:multiInstanceLoopCharacteristics><bpmn:startEvent id="square_start"/>'
        + script("times", "result = number * number") + '<bpmn:endEvent id="square_end"/>'
        + flow("square_start", "times") + flow("times", "square_end") + "</bpmn:subProcess>",
        '<bpmn:endEvent id="end"/>', flow("start", "init"), flow("init", "square"), flow("square", "end")])
    plain = _plain([path], "shifted_squares")
    instance = run_ours(path)

    assert instance.status == "completed", instance.error
    assert path_of(instance.workflow) == path_of(plain)
    assert variables(instance.main) == plain.last_task.data == {"numbers": [1, 2, 3], "squares": [122, 145, 170]}


def test_a_camunda_collection_on_a_loop_is_a_warning_that_does_not_blame_spiffworkflow(tmp_path: Path) -> None:
    """SpiffWorkflow's CamundaParser collects a camunda:collection (here each instance's index);
    layerflow runs the loop's cardinality only. The warning said SpiffWorkflow did not run it either."""
    from SpiffWorkflow.camunda.parser import CamundaParser

    from engine.validate import validate_process

    path = write(tmp_path, "three_times", [
        '<bpmn:startEvent id="start"/>',
        '<bpmn:userTask id="ask"><bpmn:multiInstanceLoopCharacteristics isSequential="true" '
        'camunda:collection="answers" camunda:elementVariable="answer"><bpmn:loopCardinality>3</bpmn:loopCardinality>'
        "</bpmn:multiInstanceLoopCharacteristics></bpmn:userTask>",
        '<bpmn:endEvent id="end"/>', flow("start", "ask"), flow("ask", "end")])
    path.write_text(path.read_text(encoding="utf-8").replace(
        "<bpmn:definitions ", '<bpmn:definitions xmlns:camunda="http://camunda.org/schema/1.0/bpmn" ', 1),
        encoding="utf-8")
    parser = CamundaParser()
    parser.add_bpmn_file(str(path))
    plain = BpmnWorkflow(parser.get_spec("three_times"))
    plain.do_engine_steps()
    while not plain.is_completed():
        plain.get_tasks(state=TaskState.READY, manual=True)[0].run()
        plain.do_engine_steps()
    engine = Engine()
    instance = run_ours(path, engine=engine)
    while instance.status == "waiting":
        instance = engine.complete_user_task(instance, instance.waiting_for[0]["id"], {})

    assert instance.status == "completed", instance.error
    assert path_of(instance.workflow) == path_of(plain)
    assert plain.last_task.data == {"answers": [0, 1, 2]} and variables(instance.main) == {}
    [warning] = [p for p in validate_process(path, discover_config=False).problems if p.code == "foreign_extension"]
    assert warning.severity == "warning" and warning.element_id == "ask" and warning.file == str(path)
    assert "camunda:collection" in warning.message and "bpmn:loopDataInputRef" in warning.message
    assert "like SpiffWorkflow" not in warning.message


# ----- the preScript of a user task runs as the task becomes ready ------------------------------

def _form_process(tmp_path: Path) -> Path:
    """A user task whose preScript prepares what the person is shown (and counts its runs)."""
    from test_conformance import write as write_bpmn

    scripts = _scripts("runs = runs + 1\ngreeting = 'Dear ' + name", "closing = greeting + '!'")
    form = f'<bpmn:userTask id="fill" name="Fill the form">{scripts}</bpmn:userTask>'
    return write_bpmn(tmp_path, "letter", [
        '<bpmn:startEvent id="start"/>', script("setup", "runs = 0"), form, '<bpmn:endEvent id="end"/>',
        flow("start", "setup"), flow("setup", "fill"), flow("fill", "end")])


def _cli(*args: str) -> tuple[int, str]:
    """The CLI in a process of its own, as a person resuming the next day runs it."""
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-m", "engine.cli", *args], capture_output=True, text=True, timeout=120,
                          cwd=Path(__file__).resolve().parents[2])
    return done.returncode, done.stdout


def test_a_user_task_prescript_runs_as_the_task_becomes_ready_as_in_plain_spiffworkflow(tmp_path: Path) -> None:
    import json

    from SpiffWorkflow.bpmn.serializer import BpmnWorkflowSerializer
    from SpiffWorkflow.spiff.serializer.config import SPIFF_CONFIG

    path = _form_process(tmp_path)
    # plain SpiffWorkflow: the preScript has run while the task waits; a save and a restore
    # later the person completes it, and the preScript does not run again
    parser = SpiffBpmnParser()
    parser.add_bpmn_file(str(path))
    wf = BpmnWorkflow(parser.get_spec("letter"))
    wf.task_tree.data.update({"name": "Ann"})
    wf.do_engine_steps()
    [waiting] = wf.get_tasks(state=TaskState.READY, manual=True)
    assert (waiting.data["runs"], waiting.data["greeting"]) == (1, "Dear Ann")
    serializer = BpmnWorkflowSerializer(BpmnWorkflowSerializer.configure(SPIFF_CONFIG))
    wf = serializer.deserialize_json(serializer.serialize_json(wf))
    [waiting] = wf.get_tasks(state=TaskState.READY, manual=True)
    waiting.task_spec.add_data_from_form(waiting, {"signed": True})
    waiting.run()
    wf.do_engine_steps()
    assert wf.is_completed()
    plain = {k: v for k, v in wf.last_task.data.items() if k != "name"}
    assert plain == {"runs": 1, "greeting": "Dear Ann", "closing": "Dear Ann!", "signed": True}

    # layerflow: the same while it waits (run --json, inspect), and after a resume in a new process
    store = f"sqlite:///{tmp_path / 'letters.db'}"
    code, out = _cli("run", str(path), "--data", '{"name": "Ann"}', "--store", store, "--json")
    doc = json.loads(out)
    assert (code, doc["status"]) == (3, "waiting"), doc["error"]
    values = {**doc["layers"]["L3"], **doc["layers"]["L4"]}
    assert (values["runs"], values["greeting"]) == (1, "Dear Ann")
    [item] = doc["waiting_for"]
    assert (item["task_id"], item["data"]) == ("fill", {"runs": 1, "greeting": "Dear Ann"})
    code, out = _cli("inspect", doc["instance_id"], "--store", store, "--json")
    shown = json.loads(out)
    assert code == 0 and "Dear Ann" in json.dumps(shown)
    answers = tmp_path / "answers.json"
    answers.write_text(json.dumps({"user_tasks": {"fill": {"signed": True}}}), encoding="utf-8")
    code, out = _cli("resume", doc["instance_id"], "--answers", str(answers), "--store", store, "--json")
    done = json.loads(out)
    assert (code, done["status"]) == (0, "completed"), done["error"]
    ours = {k: v for k, v in done["layers"]["L3"].items() if not k.startswith("activity:")}
    assert ours == plain
    records = done["layers"]["L3"]
    assert (records["activity:fill"]["status"], records["activity:fill"]["keys"]) == ("prepared", ["runs", "greeting"])
    assert (records["activity:fill#2"]["status"], records["activity:fill#2"]["keys"]) == ("completed",
                                                                                       ["signed", "closing"])
    # one run of the preScript on the tape, as the task became ready, before the wait
    engine = Engine(store=store)
    tape = engine.load(doc["instance_id"]).main.tape
    runs = [e for e in tape if e.kind == "write" and any(change[1] == "runs" for change in e.changes)]
    assert len(runs) == 2  # setup's runs = 0, the preScript's runs = 1


def test_a_user_task_prescript_that_fails_stops_the_instance_naming_the_task(tmp_path: Path) -> None:
    from test_conformance import write as write_bpmn

    path = write_bpmn(tmp_path, "broken", [
        '<bpmn:startEvent id="start"/>',
        f'<bpmn:userTask id="fill">{_scripts("greeting = missing_name", None)}</bpmn:userTask>',
        '<bpmn:endEvent id="end"/>', flow("start", "fill"), flow("fill", "end")])
    instance = run_ours(path)
    assert instance.status == "error"
    assert instance.error["task_id"] == "fill" and "preScript" in instance.error["message"]
    assert instance.main.current_activity is None


def test_a_user_task_prescript_that_fails_again_on_resume_leaves_the_instance_in_error(tmp_path: Path) -> None:
    """The retry of a failed preScript runs it as the task becomes ready again: failing once more,
    the instance is saved in error with the preScript named (it was an uncaught exception); fixed
    (``inject``), the next resume prepares the task and waits for the person."""
    from test_conformance import write as write_bpmn

    path = write_bpmn(tmp_path, "broken", [
        '<bpmn:startEvent id="start"/>',
        f'<bpmn:userTask id="fill">{_scripts("share = 100 // parts", None)}</bpmn:userTask>',
        '<bpmn:endEvent id="end"/>', flow("start", "fill"), flow("fill", "end")])
    engine = Engine(store=f"sqlite:///{tmp_path / 'broken.db'}")
    failed = engine.run(engine.start(load_process(path)))
    assert failed.status == "error" and "preScript" in failed.error["message"]
    again = engine.resume(engine.load(failed.id))
    assert again.status == "error", again.error
    assert again.error["task_id"] == "fill" and "name 'parts' is not defined" in again.error["message"]
    stored = engine.load(failed.id)
    assert stored.status == "error" and stored.main.current_activity is None
    fixed = engine.resume(engine.inject(stored, {"parts": 4}))
    assert fixed.status == "waiting", fixed.error
    assert fixed.main.resolve("share") == 25
    done = engine.complete_user_task(fixed, "fill", {})
    assert done.status == "completed"
