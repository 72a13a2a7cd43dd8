"""Public reference models, round 21, each written again in ``tests/engine/realworld21/`` (the file
says what it follows and what it leaves out; ``realworld21/README.md`` lists the sources and
licences): Operaton's (Camunda 7's) engine tests of an inclusive join after a loop, an inclusive join
after an event-based gateway, unstructured parallel joins and two escalation cases, Flowable's
model-API tests of a two-pool collaboration with a conversation and of one event carrying every event
definition, jBPM's link events and signal event sub-process, the MIWG's C.4.0 onboarding (Trisotech:
pools that speak by a signal) and A.4.1 (Signavio: two pools, message flows between plain tasks) and Camunda 8's get-up timers (saved with a BOM and CRLF) and async
retry loop. Each is validated as given (validate says what is wrong, naming the element and what to
write), then, edited as validate says, run to its end, compared with plain SpiffWorkflow where both
run and the difference where the engine is right and SpiffWorkflow is not."""

from __future__ import annotations

from pathlib import Path

import pytest

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
    # (it said "this one is not Python": it is, at column 0; test_realworld_25 has the Groovy println case)
    assert "its lines are indented (unexpected indent in 'counter = 1'); it is Python once its lines start at " \
        "column 0" in said(path)["A"]


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


# -- Operaton's ParallelGatewayTest.testUnstructuredConcurrencyTwoJoins ---------------------------

TWO_JOINS = HERE / "unstructured_two_joins.bpmn"
MANUAL = [(f"task{n}", {f"did_{n}": True}) for n in range(1, 7)]


def test_unstructured_joins_are_valid_and_run_to_the_end_as_plain_spiffworkflow() -> None:
    """join1 joins two of the fork's three branches and forks again; join2 joins the third with
    join1's three. No problem, and every manual task's answer reaches the end."""
    assert problems(TWO_JOINS) == []
    engine = Engine(store="memory://")
    instance = engine.run(engine.start(load_process([TWO_JOINS]), {}), answers={"user_tasks": dict(MANUAL)})
    assert instance.status == "completed", instance.error
    assert variables(instance.main) == {key: True for _, answer in MANUAL for key in answer}
    wf = plain_in_order(TWO_JOINS, "unstructuredConcurrencyTwoJoins", MANUAL)
    assert wf.is_completed() and sorted(path_of(wf)) == sorted(path_of(instance.workflow))
    assert path_of(wf).count("join2") == 1 and path_of(instance.workflow).count("join2") == 1


# -- Flowable's CollaborationParserTest: two pools, neither executable, a conversation ------------

COLLAB = HERE / "flowable_collaboration_conversation.bpmn"


def test_the_flowable_collaboration_is_refused_naming_both_pools_and_warns_of_each_silent_part() -> None:
    refused = said(COLLAB)
    for pid in ("process1", "process2"):
        assert refused[pid].startswith("error:") and f"process {pid!r} has isExecutable='false'" in refused[pid]
    for catch in ("intermediateCatchEvent1", "startEvent2"):
        assert refused[catch].startswith("warning:") and "names none: nothing can send it" in refused[catch]
    for task in ("serviceTask1", "ServiceTask_2", "serviceTask3"):
        assert "has no handler" in refused[task]
    assert not {"conversation1", "conversationLink1", "messageFlow1", "participant1"} & set(refused)


# -- MIWG C.4.0: onboarding, pools that speak by a signal, data stores, a "semantic:" prefix ------

C40 = HERE / "miwg_c40_onboarding.bpmn"
BANK, IT = "_42cba3a9-a8ab-40b5-b9a4-2e8f32be364e", "_f0035388-f829-470c-b82b-0b15c3da3399"
HIRED_THROW, HIRED_START = "_855451b0-5298-48b2-a81d-84ecbcca0a85", "_e9306b3f-3a77-42e1-b53e-2ed8ee45486d"
CONTRACT_GATEWAY = "_f9e3cd76-809a-48b5-be1c-e84fc4324268"


def c40_runnable(tmp_path: Path) -> Path:
    """C.4.0 as validate says: no data stores, the contract decision's flows given conditions."""
    import re

    text = C40.read_text()
    text = re.sub(r"\s*<semantic:dataStore(Reference)? [^>]*/>", "", text)
    text = re.sub(r"\s*<semantic:data(In|Out)putAssociation .*?</semantic:data\1putAssociation>", "", text, flags=re.S)
    (tmp_path / "src").mkdir(exist_ok=True)
    source = tmp_path / "src" / C40.name
    source.write_text(text)
    decision = f'sourceRef="{CONTRACT_GATEWAY}" targetRef="{{}}"/>'
    return rewritten(tmp_path, source, [
        (decision.format("_aa275782-c989-49ba-bf94-c58916ca7bb5"), decision.format("_aa275782-c989-49ba-bf94-c58916ca7bb5")[:-2]
         + "><semantic:conditionExpression>accepted</semantic:conditionExpression></semantic:sequenceFlow>"),
        (decision.format("_987b9b74-333a-4043-a72a-daadf667acc7"), decision.format("_987b9b74-333a-4043-a72a-daadf667acc7")[:-2]
         + "><semantic:conditionExpression>not accepted</semantic:conditionExpression></semantic:sequenceFlow>")])


def test_the_miwg_onboarding_is_refused_for_its_data_store_its_bare_decision_and_two_pools_to_choose_from() -> None:
    """The BPMN namespace bound to "semantic", a default namespace of Trisotech's and one
    collaboration per pool are read as they should be; what stops it is true and precise."""
    found = {(p.code, p.element_id): str(p) for p in validate_process([C40]).problems if p.severity == "error"}
    assert set(found) == {("process_ambiguous", None), ("data_store_unsupported", "_d367181e-c25a-407e-a5fb-817a27698a30"),
                          ("gateway_flow_without_condition", "_237c8380-5449-446e-a323-aad80181176d"),
                          ("gateway_flow_without_condition", "_7e9d8b8b-faa9-4264-858b-7454702c4ec2")}
    assert f"'{BANK}' (pool 'Money Bank'), '{IT}' (pool 'IT')" in found["process_ambiguous", None]


def test_the_bank_run_alone_is_told_its_signal_reaches_the_it_pool_in_no_instance(tmp_path: Path) -> None:
    """Money Bank throws "New employee hired", which only the IT pool's signal start event catches;
    run alone, nothing in the instance catches it. validate said nothing of it."""
    path = c40_runnable(tmp_path)
    warned = {p.element_id: str(p) for p in validate_process([path], process_id=BANK).problems
              if p.code == "signal_to_other_process"}
    assert set(warned) == {HIRED_THROW}
    assert (f"signal throw event {HIRED_THROW!r} of process {BANK!r} throws signal 'New employee hired', which "
            f"only process {IT!r} (pool 'IT') catches ({HIRED_START!r})") in warned[HIRED_THROW]
    assert "this one leaves the instance unheard (listed in `run --json`'s messages_out)" in warned[HIRED_THROW]
    assert f"layerflow run --process {IT}" in warned[HIRED_THROW]
    assert "layerflow send INSTANCE_ID 'New employee hired' --signal" in warned[HIRED_THROW]


def test_the_it_pool_run_alone_is_told_it_waits_for_the_signal_only_the_bank_throws(tmp_path: Path) -> None:
    path = c40_runnable(tmp_path)
    warned = {p.element_id: str(p) for p in validate_process([path], process_id=IT).problems
              if p.code == "signal_from_other_process"}
    assert set(warned) == {HIRED_START}
    text = warned[HIRED_START]
    assert (f"signal start event {HIRED_START!r} of process {IT!r} waits for signal 'New employee hired', which "
            f"only process {BANK!r} (pool 'Money Bank') throws ({HIRED_THROW!r})") in text
    assert "an instance starts waiting at" in text and "draw a plain start event" in text


def test_a_signal_thrown_and_caught_in_one_process_is_no_warning(tmp_path: Path) -> None:
    path = write_elements(tmp_path, "own_signal", [
        '<bpmn:startEvent id="start"/>', '<bpmn:parallelGateway id="split"/>',
        '<bpmn:intermediateThrowEvent id="shout"><bpmn:signalEventDefinition signalRef="sig"/></bpmn:intermediateThrowEvent>',
        '<bpmn:intermediateCatchEvent id="hear"><bpmn:signalEventDefinition signalRef="sig"/></bpmn:intermediateCatchEvent>',
        '<bpmn:parallelGateway id="join"/>', '<bpmn:endEvent id="end"/>', flow("start", "split"), flow("split", "hear"),
        flow("split", "shout"), flow("shout", "join"), flow("hear", "join"), flow("join", "end")],
        '  <bpmn:signal id="sig" name="sig"/>\n')
    assert not {"signal_to_other_process", "signal_from_other_process"} & {code for code, _, _ in problems(path)}


def test_the_it_pool_edited_waits_for_the_signal_then_runs_to_its_end(tmp_path: Path) -> None:
    path = c40_runnable(tmp_path)
    engine = Engine(store="memory://")
    instance = engine.run(engine.start(load_process([path], IT), {}))
    assert [(w["task_id"], w["event"], w["event_kind"]) for w in instance.waiting_for] == [
        (HIRED_START, "New employee hired", "signal")]
    instance = engine.send_event(instance, "New employee hired", {"employee": "Ada"}, kind="signal")
    assert [w["task_id"] for w in instance.waiting_for] == ["_7e9d2e5a-21f7-493b-9ae4-03245aa33a5c"]


# -- Camunda 8's get-up (timer-testing): timers in a loop, a join inside it, a BOM and CRLF --------

GET_UP = HERE / "camunda8_get_up.bpmn"
GET_UP_HANDLERS = '''
def call_kids(ctx):
    return {"calls": ctx.get("calls", 0) + 1}


def check(ctx):
    checks = ctx.get("checks", 0) + 1
    return {"checks": checks, "progress": ["in bed", "dressing", "ready"][min(checks, 3) - 1]}
'''


def test_get_up_with_a_bom_and_crlf_is_refused_for_its_bare_timers_and_feel_naming_each_line() -> None:
    """The byte order mark and Windows line endings change nothing: each problem is named on its
    line (the lines of this copy) with what to write."""
    found = {(p.code, p.element_id): (p.line, str(p)) for p in validate_process([GET_UP]).problems
             if p.severity == "error"}
    assert {eid for code, eid in found if code == "timer_expression"} == {
        "Wait5MinutesEvent1", "Wait15MinutesEvent", "Wait5MinutesEvent", "Wait15MinutesEvent1",
        "RunningLateBoundaryEvent"}
    line, text = found["timer_expression", "RunningLateBoundaryEvent"]
    assert GET_UP.read_bytes().split(b"\r\n")[line - 1].strip() \
        == b'<bpmn:timeDuration xsi:type="bpmn:tFormalExpression">PT1H</bpmn:timeDuration>'
    assert 'write it as a string: "PT1H"' in text
    assert "write 'progress == \"in bed\"'" in found["condition_syntax", "InBedSequenceFlow"][1]
    assert "write \"'breakfastPrepared' in locals()\"" in found["condition_syntax", "YesSequenceFlow"][1]


def get_up_runnable(tmp_path: Path) -> Path:
    edits = [(f">{d}</bpmn:timeDuration>", f'>"{d}"</bpmn:timeDuration>') for d in ("PT5M", "PT15M", "PT1H")]
    edits += [('=progress = "in bed"', 'progress == "in bed"'), ('=progress = "ready"', 'progress == "ready"'),
              ("=not(is defined(breakfastPrepared))", "'breakfastPrepared' not in locals()"),
              ("=is defined(breakfastPrepared)", "'breakfastPrepared' in locals()"),
              ('<zeebe:script expression="=true" resultVariable="breakfastPrepared" />', ""),
              ('<bpmn:outgoing>Flow_0dz740p</bpmn:outgoing>', '<bpmn:outgoing>Flow_0dz740p</bpmn:outgoing>'
               '<bpmn:script>breakfastPrepared = True</bpmn:script>')]
    path = rewritten(tmp_path, GET_UP, edits)
    (tmp_path / "get_up_handlers.py").write_text(GET_UP_HANDLERS)
    (tmp_path / "camunda8_get_up.layerflow.yaml").write_text(
        "TellKidsToGetUpTask:\n  handler: get_up_handlers.py:call_kids\n"
        "CheckCurrentProgressTask:\n  handler: get_up_handlers.py:check\n")
    return path


def test_get_up_edited_loops_through_its_timers_and_joins_to_school(tmp_path: Path) -> None:
    """Told to get up twice (in bed at the first check), dressing at the second, ready at the
    third; breakfast is prepared once (the second round finds it defined); 50 minutes in the
    sub-process, so the 1-hour "Running late" timer never fires. The parallel join inside the
    loop joins each round's timer and breakfast branch."""
    path = get_up_runnable(tmp_path)
    assert [p.code for p in validate_process([path]).problems if p.severity == "error"] == []
    now = [1_000_000.0]
    engine = Engine(store="memory://", clock=lambda: now[0])
    instance = engine.run(engine.start(load_process([path]), {}))
    waits = []
    for minutes in (15, 15, 5, 15):
        waits.append(sorted(w["task_id"] for w in instance.waiting_for if w["task_id"] != "RunningLateBoundaryEvent"))
        assert "RunningLateBoundaryEvent" in [w["task_id"] for w in instance.waiting_for]
        now[0] += minutes * 60
        instance = engine.run(instance, answers={"user_tasks": {"HaveBreakfastTask": {"ate": True}}})
    assert waits == [["Wait15MinutesEvent"], ["Wait15MinutesEvent"], ["Wait5MinutesEvent"],
                     ["Wait15MinutesEvent1"]]  # breakfast answered in advance
    assert sorted(w["task_id"] for w in instance.waiting_for) == ["GetKidsDressedTask", "Wait5MinutesEvent1"]
    now[0] += 5 * 60
    instance = engine.run(instance, answers={"user_tasks": {"GetKidsDressedTask": {"dressed": True},
                                                             "DriveKidsToSchoolTask": {"driven": True}}})
    assert instance.status == "completed", instance.error
    assert variables(instance.main) == {"calls": 2, "checks": 3, "progress": "ready", "breakfastPrepared": True,
                                        "ate": True, "dressed": True, "driven": True,
                                        # the service tasks' zeebe:ioMapping inputs, evaluated as FEEL
                                        "message": "Please get up",
                                        "options": ["in bed", "in bathroom", "dressing", "ready"]}
    ran = path_of(instance.workflow)
    assert ran.count("PrepareBreakfastTask") == 1 and ran.count("Gateway_0elxfmr") == 2
    assert "RunningLateBoundaryEvent" not in ran and "MakeThemReadyTask" not in ran


# -- Operaton's escalation tests: boundary events of one code, a non-interrupting event sub-process --

SAME_CODE = HERE / "escalation_boundaries_same_code.bpmn"
TWICE = HERE / "escalation_twice_non_interrupting.bpmn"


def with_flow_ids(tmp_path: Path, source: Path) -> Path:
    """The file with an id on each sequence flow, in order (f1, f2, ...), as validate asks."""
    text, parts = source.read_text(), []
    for n, piece in enumerate(text.split("<sequenceFlow ")):
        parts.append(piece if n == 0 else f'<sequenceFlow id="f{n}" {piece}')
    out = tmp_path / source.name
    out.write_text("".join(parts))
    return out


def test_two_boundary_events_catching_one_escalation_code_are_refused(tmp_path: Path) -> None:
    """Camunda 7 refuses the file; layerflow, as SpiffWorkflow, fired both boundary events on one
    escalation, so the path after them ran twice (myUserTask waited twice). validate said the file
    was valid once its flows had ids."""
    path = with_flow_ids(tmp_path, SAME_CODE)
    found = {p.element_id: str(p) for p in validate_process([path]).problems}
    assert list(found) == ["escalationBoundaryEvent2"]
    text = found["escalationBoundaryEvent2"]
    assert ("boundary events 'escalationBoundaryEvent1' and 'escalationBoundaryEvent2' of 'subProcess' both catch "
            "escalation code 'escalationCode'") in text
    assert "both fire on one escalation, and the path after each runs" in text
    assert "keep one" in text


@pytest.mark.parametrize("kind, first, second", [
    ("error", '<bpmn:error id="e1" errorCode="E"/>', '<bpmn:error id="e2" errorCode="E"/>'),
    ("error", "", ""),
    ("escalation", '<bpmn:escalation id="e1" escalationCode="X"/>', '<bpmn:escalation id="e2" escalationCode="Y"/>'),
], ids=["error-same-code", "error-both-catch-all", "escalation-different-codes"])
def test_boundary_events_of_one_activity_are_refused_only_when_one_throw_fires_both(
        tmp_path: Path, kind: str, first: str, second: str) -> None:
    ref = "errorRef" if kind == "error" else "escalationRef"
    refs = (f' {ref}="e1"', f' {ref}="e2"') if first else ("", "")
    path = write_elements(tmp_path, "boundaries", [
        '<bpmn:startEvent id="start"/>', '<bpmn:userTask id="work"/>', '<bpmn:endEvent id="end"/>',
        f'<bpmn:boundaryEvent id="b1" attachedToRef="work"><bpmn:{kind}EventDefinition{refs[0]}/></bpmn:boundaryEvent>',
        f'<bpmn:boundaryEvent id="b2" attachedToRef="work"><bpmn:{kind}EventDefinition{refs[1]}/></bpmn:boundaryEvent>',
        '<bpmn:endEvent id="caught"/>', flow("start", "work"), flow("work", "end"), flow("b1", "caught"),
        flow("b2", "caught")], f"  {first}\n  {second}\n")
    duplicated = [p.element_id for p in validate_process([path]).problems if p.code == "boundary_catch_twice"]
    assert duplicated == ([] if kind == "escalation" else ["b2"])


def test_a_non_interrupting_escalation_sub_process_starts_once_per_throw_beside_the_main_path(tmp_path: Path) -> None:
    """Each of the two escalation throws starts the event sub-process again (non-interrupting):
    two of its people's tasks wait beside the main path's, as Operaton's test expects."""
    assert {p.code for p in validate_process([TWICE]).problems} == {"flow_id_missing"}
    path = with_flow_ids(tmp_path, TWICE)
    assert validate_process([path]).problems == ()
    engine = Engine(store="memory://")
    instance = engine.run(engine.start(load_process([path]), {}))
    assert sorted(w["task_id"] for w in instance.waiting_for) == ["FirstTaskInMainprocess", "TaskInSubprocess"]
    instance = engine.run(instance, answers={"user_tasks": {"FirstTaskInMainprocess": {"first": 1}}})
    assert sorted(w["task_id"] for w in instance.waiting_for) == [
        "SecondTaskInMainprocess", "TaskInSubprocess", "TaskInSubprocess"]
    instance = engine.run(instance, answers={"user_tasks": {"SecondTaskInMainprocess": {"second": 2},
                                                             "TaskInSubprocess": {"handled": True}}})
    assert instance.status == "completed", instance.error
    assert path_of(instance.workflow).count("TaskInSubprocess") == 2
    assert variables(instance.main) == {"first": 1, "second": 2, "handled": True}


# -- Camunda 8's async-retry-counter: a retry loop through an event-based gateway and a timer ------

RETRY = HERE / "camunda8_async_retry.bpmn"


def test_the_retry_loop_is_refused_for_its_bare_timer_only_and_warns_of_the_job_worker() -> None:
    found = {(p.code, p.severity, p.element_id) for p in validate_process([RETRY]).problems}
    assert found == {("timer_expression", "error", "DeferRetryEvent"),
                     ("foreign_extension", "warning", "SendMessageTask")}


def test_the_retry_loop_edited_sends_again_after_a_fail_and_ends_on_success(tmp_path: Path) -> None:
    """"fail" wins the first race: after the 5-second timer the send task runs again and the
    gateway races anew; "success" then ends the instance."""
    path = rewritten(tmp_path, RETRY, [(">PT5S<", '>"PT5S"<')])
    now = [2_000_000.0]
    engine = Engine(store="memory://", clock=lambda: now[0])
    instance = engine.run(engine.start(load_process([path]), {"callbackId": "c-1"}))
    assert [(w["event"], w["event_id"]) for w in instance.waiting_for] == [
        ("success", "ResponseReceivedEvent"), ("fail", "ErrorReceivedEvent")]
    instance = engine.send_event(instance, "fail", {"reason": "busy"})
    assert [w["task_id"] for w in instance.waiting_for] == ["DeferRetryEvent"]
    now[0] += 5
    instance = engine.run(instance)
    assert [w["event"] for w in instance.waiting_for] == ["success", "fail"]
    instance = engine.send_event(instance, "success", {"answer": 42})
    assert instance.status == "completed", instance.error
    ran = path_of(instance.workflow)
    assert ran.count("SendMessageTask") == 2 and ran.count("Gateway_0lo9ey2") == 2
    assert variables(instance.main) == {"callbackId": "c-1", "reason": "busy", "answer": 42}


# -- MIWG A.4.1 (Signavio): two pools, message flows between plain tasks, an implicit split -------

A41 = HERE / "miwg_a41_signavio_pools.bpmn"
POOL_1, POOL_2 = "sid-34746A54-1D7D-46CA-B219-0C4CEAE51170", "sid-54D696FD-DEDC-45F3-99DB-1404DA433FC4"
TASK_3 = "sid-34E8C3A5-5C2A-4593-AC67-038B737814D7"


def test_the_signavio_pools_are_refused_for_not_being_executable_and_for_task_3s_implicit_split() -> None:
    found = {(p.code, p.element_id) for p in validate_process([A41]).problems}
    assert found == {("no_executable_process", POOL_1), ("no_executable_process", POOL_2),
                     ("implicit_split", TASK_3)}


def test_the_signavio_pools_made_executable_are_refused_for_message_flows_from_plain_tasks(tmp_path: Path) -> None:
    path = rewritten(tmp_path, A41, [('isExecutable="false"', 'isExecutable="true"')])
    found = {p.element_id: str(p) for p in validate_process([path]).problems}
    assert set(found) == {"sid-96EF2D8F-C322-42B1-8C08-0DA05524C904", "sid-D0B859BF-CBFB-4B35-BBC8-BCA308F6455C", TASK_3}
    assert "starts at task 'sid-3D477D07-D669-4A26-9454-12AD775FDE70', which sends no message" \
        in found["sid-D0B859BF-CBFB-4B35-BBC8-BCA308F6455C"]
    assert "draw a parallel gateway after it" in found[TASK_3]


def test_pool_2_run_alone_with_a_parallel_gateway_after_task_3_runs_both_sub_processes(tmp_path: Path) -> None:
    split = ('<outgoing>sid-4052C63C-CB50-4E0C-8901-80D86A1F9759</outgoing>\n'
             '         <outgoing>sid-0C093502-276D-4B83-A271-2ABE22F335A6</outgoing>\n      </task>')
    path = rewritten(tmp_path, A41, [
        ('isExecutable="false"', 'isExecutable="true"'),
        (split, '<outgoing>to_split</outgoing>\n      </task>\n      <parallelGateway id="split"/>\n'
                f'      <sequenceFlow id="to_split" sourceRef="{TASK_3}" targetRef="split"/>'),
        (f'sourceRef="{TASK_3}" targetRef="sid-645780CC', 'sourceRef="split" targetRef="sid-645780CC'),
        (f'sourceRef="{TASK_3}" targetRef="sid-00A82BF4', 'sourceRef="split" targetRef="sid-00A82BF4')])
    assert [p.code for p in validate_process([path], process_id=POOL_2).problems] == []
    tasks = {"sid-34E8C3A5-5C2A-4593-AC67-038B737814D7": {"three": 3}, "sid-A52AFB6A-43EE-47FE-A95F-057845582F1D": {"four": 4},
             "sid-B414AE83-11A2-4968-B4E4-45833D641928": {"six": 6}, "sid-485E1184-9951-4B41-9794-A9AFD42A3249": {"five": 5}}
    engine = Engine(store="memory://")
    instance = engine.run(engine.start(load_process([path], POOL_2), {}), answers={"user_tasks": tasks})
    assert instance.status == "completed", instance.error
    assert variables(instance.main) == {"three": 3, "four": 4, "five": 5, "six": 6}
