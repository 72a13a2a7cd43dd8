"""Messages and signals from outside (``Engine.send_event``): every kind of catch, the payload
in the catching context through the layer rules, saving and loading in between, and the
refusals that change nothing."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
from SpiffWorkflow.util.task import TaskState

from context_layers import Layer, LayeredContext
from context_layers.errors import ContextValueError, ContextWriteDenied, ProcessError
from engine import Engine, Instance, load_process
from engine.governance import BadRequest, InstanceStateError
from engine.validate import validate_process

from engine_helpers import EXAMPLES, path_of

HEAD = """<?xml version="1.0" encoding="UTF-8"?>
<bpmn:definitions xmlns:bpmn="http://www.omg.org/spec/BPMN/20100524/MODEL"
                  xmlns:spiffworkflow="http://spiffworkflow.org/bpmn/schema/1.0/core"
                  id="defs" targetNamespace="https://layerflow.dev/tests">
  <bpmn:message id="m_docs" name="documents_received"/>
  <bpmn:message id="m_cancel" name="cancel"/>
  <bpmn:signal id="s_go" name="go"/>
"""
TAIL = "  </bpmn:process>\n</bpmn:definitions>\n"


def flows(*pairs: str) -> str:
    return "".join(f'    <bpmn:sequenceFlow id="f{i}" sourceRef="{a}" targetRef="{b}"/>\n'
                   for i, (a, b) in enumerate(p.split(">") for p in pairs))


# an intermediate catch event without a messageVariable: the payload's keys go to WORKING
CATCH = HEAD + """  <bpmn:process id="catch" isExecutable="true">
    <bpmn:startEvent id="start"/>
    <bpmn:intermediateCatchEvent id="wait_docs"><bpmn:messageEventDefinition messageRef="m_docs"/></bpmn:intermediateCatchEvent>
    <bpmn:scriptTask id="use"><bpmn:script>summary = claim_id + ": " + ", ".join(files)</bpmn:script></bpmn:scriptTask>
    <bpmn:endEvent id="end"/>
""" + flows("start>wait_docs", "wait_docs>use", "use>end") + TAIL

# a signal caught by two parallel branches; branch A runs a step before it waits
SIGNAL = HEAD + """  <bpmn:process id="signal" isExecutable="true">
    <bpmn:startEvent id="start"/>
    <bpmn:parallelGateway id="split"/>
    <bpmn:scriptTask id="a_prep"><bpmn:script>a_ready = True</bpmn:script></bpmn:scriptTask>
    <bpmn:intermediateCatchEvent id="a_wait"><bpmn:signalEventDefinition signalRef="s_go"/></bpmn:intermediateCatchEvent>
    <bpmn:intermediateCatchEvent id="b_wait"><bpmn:signalEventDefinition signalRef="s_go"/></bpmn:intermediateCatchEvent>
    <bpmn:scriptTask id="a_do"><bpmn:script>a = speed * 2</bpmn:script></bpmn:scriptTask>
    <bpmn:scriptTask id="b_do"><bpmn:script>b = speed * 3</bpmn:script></bpmn:scriptTask>
    <bpmn:parallelGateway id="join"/>
    <bpmn:scriptTask id="total"><bpmn:script>total = a + b</bpmn:script></bpmn:scriptTask>
    <bpmn:endEvent id="end"/>
""" + flows("start>split", "split>a_prep", "a_prep>a_wait", "split>b_wait", "a_wait>a_do", "b_wait>b_do",
            "a_do>join", "b_do>join", "join>total", "total>end") + TAIL

def _on_docs(step_id: str, step: str) -> str:
    """An event sub-process started by the documents message (non-interrupting), running ``step``."""
    return f"""
    <bpmn:subProcess id="on_docs" triggeredByEvent="true">
      <bpmn:startEvent id="docs_start" isInterrupting="false"><bpmn:messageEventDefinition messageRef="m_docs"/></bpmn:startEvent>
      {step}
      <bpmn:endEvent id="docs_end"/>
      <bpmn:sequenceFlow id="g1" sourceRef="docs_start" targetRef="{step_id}"/>
      <bpmn:sequenceFlow id="g2" sourceRef="{step_id}" targetRef="docs_end"/>
    </bpmn:subProcess>
"""


ON_DOCS_NOTE = _on_docs("note_docs", '<bpmn:scriptTask id="note_docs"><bpmn:script>noted = len(files)</bpmn:script></bpmn:scriptTask>')
ON_DOCS_CHECK = _on_docs("check_docs", '<bpmn:userTask id="check_docs"/>')


# an event-based gateway: the documents, or a timer
GATEWAY = HEAD + """  <bpmn:process id="gateway" isExecutable="true">
    <bpmn:startEvent id="start"/>
    <bpmn:eventBasedGateway id="wait"/>
    <bpmn:intermediateCatchEvent id="docs_arrive"><bpmn:messageEventDefinition messageRef="m_docs"/></bpmn:intermediateCatchEvent>
    <bpmn:intermediateCatchEvent id="deadline">
      <bpmn:timerEventDefinition><bpmn:timeDuration>"P14D"</bpmn:timeDuration></bpmn:timerEventDefinition>
    </bpmn:intermediateCatchEvent>
    <bpmn:scriptTask id="assess"><bpmn:script>status = "assessed " + str(len(files))</bpmn:script></bpmn:scriptTask>
    <bpmn:scriptTask id="close"><bpmn:script>status = "closed"</bpmn:script></bpmn:scriptTask>
    <bpmn:endEvent id="end"/>
    <bpmn:endEvent id="end_closed"/>
""" + flows("start>wait", "wait>docs_arrive", "wait>deadline", "docs_arrive>assess", "assess>end",
            "deadline>close", "close>end_closed") + TAIL

# a user task that a "cancel" message interrupts, and an event sub-process started by a message
BOUNDARY = HEAD + """  <bpmn:process id="boundary" isExecutable="true">
    <bpmn:startEvent id="start"/>
    <bpmn:userTask id="review"/>
    <bpmn:boundaryEvent id="cancelled" attachedToRef="review" cancelActivity="true">
      <bpmn:messageEventDefinition messageRef="m_cancel"/>
    </bpmn:boundaryEvent>
    <bpmn:scriptTask id="withdraw"><bpmn:script>outcome = "withdrawn: " + reason</bpmn:script></bpmn:scriptTask>
    <bpmn:endEvent id="end"/>
    <bpmn:endEvent id="end_cancelled"/>
""" + flows("start>review", "review>end", "cancelled>withdraw", "withdraw>end_cancelled") + ON_DOCS_NOTE + TAIL

# an event sub-process started by a message, whose step waits for a person
EVENT_SUB_WAITS = HEAD + """  <bpmn:process id="event_sub_waits" isExecutable="true">
    <bpmn:startEvent id="start"/>
    <bpmn:userTask id="review"/>
    <bpmn:endEvent id="end"/>
""" + flows("start>review", "review>end") + ON_DOCS_CHECK + TAIL

# the same message twice, correlated by the claim id it carries
CORRELATED = HEAD + """  <bpmn:collaboration id="collab">
    <bpmn:participant id="p" processRef="correlated"/>
    <bpmn:correlationKey name="claim_key"><bpmn:correlationPropertyRef>claim_ref</bpmn:correlationPropertyRef></bpmn:correlationKey>
  </bpmn:collaboration>
  <bpmn:correlationProperty id="claim_ref" name="claim_ref">
    <bpmn:correlationPropertyRetrievalExpression messageRef="m_docs">
      <bpmn:formalExpression>claim_id</bpmn:formalExpression>
    </bpmn:correlationPropertyRetrievalExpression>
  </bpmn:correlationProperty>
  <bpmn:process id="correlated" isExecutable="true">
    <bpmn:startEvent id="start"/>
    <bpmn:intermediateCatchEvent id="first"><bpmn:messageEventDefinition messageRef="m_docs"/></bpmn:intermediateCatchEvent>
    <bpmn:intermediateCatchEvent id="second"><bpmn:messageEventDefinition messageRef="m_docs"/></bpmn:intermediateCatchEvent>
    <bpmn:endEvent id="end"/>
""" + flows("start>first", "first>second", "second>end") + TAIL

MESSAGE_WAIT = EXAMPLES / "message_wait.bpmn"
DOCUMENTS = {"files": ["police_report.pdf", "repair_invoice.pdf"], "sender": "claimant"}


def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / f"{name}.bpmn"
    path.write_text(text, encoding="utf-8")
    return path


def started(tmp_path: Path, text_or_path: str | Path, data: dict[str, Any] | None = None,
            engine: Engine | None = None) -> tuple[Engine, Instance]:
    path = text_or_path if isinstance(text_or_path, Path) else write(tmp_path, "process", text_or_path)
    engine = engine or Engine(f"sqlite:///{tmp_path / 'events.db'}")
    return engine, engine.run(engine.start(load_process(path), data))


def events_of(instance: Instance) -> list[dict[str, Any]]:
    return [w for w in instance.waiting_for if w["kind"] == "event"]


def frozen_state(engine: Engine, instance: Instance) -> tuple[Any, ...]:
    """Everything a refused event must leave as it was: the stored record and the live instance."""
    stored = engine.store.load(instance.id)
    return (stored["version"], stored["workflow"], stored["contexts"], instance.status, list(instance.waiting_for),
            {n: c.as_dict() for n, c in instance.contexts.items()}, instance.tape_length())


# ----------------------------------------------------------------------------- delivery

def test_a_message_survives_save_and_load_and_its_payload_lands_in_the_context(tmp_path: Path) -> None:
    """The example: waits at a receive task (with a boundary timer), is saved, loaded by a new
    Engine on the same store, then the message arrives. The payload is the messageVariable
    ``documents`` in the context, written and recorded through the tape; SpiffWorkflow's task
    data never sees it."""
    store = f"sqlite:///{tmp_path / 'claims.db'}"
    first = Engine(store)
    instance = first.run(first.start(load_process(MESSAGE_WAIT), {"claim_id": "CL-1042"}))
    assert instance.status == "waiting"
    assert [(w["kind"], w["task_id"]) for w in instance.waiting_for] == [("timer", "no_documents"),
                                                                         ("event", "receive_documents")]
    assert events_of(instance)[0]["event"] == "documents_received" and events_of(instance)[0]["event_kind"] == "message"

    later = Engine(store)
    loaded = later.load(instance.id)
    assert loaded.waiting_for == instance.waiting_for
    done = later.send_event(loaded, "documents_received", DOCUMENTS, actor="mailroom")

    assert done.status == "completed", done.error
    ctx = done.main
    assert ctx.resolve("documents") == DOCUMENTS
    assert ctx.resolve("status") == "assessing CL-1042 with police_report.pdf, repair_invoice.pdf"
    record = ctx.layer(Layer.HISTORY)["event:receive_documents"]
    assert record == {"kind": "event", "activity": "receive_documents", "status": "completed",
                      "summary": "message 'documents_received' caught at receive_documents: documents",
                      "keys": ["documents"], "tokens": record["tokens"], "event": "documents_received",
                      "event_kind": "message", "sent_by": "mailroom"}
    writes = [e for e in ctx.tape if e.kind == "write" and e.activity == "receive_documents"]
    assert [(e.actor, e.changes[0][1]) for e in writes] == [("mailroom", "documents")]
    assert path_of(done.workflow) == ["start", "open_claim", "receive_documents", "assess", "end"]
    assert all(not t.data for t in done.workflow.get_tasks())  # the payload went into the context only
    assert LayeredContext.replay(ctx.tape) == ctx
    assert later.load(done.id).main.resolve("documents") == DOCUMENTS


def test_without_a_message_variable_the_payload_keys_go_to_working(tmp_path: Path) -> None:
    engine, instance = started(tmp_path, CATCH, {"claim_id": "CL-7"})
    [item] = instance.waiting_for
    assert item == {"kind": "event", "id": item["id"], "task_id": "wait_docs", "event": "documents_received",
                    "event_kind": "message", "context": "main"}
    done = engine.send_event(engine.load(instance.id), "documents_received", {"files": ["a.pdf", "b.pdf"]})
    assert done.status == "completed", done.error
    history = done.main.layer(Layer.HISTORY)
    assert history["files"] == ["a.pdf", "b.pdf"] and history["summary"] == "CL-7: a.pdf, b.pdf"
    assert history["event:wait_docs"]["keys"] == ["files"]
    assert list(history).index("event:wait_docs") < list(history).index("activity:use")


def test_a_message_without_payload_records_the_event(tmp_path: Path) -> None:
    engine, instance = started(tmp_path, GATEWAY.replace('str(len(files))', '"without files"'))
    done = engine.send_event(instance, "documents_received")
    assert done.status == "completed", done.error
    assert done.main.resolve("status") == "assessed without files"
    assert done.main.resolve("event:docs_arrive")["keys"] == []


def test_a_signal_reaches_both_waiting_branches_each_in_its_own_context(tmp_path: Path) -> None:
    engine, instance = started(tmp_path, SIGNAL)
    assert sorted((w["task_id"], w["event"], w["event_kind"]) for w in instance.waiting_for) == [
        ("a_wait", "go", "signal"), ("b_wait", "go", "signal")]
    loaded = Engine(engine.store).load(instance.id)
    done = Engine(engine.store).send_event(loaded, "go", {"speed": 5}, kind="signal")

    assert done.status == "completed", done.error
    assert done.main.resolve("total") == 5 * 2 + 5 * 3
    branches = {info["branch_id"]: name for name, info in done.branches.items()}
    for branch, catch in (("a_prep", "a_wait"), ("b_wait", "b_wait")):
        ctx = done.contexts[branches[branch]]
        assert ctx.resolve("speed") == 5
        assert ctx.resolve(f"event:{catch}")["event"] == "go"
    assert "event:b_wait" not in done.contexts[branches["a_prep"]]  # each branch recorded its own catch


def test_an_event_based_gateway_takes_the_branch_of_the_message(tmp_path: Path) -> None:
    engine, instance = started(tmp_path, GATEWAY)
    # the gateway waits for the message, and for its timer branch (see test_conformance.py)
    timer, item = instance.waiting_for
    assert (timer["kind"], timer["task_id"]) == ("timer", "deadline")
    assert (item["task_id"], item["event"]) == ("wait", "documents_received")
    done = engine.send_event(engine.load(instance.id), "documents_received", {"files": ["x"]})
    assert done.status == "completed", done.error
    assert done.main.resolve("status") == "assessed 1"
    assert "event:docs_arrive" in done.main.layer(Layer.HISTORY)  # the gateway's branch event caught it
    assert "close" not in path_of(done.workflow)


def test_a_boundary_message_interrupts_a_user_task(tmp_path: Path) -> None:
    engine, instance = started(tmp_path, BOUNDARY)
    kinds = [(w["kind"], w["task_id"], w.get("event")) for w in instance.waiting_for]
    # the message catches are listed beside the user task they interrupt or run alongside
    assert kinds == [("user_task", "review", None), ("event", "cancelled", "cancel"),
                     ("event", "docs_start", "documents_received")]
    done = engine.send_event(engine.load(instance.id), "cancel", {"reason": "duplicate"})
    assert done.status == "completed", done.error
    assert done.main.resolve("outcome") == "withdrawn: duplicate"
    assert "review" not in path_of(done.workflow)
    assert [t for t in done.workflow.get_tasks(state=TaskState.CANCELLED) if t.task_spec.name == "review"]


def test_a_message_starts_an_event_sub_process_and_the_user_task_still_waits(tmp_path: Path) -> None:
    engine, instance = started(tmp_path, BOUNDARY)
    after = engine.send_event(engine.load(instance.id), "documents_received", {"files": ["a", "b", "c"]})
    assert after.status == "waiting"
    assert after.main.resolve("noted") == 3
    assert after.main.resolve("event:docs_start")["event_kind"] == "message"
    assert [w["task_id"] for w in after.waiting_for] == ["review", "cancelled", "docs_start"]  # it may come again
    done = engine.complete_user_task(after, "review", {"ok": True})
    assert done.status == "completed", done.error


def test_an_event_sub_process_that_waits_for_a_person_goes_on_after_a_load(tmp_path: Path) -> None:
    """SpiffWorkflow connects an event sub-process to the start of its process's spec the first
    time an event starts one. The saved spec once missed that (it was encoded once, at the
    first save): loaded, the instance failed with an opaque WorkflowException as the
    sub-process ended."""
    engine, instance = started(tmp_path, EVENT_SUB_WAITS)
    instance = engine.send_event(instance, "documents_received", {"files": ["a"]})
    assert [w["task_id"] for w in instance.waiting_for if w["kind"] == "user_task"] == ["check_docs", "review"]
    instance = engine.complete_user_task(engine.load(instance.id), "check_docs", {"checked": True})
    assert instance.status == "waiting", instance.error
    done = engine.complete_user_task(engine.load(instance.id), "review", {"ok": True})

    assert done.status == "completed", done.error
    assert path_of(done.workflow) == ["start", "docs_start", "check_docs", "docs_end", "on_docs", "review", "end"]
    assert done.main.resolve("checked") is True and done.main.resolve("files") == ["a"]


# an event sub-process started while the process's parallel branches wait for people
EVENT_SUB_BESIDE_BRANCHES = HEAD + """  <bpmn:process id="event_sub_beside" isExecutable="true">
    <bpmn:startEvent id="start"/>
    <bpmn:parallelGateway id="split"/>
    <bpmn:userTask id="review"/>
    <bpmn:userTask id="approve"/>
    <bpmn:parallelGateway id="join"/>
    <bpmn:scriptTask id="total"><bpmn:script>total = noted + len(files)</bpmn:script></bpmn:scriptTask>
    <bpmn:endEvent id="end"/>
""" + flows("start>split", "split>review", "split>approve", "review>join", "approve>join", "join>total",
            "total>end") + ON_DOCS_NOTE + TAIL


@pytest.mark.parametrize("sent_after", [0, 1], ids=["before_any_answer", "after_one_answer"])
def test_an_event_sub_process_beside_parallel_branches_comes_back_at_their_join(tmp_path: Path, sent_after: int) -> None:
    """The event sub-process wrote its payload and its task's keys into the context its process's
    branches were split from, while they ran: their join then failed ("context 'main' changed
    after the split's snapshot"). It runs in a context of its own, merged back once the
    branches have joined."""
    engine, instance = started(tmp_path, EVENT_SUB_BESIDE_BRANCHES)
    people = ["review", "approve"]
    for task in people[:sent_after]:
        instance = engine.complete_user_task(engine.load(instance.id), task, {f"{task}_ok": True})
    instance = engine.send_event(engine.load(instance.id), "documents_received", {"files": ["a", "b"]})
    assert instance.status == "waiting", instance.error
    for task in people[sent_after:]:
        instance = engine.complete_user_task(engine.load(instance.id), task, {f"{task}_ok": True})

    assert instance.status == "completed", instance.error
    assert instance.main.resolve("total") == 4 and instance.main.resolve("review_ok") is True
    assert instance.main.resolve("event:docs_start")["event_kind"] == "message"


# an event sub-process that waits for a person, and parallel branches after the first user task
EVENT_SUB_THEN_BRANCHES = HEAD + """  <bpmn:process id="event_sub_then_branches" isExecutable="true">
    <bpmn:startEvent id="start"/>
    <bpmn:userTask id="review"/>
    <bpmn:parallelGateway id="split"/>
    <bpmn:scriptTask id="a"><bpmn:script>a = 1</bpmn:script></bpmn:scriptTask>
    <bpmn:userTask id="approve"/>
    <bpmn:parallelGateway id="join"/>
    <bpmn:endEvent id="end"/>
""" + flows("start>review", "review>split", "split>a", "split>approve", "a>join", "approve>join", "join>end") + ON_DOCS_CHECK + TAIL


def test_an_event_sub_process_that_outlives_a_split_of_its_process_comes_back_at_the_join(tmp_path: Path) -> None:
    """Started before the split, it wrote into the context the split was taken from while the
    branches ran, and their join failed."""
    engine, instance = started(tmp_path, EVENT_SUB_THEN_BRANCHES)
    instance = engine.send_event(engine.load(instance.id), "documents_received", {"files": ["a"]})
    instance = engine.complete_user_task(engine.load(instance.id), "review", {"reviewed": True})
    instance = engine.complete_user_task(engine.load(instance.id), "check_docs", {"checked": True})
    instance = engine.complete_user_task(engine.load(instance.id), "approve", {"approved": True})

    assert instance.status == "completed", instance.error
    assert {k: instance.main.resolve(k) for k in ("files", "checked", "reviewed", "approved", "a")} == {
        "files": ["a"], "checked": True, "reviewed": True, "approved": True, "a": 1}


def test_a_key_the_process_and_its_event_sub_process_both_change_keeps_the_process_value(tmp_path: Path) -> None:
    """The event sub-process runs beside the flow, from a copy: where both changed a key the flow's
    value stays, and the clash is listed with the run's conflicts, settled by that rule."""
    engine, instance = started(tmp_path, EVENT_SUB_WAITS)
    instance = engine.send_event(engine.load(instance.id), "documents_received", {"files": ["a"]})
    instance = engine.complete_user_task(engine.load(instance.id), "review", {"verdict": "flow"})
    instance = engine.complete_user_task(engine.load(instance.id), "check_docs", {"verdict": "docs"})

    assert instance.status == "completed", instance.error
    assert instance.main.resolve("verdict") == "flow" and instance.main.resolve("files") == ["a"]
    [conflict] = instance.conflicts
    assert conflict["key"] == "verdict" and conflict["values"] == {"on_docs": "docs", "main": "flow"}
    assert conflict["resolution"]["resolver"] == "strategy" and "event sub-process" in conflict["resolution"]["reason"]


def _event_sub(start: str, *, nested: bool = False) -> str:
    """A process whose event sub-process starts at ``start`` (XML), at the top level or inside a
    sub-process, and notes that it ran."""
    handler = f"""<bpmn:subProcess id="on_event" triggeredByEvent="true">{start}
      <bpmn:scriptTask id="note"><bpmn:script>noted = True</bpmn:script></bpmn:scriptTask><bpmn:endEvent id="on_end"/>
      <bpmn:sequenceFlow id="g1" sourceRef="on_start" targetRef="note"/>
      <bpmn:sequenceFlow id="g2" sourceRef="note" targetRef="on_end"/></bpmn:subProcess>"""
    body = """<bpmn:startEvent id="s_start"/><bpmn:userTask id="review"/><bpmn:endEvent id="s_end"/>
      <bpmn:sequenceFlow id="h1" sourceRef="s_start" targetRef="review"/>
      <bpmn:sequenceFlow id="h2" sourceRef="review" targetRef="s_end"/>"""
    return HEAD + """  <bpmn:error id="e_bad" name="bad" errorCode="bad"/>
  <bpmn:process id="event_subs" isExecutable="true">
    <bpmn:startEvent id="start"/><bpmn:endEvent id="end"/>
""" + f'<bpmn:subProcess id="sub">{body}{handler if nested else ""}</bpmn:subProcess>' + (
        "" if nested else handler) + flows("start>sub", "sub>end") + TAIL


MESSAGE_START = '<bpmn:startEvent id="on_start" isInterrupting="false"><bpmn:messageEventDefinition messageRef="m_docs"/></bpmn:startEvent>'


@pytest.mark.parametrize(("start", "nested", "code"), [
    ('<bpmn:startEvent id="on_start"><bpmn:compensateEventDefinition/></bpmn:startEvent>', False,
     "unsupported_start_event"),
    ('<bpmn:startEvent id="on_start"><bpmn:compensateEventDefinition/></bpmn:startEvent>', True,
     "unsupported_start_event"),
    (MESSAGE_START, True, "event_subprocess_never_starts"),
], ids=["compensation_start", "nested_compensation_start", "nested_message_start"])
def test_an_event_sub_process_spiffworkflow_would_run_wrongly_is_refused(tmp_path: Path, start: str, nested: bool,
                                                                      code: str) -> None:
    """SpiffWorkflow 3.2 reads a compensation start event as one with no trigger (the event
    sub-process ran at once, with no event), and starts a message event sub-process inside a
    sub-process never (the message was refused: nothing waited for it). (Error and escalation
    starts run: ``test_error_start_events.py``.)"""
    path = write(tmp_path, "process", _event_sub(start, nested=nested))
    problems = validate_process(path).problems
    assert [(p.code, p.severity, p.element_id) for p in problems] == [(code, "error", "on_start")]
    if code == "unsupported_start_event":
        assert "has a compensation trigger" in problems[0].message and "error or escalation" in problems[0].message
    with pytest.raises(ProcessError, match="SpiffWorkflow 3.2"):
        load_process(path)


class Clock:
    def __init__(self) -> None:
        self.now = float(int(time.time()))

    def __call__(self) -> float:
        return self.now


TIMER_START = ('<bpmn:startEvent id="on_start"{interrupting}><bpmn:timerEventDefinition><bpmn:timeDuration>"PT1H"'
               '</bpmn:timeDuration></bpmn:timerEventDefinition></bpmn:startEvent>')
MESSAGE_START_AT = '<bpmn:startEvent id="on_start"{interrupting}><bpmn:messageEventDefinition messageRef="m_docs"/></bpmn:startEvent>'


def _guarded(start: str, *, interrupting: bool, nested: bool, parallel: bool = False) -> str:
    """A case: ``open_case`` sets its reference, then a person reviews it (two people, in parallel
    branches, each after a step of their own, when ``parallel``), then ``after`` runs. An event
    sub-process (in the sub-process around the review when ``nested``) escalates: it reads the
    reference and writes ``escalated``."""
    start = start.format(interrupting="" if interrupting else ' isInterrupting="false"')
    handler = f"""<bpmn:subProcess id="on_event" triggeredByEvent="true">{start}
      <bpmn:scriptTask id="escalate"><bpmn:script>escalated = "escalated " + case_ref</bpmn:script></bpmn:scriptTask>
      <bpmn:endEvent id="on_end"/>
      <bpmn:sequenceFlow id="g1" sourceRef="on_start" targetRef="escalate"/>
      <bpmn:sequenceFlow id="g2" sourceRef="escalate" targetRef="on_end"/></bpmn:subProcess>"""
    if parallel:
        review = """<bpmn:parallelGateway id="fork"/><bpmn:parallelGateway id="merge"/>
      <bpmn:scriptTask id="a_prep"><bpmn:script>a_seen = True</bpmn:script></bpmn:scriptTask>
      <bpmn:scriptTask id="b_prep"><bpmn:script>b_seen = True</bpmn:script></bpmn:scriptTask>
      <bpmn:userTask id="review"/><bpmn:userTask id="second_review"/>
      <bpmn:sequenceFlow id="r1" sourceRef="s_start" targetRef="fork"/>
      <bpmn:sequenceFlow id="r2" sourceRef="fork" targetRef="a_prep"/><bpmn:sequenceFlow id="r3" sourceRef="a_prep" targetRef="review"/>
      <bpmn:sequenceFlow id="r4" sourceRef="fork" targetRef="b_prep"/><bpmn:sequenceFlow id="r5" sourceRef="b_prep" targetRef="second_review"/>
      <bpmn:sequenceFlow id="r6" sourceRef="review" targetRef="merge"/><bpmn:sequenceFlow id="r7" sourceRef="second_review" targetRef="merge"/>
      <bpmn:sequenceFlow id="r8" sourceRef="merge" targetRef="s_end"/>"""
    else:
        review = """<bpmn:userTask id="review"/>
      <bpmn:sequenceFlow id="r1" sourceRef="s_start" targetRef="review"/>
      <bpmn:sequenceFlow id="r2" sourceRef="review" targetRef="s_end"/>"""
    body = f'<bpmn:startEvent id="s_start"/>{review}<bpmn:endEvent id="s_end"/>'
    return HEAD + """  <bpmn:process id="guarded" isExecutable="true">
    <bpmn:startEvent id="start"/>
    <bpmn:scriptTask id="open_case"><bpmn:script>case_ref = "CL-" + str(number)</bpmn:script></bpmn:scriptTask>
    <bpmn:scriptTask id="after"><bpmn:script>closed = True</bpmn:script></bpmn:scriptTask>
    <bpmn:endEvent id="end"/>
""" + f'<bpmn:subProcess id="sub">{body}{handler if nested else ""}</bpmn:subProcess>' + (
        "" if nested else handler) + flows("start>open_case", "open_case>sub", "sub>after", "after>end") + TAIL


def _fire(engine: Engine, clock: Clock, instance: Instance, start: str) -> Instance:
    """The event sub-process's event comes, on an instance loaded from the store."""
    instance = engine.load(instance.id)
    if start is TIMER_START:
        clock.now += 2 * 3600
        return engine.resume(instance)
    return engine.send_event(instance, "documents_received", {"files": []})


def _replays(instance: Instance) -> None:
    for ctx in instance.contexts.values():
        assert LayeredContext.replay(ctx.tape).as_dict() == ctx.as_dict()


# (a message event sub-process inside a sub-process is refused: event_subprocess_never_starts)
@pytest.mark.parametrize(("start", "nested"), [(TIMER_START, False), (TIMER_START, True), (MESSAGE_START_AT, False)],
                         ids=["timer_top", "timer_in_sub_process", "message_top"])
@pytest.mark.parametrize("parallel", [False, True], ids=["one_person", "parallel_people"])
def test_an_interrupting_event_sub_process_cancels_the_rest_of_its_process(tmp_path: Path, start: str, nested: bool,
                                                                          parallel: bool) -> None:
    """BPMN: an interrupting event sub-process (isInterrupting true, the default) stops the rest
    of its (sub-)process as it starts. SpiffWorkflow 3.2 does not read the attribute: the people
    still waited, and the process went on after the event sub-process. Here the waiting people
    are no longer asked, the branches are dropped, and the (sub-)process ends with the event
    sub-process; a process around the interrupted sub-process goes on."""
    path = write(tmp_path, "guarded", _guarded(start, interrupting=True, nested=nested, parallel=parallel))
    assert not validate_process(path).problems
    clock = Clock()
    engine = Engine(f"sqlite:///{tmp_path / 'esp.db'}", clock=clock)
    instance = engine.run(engine.start(load_process(path), {"number": 7}))
    people = ["review", "second_review"] if parallel else ["review"]
    assert [w["task_id"] for w in instance.waiting_for if w["kind"] == "user_task"] == people

    done = _fire(engine, clock, instance, start)

    assert done.status == "completed", (done.error, done.waiting_for)
    assert done.waiting_for == []
    assert done.main.resolve("escalated") == "escalated CL-7"  # it read what the process had written
    assert done.main.get("closed") is (True if nested else None)  # the process around it goes on
    assert done.main.get("a_seen") is None and done.main.get("b_seen") is None  # cancelled branches: dropped
    ran = path_of(done.workflow)
    assert "escalate" in ran and "review" not in ran
    assert ("after" in ran) is nested
    assert engine.load(done.id).status == "completed"
    _replays(done)


@pytest.mark.parametrize("interrupting", [True, False], ids=["interrupting", "non_interrupting"])
@pytest.mark.parametrize("nested", [False, True], ids=["top", "in_sub_process"])
def test_an_event_sub_process_whose_timer_has_not_come_ends_with_its_process(tmp_path: Path, interrupting: bool,
                                                                           nested: bool) -> None:
    """An event sub-process listens while its process runs. SpiffWorkflow 3.2 starts a timer's
    event sub-process with its process, and the process then waited for the timer after its
    last step: a one-hour escalation kept every case open for an hour, even when done at once."""
    path = write(tmp_path, "guarded", _guarded(TIMER_START, interrupting=interrupting, nested=nested))
    clock = Clock()
    engine = Engine(f"sqlite:///{tmp_path / 'esp.db'}", clock=clock)
    instance = engine.run(engine.start(load_process(path), {"number": 7}))
    assert [w["task_id"] for w in instance.waiting_for] == ["review", "on_start"]

    done = engine.complete_user_task(engine.load(instance.id), "review", {"ok": True})

    assert done.status == "completed" and done.waiting_for == []
    assert done.main.get("closed") is True and done.main.get("escalated") is None
    assert "escalate" not in path_of(done.workflow)
    _replays(done)


@pytest.mark.parametrize("nested", [False, True], ids=["top", "in_sub_process"])
def test_a_non_interrupting_timer_event_sub_process_runs_beside_the_person_who_still_waits(tmp_path: Path,
                                                                                         nested: bool) -> None:
    path = write(tmp_path, "guarded", _guarded(TIMER_START, interrupting=False, nested=nested))
    clock = Clock()
    engine = Engine(f"sqlite:///{tmp_path / 'esp.db'}", clock=clock)
    instance = engine.run(engine.start(load_process(path), {"number": 7}))
    instance = _fire(engine, clock, instance, TIMER_START)
    assert [w["task_id"] for w in instance.waiting_for] == ["review"]
    assert instance.main.resolve("escalated") == "escalated CL-7"

    done = engine.complete_user_task(engine.load(instance.id), "review", {"ok": True})

    assert done.status == "completed" and done.main.get("closed") is True
    assert done.main.resolve("escalated") == "escalated CL-7"
    _replays(done)


def test_an_event_sub_process_one_instance_started_does_not_run_in_the_next(tmp_path: Path) -> None:
    """Instances of one ``Process`` share its spec (the REST API's catalog keeps one per process),
    and SpiffWorkflow makes that connection in the spec itself: every later instance once ran
    the event sub-process as a branch of its own and waited for the message forever."""
    process = load_process(write(tmp_path, "process", BOUNDARY))
    engine = Engine()
    first = engine.run(engine.start(process))
    first = engine.send_event(first, "documents_received", {"files": ["a"]})
    first = engine.complete_user_task(first, "review", {"ok": True})
    assert first.status == "completed", first.error
    second = engine.run(engine.start(process))
    assert [w["task_id"] for w in second.waiting_for] == ["review", "cancelled", "docs_start"]
    second = engine.complete_user_task(second, "review", {"ok": True})

    assert second.status == "completed", second.waiting_for
    assert path_of(second.workflow) == ["start", "review", "end"]


def test_the_event_record_cannot_be_forged_by_an_activity(tmp_path: Path) -> None:
    engine, instance = started(tmp_path, CATCH, {"claim_id": "CL-7"})
    done = engine.send_event(instance, "documents_received", {"files": []})
    with pytest.raises(ContextWriteDenied, match="engine and the compressor"):
        done.main.write(Layer.WORKING, "event:wait_docs", "forged", actor="rogue")


def test_a_correlated_message_is_caught_only_with_the_instance_s_keys(tmp_path: Path) -> None:
    """With correlation properties SpiffWorkflow compares the keys a message carries: the first
    message fixes them, a later one with another claim id is not for this instance."""
    engine, instance = started(tmp_path, CORRELATED)
    with pytest.raises(BadRequest, match=r"correlation properties \(claim_ref: claim_id\)"):
        engine.send_event(instance, "documents_received", {"files": []})
    after = engine.send_event(instance, "documents_received", {"claim_id": "CL-1", "n": 1})
    assert after.status == "waiting" and after.main.resolve("n") == 1
    with pytest.raises(InstanceStateError,
                       match="waits for message 'documents_received', but for other correlation values"):
        engine.send_event(engine.load(after.id), "documents_received", {"claim_id": "CL-2", "n": 2})
    done = engine.send_event(engine.load(after.id), "documents_received", {"claim_id": "CL-1", "n": 3})
    assert done.status == "completed", done.error
    assert done.main.resolve("n") == 3 and "event:second" in done.main.layer(Layer.HISTORY)


# ----------------------------------------------------------------------------- refusals

@pytest.mark.parametrize(("name", "kind"), [("nobody_waits", "message"), ("documents_received", "signal")])
def test_an_event_nobody_waits_for_is_refused_and_changes_nothing(tmp_path: Path, name: str, kind: str) -> None:
    engine, instance = started(tmp_path, MESSAGE_WAIT, {"claim_id": "CL-1"})
    before = frozen_state(engine, instance)
    with pytest.raises(InstanceStateError) as refused:
        engine.send_event(instance, name, {"files": []}, kind=kind)
    message = str(refused.value)
    assert instance.id in message and f"{kind} {name!r}" in message
    assert "message 'documents_received' at receive_documents" in message and "timer no_documents" in message
    assert refused.value.kind == "invalid_state"
    assert frozen_state(engine, instance) == before


def test_a_payload_key_the_layer_rules_refuse_changes_nothing_but_the_tape(tmp_path: Path) -> None:
    """``claim_id`` is in PROCESS (append-only): the whole payload is refused, the instance still
    waits for the message, and the refusal is on the tape of the catching context (saved)."""
    engine, instance = started(tmp_path, CATCH, {"claim_id": "CL-7"})
    layers = instance.main.as_dict()
    with pytest.raises(ContextWriteDenied) as denied:
        engine.send_event(instance, "documents_received", {"files": ["a"], "claim_id": "CL-8"})
    assert denied.value.key == "claim_id" and "L1 PROCESS is append-only" in str(denied.value)
    assert instance.main.as_dict() == layers and instance.status == "waiting"
    assert events_of(instance)[0]["event"] == "documents_received"
    stored = engine.load(instance.id)
    assert stored.main.as_dict() == layers
    assert [e.data["key"] for e in stored.main.tape if e.kind == "denied"] == ["claim_id"]
    done = engine.send_event(stored, "documents_received", {"files": ["a"]})  # a good payload still goes through
    assert done.main.resolve("summary") == "CL-7: a"


def test_a_refusal_in_one_branch_writes_nothing_in_the_other(tmp_path: Path) -> None:
    """Branch A already holds the record ``activity:a_prep``; branch B does not. A payload with
    that key is refused in A, so B, which would have taken it, gets nothing either."""
    engine, instance = started(tmp_path, SIGNAL)
    contexts = {n: c.as_dict() for n, c in instance.contexts.items()}
    with pytest.raises(ContextWriteDenied, match="activity:a_prep"):
        engine.send_event(instance, "go", {"speed": 1, "activity:a_prep": "forged"}, kind="signal")
    assert {n: c.as_dict() for n, c in instance.contexts.items()} == contexts
    assert len(events_of(engine.load(instance.id))) == 2


@pytest.mark.parametrize(("payload", "error"), [
    (["not", "an", "object"], BadRequest),
    ("text", BadRequest),
    ({"files": {1, 2}}, ContextValueError),
    ({"": 1}, ContextValueError),
])
def test_a_payload_that_cannot_be_written_is_refused_and_changes_nothing(tmp_path: Path, payload: Any,
                                                                          error: type) -> None:
    engine, instance = started(tmp_path, CATCH, {"claim_id": "CL-7"})
    before = frozen_state(engine, instance)
    with pytest.raises(error):
        engine.send_event(instance, "documents_received", payload)
    assert frozen_state(engine, instance) == before


def test_with_a_message_variable_any_json_value_is_the_payload(tmp_path: Path) -> None:
    engine, instance = started(tmp_path, MESSAGE_WAIT, {"claim_id": "CL-1"})
    after = engine.send_event(instance, "documents_received", ["a.pdf"])  # the script then fails on it
    assert after.main.resolve("documents") == ["a.pdf"]
    assert after.status == "error" and after.error["task_id"] == "assess"


def test_a_completed_or_failed_instance_takes_no_event(tmp_path: Path) -> None:
    engine, instance = started(tmp_path, MESSAGE_WAIT, {"claim_id": "CL-1"})
    failed = engine.send_event(instance, "documents_received", ["not a mapping"])
    assert failed.status == "error"
    with pytest.raises(InstanceStateError, match="is in error"):
        engine.send_event(failed, "documents_received", DOCUMENTS)
    engine, instance = started(tmp_path, CATCH, {"claim_id": "CL-2"}, engine=engine)
    done = engine.send_event(instance, "documents_received", {"files": []})
    with pytest.raises(InstanceStateError, match="is completed and does not wait for message .documents_received."):
        engine.send_event(done, "documents_received", {"files": []})


def test_an_unknown_kind_is_a_programming_error(tmp_path: Path) -> None:
    engine, instance = started(tmp_path, CATCH, {"claim_id": "CL-7"})
    with pytest.raises(ValueError, match="'message' or 'signal'"):
        engine.send_event(instance, "documents_received", kind="email")


@pytest.mark.parametrize("interrupting", [True, False], ids=["interrupting", "non_interrupting"])
def test_a_message_starts_an_event_sub_process_while_people_of_a_multi_instance_step_answer(
        tmp_path: Path, interrupting: bool) -> None:
    """The context of a multi-instance step whose instances wait for people has that step open.
    The message was refused ("answer it first"), though its payload goes into the event
    sub-process's own context, forked from that one."""
    start = MESSAGE_START_AT.format(interrupting="" if interrupting else ' isInterrupting="false"')
    text = HEAD + f"""  <bpmn:process id="votes" isExecutable="true">
    <bpmn:startEvent id="start"/>
    <bpmn:userTask id="vote"><bpmn:multiInstanceLoopCharacteristics><bpmn:loopDataInputRef>voters</bpmn:loopDataInputRef>
      <bpmn:inputDataItem id="voter"/></bpmn:multiInstanceLoopCharacteristics></bpmn:userTask>
    <bpmn:scriptTask id="count"><bpmn:script>counted = True</bpmn:script></bpmn:scriptTask>
    <bpmn:endEvent id="end"/>
    <bpmn:subProcess id="on_event" triggeredByEvent="true">{start}
      <bpmn:scriptTask id="note"><bpmn:script>noted = len(voters) + len(files)</bpmn:script></bpmn:scriptTask>
      <bpmn:endEvent id="on_end"/>
      <bpmn:sequenceFlow id="g1" sourceRef="on_start" targetRef="note"/>
      <bpmn:sequenceFlow id="g2" sourceRef="note" targetRef="on_end"/></bpmn:subProcess>
""" + flows("start>vote", "vote>count", "count>end") + TAIL
    engine, instance = started(tmp_path, text, {"voters": ["ann", "bob"]})
    first = next(w for w in instance.waiting_for if w.get("instance") == 1)
    instance = engine.complete_user_task(engine.load(instance.id), first["id"], {"yes": True})

    instance = engine.send_event(engine.load(instance.id), "documents_received", {"files": ["a.pdf"]})

    assert instance.main.resolve("noted") == 3
    if interrupting:
        assert instance.status == "completed" and instance.main.get("counted") is None
    else:
        (bob,) = [w for w in instance.waiting_for if w["kind"] == "user_task"]
        assert bob["input"] == {"voter": "bob"}
        instance = engine.complete_user_task(engine.load(instance.id), bob["id"], {"yes": False})
        assert instance.status == "completed" and instance.main.get("counted") is True
    _replays(instance)


def test_an_interrupting_event_sub_process_closes_the_confirmation_a_join_waited_for(tmp_path: Path) -> None:
    """A join waits for a person to settle a conflict; the event sub-process cancels the join, so
    nobody is asked any more: the confirmation is closed (cancelled) and the instance completes."""
    text = HEAD + """  <bpmn:process id="asks" isExecutable="true">
    <bpmn:startEvent id="start"/><bpmn:parallelGateway id="split"/><bpmn:parallelGateway id="join"/>
    <bpmn:scriptTask id="a"><bpmn:script>decision = "yes"</bpmn:script></bpmn:scriptTask>
    <bpmn:scriptTask id="b"><bpmn:script>decision = "no"</bpmn:script></bpmn:scriptTask>
    <bpmn:scriptTask id="after"><bpmn:script>done = decision</bpmn:script></bpmn:scriptTask>
    <bpmn:endEvent id="end"/>
    <bpmn:subProcess id="on_event" triggeredByEvent="true">
      <bpmn:startEvent id="on_start"><bpmn:messageEventDefinition messageRef="m_cancel"/></bpmn:startEvent>
      <bpmn:scriptTask id="withdraw"><bpmn:script>withdrawn = True</bpmn:script></bpmn:scriptTask>
      <bpmn:endEvent id="on_end"/>
      <bpmn:sequenceFlow id="g1" sourceRef="on_start" targetRef="withdraw"/>
      <bpmn:sequenceFlow id="g2" sourceRef="withdraw" targetRef="on_end"/></bpmn:subProcess>
""" + flows("start>split", "split>a", "split>b", "a>join", "b>join", "join>after", "after>end") + TAIL
    path = write(tmp_path, "asks", text)
    (tmp_path / "asks.layerflow.yaml").write_text("join:\n  humanConfirm:\n    timeout: 300\n", encoding="utf-8")
    engine, instance = started(tmp_path, path)
    assert [w["id"] for w in instance.waiting_for if w["kind"] == "confirmation"] == ["join/decision"]

    done = engine.send_event(engine.load(instance.id), "cancel", {})

    assert done.status == "completed" and done.waiting_for == []
    assert [(c["id"], c["answered"], c.get("cancelled")) for c in done.confirmations] == [("join/decision", True, True)]
    # the conflict it asked about was never settled, and says why
    assert [(c["key"], c["resolution"], c.get("cancelled")) for c in done.conflicts] == [("decision", None, True)]
    assert done.main.resolve("withdrawn") is True and done.main.get("done") is None
    assert done.main.get("decision") is None  # the branches never merged
    _replays(done)


class _Clock:
    def __init__(self) -> None:
        self.now = float(int(__import__("time").time()))

    def __call__(self) -> float:
        return self.now


def _timer_start(definition: str) -> str:
    return f'<bpmn:startEvent id="on_start" isInterrupting="false"><bpmn:timerEventDefinition>{definition}' \
           "</bpmn:timerEventDefinition></bpmn:startEvent>"


TIMER_STARTS = {"duration": '<bpmn:timeDuration>"P1000D"</bpmn:timeDuration>',
                "cycle": '<bpmn:timeCycle>"R2/P1000D"</bpmn:timeCycle>'}


@pytest.mark.parametrize("nested", [False, True], ids=["process", "sub_process"])
@pytest.mark.parametrize("timer", sorted(TIMER_STARTS))
def test_a_timer_event_sub_process_that_has_not_fired_ends_with_its_scope(tmp_path: Path, timer: str,
                                                                        nested: bool) -> None:
    """A non-interrupting timer event sub-process listens while its (sub-)process runs, and no
    longer: SpiffWorkflow 3.2 starts it with the process and its end waited for the timer, so the
    process waited 1000 days after its last step (found by the random processes)."""
    clock = _Clock()
    engine = Engine(store=f"sqlite:///{tmp_path / 'i.db'}", clock=clock)
    path = write(tmp_path, "process", _event_sub(_timer_start(TIMER_STARTS[timer]), nested=nested))
    instance = engine.run(engine.start(load_process(path)))
    instance = engine.complete_user_task(engine.load(instance.id), "review", {})
    assert instance.status == "completed", instance.waiting_for
    assert "noted" not in instance.main


@pytest.mark.parametrize("nested", [False, True], ids=["process", "sub_process"])
def test_the_timer_of_an_event_sub_process_is_listed_once(tmp_path: Path, nested: bool) -> None:
    """Its task lives in a sub-workflow that SpiffWorkflow's iterator also reaches from the
    process: it was listed two or three times (found by the random processes)."""
    engine = Engine(store=f"sqlite:///{tmp_path / 'i.db'}", clock=_Clock())
    path = write(tmp_path, "process", _event_sub(_timer_start(TIMER_STARTS["duration"]), nested=nested))
    instance = engine.run(engine.start(load_process(path)))
    assert [(w["kind"], w["task_id"]) for w in instance.waiting_for] == [("user_task", "review"), ("timer", "on_start")]
    assert [(w["kind"], w["task_id"]) for w in engine.load(instance.id).waiting_for] == [
        ("user_task", "review"), ("timer", "on_start")]


def _reviewed_on_tick(nested: bool) -> str:
    """A person reviews; a cycle timer event sub-process ("R2/P1D") asks another person to check."""
    start = _timer_start('<bpmn:timeCycle>"R2/P1D"</bpmn:timeCycle>')
    return _event_sub(start, nested=nested).replace(
        '<bpmn:scriptTask id="note"><bpmn:script>noted = True</bpmn:script></bpmn:scriptTask>',
        '<bpmn:userTask id="note"/>')


@pytest.mark.parametrize("nested", [False, True], ids=["process", "sub_process"])
def test_a_cycle_event_sub_process_ends_with_its_scope_once_its_path_has_ended(tmp_path: Path, nested: bool) -> None:
    """Its first repetition's path still ran when the review was done, so the end waited for it;
    once that path ended, the cycle only listened for its second repetition, and the process waited
    for it (a day later) all the same (found by the random processes)."""
    clock = _Clock()
    engine = Engine(store=f"sqlite:///{tmp_path / 'i.db'}", clock=clock)
    instance = engine.run(engine.start(load_process(write(tmp_path, "process", _reviewed_on_tick(nested)))))
    clock.now += 25 * 3600
    instance = engine.resume(engine.load(instance.id))
    assert sorted(w["task_id"] for w in instance.waiting_for if w["kind"] == "user_task") == ["note", "review"]
    instance = engine.complete_user_task(engine.load(instance.id), "review", {"reviewed": True})
    assert [w["task_id"] for w in instance.waiting_for] == ["note", "on_start"]
    instance = engine.complete_user_task(engine.load(instance.id), "note", {"checked": True})

    assert instance.status == "completed", instance.waiting_for
    assert {k: instance.main.resolve(k) for k in ("reviewed", "checked")} == {"reviewed": True, "checked": True}


def _split_while_reminded(nested: bool) -> str:
    """A person reviews, then two people sign in parallel; a timer event sub-process ("PT1H") asks
    another person to check, and notes it."""
    text = _event_sub(_timer_start('<bpmn:timeDuration>"PT1H"</bpmn:timeDuration>'), nested=nested)
    text = text.replace('<bpmn:scriptTask id="note"><bpmn:script>noted = True</bpmn:script></bpmn:scriptTask>',
                        '<bpmn:userTask id="check"/><bpmn:scriptTask id="note"><bpmn:script>noted = True</bpmn:script>'
                        '</bpmn:scriptTask><bpmn:sequenceFlow id="g0" sourceRef="check" targetRef="note"/>')
    text = text.replace('sourceRef="on_start" targetRef="note"', 'sourceRef="on_start" targetRef="check"')
    fork = ('<bpmn:parallelGateway id="fork"/><bpmn:userTask id="sign_a"/><bpmn:userTask id="sign_b"/>'
            '<bpmn:parallelGateway id="joined"/>'
            '<bpmn:sequenceFlow id="k1" sourceRef="review" targetRef="fork"/>'
            '<bpmn:sequenceFlow id="k2" sourceRef="fork" targetRef="sign_a"/>'
            '<bpmn:sequenceFlow id="k3" sourceRef="fork" targetRef="sign_b"/>'
            '<bpmn:sequenceFlow id="k4" sourceRef="sign_a" targetRef="joined"/>'
            '<bpmn:sequenceFlow id="k5" sourceRef="sign_b" targetRef="joined"/>'
            '<bpmn:sequenceFlow id="k6" sourceRef="joined" targetRef="s_end"/>')
    return text.replace('<bpmn:sequenceFlow id="h2" sourceRef="review" targetRef="s_end"/>', fork)


@pytest.mark.parametrize("nested", [False, True], ids=["process", "sub_process"])
def test_a_timer_event_sub_process_that_runs_beside_parallel_branches_comes_back_at_their_join(
        tmp_path: Path, nested: bool) -> None:
    """Its path wrote into the context the branches were split from while they ran, and their join
    failed ("context 'main' changed after the split's snapshot"); as a message event sub-process's
    path, it runs in a context of its own, brought back once they have joined (found by the random
    processes)."""
    clock = _Clock()
    engine = Engine(store=f"sqlite:///{tmp_path / 'i.db'}", clock=clock)
    instance = engine.run(engine.start(load_process(write(tmp_path, "process", _split_while_reminded(nested)))))
    clock.now += 2 * 3600
    instance = engine.resume(engine.load(instance.id))
    for task_id, data in [("review", {"reviewed": True}), ("sign_a", {"a": 1}), ("check", {"checked": True}),
                          ("sign_b", {"b": 2})]:
        instance = engine.complete_user_task(engine.load(instance.id), task_id, data)

    assert instance.status == "completed", instance.error
    assert {k: instance.main.resolve(k) for k in ("reviewed", "a", "b", "checked", "noted")} == {
        "reviewed": True, "a": 1, "b": 2, "checked": True, "noted": True}
    assert LayeredContext.replay(instance.main.tape) == instance.main


def test_a_timer_event_sub_process_whose_path_holds_a_boundary_path_brings_both_back(tmp_path: Path) -> None:
    """The path of the timer event sub-process runs a sub-process with a non-interrupting boundary
    timer, whose own path ends inside the event sub-process: both come back at its end (its end saw
    them apart: "received what no one split sent together")."""
    inner = ('<bpmn:subProcess id="gather"><bpmn:startEvent id="g_start"/><bpmn:userTask id="collect"/>'
             '<bpmn:endEvent id="g_end"/><bpmn:sequenceFlow id="m1" sourceRef="g_start" targetRef="collect"/>'
             '<bpmn:sequenceFlow id="m2" sourceRef="collect" targetRef="g_end"/></bpmn:subProcess>'
             '<bpmn:boundaryEvent id="slow" attachedToRef="gather" cancelActivity="false"><bpmn:timerEventDefinition>'
             '<bpmn:timeDuration>"PT2H"</bpmn:timeDuration></bpmn:timerEventDefinition></bpmn:boundaryEvent>'
             '<bpmn:scriptTask id="nudge"><bpmn:script>nudged = True</bpmn:script></bpmn:scriptTask>'
             '<bpmn:endEvent id="nudged_end"/><bpmn:sequenceFlow id="m3" sourceRef="slow" targetRef="nudge"/>'
             '<bpmn:sequenceFlow id="m4" sourceRef="nudge" targetRef="nudged_end"/>')
    text = _event_sub(_timer_start('<bpmn:timeDuration>"PT1H"</bpmn:timeDuration>'))
    text = text.replace('<bpmn:scriptTask id="note"><bpmn:script>noted = True</bpmn:script></bpmn:scriptTask>',
                        inner + '<bpmn:scriptTask id="note"><bpmn:script>noted = True</bpmn:script></bpmn:scriptTask>'
                        '<bpmn:sequenceFlow id="m5" sourceRef="gather" targetRef="note"/>')
    text = text.replace('sourceRef="on_start" targetRef="note"', 'sourceRef="on_start" targetRef="gather"')
    clock = _Clock()
    engine = Engine(store=f"sqlite:///{tmp_path / 'i.db'}", clock=clock)
    instance = engine.run(engine.start(load_process(write(tmp_path, "process", text))))
    for hours in (1, 2):  # the event sub-process starts, then its sub-process's boundary timer fires
        clock.now += hours * 3600
        instance = engine.resume(engine.load(instance.id))
    instance = engine.complete_user_task(engine.load(instance.id), "collect", {"collected": True})
    instance = engine.complete_user_task(engine.load(instance.id), "review", {})

    assert instance.status == "completed", instance.error
    assert {k: instance.main.resolve(k) for k in ("collected", "nudged", "noted")} == {
        "collected": True, "nudged": True, "noted": True}


@pytest.mark.parametrize("nested", [False, True], ids=["top", "in_sub_process"])
def test_an_interrupting_cycle_event_sub_process_interrupts_at_its_first_repetition_once(tmp_path: Path,
                                                                                       nested: bool) -> None:
    """A cycle timer's start event completes after its last repetition: the process was interrupted
    only then, hours after the event sub-process first ran. It starts once, at the first."""
    start = ('<bpmn:startEvent id="on_start"{interrupting}><bpmn:timerEventDefinition><bpmn:timeCycle>"R3/PT1H"'
             '</bpmn:timeCycle></bpmn:timerEventDefinition></bpmn:startEvent>')
    path = write(tmp_path, "guarded", _guarded(start, interrupting=True, nested=nested))
    clock = Clock()
    engine = Engine(f"sqlite:///{tmp_path / 'esp.db'}", clock=clock)
    instance = engine.run(engine.start(load_process(path), {"number": 7}))
    clock.now += 3601

    done = engine.resume(engine.load(instance.id))

    assert done.status == "completed" and done.waiting_for == []
    assert done.main.resolve("escalated") == "escalated CL-7"
    assert path_of(done.workflow).count("escalate") == 1 and "review" not in path_of(done.workflow)
    assert done.main.get("closed") is (True if nested else None)
    _replays(done)


def test_an_interrupting_event_sub_process_stops_the_other_message_starts_of_its_process(tmp_path: Path) -> None:
    """Once an interrupting event sub-process started, the rest of its process is over: its other
    message-started event sub-processes (and this one's start) no longer listen. They were still
    listed in ``waiting_for``, and a message started them beside the running one, its changes
    merged into the interrupted process (a second ``cancel`` started the handler again)."""
    text = HEAD + f"""  <bpmn:process id="twice" isExecutable="true">
    <bpmn:startEvent id="start"/><bpmn:userTask id="review"/><bpmn:endEvent id="end"/>
    <bpmn:subProcess id="on_cancel" triggeredByEvent="true">
      <bpmn:startEvent id="cancel_start"><bpmn:messageEventDefinition messageRef="m_cancel"/></bpmn:startEvent>
      <bpmn:userTask id="confirm_cancel"/><bpmn:endEvent id="cancel_end"/>
      <bpmn:sequenceFlow id="c1" sourceRef="cancel_start" targetRef="confirm_cancel"/>
      <bpmn:sequenceFlow id="c2" sourceRef="confirm_cancel" targetRef="cancel_end"/></bpmn:subProcess>
{ON_DOCS_NOTE}""" + flows("start>review", "review>end") + TAIL
    engine, instance = started(tmp_path, text)
    instance = engine.send_event(engine.load(instance.id), "cancel", {})
    assert [(w["kind"], w["task_id"]) for w in instance.waiting_for] == [("user_task", "confirm_cancel")]
    for name in ("documents_received", "cancel"):
        with pytest.raises(InstanceStateError, match=f"does not wait for message {name!r}"):
            engine.send_event(engine.load(instance.id), name, {"files": ["a"]})

    done = engine.complete_user_task(engine.load(instance.id), "confirm_cancel", {"ok": True})

    assert done.status == "completed", done.error
    assert done.main.get("noted") is None and done.main.get("files") is None
    assert path_of(done.workflow) == ["start", "cancel_start", "confirm_cancel", "cancel_end", "on_cancel"]
    _replays(done)


def test_an_event_sub_process_reads_what_one_that_ended_before_it_wrote_while_branches_run(tmp_path: Path) -> None:
    """Two non-interrupting event sub-processes, one after the other, while the process waits in a
    parallel branch. The first one's changes wait for the join to merge back (the branches merge
    against the context as the split left it), yet it has ended: the second, which starts after,
    reads them. It read the context without them (``KeyError``), though they came back later."""
    text = HEAD + """  <bpmn:process id="later" isExecutable="true">
    <bpmn:startEvent id="start"/><bpmn:parallelGateway id="split"/><bpmn:parallelGateway id="join"/>
    <bpmn:userTask id="review"/><bpmn:scriptTask id="prep"><bpmn:script>prepared = True</bpmn:script></bpmn:scriptTask>
    <bpmn:endEvent id="end"/>
    <bpmn:subProcess id="on_docs" triggeredByEvent="true">
      <bpmn:startEvent id="docs_start" isInterrupting="false"><bpmn:messageEventDefinition messageRef="m_docs"/></bpmn:startEvent>
      <bpmn:scriptTask id="note_docs"><bpmn:script>noted = len(files)</bpmn:script></bpmn:scriptTask>
      <bpmn:endEvent id="docs_end"/>
      <bpmn:sequenceFlow id="d1" sourceRef="docs_start" targetRef="note_docs"/>
      <bpmn:sequenceFlow id="d2" sourceRef="note_docs" targetRef="docs_end"/></bpmn:subProcess>
    <bpmn:subProcess id="on_cancel" triggeredByEvent="true">
      <bpmn:startEvent id="cancel_start" isInterrupting="false"><bpmn:messageEventDefinition messageRef="m_cancel"/></bpmn:startEvent>
      <bpmn:scriptTask id="weigh"><bpmn:script>weighed = noted + 1</bpmn:script></bpmn:scriptTask>
      <bpmn:endEvent id="cancel_end"/>
      <bpmn:sequenceFlow id="c1" sourceRef="cancel_start" targetRef="weigh"/>
      <bpmn:sequenceFlow id="c2" sourceRef="weigh" targetRef="cancel_end"/></bpmn:subProcess>
""" + flows("start>split", "split>review", "split>prep", "review>join", "prep>join", "join>end") + TAIL
    engine, instance = started(tmp_path, text)
    instance = engine.send_event(engine.load(instance.id), "documents_received", {"files": ["a", "b"]})
    instance = engine.send_event(engine.load(instance.id), "cancel", {})
    assert instance.status == "waiting", instance.error

    done = engine.complete_user_task(engine.load(instance.id), "review", {"ok": True})

    assert done.status == "completed", done.error
    assert (done.main.resolve("noted"), done.main.resolve("weighed")) == (2, 3)
    assert done.conflicts == [] and done.main.resolve("prepared") is True
    _replays(done)
    _replays(engine.load(done.id))


def test_event_sub_processes_that_ended_while_branches_ran_merge_back_in_the_order_they_ended(tmp_path: Path) -> None:
    """Two non-interrupting event sub-processes end while the process waits in a parallel branch;
    their changes come back at the join. The one that started first (it waited for a person) ended
    last: the other's value was in the process by then, and stays (a side conflict). They merged
    in the order they started, so the later value won."""
    text = HEAD + """  <bpmn:process id="order" isExecutable="true">
    <bpmn:startEvent id="start"/><bpmn:parallelGateway id="split"/><bpmn:parallelGateway id="join"/>
    <bpmn:userTask id="review"/><bpmn:scriptTask id="prep"><bpmn:script>prepared = True</bpmn:script></bpmn:scriptTask>
    <bpmn:endEvent id="end"/>
    <bpmn:subProcess id="on_docs" triggeredByEvent="true">
      <bpmn:startEvent id="docs_start" isInterrupting="false"><bpmn:messageEventDefinition messageRef="m_docs"/></bpmn:startEvent>
      <bpmn:userTask id="check_docs"/>
      <bpmn:scriptTask id="docs_verdict"><bpmn:script>verdict = "documents"</bpmn:script></bpmn:scriptTask>
      <bpmn:endEvent id="docs_end"/>
      <bpmn:sequenceFlow id="d1" sourceRef="docs_start" targetRef="check_docs"/>
      <bpmn:sequenceFlow id="d2" sourceRef="check_docs" targetRef="docs_verdict"/>
      <bpmn:sequenceFlow id="d3" sourceRef="docs_verdict" targetRef="docs_end"/></bpmn:subProcess>
    <bpmn:subProcess id="on_cancel" triggeredByEvent="true">
      <bpmn:startEvent id="cancel_start" isInterrupting="false"><bpmn:messageEventDefinition messageRef="m_cancel"/></bpmn:startEvent>
      <bpmn:scriptTask id="cancel_verdict"><bpmn:script>verdict = "cancelled"</bpmn:script></bpmn:scriptTask>
      <bpmn:endEvent id="cancel_end"/>
      <bpmn:sequenceFlow id="c1" sourceRef="cancel_start" targetRef="cancel_verdict"/>
      <bpmn:sequenceFlow id="c2" sourceRef="cancel_verdict" targetRef="cancel_end"/></bpmn:subProcess>
""" + flows("start>split", "split>review", "split>prep", "review>join", "prep>join", "join>end") + TAIL
    engine, instance = started(tmp_path, text)
    instance = engine.send_event(engine.load(instance.id), "documents_received", {"files": []})
    instance = engine.send_event(engine.load(instance.id), "cancel", {})
    instance = engine.complete_user_task(engine.load(instance.id), "check_docs", {"ok": True})

    done = engine.complete_user_task(engine.load(instance.id), "review", {"ok": True})

    assert done.status == "completed", done.error
    assert done.main.resolve("verdict") == "cancelled"
    assert [(c["key"], c["resolution"]["value"], sorted(c["values"].values())) for c in done.conflicts] == [
        ("verdict", "cancelled", ["cancelled", "documents"])]
    _replays(done)


def test_a_signal_an_interrupting_event_sub_process_throws_starts_no_other_of_its_process(
        tmp_path: Path) -> None:
    """Once an interrupting event sub-process started, the rest of its process is over, its other
    event sub-processes too: a signal it throws itself starts none of them (SpiffWorkflow started
    it as it routed the signal). ``validate`` warns of the shape, naming the throw."""
    text = HEAD + """  <bpmn:process id="thrown" isExecutable="true">
    <bpmn:startEvent id="start"/><bpmn:userTask id="review"/><bpmn:endEvent id="end"/>
    <bpmn:subProcess id="on_cancel" triggeredByEvent="true">
      <bpmn:startEvent id="cancel_start"><bpmn:messageEventDefinition messageRef="m_cancel"/></bpmn:startEvent>
      <bpmn:intermediateThrowEvent id="shout"><bpmn:signalEventDefinition signalRef="s_go"/></bpmn:intermediateThrowEvent>
      <bpmn:endEvent id="cancel_end"/>
      <bpmn:sequenceFlow id="c1" sourceRef="cancel_start" targetRef="shout"/>
      <bpmn:sequenceFlow id="c2" sourceRef="shout" targetRef="cancel_end"/></bpmn:subProcess>
    <bpmn:subProcess id="on_go" triggeredByEvent="true">
      <bpmn:startEvent id="go_start" isInterrupting="false"><bpmn:signalEventDefinition signalRef="s_go"/></bpmn:startEvent>
      <bpmn:scriptTask id="went"><bpmn:script>gone = True</bpmn:script></bpmn:scriptTask><bpmn:endEvent id="go_end"/>
      <bpmn:sequenceFlow id="e1" sourceRef="go_start" targetRef="went"/>
      <bpmn:sequenceFlow id="e2" sourceRef="went" targetRef="go_end"/></bpmn:subProcess>
""" + flows("start>review", "review>end") + TAIL
    path = write(tmp_path, "thrown", text)
    engine, instance = started(tmp_path, path)
    done = engine.send_event(engine.load(instance.id), "cancel", {})
    assert done.status == "completed", done.error
    assert "gone" not in done.main
    ran = {spiff_id for spiff_id in (getattr(t.task_spec, "bpmn_id", None) for t in done.workflow.get_tasks()) if spiff_id}
    assert "shout" in ran and not {"on_go", "went"} & ran
    _replays(done)
    # thrown after a reload (a person answers first inside 'on_cancel'): the same
    waits = write(tmp_path, "thrown_later", text.replace(
        '<bpmn:sequenceFlow id="c1" sourceRef="cancel_start" targetRef="shout"/>',
        '<bpmn:userTask id="confirm_cancel"/><bpmn:sequenceFlow id="c1" sourceRef="cancel_start" '
        'targetRef="confirm_cancel"/><bpmn:sequenceFlow id="c0" sourceRef="confirm_cancel" targetRef="shout"/>'))
    engine, instance = started(tmp_path, waits)
    instance = engine.send_event(engine.load(instance.id), "cancel", {})
    assert [w["task_id"] for w in instance.waiting_for] == ["confirm_cancel"]
    later = engine.complete_user_task(engine.load(instance.id), "confirm_cancel", {})
    assert later.status == "completed", later.error
    assert "gone" not in later.main
    # not interrupting: the signal starts 'on_go', which runs beside
    quiet_path = write(tmp_path, "quiet_run", text.replace('<bpmn:startEvent id="cancel_start">',
                                                           '<bpmn:startEvent id="cancel_start" isInterrupting="false">'))
    engine, instance = started(tmp_path, quiet_path)
    instance = engine.send_event(engine.load(instance.id), "cancel", {})
    assert instance.status == "waiting" and instance.main.resolve("gone") is True
    (warning,) = [p for p in validate_process(path).problems if p.code == "event_subprocess_after_interrupt"]
    assert warning.severity == "warning" and warning.element_id == "shout"
    assert "'on_go'" in warning.message and 'isInterrupting="false"' in warning.message
    assert "starts nothing here" in warning.message
    quiet = text.replace('<bpmn:startEvent id="cancel_start">', '<bpmn:startEvent id="cancel_start" isInterrupting="false">')
    assert not [p for p in validate_process(write(tmp_path, "quiet", quiet)).problems
                if p.code == "event_subprocess_after_interrupt"]


def _escalating_instances(on_body: bool) -> str:
    """Each of two instances of a multi-instance sub-process escalates; a non-interrupting escalation
    boundary event catches it, on the activity or (``on_body``) on a sub-process inside each instance."""
    throw = ('<bpmn:startEvent id="w_start"/><bpmn:intermediateThrowEvent id="raise"><bpmn:escalationEventDefinition '
             'escalationRef="esc"/></bpmn:intermediateThrowEvent><bpmn:endEvent id="w_end"/>'
             '<bpmn:sequenceFlow id="w1" sourceRef="w_start" targetRef="raise"/>'
             '<bpmn:sequenceFlow id="w2" sourceRef="raise" targetRef="w_end"/>')
    catch = ('<bpmn:boundaryEvent id="heard" attachedToRef="{on}" cancelActivity="false"><bpmn:escalationEventDefinition '
             'escalationRef="esc"/></bpmn:boundaryEvent><bpmn:scriptTask id="tell"><bpmn:script>told = True'
             '</bpmn:script></bpmn:scriptTask><bpmn:endEvent id="told_end"/>'
             '<bpmn:sequenceFlow id="t1" sourceRef="heard" targetRef="tell"/>'
             '<bpmn:sequenceFlow id="t2" sourceRef="tell" targetRef="told_end"/>')
    body = (f'<bpmn:startEvent id="e_start"/><bpmn:subProcess id="work">{throw}</bpmn:subProcess>'
            '<bpmn:endEvent id="e_end"/><bpmn:sequenceFlow id="e1" sourceRef="e_start" targetRef="work"/>'
            '<bpmn:sequenceFlow id="e2" sourceRef="work" targetRef="e_end"/>' if on_body else throw)
    return HEAD + """  <bpmn:escalation id="esc" name="esc" escalationCode="E1"/>
  <bpmn:process id="escalations" isExecutable="true">
    <bpmn:startEvent id="start"/><bpmn:endEvent id="end"/>
    <bpmn:subProcess id="each"><bpmn:multiInstanceLoopCharacteristics><bpmn:loopCardinality>2</bpmn:loopCardinality>
    </bpmn:multiInstanceLoopCharacteristics>""" + body + (catch.format(on="work") if on_body else "") + \
        "</bpmn:subProcess>" + ("" if on_body else catch.format(on="each")) + flows("start>each", "each>end") + TAIL


NUDGED = HEAD + """  <bpmn:process id="nudged" isExecutable="true">
    <bpmn:startEvent id="start"/><bpmn:scriptTask id="init"><bpmn:script>nudges = 0</bpmn:script></bpmn:scriptTask>
    <bpmn:userTask id="review"/><bpmn:endEvent id="end"/>
    <bpmn:boundaryEvent id="nudge" attachedToRef="review" cancelActivity="false">{definition}</bpmn:boundaryEvent>
    <bpmn:scriptTask id="count"><bpmn:script>nudges = nudges + 1</bpmn:script></bpmn:scriptTask>
    <bpmn:endEvent id="nudge_end"/>
""" + flows("start>init", "init>review", "review>end", "nudge>count", "count>nudge_end") + TAIL


@pytest.mark.parametrize(("definition", "name", "kind"), [
    ('<bpmn:messageEventDefinition messageRef="m_docs"/>', "documents_received", "message"),
    ('<bpmn:signalEventDefinition signalRef="s_go"/>', "go", "signal"),
], ids=["message", "signal"])
def test_a_non_interrupting_boundary_event_catches_every_event_while_its_activity_runs(
        tmp_path: Path, definition: str, name: str, kind: str) -> None:
    """BPMN: a non-interrupting boundary event fires each time its event comes while the activity
    runs (two inquiries about a waiting claim). SpiffWorkflow 3.2 fired it once: the second
    message was refused as "does not wait for". Each firing runs the path once, in order, each
    with its own payload and record; a reload between them changes nothing; once the activity is
    done the boundary event waits no more."""
    engine, instance = started(tmp_path, NUDGED.format(definition=definition))
    review = next(w["id"] for w in instance.waiting_for if w["task_id"] == "review")
    waits = []
    for n in (1, 2, 3):
        instance = engine.send_event(engine.load(instance.id), name, {"n": n}, kind=kind)
        assert instance.status == "waiting", instance.error
        assert sorted(w["task_id"] for w in instance.waiting_for) == ["nudge", "review"]
        assert instance.main.resolve("nudges") == n and instance.main.resolve("n") == n
        (nudge,) = [w for w in instance.waiting_for if w["task_id"] == "nudge"]
        assert nudge["attached_to"] == review  # the same run of 'review' ...
        waits.append(nudge["id"])
    assert len(set(waits)) == 3  # ... waited on anew after each event
    done = engine.complete_user_task(engine.load(instance.id), "review", {})
    assert done.status == "completed", done.error
    assert done.waiting_for == []
    history = list(done.main.layer(Layer.HISTORY))
    assert [k for k in history if k.startswith("event:nudge")] == ["event:nudge", "event:nudge#2", "event:nudge#3"]
    assert [k for k in history if k.startswith("activity:count")] == ["activity:count", "activity:count#2",
                                                                      "activity:count#3"]
    with pytest.raises(InstanceStateError, match="does not wait for"):
        engine.send_event(engine.load(done.id), name, {"n": 4}, kind=kind)
    _replays(done)


@pytest.mark.parametrize("on_body", [False, True], ids=["on_the_activity", "inside_each_instance"])
def test_a_non_interrupting_boundary_event_on_a_multi_instance_activity_catches_every_instance(
        tmp_path: Path, on_body: bool) -> None:
    """A non-interrupting boundary event on a multi-instance activity whose instances each escalate
    runs its path once per escalation, as BPMN says (SpiffWorkflow 3.2 fired it once per run of the
    activity, plain SpiffWorkflow too; found by the random processes). On a sub-process inside each
    instance, each instance's own catches it."""
    path = write(tmp_path, "process", _escalating_instances(on_body))
    problems = [(p.code, p.severity, p.element_id) for p in validate_process(path).problems]
    assert problems == []
    engine = Engine(f"sqlite:///{tmp_path / 'i.db'}")
    instance = engine.run(engine.start(load_process(path)))
    assert instance.status == "completed", instance.error
    # the scope of each instance (``each#<n>``) keeps what it caught; the activity's path is the main context's
    told = {name: sum(k.startswith("activity:tell") for k in ctx.layer(Layer.HISTORY))
            for name, ctx in instance.contexts.items() if name == "main" or ("#" in name and name.count("/") == 1)}
    assert (told.pop("main"), sum(told.values())) == ((0, 2) if on_body else (2, 0)), told


# two parallel instances, each waiting for a person inside a sub-process that a non-interrupting
# message boundary event watches (the shape of test_random_processes_scopes's failed example)
NUDGED_INSTANCES = HEAD + """  <bpmn:process id="nudged_instances" isExecutable="true">
    <bpmn:startEvent id="start"/><bpmn:endEvent id="end"/>
    <bpmn:subProcess id="each"><bpmn:multiInstanceLoopCharacteristics><bpmn:loopCardinality>2</bpmn:loopCardinality>
    </bpmn:multiInstanceLoopCharacteristics>
      <bpmn:startEvent id="e_start"/><bpmn:endEvent id="e_end"/>
      <bpmn:subProcess id="claim"><bpmn:startEvent id="c_start"/><bpmn:userTask id="review"/><bpmn:endEvent id="c_end"/>
        <bpmn:sequenceFlow id="c1" sourceRef="c_start" targetRef="review"/>
        <bpmn:sequenceFlow id="c2" sourceRef="review" targetRef="c_end"/></bpmn:subProcess>
      <bpmn:boundaryEvent id="nudge" attachedToRef="claim" cancelActivity="false">
        <bpmn:messageEventDefinition messageRef="m_docs"/></bpmn:boundaryEvent>
      <bpmn:scriptTask id="count"><bpmn:script>nudged = True</bpmn:script></bpmn:scriptTask><bpmn:endEvent id="n_end"/>
      <bpmn:sequenceFlow id="e1" sourceRef="e_start" targetRef="claim"/>
      <bpmn:sequenceFlow id="e2" sourceRef="claim" targetRef="e_end"/>
      <bpmn:sequenceFlow id="e3" sourceRef="nudge" targetRef="count"/>
      <bpmn:sequenceFlow id="e4" sourceRef="count" targetRef="n_end"/>
    </bpmn:subProcess>
""" + flows("start>each", "each>end") + TAIL


def test_each_message_reaches_the_boundary_event_of_every_parallel_instance_that_waits(tmp_path: Path) -> None:
    """A message reaches every catch that waits for its name, and a non-interrupting boundary event
    waits anew after each one while its activity runs: with two instances waiting, one message runs
    the path once in each (2), a second message once more in each (4). (The random-process driver
    once sent a second message for the second instance, which the first had already reached, and
    its reference counted 2: the engine's 4 was right.)"""
    engine, instance = started(tmp_path, NUDGED_INSTANCES)
    runs = {w["attached_to"] for w in events_of(instance)}
    assert len(runs) == 2, instance.waiting_for  # one run of 'claim' per instance

    def nudges(inst: Instance) -> int:
        """The runs of 'count': its records in each instance's scope (``each#<n>``) and the side
        contexts of the paths running in it (a path's context comes back into the scope later)."""
        scopes = [name for name, info in inst.branches.items() if info["branch_id"] in ("each#1", "each#2")]
        assert len(scopes) == 2, inst.branches
        return sum(len({k for name, ctx in inst.contexts.items() if name == scope or name.startswith(scope + "/")
                        for k in ctx.layer(Layer.HISTORY) if k.startswith("activity:count")}) for scope in scopes)

    for sent in (1, 2):
        instance = engine.send_event(engine.load(instance.id), "documents_received", {})
        assert instance.status == "waiting", instance.error
        assert {w["attached_to"] for w in events_of(instance)} == runs  # both still wait, anew
        assert nudges(instance) == 2 * sent
    for review in [w["id"] for w in instance.waiting_for if w["kind"] == "user_task"]:
        instance = engine.complete_user_task(engine.load(instance.id), review, {})
    assert instance.status == "completed", instance.error
    assert events_of(instance) == []
    assert nudges(instance) == 4
    _replays(instance)
