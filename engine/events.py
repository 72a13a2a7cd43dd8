"""Messages and signals sent to an instance from outside: who waits for them, and delivery.

SpiffWorkflow decides who catches an event (its ``EventManager``, through
``BpmnWorkflow.send_event``): a waiting intermediate catch event, receive task, boundary
event, a branch of an event-based gateway, or the message / signal start event of an
event sub-process (which starts it). A message reaches every task waiting for its
name, as a signal does; the two differ in what they mean to the process (a message is
addressed to this instance, a signal is broadcast), not in how they are caught.

layerflow decides where the payload goes. SpiffWorkflow keeps it in the catching
task's data (under ``spiffworkflow:messageVariable`` / the signal's ``variableName``),
outside any governance; layerflow writes it into the context of the task that caught
it instead, through the write path every activity's data takes, and hands
SpiffWorkflow an empty payload:

* each catch is a step of its own in its context: ``begin_activity(<catch event id>)``,
  the payload written to WORKING (``write_many``: the layer rules, all keys or none,
  ``write`` events on the tape), and ``complete_activity`` with an
  ``event:<catch event id>`` record in HISTORY (``kind: "event"``, the event's name and
  kind, the keys written, who sent it). The keys move to HISTORY as any activity's do.
* what is written: ``{VARIABLE: payload}`` when the BPMN names a variable for the
  payload (as SpiffWorkflow would set it, so a process reads the same name under
  layerflow as under plain SpiffWorkflow); otherwise the payload's keys (a JSON object;
  none when it is empty or absent).
* a signal caught by several branches writes into each branch's own context.
* an event sub-process runs in a side context of its own, forked from its process's as it
  starts (the process goes on meanwhile, and may split): the payload that started it is
  written there, and all of it comes back when it ends, or once the branches split meanwhile
  have joined (``engine.runtime``, ``enter_subworkflow``).

Everything is checked before anything changes: an event nobody waits for, a payload
that is not an object, a value that is not JSON, a key of the engine's own (a join's
``_mergedConflicts``, any ``_`` key, ``activity:``/``event:``/``compaction:`` records: an
``event_refused`` note), a key the layer rules refuse in any of the catching contexts. A refused key is recorded on the tape of that context (the
``denied`` event every refused write leaves), nothing else changes.

An event is sent to one instance, by its id (``engine.correlate`` finds that instance among the
waiting ones of a store, by the message's name and the values its context holds). A message with correlation properties
is handed to SpiffWorkflow with its payload and correlation keys, as another process
would send it: the first one fixes the instance's keys, a later one with other keys is
not caught (SpiffWorkflow keeps that payload in the task's internal data too).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, MutableMapping, Sequence
from dataclasses import dataclass
from typing import Any

from SpiffWorkflow.bpmn.specs.event_definitions.item_aware_event import (ErrorEventDefinition, EscalationEventDefinition,
                                                                    SignalEventDefinition)
from SpiffWorkflow.bpmn.specs.event_definitions.conditional import ConditionalEventDefinition
from SpiffWorkflow.bpmn.specs.event_definitions.message import MessageEventDefinition
from SpiffWorkflow.bpmn.specs.event_definitions.multiple import MultipleEventDefinition
from SpiffWorkflow.bpmn.specs.mixins.events.intermediate_event import BoundaryEvent, EventBasedGateway
from SpiffWorkflow.bpmn.util import BpmnEvent
from SpiffWorkflow.util.task import TaskState

from context_layers import Layer, LayeredContext, freeze, json_equal, thaw
from context_layers.errors import ContextValueError, ContextWriteDenied

from . import spiff
from .gateway_steps import ENGINE_KEY_RULE, is_engine_key

__all__ = ["EVENT_KINDS", "Catch", "catch_thrown", "conditional_members", "deliver", "describe_waiting", "kind_of", "takers", "waiting_catches", "waiting_items"]

EVENT_KINDS = ("message", "signal")


@dataclass(frozen=True)
class Catch:
    """One place that waits for a message or signal."""

    name: str                 # the message's / signal's name
    kind: str                 # "message" | "signal"
    event_id: str             # BPMN id of the catch event (an event-based gateway: its branch's event)
    task_id: str              # BPMN id of the waiting task (an event-based gateway: the gateway)
    task: Any                 # the waiting SpiffWorkflow task; None: an event sub-process's start event
    context: str              # the context the payload goes into
    variable: str | None      # the BPMN's variable for the payload (messageVariable, variableName)
    definition: Any           # SpiffWorkflow's event definition

    def item(self) -> dict[str, Any]:
        """The ``waiting_for`` entry: kind ``event``, plus the event it waits for."""
        item = {"kind": "event", "id": str(self.task.id) if self.task is not None else self.event_id,
                "task_id": self.task_id, "event": self.name, "event_kind": self.kind}
        branch = spiff.gateway_branch(self.task, self.event_id) if self.task is not None else None
        if branch is not None:
            # a branch of an event-based gateway: the gateway waits, the branch's catch event catches
            # (its `event:` record). Each branch is an item of its own, under the id of its catch
            # event's task (the one that runs when it comes first), as the timer branch's item is
            item.update(id=str(branch.id), event_id=self.event_id, gateway_id=self.task_id)
        activity = spiff.attached_activity(self.task) if self.task is not None else None
        if activity is not None:
            # a boundary event: the run of the activity it waits on (a non-interrupting one waits
            # anew after each event it catches, under a new id, while that run goes on)
            item["attached_to"] = str(activity.id)
        return item


def kind_of(definition: Any) -> str | None:
    if isinstance(definition, MessageEventDefinition):
        return "message"
    if isinstance(definition, SignalEventDefinition):
        return "signal"
    return None


def _variable(definition: Any) -> str | None:
    names = spiff.payload_variables(definition)
    return names[0] if names else None


def _members(spec: Any, keep: Callable[[Any], Any] = kind_of) -> list[tuple[Any, str]]:
    """(event definition, BPMN id of the catch event) for each event ``spec`` waits for that ``keep``
    takes (by default: each message or signal)."""
    ed = getattr(spec, "event_definition", None)
    if isinstance(ed, MultipleEventDefinition):
        if isinstance(spec, EventBasedGateway):  # the branches' events, in the order of the branches
            ids = [spiff.spec_bpmn_id(out) for out in spec.outputs]
            return [(d, ids[i] if i < len(ids) else spiff.spec_bpmn_id(spec))
                    for i, d in enumerate(ed.event_definitions) if keep(d)]
        return [(d, spiff.spec_bpmn_id(spec)) for d in ed.event_definitions if keep(d)]
    return [(ed, spiff.spec_bpmn_id(spec))] if keep(ed) else []


def conditional_members(spec: Any) -> list[tuple[Any, str]]:
    """(condition's definition, BPMN id of the catch event) for each conditional event ``spec``
    waits for: a conditional catch, the conditional branches of an event-based gateway."""
    return _members(spec, lambda d: isinstance(d, ConditionalEventDefinition))


def waiting_catches(workflow: Any) -> list[Catch]:
    """Every message and signal the workflow waits for, where SpiffWorkflow would catch it."""
    out: list[Catch] = []
    if workflow.is_completed():
        return out
    waiting_specs = set()
    for task in list(workflow.event_manager.tasks.values()):
        waiting_specs.add(task.task_spec)
        # an event that waits for all of its events (parallelMultiple) keeps the ones it caught in
        # ``seen_events``: it waits for the others only
        seen = [e.event_definition for e in task.internal_data.get("seen_events", [])] \
            if getattr(task.task_spec.event_definition, "parallel", False) else []
        for definition, event_id in _members(task.task_spec):
            if definition in seen:
                continue
            out.append(Catch(definition.name, str(kind_of(definition)), event_id, spiff.bpmn_id_of(task), task,
                             spiff.context_name_of(task), _variable(definition), definition))
    # event sub-processes with a message / signal start: SpiffWorkflow starts one when it is caught,
    # unless an interrupting one started (``_Runtime.interrupt``): then the process is over but for it
    root = workflow.task_tree
    # (a pool of a collaboration whose process starts on a message is started by the pool that sends it,
    # never from outside: its payload would reach the instance's context, shared by every pool)
    starts = [] if root.internal_data.get(spiff.INTERRUPTED_KEY) or spiff.is_collaboration(workflow.spec) \
        else workflow.spec.start.trigger_specs
    for name in starts:
        sp_spec = workflow.subprocess_specs.get(name)
        for start in getattr(sp_spec, "bpmn_start_events", None) or []:
            definition = start.event_definition
            if kind_of(definition) and start not in waiting_specs:
                out.append(Catch(definition.name, str(kind_of(definition)), spiff.spec_bpmn_id(start),
                                 spiff.spec_bpmn_id(start), None, spiff.context_name_of(root),
                                 _variable(definition), definition))
    return out


def waiting_items(workflow: Any) -> list[dict[str, Any]]:
    return [c.item() for c in waiting_catches(workflow)]


def _other_kind_hint(workflow: Any, kind: str, name: str) -> str:
    """A message sent where only a signal of that name waits (or the other way round) names the fix."""
    other = "signal" if kind == "message" else "message"
    if not any(c.kind == other and c.name == name for c in waiting_catches(workflow)):
        return ""
    how = ('"kind": "signal" in the REST body, --signal on `layerflow send`' if other == "signal"
           else 'no "kind" (or "kind": "message") in the REST body, no --signal on `layerflow send`')
    return f"; {name!r} is a {other} here: send it as one ({how}, kind={other!r} in Python)"


def _thrown_not_sent_hint(workflow: Any, name: str) -> str:
    """An error's or escalation's code (or name) sent as a message or signal: the boundary event
    waiting for it catches it only as its activity throws it (a person's answer throws nothing)."""
    for task in list(workflow.event_manager.tasks.values()):
        definition = task.task_spec.event_definition
        kind = "error" if isinstance(definition, ErrorEventDefinition) else \
            "escalation" if isinstance(definition, EscalationEventDefinition) else None
        code = getattr(definition, "code", None)
        if kind is None or name not in (code, definition.name) or task.parent is None:
            continue
        activity = next((spiff.bpmn_id_of(c) for c in task.parent.children
                         if c is not task and not isinstance(c.task_spec, BoundaryEvent)), None)
        thrown = f'BpmnError("{code or name}")'
        how = (f"raise {thrown} in a spiffworkflow:postScript of {activity!r} (or in its handler) when it should be "
               "thrown" if kind == "error" else
               f"no script throws one: draw an exclusive gateway after {activity!r} whose flow to the boundary "
               "event's path is taken on the answer, and take the boundary event away")
        return (f"; {code or name!r} is the code of the {kind} that {kind} boundary event {spiff.bpmn_id_of(task)!r} "
                f"on {activity!r} catches: an {kind} is thrown by the task, never sent; {how}")
    return ""


def describe_waiting(waiting_for: Sequence[Mapping[str, Any]]) -> str:
    """What an instance waits for, in words (for error messages)."""
    parts = []
    for item in waiting_for:
        kind = item.get("kind")
        if kind == "event" and item.get("event"):
            parts.append(f"{item.get('event_kind')} {item['event']!r} at {item.get('task_id')}")
        elif kind == "user_task":
            parts.append(f"user task {item.get('task_id')}")
        elif kind == "timer":
            left = item.get("repetitions_left", 0)
            repeats = "" if "repetitions_left" not in item else (
                ", repeats without end" if left is None else f", {left} repetition(s) left")
            parts.append(f"timer {item.get('task_id')} (due {item.get('due')}{repeats})")
        elif kind == "confirmation":
            parts.append(f"confirmation {item.get('id')}")
        else:
            parts.append(f"{kind} at {item.get('task_id')}")
    return "; ".join(parts) or "nothing"


def _event(workflow: Any, definition: Any, payload: Any, bad_request: type[Exception]) -> BpmnEvent:
    """The event SpiffWorkflow catches: no payload (it goes into the context), unless the
    message has correlation properties. Then SpiffWorkflow needs it, as any sender gives
    it: to record the instance's correlation keys from the first message, and to catch
    a later one only when its keys match."""
    props = getattr(definition, "correlation_properties", None) or []
    if not props:
        return BpmnEvent(definition, payload=None)
    try:
        values = dict(payload) if isinstance(payload, Mapping) else {}
        correlations = definition.calculate_correlations(workflow.script_engine, props, values)
    except Exception as err:  # noqa: BLE001 - SpiffWorkflow evaluates the retrieval expressions
        expressions = ", ".join(f"{p.name}: {p.retrieval_expression}" for p in props)
        raise bad_request(f"the payload of message {definition.name!r} must carry its correlation properties "
                          f"({expressions}): {type(err).__name__}: {err}") from None
    return BpmnEvent(definition, payload=payload, correlations=correlations)


def _refuse_uncorrelated(named: Sequence[Catch], event: BpmnEvent | None, workflow: Any, kind: str, name: str,
                         instance_id: str, refusal: type[Exception]) -> None:
    """Raise ``refusal`` saying why catches that wait for ``event`` did not take it, when its correlation
    keys decide: SpiffWorkflow compares them with the keys of the workflow (or sub-process) the catch is
    in, and catches only when one of the message's keys is there with the same value."""
    if event is None or not event.correlations:
        return
    held: dict[str, Any] = {}
    for c in named:
        held.update(getattr(c.task.workflow if c.task is not None else workflow, "correlations", None) or {})
    if not held:
        return
    where = ", ".join(sorted({c.event_id for c in named}))
    clash = {key: value for key, value in event.correlations.items() if key in held and held[key] != value}
    if clash:
        raise refusal(
            f"instance {instance_id} waits for {kind} {name!r}, but for other correlation values: the "
            f"message carries {clash}, the instance has {({key: held[key] for key in clash})}; send the message "
            "meant for this instance (its payload's correlation properties decide which instance it is for)")
    raise refusal(
        f"instance {instance_id} waits for {kind} {name!r} at {where}, but SpiffWorkflow catches a correlated "
        f"message only when one of its correlation keys is one the instance already holds: the message has "
        f"correlation key {', '.join(map(repr, sorted(event.correlations)))}, the instance "
        f"{', '.join(map(repr, sorted(held)))}; correlate message {name!r} through a key the instance holds "
        "(a correlationProperty of that key with a retrieval expression for the message)")


def _mark_delivered(workflow: Any, catches: Sequence[Catch]) -> dict[int, str]:
    """Tell the catching tasks that this payload is in the context already (``spiff.DELIVERED_KEY``):
    SpiffWorkflow still hands it to them (as the variable's value) when they run. Returns the
    context of each event sub-process's start event that caught it (by ``id`` of its catch)."""
    started: dict[int, str] = {}
    for c in catches:
        if c.task is not None:
            c.task.internal_data[spiff.DELIVERED_KEY] = True
            continue
        # an event sub-process's start event: SpiffWorkflow made the task as it caught the event
        for wf in [workflow, *workflow.subprocesses.values()]:
            for task in wf.tasks.values():
                if (spiff.bpmn_id_of(task) == c.event_id and c.definition.name in task.internal_data
                        and not task.has_state(TaskState.FINISHED_MASK)):
                    task.internal_data[spiff.DELIVERED_KEY] = True
                    started[id(c)] = spiff.context_name_of(task)
    return started


def _open_multi_instance(catch: Catch, activity: str) -> Any:
    """The multi-instance task ``catch`` (a boundary event) is attached to, when it is the activity
    open in the catching context (its instances wait for people); else None."""
    split = catch.task.parent if catch.task is not None else None
    for task in split.children if split is not None else []:
        if task is not catch.task and spiff.bpmn_id_of(task) == activity and task.internal_data.get(spiff.MULTI_KEY):
            return task
    return None


def catch_thrown(ctx: LayeredContext, task: Any, values: Mapping[str, Any], *,
                 sent_from: Mapping[str, Any] | None = None, code: str | None = None) -> None:
    """The payload of an event the process threw itself (an intermediate throw or end event, a
    send task), where SpiffWorkflow put it for ``task`` (the catching event): into ``ctx``, as
    an event sent from outside goes (``deliver``), recorded as ``event:<catch event id>``, also
    when it carries nothing (``values`` empty); ``sent_from`` (a collaboration's message: the
    sending pool, ``collaboration.sender_of``) and ``code`` (a thrown error's or escalation's) are
    on the record."""
    spec = task.task_spec
    event_id = spiff.bpmn_id_of(task)
    if isinstance(spec, EventBasedGateway) and task.children:
        event_id = spiff.bpmn_id_of(task.children[0])  # the branch its event opened
    definitions = spec.event_definition.event_definitions if isinstance(spec.event_definition,
                                                                          MultipleEventDefinition) else [spec.event_definition]
    caught = next((d for d in definitions if set(spiff.payload_variables(d)) & set(values)), spec.event_definition)
    if isinstance(caught, MultipleEventDefinition):
        # the event of its definitions that came (the last to come, for one that waited for all)
        seen = [e.event_definition for e in task.internal_data.get("seen_events", [])]
        caught = (seen or [d for d in definitions if kind_of(d)] or [caught])[-1]
    # (layerflow's error and escalation classes are named Engine<...>: the record says "error")
    kind = kind_of(caught) or ("error" if isinstance(caught, ErrorEventDefinition) else "escalation"
                               if isinstance(caught, EscalationEventDefinition)
                               else type(caught).__name__.removesuffix("EventDefinition").lower())
    name = getattr(caught, "name", None) or event_id
    ctx.begin_activity(event_id, actor=event_id)
    try:
        ctx.write_many(Layer.WORKING, dict(values), actor=event_id)
    except BaseException as err:
        ctx.abort_activity(event_id, reason=f"{type(err).__name__}: {err}"[:500], actor="engine")
        raise
    sender = ""
    if sent_from is not None:
        sender = f" from {sent_from.get('element')!r} of pool {sent_from.get('participant') or sent_from.get('process')!r}"
    ctx.complete_activity(event_id, summary=f"{kind} {name!r} caught at {event_id}{sender}: "
                                            f"{', '.join(values) or 'no data'}",
                          actor=event_id, record_kind="event",
                          details={"event": name, "event_kind": kind, "sent_by": "process",
                                   **({"code": code} if code is not None else {}),
                                   **({"sent_from": dict(sent_from)} if sent_from is not None else {})})


def _check_output_mappings(c: Catch, ctx: LayeredContext, values: Mapping[str, Any], actor: str) -> None:
    """The catch event's output mappings (``zeebe:output source="=amount" target="paid"``) run as it
    fires, after the payload went in: part of catching the event. One whose write the layer rules
    refuse (a PROCESS key it would change, a SYSTEM key) refuses the event whole, before anything is
    delivered, as a payload key the rules refuse does: the instance keeps waiting for a message it
    can take (else it would fail at the catch event with the message used up)."""
    ext = (getattr(c.task.task_spec, "extensions", None) or {}) if c.task is not None else {}
    script = ext.get(spiff.EVENT_OUTPUTS_KEY)
    if not script:
        return
    names: dict[str, Any] = {k: thaw(v) for k, v in ctx.resolved().items()}
    names.update({k: thaw(freeze(v)) for k, v in values.items()})
    try:
        exec(compile(script, f"<output mappings {c.event_id}>", "exec"), {}, names)  # noqa: S102 - the BPMN's own
    except Exception:  # noqa: BLE001 - the run reports it at the event, naming the event, as before
        return
    mapped: Mapping[str, str] = ext.get(spiff.MAPPED_KEY) or {}
    for target, field in mapped.items():
        key = target.split(".")[0].strip()
        if key not in names or key in values:
            continue
        _, reason = ctx.check_write(Layer.WORKING, key)
        if reason is None or (key in ctx and json_equal(ctx.resolve(key), freeze(names[key]))):
            continue  # allowed, or no change (the value the context holds)
        try:
            ctx.write(Layer.WORKING, key, names[key], actor=actor)  # denied: on the tape, nothing written
        except ContextWriteDenied as err:
            raise ContextWriteDenied(err.key, err.requested, err.effective,
                                     f"{err.reason}; {key!r} is set by {field} of {c.event_id!r}, which runs as "
                                     f"{c.kind} {c.name!r} is caught: nothing was delivered, the instance still "
                                     "waits for it") from None


def _refused_at(err: ContextWriteDenied, c: Catch, kind: str, name: str) -> ContextWriteDenied:
    """A payload key the layer rules refuse, named with the catch event it was for (its
    ``task_id``) and what the sender can do: the write rule's own advice is an activity's."""
    refused = ContextWriteDenied(err.key, err.requested, err.effective,
                                 f"{err.reason}; the payload of {kind} {name!r} goes to the context of catch "
                                 f"event {c.event_id!r}: send the payload without {err.key!r}, or name one "
                                 "variable for the whole payload in the BPMN (spiffworkflow:messageVariable, "
                                 "or a signal's variableName); nothing was delivered, the instance still waits "
                                 "for it", op=err.op)
    refused.context = err.context
    refused.task_id = c.event_id
    return refused


def takers(workflow: Any, name: str, payload: Any, *, kind: str = "message"
           ) -> tuple[list[Catch], BpmnEvent | None, list[Catch]]:
    """Who would take event ``name`` with ``payload``: the catches waiting for its name, the event
    SpiffWorkflow is handed, and those of the catches that catch it (SpiffWorkflow's own test: a
    boundary event catches only while it waits, a correlated message only with the instance's keys).
    Changes nothing; a payload without the message's correlation properties raises ``BadRequest``."""
    from .governance import BadRequest  # the engine's error tree (governance imports runtime)

    named = [c for c in waiting_catches(workflow) if c.kind == kind and c.name == name]
    event = _event(workflow, named[0].definition, payload, BadRequest) if named else None
    if event is None:
        return named, None, []
    return named, event, [c for c in named if c.task is None or
                          (c.task.task_spec.catches(c.task, event) and c.definition.catches(c.task, event))]


def deliver(workflow: Any, contexts: MutableMapping[str, LayeredContext], name: str, payload: Any, *,
            kind: str, actor: str, instance_id: str, waiting_for: Sequence[Mapping[str, Any]]) -> list[Catch]:
    """Deliver a message or signal: check everything, let SpiffWorkflow catch the event, then
    write the payload into each catching context (see the module doc). Returns the catches.

    Raises, changing nothing: ``InstanceStateError`` when nothing waits for the event (the
    message names what the instance waits for) or a catching context has an activity open;
    ``BadRequest`` for a payload that is not an object where its keys are to be written;
    ``ContextValueError`` for a value that is not JSON; ``ContextWriteDenied`` for a key the
    layer rules refuse (recorded on the tape of its context, as every refused write is).
    """
    from .governance import BadRequest, InstanceStateError  # the engine's error tree (governance imports runtime)

    if kind not in EVENT_KINDS:
        raise ValueError(f"kind={kind!r}: use 'message' or 'signal'")
    named, event, catches = takers(workflow, name, payload, kind=kind)
    if event is None or not catches:
        _refuse_uncorrelated(named, event, workflow, kind, name, instance_id, InstanceStateError)
        raise InstanceStateError(f"instance {instance_id} does not wait for {kind} {name!r}; it waits for: "
                                 f"{describe_waiting(waiting_for)}{_other_kind_hint(workflow, kind, name)}"
                                 f"{_thrown_not_sent_hint(workflow, name)}")

    writes: list[tuple[Catch, LayeredContext, dict[str, Any]]] = []
    interrupted: list[tuple[LayeredContext, Any]] = []  # open multi-instance activities the event cancels
    inside: set[int] = set()  # catches whose payload joins the open activity they are attached to
    for c in catches:
        ctx = contexts[c.context]
        # (an event sub-process's start: its payload goes into the context the event sub-process
        # gets, forked from this one, never into an open activity's)
        if ctx.current_activity is not None and c.task is not None:
            multi = _open_multi_instance(c, ctx.current_activity)
            if multi is None:
                raise InstanceStateError(f"instance {instance_id}: {c.kind} {name!r} is caught at {c.event_id} in "
                                         f"context {ctx.name!r}, where activity {ctx.current_activity!r} is open "
                                         "(waiting for a confirmation); answer it first, then send the event again")
            # a boundary event of a multi-instance activity whose instances wait for people
            if getattr(c.task.task_spec, "cancel_activity", False):
                interrupted.append((ctx, multi))
            else:
                inside.add(id(c))
        if c.variable is not None:
            values = {c.variable: payload}
        elif payload is None:
            values = {}
        elif isinstance(payload, Mapping):
            values = dict(payload)
        else:
            raise BadRequest(f"the payload of {kind} {name!r} must be a JSON object: its keys are written to WORKING "
                             f"of the context that catches it ({c.event_id}); got {type(payload).__name__}. Send an "
                             "object, or name one variable for the payload in the BPMN ("
                             + ("spiffworkflow:messageVariable in the extensionElements of the catch event's "
                                "bpmn:messageEventDefinition, or of a bpmn:receiveTask" if kind == "message" else
                                f"spiffworkflow:variableName in the extensionElements of the bpmn:{kind}") + ")")
        for key, value in values.items():
            if not isinstance(key, str) or not key:
                raise ContextValueError(str(key), f"payload keys must be non-empty strings, got {key!r}")
            try:
                freeze(value)
            except (TypeError, ValueError) as err:
                raise ContextValueError(str(key), str(err)) from None
            if c.variable is None and is_engine_key(key):
                # data from outside, as an inject or a person's answer: a sender's `_mergedConflicts`
                # would forge a join's resolutions, an `event:` key the engine's record of a catch
                held = ctx.locate(key)
                why = f"{ENGINE_KEY_RULE}; a payload carries data keys only"
                ctx.record("event_refused", actor=actor, data={"event": name, "event_kind": kind,
                                                               "caught_at": c.event_id, "key": key, "reason": why})
                raise _refused_at(ContextWriteDenied(key, Layer.WORKING, held if held is not None and
                                                     held < Layer.WORKING else Layer.WORKING, why), c, kind, name)
        # in key order: a JSON object has none, and the same payload must make the same HISTORY
        # (and send the same bytes to the next model) whatever order its sender wrote the keys in
        writes.append((c, ctx, dict(sorted(values.items()))))
    for c, ctx, values in writes:
        if any(ctx.check_write(Layer.WORKING, key)[1] is not None for key in values):
            try:
                ctx.write_many(Layer.WORKING, values, actor=actor)  # denied: on the tape, nothing written
            except ContextWriteDenied as err:
                raise _refused_at(err, c, kind, name) from None
        _check_output_mappings(c, ctx, values, actor)

    for ctx, multi in interrupted:  # as SpiffWorkflow will cancel the activity: closed, its writes undone
        ctx.abort_activity(ctx.current_activity or "", reason=f"interrupted by {kind} {name!r}", actor=actor)
        multi.internal_data.pop(spiff.MULTI_KEY, None)
        multi.data = {}
    # (the payload goes into the catching contexts only below: a non-interrupting boundary event's
    # path, which runs next, forks with it, not at the catch as for an event thrown inside: spiff.catch)
    workflow.lf_delivering = True
    try:
        workflow.send_event(event)
    finally:
        workflow.lf_delivering = False
    started = _mark_delivered(workflow, catches)
    for c, ctx, values in writes:
        if c.task is None and id(c) in started:  # the event sub-process it started runs in a context of its own
            ctx = contexts[started[id(c)]]
        if id(c) in inside:  # the open activity takes the payload; its record notes the event
            ctx.write_many(Layer.WORKING, values, actor=actor)
            ctx.record("event", actor=actor, data={"event": name, "event_kind": c.kind, "caught_at": c.event_id,
                                                   "keys": list(values), "sent_by": actor})
            continue
        ctx.begin_activity(c.event_id, actor=actor)
        ctx.write_many(Layer.WORKING, values, actor=actor)
        keys = ", ".join(values) or "no data"
        ctx.complete_activity(c.event_id, summary=f"{c.kind} {name!r} caught at {c.event_id}: {keys}", actor=actor,
                              record_kind="event", details={"event": name, "event_kind": c.kind, "sent_by": actor})
    return catches
