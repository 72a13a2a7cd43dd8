"""Shapes met in public BPMN files, round 15: lanes that list their steps by flowNodeRef (jBPM's own
test of a lane, a ``.bpmn2`` file in the default namespace, and its parallel split to two signals
that each end in a terminate end event), complex gateways (bpmn-js's fixture of
every gateway kind), Signavio's export of a collapsed sub-process, and Bizagi Modeler's export of a
small calculation (two pools, the main one drawn empty; empty scripts; a gateway's flows with an
empty condition) and of three steps whose scripts Bizagi left empty. Each is in ``tests/engine/realworld15/`` (the file says where it comes from and
what was trimmed). Where plain SpiffWorkflow 3.2 runs a file, a case runs it there too and the path
and the variables must agree; where neither can, ``layerflow validate`` must say so, naming the file,
the element and what to do, and doing that must give a file that runs as in plain SpiffWorkflow."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from SpiffWorkflow.bpmn.util.event import BpmnEvent
from SpiffWorkflow.spiff.specs.event_definitions import SignalEventDefinition

from context_layers.errors import ProcessError
from engine import Engine, load_process
from engine.validate import validate_process

from engine_helpers import cli_in_a_tmp_store, path_of, run_json, run_plain, variables
from test_realworld_4 import rewritten
from test_realworld_12 import agree, problems
from test_realworld_13 import plain_workflow

HERE = Path(__file__).resolve().parent / "realworld15"
cli = cli_in_a_tmp_store  # the fixture "cli", here too


def errors(path: Path, process_id: str | None = None) -> dict[str, str]:
    """validate's errors: element id (or the field, for the file as a whole) -> its messages."""
    found: dict[str, str] = {}
    for p in validate_process([path], process_id=process_id).problems:
        if p.severity == "error":
            key = str(p.element_id or p.field)
            found[key] = f"{found[key]}\n{p}" if key in found else str(p)
    return found


# -- jBPM: a lane that lists its user tasks by flowNodeRef ----------------------------------------

LANE = HERE / "jbpm_lane.bpmn2"
LANE_ANSWERS = {"_2": {"greeting": "hello"}, "_3": {"farewell": "goodbye"}}


def test_a_jbpm_lane_of_user_tasks_runs_to_its_terminate_end_as_in_plain_spiffworkflow() -> None:
    """The lane (its name also in a drools metaData), the potentialOwner and the empty
    ioSpecifications load without a word; both people's answers reach the terminate end event on
    plain SpiffWorkflow's path, with its data."""
    instance, wf = agree(LANE, {}, LANE_ANSWERS)
    assert path_of(wf) == ["_1", "_2", "_3", "_4"]
    assert variables(instance.main) == {"greeting": "hello", "farewell": "goodbye"}


def test_a_waiting_user_task_names_the_lane_it_is_drawn_in(cli: Any) -> None:
    """SpiffWorkflow reads the lane of each task (``task_spec.lane``); the person's task waiting in
    it says which lane it is, so an application can route it to the lane's people; a task in no
    lane carries no ``lane``."""
    out = run_json(cli, "run", str(LANE), code=3)
    assert [(w["task_id"], w.get("lane")) for w in out["waiting_for"]] == [("_2", "My Lane")]


SWIMLANES = HERE / "swimlanes.bpmn"
SUB_START = ('<bpmn:manualTask id="subtask" name="Sub task" />',
             '<bpmn:startEvent id="sub_start" />\n      <bpmn:manualTask id="subtask" name="Sub task" />\n'
             '      <bpmn:endEvent id="sub_end" />\n'
             '      <bpmn:sequenceFlow id="to-subtask" sourceRef="sub_start" targetRef="subtask" />\n'
             '      <bpmn:sequenceFlow id="from-subtask" sourceRef="subtask" targetRef="sub_end" />')


def test_a_sub_process_in_a_lane_without_a_start_event_is_refused_naming_it() -> None:
    said = errors(SWIMLANES)
    assert list(said) == ["sub"]
    assert "swimlanes.bpmn" in said["sub"] and "has no start event" in said["sub"] and "to 'subtask'" in said["sub"]


def test_each_person_s_task_of_two_swimlanes_names_its_lane_and_the_run_agrees_with_plain_spiffworkflow(
        tmp_path: Path) -> None:
    """With the start event validate asked for, the customer's task waits in "Customer", the
    admin's in "Admin", and so does the manual task inside the sub-process the Admin lane lists (no
    flowNodeRef names it: it is in its sub-process's lane, as SpiffWorkflow reads it). Path and data
    are plain SpiffWorkflow's."""
    path = rewritten(tmp_path, SWIMLANES, [SUB_START])
    answers = {"fillform": {"form": "filled"}, "approveform": {"approved": True}, "subtask": {"done": True}}
    engine = Engine(store="memory://")
    instance = engine.run(engine.start(load_process([path]), {}))
    lanes = []
    while instance.status == "waiting":
        [item] = instance.waiting_for
        lanes.append((item["task_id"], item.get("lane")))
        instance = engine.complete_user_task(instance, item["task_id"], answers[item["task_id"]])
    assert lanes == [("fillform", "Customer"), ("approveform", "Admin"), ("subtask", "Admin")]
    wf, plain_data = run_plain(path, {}, answers)
    assert instance.status == "completed", instance.error
    assert path_of(instance.workflow) == path_of(wf)
    assert variables(instance.main) == plain_data == {"form": "filled", "approved": True, "done": True}


# -- jBPM: a parallel split to two signals, each path ending in a terminate end event ---------------

SPLIT = HERE / "jbpm_parallel_split_terminate.bpmn2"


@pytest.mark.parametrize("signal, end", [("Signal 1", "EndEvent_2"), ("Signal 2", "EndEvent_1")])
def test_the_first_signal_of_a_jbpm_parallel_split_terminates_the_other_path_as_in_plain_spiffworkflow(
        signal: str, end: str) -> None:
    """Both catch events wait after the split; the signal that comes first runs its path to its
    terminate end event, which ends the process with the other catch event still waiting, on plain
    SpiffWorkflow's path. The signal's payload goes into the context (README: its keys into
    WORKING, then HISTORY), where plain SpiffWorkflow, given no variable to hold it, drops it."""
    assert problems(SPLIT) == []
    engine = Engine(store="memory://")
    waiting = engine.run(engine.start(load_process([SPLIT]), {}))
    assert sorted((w["kind"], w["event"]) for w in waiting.waiting_for) == [("event", "Signal 1"), ("event", "Signal 2")]
    done = engine.send_event(waiting, signal, {"by": signal}, kind="signal")
    wf = plain_workflow(SPLIT, "BPMN2-ParallelSpitTerminate")
    wf.catch(BpmnEvent(SignalEventDefinition(signal), {"by": signal}))
    wf.do_engine_steps()
    assert done.status == "completed" and wf.is_completed()
    assert path_of(done.workflow) == path_of(wf) and path_of(wf)[-1] == end
    assert variables(done.main) == {"by": signal}
    assert dict(wf.last_task.data) == {}


# -- complex gateways -----------------------------------------------------------------------------

GATEWAYS = HERE / "bpmn_js_gateways.bpmn"


def test_a_complex_gateway_is_refused_naming_it_and_the_gateway_to_draw_instead() -> None:
    found = errors(GATEWAYS)
    assert "ComplexGateway_1" in found
    said = found["ComplexGateway_1"]
    assert "bpmn_js_gateways.bpmn" in said and "'ComplexGateway_1'" in said
    assert "SpiffWorkflow has no complex gateway" in said and "draw an inclusive gateway" in said
    assert 'set isExecutable="true"' in found["Process_1"]
    with pytest.raises(ProcessError, match="ComplexGateway_1"):
        load_process([GATEWAYS])


def test_a_complex_gateway_in_a_process_that_runs_is_refused_where_plain_spiffworkflow_fails_to_parse(
        tmp_path: Path) -> None:
    """Made executable and given a start event, the file still holds the complex gateway, which
    plain SpiffWorkflow cannot parse at all."""
    path = rewritten(tmp_path, GATEWAYS, [
        ('isExecutable="false">', 'isExecutable="true">\n    <bpmn:startEvent id="start"/>\n'
                                  '    <bpmn:sequenceFlow id="go" sourceRef="start" targetRef="ComplexGateway_1"/>')])
    assert "ComplexGateway_1" in errors(path)
    with pytest.raises(Exception, match="no support implemented for this task type"):
        run_plain(path, {}, {})


# -- Signavio: a collapsed sub-process and nothing else ------------------------------------------

SIGNAVIO = HERE / "signavio_collapsed_subprocess.bpmn"


def test_a_signavio_collapsed_sub_process_without_events_is_refused_naming_what_to_draw() -> None:
    found = errors(SIGNAVIO)
    process = "sid-12284d7c-64a5-4e10-a961-b5b2793abafc"
    assert 'set isExecutable="true"' in found[process]
    assert "has no start event" in found["SubProcess_1"]
    assert "to 'Task_1' and 'sid-E5C409EE-D285-456A-BB28-C1ABB0132774'" in found["SubProcess_1"]
    with pytest.raises(ProcessError, match=process):
        load_process([SIGNAVIO])


# -- Bizagi: an empty main pool, empty scripts, empty conditions ----------------------------------

BIZAGI = HERE / "bizagi_empty_conditions.bpmn"
BIZAGI_PROCESS = "Id_afe38634-abd2-4197-98b5-503c0877e173"
NO, SI = "Id_4cf212a8-eb51-4419-a94f-0be7bd7fa7fa", "Id_ebe36648-49e5-4218-9333-feaa54a5e205"


def test_bizagi_s_empty_main_pool_is_not_a_process_to_choose_from() -> None:
    """Bizagi draws its main participant as an empty pool beside the pool that holds the process:
    a process with nothing in it cannot be the one to run, so it is neither a candidate that makes
    the choice ambiguous nor told to draw a start event; what validate reports is the process the
    file holds (the gateway's flows with an empty condition), as when its id is given."""
    assert errors(BIZAGI) == errors(BIZAGI, BIZAGI_PROCESS)
    assert set(errors(BIZAGI)) == {NO, SI}


@pytest.mark.parametrize("flow", [NO, SI])
def test_an_empty_bizagi_condition_is_refused_naming_the_flow_the_gateway_and_what_to_write(flow: str) -> None:
    said = errors(BIZAGI, BIZAGI_PROCESS)[flow]
    assert "bizagi_empty_conditions.bpmn" in said and f"'{flow}'" in said
    assert "conditionExpression" in said and "'Id_aef1b59b-abcb-44f8-b0a2-4a5e06978d85'" in said
    with pytest.raises(Exception, match="outgoing sequence flow without condition"):
        plain_workflow(BIZAGI, BIZAGI_PROCESS)


SCRIPTS = {  # each script task by its outgoing flow: Tarea 1, Multiplicar, Sumar, Enviar Resultado
    "Id_a1480b2c-fa44-40a0-b332-fb467bdac7cb": "leido = True",
    "Id_dba6b463-de7d-4bf3-bc85-345ffad08ee8": "resultado = Numero1 * Numero2",
    "Id_a793ef20-610b-4421-93f5-a7eff61f587b": "resultado = Numero1 + Numero2",
    "Id_53c58a28-c431-4a6f-9e5f-05664099d623": "enviado = resultado",
}


EMPTY_POOL = [
    ('<process id="Id_308618d4-966d-4419-a64d-84dd56e7a810" name="Proceso principal">\n'
     '    <laneSet id="Id_784b4cc0-641a-42fb-ae14-44b2eab65072" />\n  </process>\n', ""),
    ('<participant id="Id_21149935-4d1f-48c5-9a5d-5df0f62aea4e" name="Proceso Principal" '
     'processRef="Id_308618d4-966d-4419-a64d-84dd56e7a810" />', ""),
]


def _calculation(tmp_path: Path, keep_empty_pool: bool = False) -> Path:
    """The file as validate says to write it: the "SI" flow given its condition (the gateway's
    name), "NO" the default flow, and the empty scripts filled in (Python); without the empty pool
    unless asked, for helpers that run a file's first process."""
    return rewritten(tmp_path, BIZAGI, [
        *([] if keep_empty_pool else EMPTY_POOL),
        ('gatewayDirection="Diverging">', f'gatewayDirection="Diverging" default="{NO}">'),
        ('<conditionExpression id="Expression_04afec58-2693-4851-a2f4-8533a6457140" />', ""),
        ('<conditionExpression id="Expression_9e579966-87e5-4803-afb9-e628bc7da609" />',
         '<conditionExpression id="Expression_9e579966-87e5-4803-afb9-e628bc7da609">Numero1 &gt; Numero2'
         '</conditionExpression>'),
        ('<process id="Id_afe38634-abd2-4197-98b5-503c0877e173">',
         '<process id="Id_afe38634-abd2-4197-98b5-503c0877e173" isExecutable="true">'),
        *[(f"<outgoing>{flow}</outgoing>\n      <script />", f"<outgoing>{flow}</outgoing>\n      <script>{script}</script>")
          for flow, script in SCRIPTS.items()],
    ])


@pytest.mark.parametrize("numbers, result", [((5, 3), 8), ((2, 7), 14), ((4, 4), 16)], ids=["SI", "NO", "equal"])
def test_the_bizagi_calculation_written_as_validate_says_runs_as_in_plain_spiffworkflow(
        tmp_path: Path, numbers: tuple[int, int], result: int) -> None:
    path = _calculation(tmp_path)
    data = {"Numero1": numbers[0], "Numero2": numbers[1]}
    instance, _ = agree(path, data)
    assert variables(instance.main) == {**data, "leido": True, "resultado": result, "enviado": result}


def test_the_bizagi_calculation_beside_its_empty_pool_runs_the_pool_that_holds_the_flow(tmp_path: Path) -> None:
    """Fixed as validate says, with Bizagi's empty main pool left in the file: layerflow runs the
    pool that holds the flow, as plain SpiffWorkflow does when given that pool's id (given none, it
    takes the first process, the empty pool: "No start event found")."""
    path = _calculation(tmp_path, keep_empty_pool=True)
    assert [p for p in problems(path) if p[1] == "error"] == []
    data = {"Numero1": 9, "Numero2": 2}
    engine = Engine(store="memory://")
    instance = engine.run(engine.start(load_process([path]), data))
    wf = plain_workflow(path, BIZAGI_PROCESS, data)
    assert instance.status == "completed", instance.error
    assert instance.process_id == BIZAGI_PROCESS
    assert path_of(instance.workflow) == path_of(wf)
    assert variables(instance.main) == dict(wf.last_task.data) == {**data, "leido": True, "resultado": 11, "enviado": 11}
    with pytest.raises(Exception, match="No start event found"):
        run_plain(path, data, {})


SCRIPTLESS = HERE / "bizagi_empty_scripts.bpmn"
LOGS = ["Id_8a13ebc1-f48c-444c-8412-2d6e4516de10", "Id_39ef24ff-8f0c-46f1-8bd3-718c2cd7681d",
        "Id_d91ff9fb-165f-465e-a3ae-6bffc75efbbb"]  # Log01, Log02, Log03


def test_bizagi_s_empty_scripts_are_warned_of_and_stop_the_run_at_the_first_naming_it(cli: Any) -> None:
    """Bizagi's script tasks with an empty script (the repository runs JavaScript handlers of its
    own for them): validate warns of each (a handler may be registered in Python), naming what to
    give; run, the instance stops at the first with an error naming it and what to write (exit 1
    on the command line), where plain SpiffWorkflow fails with Python's TypeError from exec()."""
    warned = {p.element_id: p.message for p in validate_process([SCRIPTLESS]).problems if p.code == "no_implementation"}
    assert list(warned) == [LOGS[1], LOGS[0], LOGS[2]]  # document order
    assert all("write its Python script" in m and "handler" in m for m in warned.values())
    out = run_json(cli, "run", str(SCRIPTLESS), code=1)
    assert out["status"] == "error" and out["error"]["task_id"] == LOGS[0]
    assert "has no script" in out["error"]["message"] and "write its Python script" in out["error"]["message"]
    with pytest.raises(Exception, match="exec\\(\\) arg 1 must be a string"):
        run_plain(SCRIPTLESS, {}, {})


def test_bizagi_s_empty_scripts_run_the_handlers_registered_for_them_in_order() -> None:
    """Given handlers, as the warning says, the three steps run in order to the end."""
    engine = Engine(store="memory://", handlers={t: (lambda actx, n=n: {f"log{n}": True}) for n, t in enumerate(LOGS, 1)})
    instance = engine.run(engine.start(load_process([SCRIPTLESS]), {}))
    assert instance.status == "completed", instance.error
    assert [t for t in path_of(instance.workflow) if t in LOGS] == LOGS
    assert variables(instance.main) == {"log1": True, "log2": True, "log3": True}


def test_validate_on_the_command_line_names_the_bizagi_file_and_the_flow(cli: Any) -> None:
    result = cli("validate", str(BIZAGI))
    assert result.exit_code == 2, result.output
    assert "bizagi_empty_conditions.bpmn" in result.output and NO in result.output
    assert "process_ambiguous" not in result.output and "no start event" not in result.output


def test_the_bizagi_calculation_runs_on_the_command_line(tmp_path: Path, cli: Any) -> None:
    out = run_json(cli, "run", str(_calculation(tmp_path)), "--data", '{"Numero1": 6, "Numero2": 1}')
    assert out["status"] == "completed", out["error"]
    assert out["layers"]["L3"]["enviado"] == 7


def test_no_problem_is_left_in_the_rewritten_files(tmp_path: Path) -> None:
    assert [p for p in problems(_calculation(tmp_path)) if p[1] == "error"] == []
    assert problems(LANE) == []


def test_the_refusals_name_the_file_and_line(tmp_path: Path) -> None:
    for path in (GATEWAYS, SIGNAVIO, BIZAGI):
        for message in errors(path).values():
            assert re.search(rf"{re.escape(path.name)}:\d+", message), message
