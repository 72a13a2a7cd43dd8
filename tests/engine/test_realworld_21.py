"""Public reference models, round 21, each written again in ``tests/engine/realworld21/`` (the file
says what it follows and what it leaves out; ``realworld21/README.md`` lists the sources): Operaton's
(Camunda 7's) engine tests of an inclusive join after a loop, an inclusive join after an event-based
gateway and unstructured parallel joins, Flowable's model-API tests of a two-pool collaboration with a
conversation and of one event carrying every event definition, ... Each is validated as given
(validate says what is wrong, naming the element and what to write), then, edited as validate says,
run to its end, compared with plain SpiffWorkflow where both run."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from SpiffWorkflow.bpmn.workflow import BpmnWorkflow
from SpiffWorkflow.spiff.parser.process import SpiffBpmnParser
from SpiffWorkflow.util.task import TaskState

from engine import Engine, load_process
from engine.validate import validate_process

from engine_helpers import flow, path_of, variables, write_elements
from test_realworld_4 import rewritten
from test_realworld_10 import plain_in_order
from test_realworld_12 import problems
from test_realworld_17 import said

HERE = Path(__file__).resolve().parent / "realworld21"


# -- Flowable's EventDefinitionsTest: one throw event carrying every event definition ---------------

EVERY = HERE / "flowable_every_event_definition.bpmn"


def test_an_event_carrying_definitions_bpmn_forbids_there_is_refused_naming_each_kind() -> None:
    """A throw event cannot wait (timer, conditional) nor end anything (terminate, error, cancel):
    SpiffWorkflow ignores such a definition and goes straight past the event. validate said
    nothing of it, and spoke of the event's timers as if it waited."""
    text = said(EVERY)["event"]
    misplaced = next(line for line in text.splitlines() if "which BPMN allows on no intermediate throw" in line)
    assert misplaced.startswith("error:")
    assert ("bpmn:intermediateThrowEvent 'event' has cancel, conditional, error, terminate and timer event "
            "definitions") in misplaced
    assert "SpiffWorkflow ignores them, so the event goes straight on" in misplaced
    assert "conditional and timer: to wait, draw an intermediate catch event with it" in misplaced
    assert "error and terminate: to end there, draw an end event with it" in misplaced
    assert "cancel: to end there, draw an end event with it inside the transaction" in misplaced


THROW_CATCH_END = [
    ("intermediateThrowEvent", '<bpmn:timerEventDefinition><bpmn:timeDuration>"PT1H"</bpmn:timeDuration>'
     '</bpmn:timerEventDefinition>', "timer", "to wait, draw an intermediate catch event with it"),
    ("intermediateThrowEvent", '<bpmn:terminateEventDefinition/>', "terminate", "to end there, draw an end event"),
    ("intermediateCatchEvent", '<bpmn:errorEventDefinition errorRef="err"/>', "error",
     "to catch an error, attach an error boundary event to the activity that throws it, or draw an event "
     "sub-process with an error start event"),
    ("intermediateCatchEvent", '<bpmn:escalationEventDefinition escalationRef="esc"/>', "escalation",
     "to catch an escalation, attach an escalation boundary event"),
    ("endEvent", '<bpmn:conditionalEventDefinition><bpmn:condition>x == 1</bpmn:condition>'
     '</bpmn:conditionalEventDefinition>', "conditional", "to wait, draw an intermediate catch event with it"),
    ("startEvent", '<bpmn:errorEventDefinition errorRef="err"/>', "error",
     "or put the start event in an event sub-process"),
]


@pytest.mark.parametrize("tag, definition, kind, todo", THROW_CATCH_END,
                         ids=[f"{t}-{k}" for t, _, k, _ in THROW_CATCH_END])
def test_one_misplaced_event_definition_is_refused_with_what_to_draw(tmp_path: Path, tag: str, definition: str,
                                                                     kind: str, todo: str) -> None:
    event = f'<bpmn:{tag} id="ev">{definition}</bpmn:{tag}>'
    elements = [event, '<bpmn:endEvent id="end"/>', flow("ev", "end")] if tag == "startEvent" else \
        ['<bpmn:startEvent id="start"/>', event, flow("start", "ev")] if tag == "endEvent" else \
        ['<bpmn:startEvent id="start"/>', event, '<bpmn:endEvent id="end"/>', flow("start", "ev"), flow("ev", "end")]
    path = write_elements(tmp_path, "misplaced", elements, '  <bpmn:error id="err" errorCode="E"/>\n'
                          '  <bpmn:escalation id="esc" escalationCode="X"/>\n')
    found = {p.element_id: str(p) for p in validate_process([path]).problems if p.code == "event_definition_misplaced"}
    assert list(found) == ["ev"]
    article = "an" if kind[0] in "aeiou" else "a"
    assert f"has {article} {kind} event definition, which BPMN allows on no " in found["ev"] and todo in found["ev"]


@pytest.mark.parametrize("tag, definition", [
    ("intermediateCatchEvent", '<bpmn:timerEventDefinition><bpmn:timeDuration>"PT1H"</bpmn:timeDuration>'
     '</bpmn:timerEventDefinition>'),
    ("intermediateThrowEvent", '<bpmn:escalationEventDefinition escalationRef="esc"/>'),
    ("intermediateThrowEvent", '<bpmn:signalEventDefinition signalRef="sig"/>'),
], ids=["timer-catch", "escalation-throw", "signal-throw"])
def test_an_event_definition_in_its_place_is_no_problem(tmp_path: Path, tag: str, definition: str) -> None:
    path = write_elements(tmp_path, "placed", [
        '<bpmn:startEvent id="start"/>', f'<bpmn:{tag} id="ev">{definition}</bpmn:{tag}>', '<bpmn:endEvent id="end"/>',
        flow("start", "ev"), flow("ev", "end")],
        '  <bpmn:escalation id="esc" escalationCode="X"/>\n  <bpmn:signal id="sig" name="sig"/>\n')
    assert "event_definition_misplaced" not in [code for code, _, _ in problems(path)]


def test_an_error_start_event_in_an_event_sub_process_is_in_its_place(tmp_path: Path) -> None:
    path = write_elements(tmp_path, "handled", [
        '<bpmn:startEvent id="start"/>', '<bpmn:scriptTask id="work"><bpmn:script>x = 1</bpmn:script></bpmn:scriptTask>',
        '<bpmn:endEvent id="end"/>', flow("start", "work"), flow("work", "end"),
        '<bpmn:subProcess id="on_error" triggeredByEvent="true"><bpmn:startEvent id="caught">'
        '<bpmn:errorEventDefinition errorRef="err"/></bpmn:startEvent><bpmn:endEvent id="handled_end"/>'
        + flow("caught", "handled_end") + '</bpmn:subProcess>'], '  <bpmn:error id="err" errorCode="E"/>\n')
    assert "event_definition_misplaced" not in [code for code, _, _ in problems(path)]


# -- jBPM's BPMN2-SignalEventSubProcess: a script raising a signal an event sub-process catches ------

SIGNAL_SUB = HERE / "jbpm_signal_event_subprocess.bpmn2"
SENDER = "_0CD6AAF6-226C-46B7-B764-83F83FCF6C09"


def test_the_jbpm_signal_sub_process_is_refused_for_its_java_and_the_signal_its_script_raises() -> None:
    """The Java scripts and the start event's mapping into the process property 'data' are refused;
    the first script raises 'SignalEvent' through kcontext, and validate now says which event to draw
    for it (it said only how to print and assign)."""
    refused = said(SIGNAL_SUB)
    assert "a script cannot raise signal 'SignalEvent' here (signalEvent): draw an intermediate throw event " \
        "after the task with a bpmn:signalEventDefinition whose signalRef names the bpmn:signal of that name" \
        in refused[SENDER]
    assert "targetRef 'data', a bpmn:property of the process" in refused["_5F7515CA-24C0-45D3-969A-DB2BB9B76142"]
    assert "the default namespace" not in "\n".join(refused.values())  # xmlns="http://www.omg.org/bpmn20" is no problem


def signal_sub_runnable(tmp_path: Path) -> Path:
    """As validate says: Python scripts, a signal throw event after the first, no mapping into 'data'."""
    text = SIGNAL_SUB.read_text()
    mapping = text[text.index("        <bpmn2:dataOutputAssociation"):text.index("</bpmn2:outputSet>") + 19]
    return rewritten(tmp_path, SIGNAL_SUB, [
        ('System.out.println("SignalEventSubProcess: Sending Signal");\n'
         'kcontext.getKnowledgeRuntime().signalEvent("SignalEvent", "data", kcontext.getProcessInstance().getId());',
         'sent = True'),
        ('System.out.println("SignalEventSubProcess: Ending");', 'ended_normally = True'),
        ('System.out.println("SignalEventSubProcess: CATCHING SIGNAL");', 'caught = True'),
        (mapping, ""), ('scriptFormat="http://www.java.com/java"', 'scriptFormat="python"'),
        ('<bpmn2:sequenceFlow id="_6B85BFF9-C6FD-4A87-B40A-65B83EF6FF8E" sourceRef="_0CD6AAF6-226C-46B7-B764-83F83FCF6C09"',
         '<bpmn2:intermediateThrowEvent id="raise_signal"><bpmn2:signalEventDefinition '
         'signalRef="_d2386f17-a83c-39b3-a4ee-a4cb599d9dce"/></bpmn2:intermediateThrowEvent>\n'
         '    <bpmn2:sequenceFlow id="to_raise_signal" sourceRef="_0CD6AAF6-226C-46B7-B764-83F83FCF6C09" '
         'targetRef="raise_signal"/>\n    <bpmn2:sequenceFlow id="_6B85BFF9-C6FD-4A87-B40A-65B83EF6FF8E" '
         'sourceRef="raise_signal"'),
    ])


def test_the_jbpm_signal_sub_process_edited_runs_the_event_sub_process_whose_terminate_ends_it(tmp_path: Path) -> None:
    """The thrown signal starts the (interrupting) event sub-process, which cancels the rest of the
    process: "Should not be executed" never runs, as jBPM's test expects. Plain SpiffWorkflow 3.2
    ignores isInterrupting and goes on to run it (the README says so): the engine is right here."""
    path = signal_sub_runnable(tmp_path)
    assert validate_process([path]).problems == ()
    engine = Engine(store="memory://")
    instance = engine.run(engine.start(load_process([path]), {}))
    assert instance.status == "completed", instance.error
    assert variables(instance.main) == {"sent": True, "caught": True}
    not_run = "_FDB4D3CF-2752-4738-9395-3A0A23964AA8"
    assert not_run not in path_of(instance.workflow)
    wf = plain_in_order(path, "SignalEventSubProcess", [])
    assert wf.is_completed() and not_run in path_of(wf)
    assert [t for t in path_of(wf) if t != not_run and t != "_69CB9876-EB52-4898-88EB-32C1E5D500B7"] \
        == path_of(instance.workflow)


# -- jBPM's BPMN2-IntermediateLinkEvent: two link jumps, two flows of one id ----------------------

LINKS = HERE / "jbpm_link_events.bpmn2"


def test_the_jbpm_link_process_is_refused_for_its_shared_flow_id_and_java_prints() -> None:
    refused = said(LINKS)
    assert "id '_481A2782-FC17-41CB-BC28-5799B6866A81' is used twice in this file (first on line 30)" \
        in refused["_481A2782-FC17-41CB-BC28-5799B6866A81"]
    assert "write it as 'print(\"about to jump\")'" in refused["_seqid123"]
    assert "link" not in refused.get("_id_1", "") + refused.get("_id_3", "")  # the links pair up


def test_the_jbpm_link_process_edited_jumps_twice_to_its_end(tmp_path: Path) -> None:
    text = LINKS.read_text()
    second = text.rindex("id='_481A2782-FC17-41CB-BC28-5799B6866A81'")
    (tmp_path / "src").mkdir()
    source = tmp_path / "src" / LINKS.name
    source.write_text(text[:second] + "id='_481A2782-FC17-41CB-BC28-5799B6866A83'" + text[second + 42:])
    path = rewritten(tmp_path, source, [('System.out.println("about to jump");', 'jumps = 0'),
                                        ('System.out.println("jumped");', 'jumps += 1'),
                                        ('System.out.println("jumped 2");', 'jumps += 1')])
    assert [p.code for p in validate_process([path]).problems] == ["process_executable_unset"]
    engine = Engine(store="memory://")
    instance = engine.run(engine.start(load_process([path]), {}))
    assert instance.status == "completed", instance.error
    assert variables(instance.main) == {"jumps": 2}


# -- Operaton's InclusiveGatewayTest.testLoop: inclusive joins after a loop, an implicit split ------

LOOP = HERE / "inclusive_join_after_loop.bpmn"


def test_the_groovy_loop_is_refused_for_its_groovy_not_for_the_indentation_of_its_cdata() -> None:
    """The Groovy script sits indented in its CDATA block: Python's first complaint is the indent,
    which hid why the script is no Python; validate now names the Groovy line's own error."""
    refused = said(LOOP)
    assert "this one is not Python (expected '(' in 'def processInstance = execution.getProcessInstance()')" \
        in refused["A"]
    assert "unexpected indent" not in refused["A"]
    assert "write 'counter <= 5'" in refused["flow5"] and "write 'counter > 5'" in refused["flow6"]


def test_an_indented_python_script_still_says_it_is_indented(tmp_path: Path) -> None:
    """Dedented, the script parses: its indentation is all that is wrong, and validate says so."""
    path = write_elements(tmp_path, "indented", [
        '<bpmn:startEvent id="start"/>', '<bpmn:scriptTask id="A" scriptFormat="groovy"><bpmn:script>\n'
        '      counter = 1\n      counter += 1\n</bpmn:script></bpmn:scriptTask>', '<bpmn:endEvent id="end"/>',
        flow("start", "A"), flow("A", "end")])
    assert "this one is not Python (unexpected indent in 'counter = 1')" in said(path)["A"]


LOOP_IN_PYTHON = [('scriptFormat="groovy"', 'scriptFormat="python"'), ("${counter <= 5}", "counter <= 5"),
                  ("${counter > 5}", "counter > 5")]


def loop_runnable(tmp_path: Path) -> Path:
    text = LOOP.read_text()
    groovy = text[text.index("<script><![CDATA["):text.index("]]></script>") + 12]
    return rewritten(tmp_path, LOOP, [*LOOP_IN_PYTHON, (groovy, "<script>counter = counter + 1</script>")])


def test_the_loop_edited_runs_a_five_times_then_both_inclusive_joins_as_plain_spiffworkflow(tmp_path: Path) -> None:
    """The start event's three flows run side by side; A loops until counter is 6; the first
    inclusive join waits for A's loop and B, the second for that and C. counter comes with the start
    data, so it is mapped to WORKING for A to change it (PROCESS keys are append-only)."""
    path = loop_runnable(tmp_path)
    assert validate_process([path]).problems == ()
    steps = [("C", {"seen": True}), ("B", {})]
    engine = Engine(store="memory://")
    (tmp_path / "inclusive_join_after_loop.layerflow.yaml").write_text("data_layers:\n  counter: WORKING\n")
    instance = engine.run(engine.start(load_process([path]), {"counter": 1}), answers={"user_tasks": dict(steps)})
    assert instance.status == "completed", instance.error
    assert variables(instance.main) == {"counter": 6, "seen": True}
    assert path_of(instance.workflow).count("A") == 5
    wf = plain_in_order(path, "inclusiveTestLoop", steps, {"counter": 1})
    # plain SpiffWorkflow's join lets the last branch (C's, counter 1) win every key it carries
    # (SpiffWorkflow#440); layerflow's three-way merge keeps A's change
    assert wf.is_completed() and wf.last_task.data["counter"] == 1
    assert sorted(path_of(instance.workflow)) == sorted(path_of(wf))


# -- Operaton's InclusiveGatewayTest.testJoinAfterEventBasedGateway: flows without ids -------------

AFTER_RACE = HERE / "inclusive_join_after_event_gateway.bpmn"


def test_the_join_after_the_race_is_refused_for_flows_without_ids_and_juel_trues() -> None:
    found = [(p.code, p.field) for p in validate_process([AFTER_RACE]).problems]
    assert found.count(("flow_id_missing", "id")) == 11
    assert found.count(("condition_syntax", "conditionExpression")) == 2
    assert len(found) == 13


def test_the_join_after_the_race_edited_waits_for_the_person_and_the_message_that_won(tmp_path: Path) -> None:
    text = AFTER_RACE.read_text()
    edits = [("${true}", "True")]
    for n, at in enumerate(m for m in range(len(text)) if text.startswith("<sequenceFlow sourceRef", m)):
        edits.append((text[at:text.index(">", at)], f'<sequenceFlow id="flow{n + 1}"' + text[at + 13:text.index(">", at)]))
    path = rewritten(tmp_path, AFTER_RACE, edits)
    assert validate_process([path]).problems == ()
    engine = Engine(store="memory://")
    instance = engine.run(engine.start(load_process([path]), {}), answers={"user_tasks": {"theTask": {"done": 1}}})
    assert instance.status == "waiting"
    assert [(w["task_id"], w["event"], w["event_id"]) for w in instance.waiting_for] == [
        ("eventBasedGateway", "foo", "catch1"), ("eventBasedGateway", "bar", "catch2")]
    instance = engine.send_event(instance, "bar", {"won": "bar"})
    assert [w["task_id"] for w in instance.waiting_for] == ["taskAfterJoin"]
    instance = engine.run(instance, answers={"user_tasks": {"taskAfterJoin": {"after": True}}})
    assert instance.status == "completed", instance.error
    assert "catch2" in path_of(instance.workflow) and "catch1" not in path_of(instance.workflow)
    assert variables(instance.main) == {"done": 1, "won": "bar", "after": True}
