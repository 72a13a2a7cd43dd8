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
