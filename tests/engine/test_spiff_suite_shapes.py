"""Process shapes from a sweep of SpiffWorkflow's own test processes run under layerflow.

Each test runs a small BPMN written here (the shape of a SpiffWorkflow test process, not a
copy of it) under plain SpiffWorkflow and under layerflow, and compares the status, the path
taken (the completed tasks' BPMN ids, in order) and the variables, as test_conformance.py does;
for a process both refuse, that ``layerflow validate`` names the element and says what to do."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from SpiffWorkflow.bpmn.parser.ValidationException import ValidationException
from SpiffWorkflow.bpmn.workflow import BpmnWorkflow
from SpiffWorkflow.spiff.parser.process import SpiffBpmnParser

from context_layers import LayeredContext
from context_layers.errors import ProcessError
from engine import Engine, load_process
from engine.validate import validate_process

from engine_helpers import ROOT, flow, path_of, run_plain, run_plain_files, variables
from engine_helpers import script_task as script
from engine_helpers import write_elements as write


def run_ours(path: Path, data: dict[str, Any] | None = None) -> Any:
    engine = Engine()
    return engine.run(engine.start(load_process(path), data or {}))


# ----- a script that prints, under `layerflow run --json` -------------------------------------------

def test_a_script_that_prints_leaves_run_json_one_document(tmp_path: Path) -> None:
    """Scripts may print (SpiffWorkflow's call-activity tests do); under ``--json`` what they
    print went to stdout before the document, and the document no longer parsed."""
    path = write(tmp_path, "chatty", [
        '<bpmn:startEvent id="start"/>', script("greet", "name = 'World'\nprint('Hello', name)"),
        '<bpmn:endEvent id="end"/>', flow("start", "greet"), flow("greet", "end"),
    ])
    plain_wf, plain_vars = run_plain(path, {}, {})
    done = subprocess.run([sys.executable, "-m", "engine.cli", "run", str(path), "--json", "--store", "memory://"],
                          capture_output=True, text=True, cwd=tmp_path, timeout=120, stdin=subprocess.DEVNULL,
                          env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})

    document = json.loads(done.stdout)  # one document and nothing else
    assert done.returncode == 0 and document["status"] == "completed"
    assert "Hello World" in done.stderr  # the print is kept, on stderr
    assert document["layers"]["L3"]["name"] == plain_vars["name"] == "World"
    assert path_of(plain_wf) == ["start", "greet", "end"]


# ----- a data store that nothing implements ----------------------------------------------------------

@pytest.mark.parametrize(("store", "plain_says", "words"), [
    ('<bpmn:dataStore id="shelf" name="pantry"/>', "pantry", "'pantry'"),
    ('<bpmn:dataStore id="shelf"/>', "Data Store name is missing", "no name"),  # SpiffWorkflow's just_data_store_reference
])
def test_a_data_store_without_an_implementation_is_refused_naming_the_store(tmp_path: Path, store: str,
                                                                            plain_says: str, words: str) -> None:
    """SpiffWorkflow loads a bpmn:dataStore only through a class registered for its name, and refuses
    one with no name; its error names neither the element nor the file, and validate once passed
    that on as "fix the BPMN element named here" with no element named."""
    path = write(tmp_path, "stored", [
        '<bpmn:startEvent id="start"/>',
        '<bpmn:scriptTask id="keep"><bpmn:dataOutputAssociation id="keep_out"><bpmn:targetRef>shelf_ref'
        "</bpmn:targetRef></bpmn:dataOutputAssociation><bpmn:script>shelf = 'jar'</bpmn:script></bpmn:scriptTask>",
        '<bpmn:dataStoreReference id="shelf_ref" dataStoreRef="shelf"/>', '<bpmn:endEvent id="end"/>',
        flow("start", "keep"), flow("keep", "end"),
    ], f"{store}\n")
    with pytest.raises(ValidationException, match=plain_says):
        run_plain(path, {}, {})

    problems = [p for p in validate_process([path]).problems if p.severity == "error"]
    assert [(p.code, p.element_id, p.file) for p in problems] == [("data_store_unsupported", "shelf", str(path))]
    assert words in problems[0].message and "bpmn:dataObject" in problems[0].message
    with pytest.raises(ProcessError, match="'shelf'"):
        load_process(path)


# ----- a data association to a reference that is not there -------------------------------------------

@pytest.mark.parametrize(("reference", "words"), [
    ('<bpmn:dataObjectReference id="note_ref" dataObjectRef="note"/>',
     ["'write' has targetRef 'note_rfe'", "no dataObjectReference", "did you mean 'note_ref'"]),
    ('<bpmn:dataObjectReference id="note_rfe" dataObjectRef="nothing"/>',
     ["'write' has targetRef 'note_rfe'", "dataObjectRef='nothing' is no bpmn:dataObject"]),
])
def test_a_dangling_data_association_names_the_reference(tmp_path: Path, reference: str, words: list[str]) -> None:
    """SpiffWorkflow refuses the process too, but its message shows an lxml element and a memory
    address ("Cannot resolve dataOutputAssociation <Element ... at 0x...>"), not the id it missed."""
    path = write(tmp_path, "noted", [
        '<bpmn:dataObject id="note"/>', reference, '<bpmn:startEvent id="start"/>',
        '<bpmn:scriptTask id="write"><bpmn:dataOutputAssociation id="write_out"><bpmn:targetRef>note_rfe'
        "</bpmn:targetRef></bpmn:dataOutputAssociation><bpmn:script>note = 'hi'</bpmn:script></bpmn:scriptTask>",
        '<bpmn:endEvent id="end"/>', flow("start", "write"), flow("write", "end"),
    ])
    with pytest.raises(ValidationException, match="Cannot resolve dataOutputAssociation"):
        run_plain(path, {}, {})

    problems = [p for p in validate_process([path]).problems if p.severity == "error"]
    assert [(p.code, p.element_id, p.field) for p in problems] == [("data_ref_unknown", "write", "targetRef")]
    assert all(w in problems[0].message for w in words), problems[0].message
    assert " at 0x" not in problems[0].message


# ----- what leaves a task with an ioSpecification ----------------------------------------------------

def _io(task_id: str, given: str, made: str) -> str:
    return (f'<bpmn:ioSpecification><bpmn:dataInput id="{given}" name="{given}"/>'
            f'<bpmn:dataOutput id="{made}" name="{made}"/><bpmn:inputSet id="{task_id}_in">'
            f"<bpmn:dataInputRefs>{given}</bpmn:dataInputRefs></bpmn:inputSet><bpmn:outputSet id=\"{task_id}_out\">"
            f"<bpmn:dataOutputRefs>{made}</bpmn:dataOutputRefs></bpmn:outputSet></bpmn:ioSpecification>")


def test_only_the_data_outputs_leave_a_task_with_an_io_specification(tmp_path: Path) -> None:
    """SpiffWorkflow narrows a task's data to its data outputs when it completes; under layerflow
    a script's temporary and a person's extra form field once stayed in the context. (Keys the
    context held before the task stay, see test_conformance.)"""
    path = write(tmp_path, "taxed", [
        '<bpmn:startEvent id="start"/>', script("prepare", "net = 100"),
        f'<bpmn:scriptTask id="tax">{_io("tax", "net", "gross")}<bpmn:script>rate = 0.25\ngross = net * (1 + rate)'
        "</bpmn:script></bpmn:scriptTask>",
        script("make_bill", "bill = str(gross)"),
        f'<bpmn:userTask id="check">{_io("check", "bill", "approved")}</bpmn:userTask>', '<bpmn:endEvent id="end"/>',
        flow("start", "prepare"), flow("prepare", "tax"), flow("tax", "make_bill"), flow("make_bill", "check"),
        flow("check", "end"),
    ])
    answer = {"approved": True, "remark": "looks right"}
    plain_wf, plain_vars = run_plain(path, {}, {"check": answer})
    engine = Engine()
    instance = engine.run(engine.start(load_process(path)))
    instance = engine.complete_user_task(instance, instance.waiting_for[0]["id"], answer)

    assert instance.status == "completed", instance.error
    assert path_of(instance.workflow) == path_of(plain_wf)
    ours = variables(instance.main)
    # held before the tasks that take them as inputs: plain SpiffWorkflow drops them there
    assert (ours.pop("net"), ours.pop("gross"), ours.pop("bill")) == (100, 125.0, "125.0")
    assert ours == plain_vars == {"approved": True}


# ----- the type of an existing output collection ------------------------------------------------------

def test_an_empty_list_as_output_collection_collects_a_map_input_into_a_list(tmp_path: Path) -> None:
    """SpiffWorkflow collects into the output collection the process holds: an empty list gets
    the instances' output items in order, whatever the input collection is. Under layerflow the
    list was not handed over (a list starts empty each time), so a map input made a map output."""
    path = write(tmp_path, "doubled", [
        '<bpmn:startEvent id="start"/>', script("prepare", "pieces = {'a': 1, 'b': 2, 'c': 3}\nresults = []"),
        '<bpmn:scriptTask id="double"><bpmn:multiInstanceLoopCharacteristics>'
        "<bpmn:loopDataInputRef>pieces</bpmn:loopDataInputRef><bpmn:loopDataOutputRef>results</bpmn:loopDataOutputRef>"
        '<bpmn:inputDataItem id="piece" name="piece"/><bpmn:outputDataItem id="result" name="result"/>'
        "</bpmn:multiInstanceLoopCharacteristics><bpmn:script>result = piece * 2</bpmn:script></bpmn:scriptTask>",
        script("total", "total = sum(results)"), '<bpmn:endEvent id="end"/>',
        flow("start", "prepare"), flow("prepare", "double"), flow("double", "total"), flow("total", "end"),
    ])
    plain_wf, plain_vars = run_plain(path, {}, {})
    instance = run_ours(path)

    assert instance.status == "completed", instance.error
    assert path_of(instance.workflow) == path_of(plain_wf)
    assert variables(instance.main) == plain_vars == {
        "pieces": {"a": 1, "b": 2, "c": 3}, "results": [2, 4, 6], "total": 12}


# ----- several start events with no trigger ------------------------------------------------------

def test_a_second_start_event_with_no_trigger_is_a_warning_naming_the_path_that_never_runs(tmp_path: Path) -> None:
    """SpiffWorkflow starts a process with several start events at the first one that fires and
    cancels the others; with two plain start events (two lanes, each with its own start) the
    second path never runs, in SpiffWorkflow and under layerflow. ``validate`` said it was valid."""
    path = write(tmp_path, "two_starts", [
        '<bpmn:startEvent id="start_a"/>', script("a", "x = 1"), '<bpmn:endEvent id="end_a"/>',
        '<bpmn:startEvent id="start_b"/>', script("b", "y = 2"), '<bpmn:endEvent id="end_b"/>',
        flow("start_a", "a"), flow("a", "end_a"), flow("start_b", "b"), flow("b", "end_b"),
    ])
    plain_wf, plain_vars = run_plain(path, {}, {})
    instance = run_ours(path)

    assert instance.status == "completed", instance.error
    assert "b" not in path_of(plain_wf) and "b" not in path_of(instance.workflow)
    assert variables(instance.main) == plain_vars == {"x": 1}
    report = validate_process([path])
    [warning] = [p for p in report.problems if p.code == "start_event_never_runs"]
    assert (warning.severity, warning.element_id, warning.file) == ("warning", "start_b", str(path))
    assert "'start_a'" in warning.message and "parallel gateway" in warning.message
    assert report.ok


def test_a_message_start_beside_a_start_with_no_trigger_is_a_warning_saying_where_to_put_it(tmp_path: Path) -> None:
    """The start with no trigger fires at once and cancels the message start: its message is never
    waited for, in SpiffWorkflow and under layerflow."""
    path = write(tmp_path, "two_kinds", [
        '<bpmn:startEvent id="start"/>', script("a", "x = 1"), '<bpmn:endEvent id="end_a"/>',
        '<bpmn:startEvent id="on_order"><bpmn:messageEventDefinition messageRef="order"/></bpmn:startEvent>',
        script("b", "y = 2"), '<bpmn:endEvent id="end_b"/>',
        flow("start", "a"), flow("a", "end_a"), flow("on_order", "b"), flow("b", "end_b"),
    ], '<bpmn:message id="order" name="order"/>\n')
    plain_wf, plain_vars = run_plain(path, {}, {})
    instance = run_ours(path)
    assert instance.status == "completed" and instance.waiting_for == []
    assert path_of(instance.workflow) == path_of(plain_wf) == ["start", "a", "end_a"]
    [warning] = [p for p in validate_process([path]).problems if p.code == "start_event_never_runs"]
    assert warning.element_id == "on_order" and "event sub-process" in warning.message


def test_one_start_event_per_scope_and_event_starts_are_no_warning(tmp_path: Path) -> None:
    """A sub-process's own start, an event sub-process's start and one start per process are the
    normal shapes: no warning for them."""
    path = write(tmp_path, "scoped_starts", [
        '<bpmn:startEvent id="start"/>',
        '<bpmn:subProcess id="inner"><bpmn:startEvent id="inner_start"/>' + script("work", "x = 1")
        + '<bpmn:endEvent id="inner_end"/>' + flow("inner_start", "work") + flow("work", "inner_end")
        + "</bpmn:subProcess>",
        '<bpmn:subProcess id="on_stop" triggeredByEvent="true"><bpmn:startEvent id="stop_start">'
        '<bpmn:signalEventDefinition signalRef="stop"/></bpmn:startEvent><bpmn:endEvent id="stop_end"/>'
        + flow("stop_start", "stop_end") + "</bpmn:subProcess>",
        '<bpmn:endEvent id="end"/>', flow("start", "inner"), flow("inner", "end"),
    ], '<bpmn:signal id="stop" name="stop"/>\n')
    assert [p for p in validate_process([path]).problems if p.code == "start_event_never_runs"] == []


# ----- a join that fires before every branch of its split arrived --------------------------------

def test_a_join_that_fires_with_part_of_a_split_names_the_split_and_the_missing_branch(tmp_path: Path) -> None:
    """A three-way split whose join has two incoming flows, two branches merging in an exclusive
    gateway before it: the join fires with the first two branches to arrive, and plain SpiffWorkflow
    fires it again for the third. layerflow merges a split's branches at one join, and stops there
    with an error that said the join received branches of *different* splits, where they were
    branches of one split, not all there."""
    path = _short_join(tmp_path)
    plain_wf, _ = run_plain(path, {}, {"b": {}, "c": {}})
    assert path_of(plain_wf).count("join") == 2
    engine = Engine()
    instance = engine.run(engine.start(load_process(path)))
    instance = engine.complete_user_task(instance, instance.waiting_for[0]["id"], {})

    assert instance.status == "error" and instance.error["task_id"] == "join"
    message = instance.error["message"]
    assert "different splits" not in message
    assert "'fork'" in message and "2 of the 3 branches" in message and "'c' had not arrived" in message


def _short_join(tmp_path: Path) -> Path:
    return write(tmp_path, "short_join", [
        '<bpmn:startEvent id="start"/>', '<bpmn:parallelGateway id="fork"/>', script("a", "x = 1"),
        '<bpmn:userTask id="b"/>', '<bpmn:userTask id="c"/>', '<bpmn:exclusiveGateway id="either"/>',
        '<bpmn:parallelGateway id="join"/>', '<bpmn:endEvent id="end"/>',
        flow("start", "fork"), flow("fork", "a"), flow("fork", "b"), flow("fork", "c"), flow("a", "join"),
        flow("b", "either"), flow("c", "either"), flow("either", "join"), flow("join", "end"),
    ])


def test_branches_of_one_split_merged_before_the_join_are_a_warning_naming_the_merge(tmp_path: Path) -> None:
    """The shape above (two branches of a split meet in an exclusive gateway, so the join has fewer
    incoming flows than the split has branches) passed validate and stopped the instance at run time."""
    report = validate_process([_short_join(tmp_path)])
    [warning] = [p for p in report.problems if p.code == "split_branches_merged"]
    assert (warning.severity, warning.element_id) == ("warning", "either")
    assert all(w in warning.message for w in ("'fork'", "'b'", "'c'", "parallel gateway")), warning.message
    assert report.ok


def test_a_merge_inside_one_branch_or_at_an_end_event_is_no_warning(tmp_path: Path) -> None:
    """An exclusive choice and its merge inside one branch, and branches that end at one end event
    (the process's end joins them), are the normal shapes."""
    path = write(tmp_path, "tidy", [
        '<bpmn:startEvent id="start"/>', '<bpmn:parallelGateway id="fork"/>', '<bpmn:exclusiveGateway id="pick" default="p2"/>',
        script("p1_task", "p = 1"), script("p2_task", "p = 2"), '<bpmn:exclusiveGateway id="picked"/>',
        script("other", "o = 1"), '<bpmn:parallelGateway id="join"/>', script("tail_a", "t = 1"), script("tail_b", "u = 1"),
        '<bpmn:parallelGateway id="fork2"/>', '<bpmn:endEvent id="end"/>',
        flow("start", "fork"), flow("fork", "pick"), flow("fork", "other"),
        flow("pick", "p1_task", "o == 0"), '<bpmn:sequenceFlow id="p2" sourceRef="pick" targetRef="p2_task"/>',
        flow("p1_task", "picked"), flow("p2_task", "picked"), flow("picked", "join"), flow("other", "join"),
        flow("join", "fork2"), flow("fork2", "tail_a"), flow("fork2", "tail_b"), flow("tail_a", "end"), flow("tail_b", "end"),
    ])
    assert [p for p in validate_process([path]).problems if p.code == "split_branches_merged"] == []


def test_a_join_reached_by_a_loop_back_into_a_split_names_the_branches_in_bpmn_terms(tmp_path: Path) -> None:
    """A loop goes back into the branches of a parallel section through exclusive merges, from a second
    split: the join gets a branch of that split and the context of the first pass. Plain SpiffWorkflow
    crashes at the end (AttributeError); layerflow stops at the join, but its error listed internal
    context names ("main, main/to_right@14/to_right@8") that appear nowhere in the BPMN."""
    path = write(tmp_path, "rounds", [
        '<bpmn:startEvent id="start"/>', script("init", "n = 0"), '<bpmn:parallelGateway id="first_split"/>',
        '<bpmn:exclusiveGateway id="to_left" default="to_left_join"/>', script("right_work", "r = 1"),
        '<bpmn:exclusiveGateway id="to_right" default="to_right_join"/>', '<bpmn:parallelGateway id="join"/>',
        script("count", "n = n + 1"), '<bpmn:exclusiveGateway id="again" default="again_end"/>',
        '<bpmn:parallelGateway id="round_split"/>', '<bpmn:userTask id="review"/>', '<bpmn:endEvent id="end"/>',
        flow("start", "init"), flow("init", "first_split"), flow("first_split", "to_left"),
        flow("first_split", "right_work"), flow("right_work", "to_right"),
        '<bpmn:sequenceFlow id="to_left_join" sourceRef="to_left" targetRef="join"/>',
        '<bpmn:sequenceFlow id="to_right_join" sourceRef="to_right" targetRef="join"/>', flow("join", "count"),
        flow("count", "again"), flow("again", "round_split", "n < 3"),
        '<bpmn:sequenceFlow id="again_end" sourceRef="again" targetRef="end"/>',
        flow("round_split", "review"), flow("round_split", "to_right"), flow("review", "to_left"),
    ])
    with pytest.raises(AttributeError):
        run_plain(path, {}, {"review": {}})
    engine = Engine()
    instance = engine.run(engine.start(load_process(path)))
    while instance.status == "waiting":
        instance = engine.complete_user_task(instance, instance.waiting_for[0]["id"], {})

    assert instance.status == "error" and instance.error["task_id"] == "join"
    message = instance.error["message"]
    assert "main/" not in message and "@" not in message, message
    assert "branch 'to_right' of split 'round_split'" in message and "outside any split" in message, message


# ----- an ad-hoc sub-process ---------------------------------------------------------------------

def _pick_in_any_order(tmp_path: Path, data_object: bool = False) -> Path:
    inner = '<bpmn:dataObject id="notes"/>' if data_object else ""
    return write(tmp_path, "any_order", [
        '<bpmn:startEvent id="start"/>',
        f'<bpmn:adHocSubProcess id="pick">{inner}<bpmn:userTask id="call_client"/><bpmn:userTask id="write_offer"/>'
        "<bpmn:completionCondition>offer_sent</bpmn:completionCondition></bpmn:adHocSubProcess>",
        script("archive", "archived = offer_sent"), '<bpmn:endEvent id="end"/>',
        flow("start", "pick"), flow("pick", "archive"), flow("archive", "end"),
    ])


@pytest.mark.parametrize("data_object", [False, True], ids=["tasks only", "with a data object"])
def test_an_ad_hoc_sub_process_is_refused_naming_it(tmp_path: Path, data_object: bool) -> None:
    """SpiffWorkflow 3.2 cannot keep an ad-hoc sub-process: with tasks only, its path bookkeeping
    raises KeyError 'data_objects' after the first task; with a data object inside, it runs in
    memory but its serializer cannot save the workflow. layerflow let validate pass it, then failed
    at run time naming no element: a NameError for the completion condition (which SpiffWorkflow
    evaluates over its own data, not the context), or a save error at start."""
    from SpiffWorkflow.bpmn.serializer import BpmnWorkflowSerializer
    from SpiffWorkflow.spiff.serializer.config import SPIFF_CONFIG

    path = _pick_in_any_order(tmp_path, data_object)
    answers = {"call_client": {}, "write_offer": {"offer_sent": True}}
    if data_object:
        plain_wf, _ = run_plain(path, {"offer_sent": False}, answers)
        with pytest.raises(TypeError, match="DataObject"):
            BpmnWorkflowSerializer(BpmnWorkflowSerializer.configure(SPIFF_CONFIG)).serialize_json(plain_wf)
    else:
        with pytest.raises(KeyError, match="data_objects"):
            run_plain(path, {"offer_sent": False}, answers)

    errors = [p for p in validate_process([path]).problems if p.severity == "error"]
    assert [(p.code, p.element_id, p.file) for p in errors] == [("unsupported_element", "pick", str(path))]
    assert "ad-hoc" in errors[0].message and "exclusive gateway" in errors[0].message
    with pytest.raises(ProcessError, match="'pick'"):
        load_process(path)


# ----- a cancel boundary event on something that is no transaction ---------------------------------

def test_a_cancel_boundary_event_outside_a_transaction_is_refused_naming_the_event(tmp_path: Path) -> None:
    """SpiffWorkflow refuses a cancel event anywhere but on a transaction, and names the task it is
    attached to; validate passed that on ("fix the BPMN element named here") without naming the
    event to change or saying what to draw instead."""
    path = write(tmp_path, "cancel_on_task", [
        '<bpmn:startEvent id="start"/>', '<bpmn:userTask id="count"/>',
        '<bpmn:boundaryEvent id="reset" attachedToRef="count"><bpmn:cancelEventDefinition/></bpmn:boundaryEvent>',
        script("note", "reset_seen = True"), '<bpmn:endEvent id="end"/>', '<bpmn:endEvent id="end_reset"/>',
        flow("start", "count"), flow("count", "end"), flow("reset", "note"), flow("note", "end_reset"),
    ])
    with pytest.raises(ValidationException, match="Cancel Events may only be used with transactions"):
        run_plain(path, {}, {})

    errors = [p for p in validate_process([path]).problems if p.severity == "error"]
    assert [(p.code, p.element_id, p.field) for p in errors] == [("cancel_outside_transaction", "reset", "attachedToRef")]
    assert "'count'" in errors[0].message and "bpmn:transaction" in errors[0].message
    with pytest.raises(ProcessError, match="'reset'"):
        load_process(path)


# ----- a call activity that calls its own process back ------------------------------------------------

def _call(call_id: str, process: str) -> str:
    return f'<bpmn:callActivity id="{call_id}" calledElement="{process}"/>'


def _countdown(tmp_path: Path, decided: bool) -> list[Path]:
    """``main`` calls ``countdown``, which counts ``left`` down and calls itself again: behind a gateway
    that stops at zero (``decided``), or on every run."""
    main = write(tmp_path, "main", [
        '<bpmn:startEvent id="start"/>', script("init", "left = 3"), _call("count", "countdown"),
        '<bpmn:endEvent id="end"/>', flow("start", "init"), flow("init", "count"), flow("count", "end")])
    again = [_call("again", "countdown"), '<bpmn:endEvent id="c_end"/>', flow("again", "c_end")]
    if decided:
        again += ['<bpmn:exclusiveGateway id="more" default="tick_to_c_done"/>', '<bpmn:endEvent id="c_done"/>',
                  flow("tick", "more"), flow("more", "again", "left > 0"),
                  '<bpmn:sequenceFlow id="tick_to_c_done" sourceRef="more" targetRef="c_done"/>']
    else:
        again.append(flow("tick", "again"))
    countdown = write(tmp_path, "countdown", [
        '<bpmn:startEvent id="c_start"/>', script("tick", "left = left - 1"), flow("c_start", "tick"), *again])
    return [main, countdown]


def test_a_call_activity_that_calls_its_own_process_on_every_run_is_refused(tmp_path: Path) -> None:
    """SpiffWorkflow starts a new instance of the called process at each call, without end (its parser
    once refused recursive calls; 3.2 hangs); validate passed such a process and `layerflow run`
    hung until it was killed."""
    paths = _countdown(tmp_path, decided=False)

    errors = [p for p in validate_process(paths).problems if p.severity == "error"]
    assert [(p.code, p.element_id, p.field, p.file) for p in errors] == [
        ("call_activity_recursion", "again", "calledElement", str(paths[1]))]
    assert "countdown -> countdown" in errors[0].message and "exclusive gateway" in errors[0].message
    with pytest.raises(ProcessError, match="'again'"):
        load_process(paths)


def test_a_call_activity_that_calls_its_own_process_behind_a_gateway_runs_as_in_spiffworkflow(tmp_path: Path) -> None:
    paths = _countdown(tmp_path, decided=True)
    plain = run_plain_files(paths, "main")
    engine = Engine()
    instance = engine.run(engine.start(load_process(paths)))

    assert [p.code for p in validate_process(paths).problems] == []
    assert plain.is_completed() and instance.status == "completed", instance.error
    assert path_of(instance.workflow) == path_of(plain)
    assert variables(instance.main) == plain.last_task.data == {"left": 0}


# ----- a correlation property's retrieval expression that is no Python ---------------------------------

def test_a_correlation_expression_that_is_not_python_is_refused_naming_the_property(tmp_path: Path) -> None:
    """SpiffWorkflow evaluates a correlation property's retrieval expression over a message's payload
    when the message is sent or caught; validate passed one that is no Python (a payload key that is a
    keyword), and every delivery then failed with a SyntaxError that named neither the property nor the
    file (under layerflow: "the payload must carry its correlation properties", which no payload can)."""
    path = write(tmp_path, "ordering", [
        '<bpmn:startEvent id="start"/>',
        '<bpmn:intermediateCatchEvent id="paid"><bpmn:messageEventDefinition messageRef="payment"/>'
        "</bpmn:intermediateCatchEvent>", '<bpmn:endEvent id="end"/>', flow("start", "paid"), flow("paid", "end"),
    ], '<bpmn:message id="payment" name="Payment"/>\n<bpmn:correlationProperty id="order_ref" name="Order">'
       '<bpmn:correlationPropertyRetrievalExpression messageRef="payment"><bpmn:formalExpression>global.ref'
       "</bpmn:formalExpression></bpmn:correlationPropertyRetrievalExpression></bpmn:correlationProperty>\n")
    parser = SpiffBpmnParser()
    parser.add_bpmn_file(str(path))
    plain = BpmnWorkflow(parser.get_spec("ordering"))
    plain.do_engine_steps()
    [waiting] = [t for t in plain.get_tasks() if t.task_spec.bpmn_id == "paid"]
    definition = waiting.task_spec.event_definition
    with pytest.raises(SyntaxError):
        definition.calculate_correlations(plain.script_engine, definition.correlation_properties, {"global": 1})

    errors = [p for p in validate_process([path]).problems if p.severity == "error"]
    assert [(p.code, p.element_id, p.field) for p in errors] == [("condition_syntax", "order_ref", "formalExpression")]
    assert "'global.ref'" in errors[0].message and "'payment'" in errors[0].message
    with pytest.raises(ProcessError, match="'order_ref'"):
        load_process(path)


# ----- a call activity that calls a process that is not executable ---------------------------------------

def test_a_call_of_a_process_that_is_not_executable_names_the_call_and_what_to_set(tmp_path: Path) -> None:
    """SpiffWorkflow loads no process with isExecutable="false", a called one neither; validate passed
    its message on ("Process ... is not executable ...; fix the BPMN element named here"), naming the
    called process but not the call activity, nor the attribute to change."""
    main = write(tmp_path, "shipping", [
        '<bpmn:startEvent id="start"/>', '<bpmn:callActivity id="label" calledElement="print_label"/>',
        '<bpmn:endEvent id="end"/>', flow("start", "label"), flow("label", "end")])
    called = write(tmp_path, "print_label", [
        '<bpmn:startEvent id="p_start"/>', script("render", "label_text = 'TO: ACME'"), '<bpmn:endEvent id="p_end"/>',
        flow("p_start", "render"), flow("render", "p_end")])
    called.write_text(called.read_text().replace('isExecutable="true"', 'isExecutable="false"'))
    parser = SpiffBpmnParser()
    parser.add_bpmn_files([str(main), str(called)])
    with pytest.raises(ValidationException, match="not executable"):
        parser.get_subprocess_specs("shipping")

    errors = [p for p in validate_process([main, called]).problems if p.severity == "error"]
    assert [(p.code, p.element_id, p.field, p.file) for p in errors] == [
        ("call_activity_unknown_process", "label", "calledElement", str(main))]
    assert "'print_label'" in errors[0].message and 'isExecutable="true"' in errors[0].message
    with pytest.raises(ProcessError, match="'label'"):
        load_process([main, called])


# ----- a timer whose expression gives no date or duration ------------------------------------------------

@pytest.mark.parametrize(("field", "given", "plain_error"), [
    ("timeDate", "soon", "Invalid isoformat string"),
    ("timeDate", 5, "has no attribute"),
    ("timeDuration", "an hour", "Invalid duration"),
])
def test_a_timer_value_that_is_no_iso_8601_says_what_to_write(tmp_path: Path, field: str, given: Any,
                                                              plain_error: str) -> None:
    """A timer's expression is Python over the context (SpiffWorkflow's timer tests give a variable);
    a value that is no ISO 8601 text stopped the instance with Python's own words about it
    ("'int' object has no attribute 'isoformat'"), not what the timer needs."""
    path = write(tmp_path, "reminder", [
        '<bpmn:startEvent id="start"/>',
        f'<bpmn:intermediateCatchEvent id="wait"><bpmn:timerEventDefinition><bpmn:{field}>due</bpmn:{field}>'
        "</bpmn:timerEventDefinition></bpmn:intermediateCatchEvent>", '<bpmn:endEvent id="end"/>',
        flow("start", "wait"), flow("wait", "end")])
    with pytest.raises(Exception, match=plain_error):
        run_plain(path, {"due": given}, {})

    instance = run_ours(path, {"due": given})
    assert instance.status == "error" and instance.error["task_id"] == "wait"
    message = instance.error["message"]
    assert f"timer 'wait': its {field} 'due' gave {given!r}" in message and "ISO 8601 text such as" in message


# ----- an exclusive choice inside each branch of a parallel split ------------------------------------------

def test_an_exclusive_choice_in_each_parallel_branch_merges_without_asking(tmp_path: Path) -> None:
    """Each branch of a parallel split decides something at an exclusive gateway before the join
    (the shape of SpiffWorkflow's Parallel-Join-Long-Inclusive). The exclusive split rewrote the
    branch's ``_branch_id`` and ``_snapshot_id``, and the join asked a person which branch's
    engine markers the process should continue with; the instance waited forever."""
    def choice(side: str, limit: int) -> list[str]:
        return [script(f"{side}_count", f"{side} = {limit}"),
                f'<bpmn:exclusiveGateway id="{side}_big" default="{side}_small_flow"/>',
                script(f"{side}_large", f"{side}_size = 'large'"), script(f"{side}_small", f"{side}_size = 'small'"),
                f'<bpmn:exclusiveGateway id="{side}_sized"/>',
                flow("split", f"{side}_count"), flow(f"{side}_count", f"{side}_big"),
                flow(f"{side}_big", f"{side}_large", f"{side} > 3"),
                f'<bpmn:sequenceFlow id="{side}_small_flow" sourceRef="{side}_big" targetRef="{side}_small"/>',
                flow(f"{side}_large", f"{side}_sized"), flow(f"{side}_small", f"{side}_sized"),
                flow(f"{side}_sized", "join")]
    path = write(tmp_path, "sizing", [
        '<bpmn:startEvent id="start"/>', '<bpmn:parallelGateway id="split"/>', *choice("boxes", 1),
        *choice("crates", 5), '<bpmn:inclusiveGateway id="join"/>', '<bpmn:endEvent id="end"/>',
        flow("start", "split"), flow("join", "end")])
    plain_wf, plain_vars = run_plain(path, {}, {})
    instance = run_ours(path)

    assert instance.status == "completed", instance.waiting_for or instance.error
    assert path_of(instance.workflow) == path_of(plain_wf)
    assert variables(instance.main) == plain_vars == {"boxes": 1, "boxes_size": "small", "crates": 5,
                                                      "crates_size": "large"}
    assert instance.to_document()["conflicts"] == []


# ----- two files that define one process id ------------------------------------------------------------

def test_two_files_that_define_one_process_id_are_named_in_one_error(tmp_path: Path) -> None:
    """SpiffWorkflow refuses a second process with an id it has ("Duplicate process ID"), naming no
    file; validate passed that on, and first asked for a process id to choose between 'Level2' and
    'Level2' (--process would not have helped)."""
    first = write(tmp_path, "billing", ['<bpmn:startEvent id="start"/>', '<bpmn:userTask id="bill"/>',
                                        '<bpmn:endEvent id="end"/>', flow("start", "bill"), flow("bill", "end")])
    second = tmp_path / "billing_v2.bpmn"
    second.write_text(first.read_text().replace('id="bill"', 'id="invoice"').replace('"bill"', '"invoice"'))
    parser = SpiffBpmnParser()
    with pytest.raises(ValidationException, match="Duplicate process ID"):
        parser.add_bpmn_files([str(first), str(second)])

    errors = [p for p in validate_process([first, second]).problems if p.severity == "error"]
    assert [(p.code, p.element_id, p.file) for p in errors] == [("duplicate_id", "billing", str(second))]
    assert str(first) in errors[0].message and "give only one of the files" in errors[0].message
    with pytest.raises(ProcessError, match="'billing'"):
        load_process([first, second])



# ----- ids inside another engine's extension elements -------------------------------------------------

def test_the_same_id_twice_inside_extension_elements_is_no_duplicate_bpmn_id(tmp_path: Path) -> None:
    """Camunda's modeler writes ids on its own extension elements (a form field's properties), and two
    of them may share one (SpiffWorkflow's ParallelTasksNavigation: ``camunda:property id="repeat"``
    on two fields). They are no BPMN ids: SpiffWorkflow runs the process; validate refused it as a
    duplicate id, and so did ``load_process``."""
    form = ('<bpmn:extensionElements><camunda:formData xmlns:camunda="http://camunda.org/schema/1.0/bpmn">'
            + "".join(f'<camunda:formField id="{field}" type="string"><camunda:properties>'
                      '<camunda:property id="repeat" value="things"/></camunda:properties></camunda:formField>'
                      for field in ("first", "second"))
            + "</camunda:formData></bpmn:extensionElements>")
    path = write(tmp_path, "favourites", [
        '<bpmn:startEvent id="start"/>', f'<bpmn:userTask id="ask">{form}</bpmn:userTask>',
        script("count", "n = len(first) + len(second)"), '<bpmn:endEvent id="end"/>',
        flow("start", "ask"), flow("ask", "count"), flow("count", "end"),
    ])
    answer = {"first": "tea", "second": "cake"}
    plain_wf, plain_vars = run_plain(path, {}, {"ask": answer})

    assert [p.code for p in validate_process([path]).problems] == []
    engine = Engine()
    instance = engine.run(engine.start(load_process(path)))
    instance = engine.complete_user_task(instance, instance.waiting_for[0]["id"], answer)
    assert instance.status == "completed", instance.error
    assert path_of(instance.workflow) == path_of(plain_wf) == ["start", "ask", "count", "end"]
    assert variables(instance.main) == plain_vars == {"first": "tea", "second": "cake", "n": 7}


def test_the_same_bpmn_id_twice_is_still_refused(tmp_path: Path) -> None:
    path = write(tmp_path, "twice", [
        '<bpmn:startEvent id="start"/>', script("work", "x = 1"), script("work", "x = 2"), '<bpmn:endEvent id="end"/>',
        flow("start", "work"), flow("work", "end"),
    ])
    assert [(p.code, p.element_id) for p in validate_process([path]).problems if p.severity == "error"] == [
        ("duplicate_id", "work")]


# ----- a condition that reads a name the context does not hold -----------------------------------------

@pytest.mark.parametrize(("condition", "says"), [
    ("approved == true", "write True, False or None"),  # SpiffWorkflow's Nav* processes: `true`, `false`
    ("aproved", "give 'aproved' a value before 'check'"),  # a typo (SpiffWorkflow's `tru`)
])
def test_a_condition_on_a_name_the_context_lacks_says_what_to_write(tmp_path: Path, condition: str, says: str) -> None:
    """SpiffWorkflow evaluates conditions as Python over the task data: ``true`` (a modeler's JavaScript
    or FEEL literal) or a misspelt key is a NameError at the gateway. validate passed it, and the run
    stopped with Python's words ("name 'true' is not defined") and nothing about what to change."""
    path = write(tmp_path, "checking", [
        '<bpmn:startEvent id="start"/>', '<bpmn:userTask id="ask"/>',
        '<bpmn:exclusiveGateway id="check" default="check_to_no"/>', script("yes", "outcome = 'yes'"),
        script("no", "outcome = 'no'"), '<bpmn:endEvent id="end"/>',
        flow("start", "ask"), flow("ask", "check"), flow("check", "yes", condition),
        '<bpmn:sequenceFlow id="check_to_no" sourceRef="check" targetRef="no"/>', flow("yes", "end"), flow("no", "end"),
    ])
    with pytest.raises(Exception, match="Error evaluating expression"):
        run_plain(path, {}, {"ask": {"approved": True}})

    engine = Engine()
    instance = engine.run(engine.start(load_process(path)))
    instance = engine.complete_user_task(instance, instance.waiting_for[0]["id"], {"approved": True})
    assert instance.status == "error" and instance.error["task_id"] == "check"
    assert says in instance.error["message"], instance.error["message"]
    if "true" in condition:
        [warning] = [p for p in validate_process([path]).problems if p.code == "condition_literal_name"]
        assert (warning.severity, warning.element_id, warning.field) == ("warning", "check_to_yes", "conditionExpression")
        assert "'true'" in warning.message and "True" in warning.message


def test_a_condition_that_assigns_says_to_compare_with_two_equals_signs(tmp_path: Path) -> None:
    """SpiffWorkflow's Scripts test process has ``priority = 'Emergency'`` on a flow: SpiffWorkflow
    refuses it when the gateway runs; validate refused it saying only "invalid syntax; fix the condition"."""
    path = write(tmp_path, "urgency", [
        '<bpmn:startEvent id="start"/>', '<bpmn:exclusiveGateway id="urgent" default="urgent_to_normal"/>',
        script("rush", "fast = True"), script("normal", "fast = False"), '<bpmn:endEvent id="end"/>',
        flow("start", "urgent"), flow("urgent", "rush", "priority = 'Emergency'"),
        '<bpmn:sequenceFlow id="urgent_to_normal" sourceRef="urgent" targetRef="normal"/>',
        flow("rush", "end"), flow("normal", "end"),
    ])
    with pytest.raises(Exception, match="Error evaluating expression"):
        run_plain(path, {"priority": "Emergency"}, {})

    [error] = [p for p in validate_process([path]).problems if p.severity == "error"]
    assert (error.code, error.element_id, error.field) == ("condition_syntax", "urgent_to_rush", "conditionExpression")
    assert "write \"priority == 'Emergency'\"" in error.message, error.message


# ----- a correlated message the instance waits for but SpiffWorkflow will not catch ----------------------

def _two_conversations(tmp_path: Path, inner: bool) -> Path:
    """An order message correlates the instance by ``order_no`` (key ``by_order``); the payment message
    that follows correlates by ``payment_ref`` only (key ``by_payment``). ``inner``: inside a sub-process."""
    waits = [
        '<bpmn:intermediateCatchEvent id="ordered"><bpmn:messageEventDefinition messageRef="order"/></bpmn:intermediateCatchEvent>',
        '<bpmn:intermediateCatchEvent id="paid"><bpmn:messageEventDefinition messageRef="payment"/></bpmn:intermediateCatchEvent>',
    ]
    if inner:
        body = ['<bpmn:subProcess id="deal"><bpmn:startEvent id="deal_start"/>' + "".join(waits)
                + '<bpmn:endEvent id="deal_end"/>' + flow("deal_start", "ordered") + flow("ordered", "paid")
                + flow("paid", "deal_end") + "</bpmn:subProcess>", flow("start", "deal"), flow("deal", "end")]
    else:
        body = [*waits, flow("start", "ordered"), flow("ordered", "paid"), flow("paid", "end")]
    keys = ('<bpmn:collaboration id="talks"><bpmn:participant id="shop" processRef="selling"/>'
            '<bpmn:correlationKey name="by_order"><bpmn:correlationPropertyRef>order_no</bpmn:correlationPropertyRef>'
            '</bpmn:correlationKey><bpmn:correlationKey name="by_payment"><bpmn:correlationPropertyRef>payment_ref'
            "</bpmn:correlationPropertyRef></bpmn:correlationKey></bpmn:collaboration>\n")
    props = ('<bpmn:message id="order" name="order"/><bpmn:message id="payment" name="payment"/>\n'
             '<bpmn:correlationProperty id="order_no" name="order_no"><bpmn:correlationPropertyRetrievalExpression '
             'messageRef="order"><bpmn:formalExpression>number</bpmn:formalExpression>'
             "</bpmn:correlationPropertyRetrievalExpression></bpmn:correlationProperty>\n"
             '<bpmn:correlationProperty id="payment_ref" name="payment_ref"><bpmn:correlationPropertyRetrievalExpression '
             'messageRef="payment"><bpmn:formalExpression>ref</bpmn:formalExpression>'
             "</bpmn:correlationPropertyRetrievalExpression></bpmn:correlationProperty>\n")
    path = write(tmp_path, "selling", ['<bpmn:startEvent id="start"/>', '<bpmn:endEvent id="end"/>', *body], props)
    path.write_text(path.read_text().replace("<bpmn:process ", keys + "  <bpmn:process ", 1))
    return path


@pytest.mark.parametrize("inner", [False, True], ids=["in the process", "in a sub-process"])
def test_a_message_correlated_by_a_key_the_instance_lacks_says_why_it_is_not_caught(tmp_path: Path, inner: bool) -> None:
    """SpiffWorkflow catches a correlated message only when one of its correlation keys matches a key the
    instance (its sub-process, for a catch inside one) already holds; SpiffWorkflow's
    correlation_two_conversations has this shape. The refusal said the instance "does not wait for message
    'payment'; it waits for: message 'payment' at paid", and, inside a sub-process, also for a message
    whose key had another value (the keys were looked up on the top workflow only)."""
    from engine.governance import InstanceStateError

    from SpiffWorkflow.bpmn.util.event import BpmnEvent
    from SpiffWorkflow.util.task import TaskState

    path = _two_conversations(tmp_path, inner)
    parser = SpiffBpmnParser()
    parser.add_bpmn_file(str(path))
    plain = BpmnWorkflow(parser.get_spec("selling"), parser.get_subprocess_specs("selling"))
    plain.do_engine_steps()
    for name, payload in (("order", {"number": 7}), ("payment", {"ref": "P-1"})):
        [task] = [t for t in plain.get_tasks(state=TaskState.WAITING) if t.task_spec.bpmn_id in ("ordered", "paid")]
        definition = task.task_spec.event_definition
        plain.catch(BpmnEvent(definition, payload, definition.calculate_correlations(
            plain.script_engine, definition.correlation_properties, payload)))
        plain.do_engine_steps()
    assert [t.task_spec.bpmn_id for t in plain.get_tasks(state=TaskState.WAITING)
            if t.task_spec.bpmn_id in ("ordered", "paid")] == ["paid"]  # SpiffWorkflow does not catch it either

    engine = Engine()
    instance = engine.run(engine.start(load_process(path)))
    instance = engine.send_event(instance, "order", {"number": 7})
    assert [w["task_id"] for w in instance.waiting_for] == ["paid"]

    with pytest.raises(InstanceStateError) as refused:
        engine.send_event(instance, "payment", {"ref": "P-1"})
    message = str(refused.value)
    assert "does not wait" not in message, message
    assert "'by_payment'" in message and "'by_order'" in message and "correlation key" in message, message
    assert instance.status == "waiting"



# ----- an answers file that sends a loop round again and again -------------------------------------------

def _ask_again(tmp_path: Path, counted: bool) -> Path:
    """A person is asked whether to go round again; ``counted``: a script counts the rounds and the
    gateway stops at three whatever the answer."""
    again = "again and n < 3" if counted else "again"
    return write(tmp_path, "rounds_asked", [
        '<bpmn:startEvent id="start"/>', script("init", "n = 0"), '<bpmn:userTask id="ask"/>',
        script("count", "n = n + 1" if counted else "seen = True"),
        '<bpmn:exclusiveGateway id="more" default="more_to_end"/>', '<bpmn:endEvent id="end"/>',
        flow("start", "init"), flow("init", "ask"), flow("ask", "count"), flow("count", "more"),
        flow("more", "ask", again), '<bpmn:sequenceFlow id="more_to_end" sourceRef="more" targetRef="end"/>',
    ])


@pytest.mark.parametrize("counted", [False, True], ids=["the same round each time", "rounds that count"])
def test_an_answer_that_only_repeats_a_round_leaves_the_instance_waiting(tmp_path: Path, counted: bool) -> None:
    """An answers file answers a user task each time the process comes back to it. SpiffWorkflow's
    LoopBackNav and BacktrackNavigation go back to the asking task on one answer: given that answer,
    ``layerflow run --json`` went round for ever and never printed its document. A round that changes
    nothing, answered as the round before, is now left waiting for a person; rounds that change the
    context still run."""
    path = _ask_again(tmp_path, counted)
    (tmp_path / "answers.json").write_text(json.dumps({"user_tasks": {"ask": {"again": True}}}))
    done = subprocess.run([sys.executable, "-m", "engine.cli", "run", str(path), "--json", "--store", "memory://",
                           "--answers", str(tmp_path / "answers.json")], capture_output=True, text=True, cwd=tmp_path,
                          timeout=120, stdin=subprocess.DEVNULL, env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    document = json.loads(done.stdout)
    if counted:
        assert (done.returncode, document["status"]) == (0, "completed"), done.stderr
        assert document["layers"]["L3"]["n"] == 3
    else:
        assert (done.returncode, document["status"]) == (3, "waiting"), done.stderr
        assert [w["task_id"] for w in document["waiting_for"]] == ["ask"]
        assert "'ask'" in done.stderr and "nothing changed" in done.stderr, done.stderr


@pytest.mark.parametrize("inside", ["task", "sub-process"])
def test_the_instances_of_a_sequential_multi_instance_step_are_answered_each_from_one_answer(tmp_path: Path,
                                                                                           inside: str) -> None:
    """The next instance of a sequential multi-instance step, answered as the one before with nothing
    changed, is no round again: an answers file completes every instance."""
    loop = ('<bpmn:multiInstanceLoopCharacteristics isSequential="true"><bpmn:loopCardinality>3</bpmn:loopCardinality>'
            "</bpmn:multiInstanceLoopCharacteristics>")
    if inside == "task":
        step = f'<bpmn:userTask id="sign">{loop}</bpmn:userTask>'
    else:
        step = (f'<bpmn:subProcess id="sign">{loop}<bpmn:startEvent id="s"/><bpmn:userTask id="sign_one"/>'
                f'<bpmn:endEvent id="e"/>{flow("s", "sign_one")}{flow("sign_one", "e")}</bpmn:subProcess>')
    path = write(tmp_path, "signing", ['<bpmn:startEvent id="start"/>', step, '<bpmn:endEvent id="end"/>',
                                       flow("start", "sign"), flow("sign", "end")])
    engine = Engine()
    # (a user_tasks key naming no user task of the process is refused: sign_one is the sub-process's
    # user task; since round 18 the sub-process "sign" itself, which takes no answer, is refused too)
    answers = {"sign": {}} if inside == "task" else {"sign_one": {}}
    instance = engine.run(engine.start(load_process(path)), answers={"user_tasks": answers})
    assert instance.status == "completed", instance.waiting_for
    assert instance.notices == []
    done = path_of(instance.workflow)
    assert (done.count("sign_one") if inside == "sub-process" else done.count("sign") - 1) == 3  # - the activity itself


# ----- a gateway where no condition holds -----------------------------------------------------------

@pytest.mark.parametrize("kind", ["exclusiveGateway", "inclusiveGateway"])
def test_a_gateway_where_no_condition_holds_names_the_values_and_what_to_add(tmp_path: Path, kind: str) -> None:
    """SpiffWorkflow's ExclusiveGatewayNavigation asks which branch, 'a' or 'b': an answer 'c' finds no
    flow to take. The run stopped with SpiffWorkflow's words ("No conditions satisfied for ...") and
    nothing about the values or what to change."""
    path = write(tmp_path, "branching", [
        '<bpmn:startEvent id="start"/>', '<bpmn:userTask id="ask"/>', f'<bpmn:{kind} id="which"/>',
        script("do_a", "done = 'a'"), script("do_b", "done = 'b'"), '<bpmn:endEvent id="end"/>',
        flow("start", "ask"), flow("ask", "which"), flow("which", "do_a", "branch == 'a'"),
        flow("which", "do_b", "branch == 'b'"), flow("do_a", "end"), flow("do_b", "end"),
    ])
    with pytest.raises(Exception, match="No conditions satisfied"):
        run_plain(path, {}, {"ask": {"branch": "c"}})

    engine = Engine()
    instance = engine.run(engine.start(load_process(path)))
    instance = engine.complete_user_task(instance, instance.waiting_for[0]["id"], {"branch": "c"})
    assert instance.status == "error" and instance.error["task_id"] == "which"
    message = instance.error["message"]
    assert "No conditions satisfied" not in message, message
    assert all(w in message for w in ("'which'", "branch == 'a'", "branch == 'b'", "branch='c'", "default")), message


# ----- a process or sub-process with no start event ------------------------------------------------

@pytest.mark.parametrize("inside", [False, True], ids=["process", "sub-process"])
def test_a_scope_with_no_start_event_says_where_to_draw_one(tmp_path: Path, inside: bool) -> None:
    """SpiffWorkflow's Invalid-Workflows/No-Start-Event: SpiffWorkflow refuses the process ("No start event
    found", or for a sub-process "Exactly one start event is required in a SubWorkflow Task; found 0");
    validate passed that on with "fix the BPMN element named here", not saying what to draw or where."""
    steps = [script("first", "x = 1"), '<bpmn:userTask id="second"/>', '<bpmn:endEvent id="done"/>',
             flow("first", "second"), flow("second", "done")]
    if inside:
        path = write(tmp_path, "startless", [
            '<bpmn:startEvent id="start"/>', '<bpmn:subProcess id="inner">' + "".join(steps) + "</bpmn:subProcess>",
            '<bpmn:endEvent id="end"/>', flow("start", "inner"), flow("inner", "end")])
    else:
        path = write(tmp_path, "startless", steps)
    with pytest.raises(ValidationException, match="start event"):
        run_plain(path, {}, {})

    errors = [p for p in validate_process([path]).problems if p.severity == "error"]
    scope = "inner" if inside else "startless"
    assert [(p.code, p.element_id) for p in errors] == [("no_start_event", scope)], errors
    assert "bpmn:startEvent" in errors[0].message and "'first'" in errors[0].message, errors[0].message
    with pytest.raises(ProcessError, match=f"'{scope}'"):
        load_process(path)


# ----- joins that each close part of one split ----------------------------------------------------

@pytest.mark.parametrize("inside", [False, True], ids=["process", "sub-process"])
def test_joins_that_each_close_part_of_a_split_merge_their_branches_and_the_rest_at_the_end(
        tmp_path: Path, inside: bool) -> None:
    """SpiffWorkflow's Parallel-Many-Threads-At-Same-Point-Nested: a split of four branches, one
    parallel join for two of them and one for the other two, both going on to one task and the end.
    Each join fires when its two branches are in, and the task runs once after each (plain
    SpiffWorkflow completes it). layerflow stopped the instance at the first join ("fired with 2 of
    the 4 branches"), though the other two never reach that join; validate had said it was valid."""
    steps = [
        '<bpmn:parallelGateway id="split"/>', script("a", "a = 1"), script("b", "b = 2"), script("c", "c = 3"),
        '<bpmn:userTask id="d"/>', '<bpmn:parallelGateway id="join_ab"/>', '<bpmn:parallelGateway id="join_cd"/>',
        script("sum_ab", "ab = a + b"), script("sum_cd", "cd = c + d"), script("done", "seen = True"),
        '<bpmn:endEvent id="finish"/>',
        *(flow("split", t) for t in "abcd"), flow("a", "join_ab"), flow("b", "join_ab"), flow("c", "join_cd"),
        flow("d", "join_cd"), flow("join_ab", "sum_ab"), flow("join_cd", "sum_cd"), flow("sum_ab", "done"),
        flow("sum_cd", "done"), flow("done", "finish"),
    ]
    if inside:
        elements = ['<bpmn:startEvent id="start"/>',
                    '<bpmn:subProcess id="inner"><bpmn:startEvent id="inner_start"/>' + "".join(steps)
                    + flow("inner_start", "split") + "</bpmn:subProcess>",
                    script("after", "total = ab + cd"), '<bpmn:endEvent id="end"/>',
                    flow("start", "inner"), flow("inner", "after"), flow("after", "end")]
    else:
        elements = ['<bpmn:startEvent id="start"/>', *steps, flow("start", "split")]
    path = write(tmp_path, "four_ways", elements)
    plain_wf, _ = run_plain(path, {}, {"d": {"d": 4}})
    assert validate_process([path]).ok

    store = f"sqlite:///{tmp_path / 'runs.db'}"
    engine = Engine(store=store)
    instance = engine.run(engine.start(load_process(path)))
    assert instance.status == "waiting", instance.error
    instance = Engine(store=store).load(instance.id)  # the first join's merge, saved and loaded
    instance = engine.complete_user_task(instance, instance.waiting_for[0]["id"], {"d": 4})

    assert instance.status == "completed", instance.error
    assert path_of(instance.workflow) == path_of(plain_wf)
    expected = {"a": 1, "b": 2, "c": 3, "d": 4, "ab": 3, "cd": 7, "seen": True}
    assert variables(instance.main) == ({**expected, "total": 10} if inside else expected)
    assert instance.conflicts == []
    for ctx in instance.contexts.values():
        assert LayeredContext.replay(ctx.tape) == ctx


# ----- nested splits whose inner joins each settled a conflict -------------------------------------

def test_the_conflict_logs_of_nested_joins_add_up_at_the_outer_join(tmp_path: Path) -> None:
    """SpiffWorkflow's Parallel-Multiple-Splits-And-Joins, with branches that disagree: each outer branch
    splits again, and each inner join settles a conflict (answered in advance). Each inner join adds
    its entry to ``_mergedConflicts``; the outer join then saw two branches change that log differently
    and asked a person to pick one of the two lists (dropping the other's entries)."""
    path = write(tmp_path, "nested_votes", [
        '<bpmn:startEvent id="start"/>', '<bpmn:parallelGateway id="outer"/>',
        '<bpmn:parallelGateway id="split_1"/>', script("one_a", "x = 'a'"), script("one_b", "x = 'b'"),
        '<bpmn:parallelGateway id="join_1"/>', '<bpmn:parallelGateway id="split_2"/>', script("two_a", "y = 'a'"),
        script("two_b", "y = 'b'"), '<bpmn:parallelGateway id="join_2"/>', '<bpmn:parallelGateway id="outer_join"/>',
        '<bpmn:endEvent id="end"/>', flow("start", "outer"), flow("outer", "split_1"), flow("outer", "split_2"),
        flow("split_1", "one_a"), flow("split_1", "one_b"), flow("one_a", "join_1"), flow("one_b", "join_1"),
        flow("split_2", "two_a"), flow("split_2", "two_b"), flow("two_a", "join_2"), flow("two_b", "join_2"),
        flow("join_1", "outer_join"), flow("join_2", "outer_join"), flow("outer_join", "end"),
    ])
    plain_wf, _ = run_plain(path, {}, {})
    engine = Engine()
    instance = engine.run(engine.start(load_process(path)), answers={"confirmations": {"join_1/x": "a", "join_2/y": "b"}})

    assert instance.status == "completed", (instance.error, instance.waiting_for)
    assert path_of(instance.workflow) == path_of(plain_wf)
    assert variables(instance.main) == {"x": "a", "y": "b"}
    log = instance.main.resolve("_mergedConflicts")
    assert [(e["gatewayId"], e["key"], e["resolution"]["value"]) for e in log] == [("join_1", "x", "a"), ("join_2", "y", "b")]
    assert [(c["gateway_id"], c["key"]) for c in instance.conflicts] == [("join_1", "x"), ("join_2", "y")]


def test_a_join_that_closes_part_of_a_split_in_a_loop_merges_each_pass(tmp_path: Path) -> None:
    """Two of three branches meet at a first join, the third at a second one after it; the process
    goes round again. The third branch reaches the first join only through the split again (with
    new branches), so it never comes to this pass's first join. (Plain SpiffWorkflow 3.2 does not run
    this loop: its engine steps end in a RecursionError; each branch here reads ``n`` as the split left it.)"""
    path = write(tmp_path, "staged_rounds", [
        '<bpmn:startEvent id="start"/>', script("count", "n = 0"), '<bpmn:parallelGateway id="split"/>',
        script("a", "n = n + 1"),
        script("b", "b = n * 10"), '<bpmn:userTask id="c"/>', '<bpmn:parallelGateway id="join_ab"/>',
        script("sum_ab", "ab = n + b"), '<bpmn:parallelGateway id="join_all"/>',
        '<bpmn:exclusiveGateway id="again" default="done"/>', '<bpmn:endEvent id="end"/>',
        flow("start", "count"), flow("count", "split"), *(flow("split", t) for t in "abc"), flow("a", "join_ab"),
        flow("b", "join_ab"),
        flow("join_ab", "sum_ab"), flow("sum_ab", "join_all"), flow("c", "join_all"), flow("join_all", "again"),
        flow("again", "split", "n < 2"), '<bpmn:sequenceFlow id="done" sourceRef="again" targetRef="end"/>',
    ])
    engine = Engine()
    instance = engine.run(engine.start(load_process(path)), answers={"user_tasks": {"c": {"c": "seen"}}})

    assert instance.status == "completed", instance.error
    taken = path_of(instance.workflow)
    assert (taken.count("a"), taken.count("c"), taken[-2:]) == (2, 2, ["again", "end"]), taken
    assert variables(instance.main) == {"n": 2, "b": 10, "ab": 12, "c": "seen"}
    joins = [e.data.get("gateway_id") for e in instance.main.tape if e.changes and e.data.get("gateway_id")]
    assert joins == ["join_all", "join_all"]  # once a pass; join_ab merged into a branch of the split
    assert instance.conflicts == []


# ----- a multi-instance sub-process whose instances set no output item ------------------------------

@pytest.mark.parametrize("kind", ["scriptTask", "subProcess"])
def test_an_output_item_named_by_its_name_not_its_id_names_the_activity_and_the_id(tmp_path: Path, kind: str) -> None:
    """SpiffWorkflow reads a multi-instance activity's outputDataItem by its id; a modeler that gives
    it an id like DataOutput_1 and the name the script writes makes every instance end without it.
    Plain SpiffWorkflow raises "Expected an output item."; for a sub-process layerflow passed that on
    as an engine error naming no task."""
    loop = ('<bpmn:multiInstanceLoopCharacteristics><bpmn:loopDataInputRef>pieces</bpmn:loopDataInputRef>'
            '<bpmn:loopDataOutputRef>results</bpmn:loopDataOutputRef><bpmn:inputDataItem id="piece" name="piece"/>'
            '<bpmn:outputDataItem id="DataOutput_1" name="result"/></bpmn:multiInstanceLoopCharacteristics>')
    if kind == "scriptTask":
        body = f'<bpmn:scriptTask id="double">{loop}<bpmn:script>result = piece * 2</bpmn:script></bpmn:scriptTask>'
    else:
        body = (f'<bpmn:subProcess id="double">{loop}<bpmn:startEvent id="inner_start"/>' + script("calc", "result = piece * 2")
                + '<bpmn:endEvent id="inner_end"/>' + flow("inner_start", "calc") + flow("calc", "inner_end") + "</bpmn:subProcess>")
    path = write(tmp_path, "doubles", [
        '<bpmn:startEvent id="start"/>', script("prepare", "pieces = [1, 2]"), body, '<bpmn:endEvent id="end"/>',
        flow("start", "prepare"), flow("prepare", "double"), flow("double", "end"),
    ])
    with pytest.raises(Exception, match="Expected an output item"):
        run_plain(path, {}, {})
    instance = run_ours(path)

    assert instance.status == "error" and instance.error["task_id"] == "double", instance.error
    message = instance.error["message"]
    assert "'DataOutput_1'" in message and "its id" in message and "'result'" in message, message
    assert "WorkflowDataException" not in message


@pytest.mark.parametrize(("item", "reads"), [
    ('<bpmn:inputDataItem id="DataInput_1" name="piece"/><bpmn:outputDataItem id="result" name="result"/>', "piece"),
    ('<bpmn:inputDataItem id="piece" name="piece"/><bpmn:outputDataItem id="DataOutput_1" name="result"/>', "result"),
], ids=["input", "output"])
def test_validate_warns_of_a_data_item_whose_name_is_not_its_id(tmp_path: Path, item: str, reads: str) -> None:
    """The variable of a multi-instance item is its id; a script written for its name fails at run time
    (NameError for the input item, no output item) though validate had said nothing."""
    path = write(tmp_path, "items", [
        '<bpmn:startEvent id="start"/>', script("prepare", "pieces = [1, 2]"),
        '<bpmn:scriptTask id="double"><bpmn:multiInstanceLoopCharacteristics><bpmn:loopDataInputRef>pieces'
        '</bpmn:loopDataInputRef><bpmn:loopDataOutputRef>results</bpmn:loopDataOutputRef>' + item +
        '</bpmn:multiInstanceLoopCharacteristics><bpmn:script>result = piece * 2</bpmn:script></bpmn:scriptTask>',
        '<bpmn:endEvent id="end"/>', flow("start", "prepare"), flow("prepare", "double"), flow("double", "end"),
    ])
    report = validate_process([path])
    [warning] = [p for p in report.problems if p.code == "data_item_named_apart"]
    assert (warning.severity, warning.element_id) == ("warning", "double")
    assert f"name={reads!r}" in warning.message and f"id={reads!r}" in warning.message, warning.message
    assert report.ok
    assert run_ours(path).status == "error"

    fixed = path.read_text(encoding="utf-8").replace('id="DataInput_1"', 'id="piece"').replace('id="DataOutput_1"',
                                                                                                 'id="result"')
    path.write_text(fixed, encoding="utf-8")
    assert [p for p in validate_process([path]).problems if p.code == "data_item_named_apart"] == []
    assert run_ours(path).status == "completed"


def test_validate_warns_of_a_task_data_input_whose_name_is_not_its_id(tmp_path: Path) -> None:
    """The same for a task's ioSpecification: the run stopped with "needs the data input(s)
    'DataInput_1'" though the context held 'net', the input's name."""
    io = ('<bpmn:ioSpecification><bpmn:dataInput id="DataInput_1" name="net"/><bpmn:inputSet id="tax_in">'
          '<bpmn:dataInputRefs>DataInput_1</bpmn:dataInputRefs></bpmn:inputSet><bpmn:outputSet id="tax_out"/>'
          '</bpmn:ioSpecification>')
    path = write(tmp_path, "taxing", [
        '<bpmn:startEvent id="start"/>', script("prepare", "net = 100"),
        f'<bpmn:scriptTask id="tax">{io}<bpmn:script>gross = net * 2</bpmn:script></bpmn:scriptTask>',
        '<bpmn:endEvent id="end"/>', flow("start", "prepare"), flow("prepare", "tax"), flow("tax", "end"),
    ])
    with pytest.raises(Exception, match="Missing data input"):
        run_plain(path, {}, {})
    [warning] = [p for p in validate_process([path]).problems if p.code == "data_item_named_apart"]
    assert (warning.element_id, warning.field) == ("tax", "dataInput")
    assert "id='DataInput_1'" in warning.message and "give it id='net'" in warning.message, warning.message


# ----- a catch event that names no message or signal -----------------------------------------------

@pytest.mark.parametrize(("definition", "ref"), [
    ('<bpmn:messageEventDefinition id="no_message"/>', "messageRef"),
    ('<bpmn:signalEventDefinition id="no_signal"/>', "signalRef"),
])
def test_a_catch_event_with_no_message_or_signal_named_is_a_warning(tmp_path: Path, definition: str, ref: str) -> None:
    """SpiffWorkflow's Invalid-Workflows (Multiple-Start-Events, Unsupported-Task) and boundary_event_split
    attach a message or signal boundary event that names no bpmn:message or bpmn:signal. SpiffWorkflow
    loads it; nothing can ever send it (`layerflow send` names the message), so the path after it never
    runs, and the instance listed it in waiting_for as an event named null. validate said nothing."""
    path = write(tmp_path, "unnamed", [
        '<bpmn:startEvent id="start"/>', '<bpmn:userTask id="work"/>',
        f'<bpmn:boundaryEvent id="poke" attachedToRef="work" cancelActivity="false">{definition}</bpmn:boundaryEvent>',
        script("react", "poked = True"), '<bpmn:endEvent id="end"/>', '<bpmn:endEvent id="poke_end"/>',
        flow("start", "work"), flow("work", "end"), flow("poke", "react"), flow("react", "poke_end"),
    ])
    plain_wf, plain_vars = run_plain(path, {}, {"work": {"done": True}})
    assert "react" not in path_of(plain_wf)

    report = validate_process([path])
    [warning] = [p for p in report.problems if p.code == "event_without_ref"]
    assert (warning.severity, warning.element_id, warning.field) == ("warning", "poke", ref)
    assert f"{ref}=" in warning.message and "never" in warning.message, warning.message
    assert report.ok
