"""SpiffWorkflow glue: the parser, the spec subclasses, the script engine, the serializer.

This is the only module of layerflow's run path that imports SpiffWorkflow. Why it is
built this way (see shared/notes/spiffworkflow-3.2.md):

* Spec subclasses are the one hook that fires for every task type and survives
  serialization. ``LayerflowBpmnParser`` builds a ``Layerflow<Spec>`` twin of every spec
  class SpiffWorkflow would build, and ``SERIALIZER`` knows the twins.
* layerflow's context lives outside ``task.data``: stock SpiffWorkflow shares nested data
  between branches and lets the last branch win at a join. A task carries only the
  name of its context in ``task.internal_data`` (serialized, never merged).
* The twins call a per-workflow *driver* found at ``workflow.top_workflow.layerflow``
  (the engine sets it after creating or deserializing a workflow). Without a driver the
  twins behave like the stock classes, so a layerflow-parsed spec still runs under plain
  SpiffWorkflow; one exception, with or without a driver: an inclusive gateway joins by
  BPMN's rule (``engine.inclusive_join``), where SpiffWorkflow's own check fires it early.
* SpiffWorkflow 3.2 reads no link events: the parser connects a link throw event to its
  catch event (``engine.links``) as it parses the throw, so the spec holds the jump as if a
  sequence flow drew it, and runs under plain SpiffWorkflow too.
* SpiffWorkflow 3.2 sees no task deeper than 1,000 levels, and a loop adds levels with
  every pass: ``engine.deep_trees`` lifts that limit (and the recursion that comes with
  deep trees) when this module is imported.

The driver protocol (implemented by ``engine.runtime``)::

    run_activity(task, default_run) -> bool | None   # an activity's _run_hook
    evaluate(task, expression[, external]) -> Any    # gateway, loop and event conditions (external: names
                                                     # SpiffWorkflow offers besides task data, read last)
    exec_script(task, script) -> bool                # spiff pre/post scripts (True: it threw a BPMN error,
                                                     # thrown to its catching events)
    prepare(task) -> bool                            # a user (manual) task with a preScript becomes ready
    join(task) -> bool                               # a joining gateway's _run_hook; False: wait
    split(task) -> None                              # a splitting gateway, once its children exist
    begin_multi(task) -> None                        # a multi-instance task, before spiff makes instances
    abort_multi(task, err) -> None                   # ... when spiff failed to make them
    complete_multi(task) -> bool                     # ... once every instance merged (its _run_hook; True:
                                                     # its postScript threw a BPMN error)
    timer(task) -> None                              # a timer event's _update_hook (due by the engine's clock?
                                                     # a cycle: its first due time)
    now() -> datetime                                # the engine's clock (a cycle timer's repetitions)
    io_inputs(task) -> dict                          # an activity's ioSpecification data inputs, from the context
    boundary_caught(task) -> None                    # a non-interrupting boundary event caught a message, signal
                                                     # or escalation: its path will start from the context as it is
    boundary_path(task, path=None) -> None           # a non-interrupting boundary event fires, or a cycle
                                                     # timer's repetition (``path``: its first task): a path starts
    thrown_out(task, event) -> None                  # a message or signal ``task`` threw left the instance:
                                                     # nothing in it caught it (SpiffWorkflow's bpmn_events)
    caught(task, values, sent_from) -> None          # a catching event ran with the payload of an event the
                                                     # process threw itself: {variable: payload}; sent_from:
                                                     # a collaboration's sender (element, pool's process)
    enter_subworkflow(task, subworkflow) -> None     # a sub-process / call activity starts (SpiffWorkflow's
    leave_subworkflow(task, subworkflow) -> None     # copy_data / update_data: its data in and out)
    cancel_subworkflow(task, subworkflow) -> None    # ... is cancelled, before its tasks are
    event_path(task, path=None) -> None              # a timer, error or escalation starts a path of an event
                                                     # sub-process made with its scope (its start event runs)
    event_path_ended(task) -> None                   # an end event of a non-interrupting error or escalation
                                                     # event sub-process completed, none of its paths running
    start_caught(task) -> None                       # an event sub-process's start event caught an error or
                                                     # escalation of its scope: it runs next

Multi-instance tasks: the wrapper (``MultiInstanceTask``) is *the* activity; its
instances (children of the wrapper, with the original task's spec) run their handlers
inside it. SpiffWorkflow's own bookkeeping of the instances (input collection, output
collection, input and output item) runs on ``task.data`` of the wrapper and of each
instance, and nowhere else: the driver fills the wrapper's data with the input
collection from the context before spiff reads it, each instance's data with its input
and output item only, and lifts the output collection into the context when the wrapper
completes (then empties the wrapper's data, so no successor inherits any of it).
"""

from __future__ import annotations

import ast
import json
import math
import re
import weakref
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from json.encoder import encode_basestring_ascii
from typing import Any, Callable, Iterable, Iterator, Protocol

from lxml import etree
from SpiffWorkflow.bpmn.parser.BpmnParser import BpmnParser
from SpiffWorkflow.bpmn.parser.ValidationException import ValidationException
from SpiffWorkflow.bpmn.parser.event_parsers import (CANCEL_EVENT_XPATH, ERROR_EVENT_XPATH, ESCALATION_EVENT_XPATH,
                                                      MESSAGE_EVENT_XPATH, SIGNAL_EVENT_XPATH, TERMINATION_EVENT_XPATH)
from SpiffWorkflow.bpmn.parser.util import full_tag
from SpiffWorkflow.bpmn.script_engine import PythonScriptEngine
from SpiffWorkflow.bpmn.serializer import BpmnWorkflowSerializer
from SpiffWorkflow.bpmn.serializer.default.workflow import BpmnEventConverter, BpmnWorkflowConverter, WorkflowConverter
from SpiffWorkflow.bpmn.serializer.helpers.encoder import create_encoder
from SpiffWorkflow.bpmn.specs.mixins.multiinstance_task import LoopTask, MultiInstanceTask
from SpiffWorkflow.bpmn.specs.mixins.subworkflow_task import SubWorkflowTask
from SpiffWorkflow.bpmn.specs.control import BoundaryEventJoin, BoundaryEventSplit, BpmnStartTask, _EndJoin
from SpiffWorkflow.bpmn.specs.event_definitions.simple import (CancelEventDefinition, NoneEventDefinition,
                                                              TerminateEventDefinition)
from SpiffWorkflow.bpmn.specs.mixins.exclusive_gateway import ExclusiveGateway
from SpiffWorkflow.bpmn.specs.mixins.inclusive_gateway import InclusiveGateway
from SpiffWorkflow.bpmn.specs.mixins.parallel_gateway import ParallelGateway
from SpiffWorkflow.bpmn.specs.mixins.unstructured_join import UnstructuredJoin
from SpiffWorkflow.bpmn.specs.event_definitions.item_aware_event import (CodeEventDefinition, ErrorEventDefinition,
                                                                    EscalationEventDefinition, ItemAwareEventDefinition,
                                                                    SignalEventDefinition)
from SpiffWorkflow.bpmn.specs.mixins.events.event_types import CatchingEvent, ThrowingEvent
from SpiffWorkflow.bpmn.specs.mixins.events.intermediate_event import BoundaryEvent
from SpiffWorkflow.bpmn.specs.mixins.events.end_event import EndEvent
from SpiffWorkflow.bpmn.specs.mixins.events.start_event import StartEvent
from SpiffWorkflow.bpmn.specs.event_definitions.message import MessageEventDefinition
from SpiffWorkflow.bpmn.specs.event_definitions.multiple import MultipleEventDefinition
from SpiffWorkflow.bpmn.specs.event_definitions.timer import (
    CycleTimerEventDefinition,
    DurationTimerEventDefinition,
    TimeDateEventDefinition,
    TimerEventDefinition,
)
from SpiffWorkflow.bpmn.util.event import BpmnEvent, EventManager
from SpiffWorkflow.bpmn.workflow import BpmnWorkflow
from SpiffWorkflow.exceptions import WorkflowException
from SpiffWorkflow.spiff.parser.event_parsers import SpiffEndEventParser
from SpiffWorkflow.spiff.parser.process import SpiffBpmnParser, SpiffProcessParser
from SpiffWorkflow.spiff.parser.task_spec import (BusinessRuleTaskParser, CallActivityParser, ServiceTaskParser,
                                                  SpiffTaskParser)
from SpiffWorkflow.spiff.serializer.config import SPIFF_CONFIG
from SpiffWorkflow.spiff.serializer.task_spec import BusinessRuleTaskConverter, SpiffBpmnTaskConverter
from SpiffWorkflow.spiff.specs import defaults as spiff_defaults
from SpiffWorkflow.spiff.specs.event_definitions import ErrorEventDefinition as SpiffErrorEventDefinition
from SpiffWorkflow.spiff.specs.event_definitions import EscalationEventDefinition as SpiffEscalationEventDefinition
from SpiffWorkflow.bpmn.specs import defaults as bpmn_defaults
from SpiffWorkflow.util.deep_merge import DeepMerge
from SpiffWorkflow.util.task import TaskState

from context_layers.canonical import fast_encode
from context_layers.errors import ActivityError
from gateways.conditions import python_source

from . import call_mappings, deep_trees, dmn, inclusive_join, io_mappings, lean_spiff, links

deep_trees.lift()  # a loop runs as many passes as its condition says (see engine.deep_trees)
lean_spiff.install()  # no per-task bookkeeping nobody reads (see engine.lean_spiff)

__all__ = [
    "LAYERFLOW_NS",
    "SPIFF_NS",
    "CTX_KEY",
    "MultiInstanceTask",  # re-exported: engine.runtime tells a multi-instance loop from a standard one
    "BRANCH_KEY",
    "MAIN_CONTEXT",
    "Driver",
    "LayerflowBpmnParser",
    "LayerflowScriptEngine",
    "SERIALIZER",
    "serialize_json",
    "deserialize",
    "new_workflow",
    "attach",
    "driver_of",
    "driver_of_workflow",
    "context_name_of",
    "element_config_texts",
    "is_activity",
    "is_join",
    "is_split",
    "is_multi",
    "is_timer",
    "timer_definition",
    "timer_event_id",
    "gateway_branch",
    "timer_due",
    "is_cycle",
    "start_cycle",
    "cycle_repetitions_left",
    "EngineCycleTimerEventDefinition",
    "EngineErrorEventDefinition",
    "EngineEscalationEventDefinition",
    "boundary_of_subworkflow",
    "caught_in_scope",
    "error_catchers",
    "throw_activity_error",
    "arm_error_boundaries",
    "ScriptThrew",
    "THROWN_KEY",
    "catching_scope",
    "loop_of",
    "io_names",
    "multi_instance_of",
    "data_name",
    "in_instance_order",
    "MULTI_KEY",
    "DELIVERED_KEY",
    "arrived_branch_tasks",
    "payload_variables",
    "is_collaboration",
    "is_pool",
    "pool_process_of",
    "SENT_FROM_KEY",
    "LayerflowCollaborationStart",
    "bpmn_id_of",
    "branch_start_id",
    "flow_target_id",
]

LAYERFLOW_NS = "https://layerflow.dev/bpmn"
SPIFF_NS = "http://spiffworkflow.org/bpmn/schema/1.0/core"
_BPMN_NS = "http://www.omg.org/spec/BPMN/20100524/MODEL"

# Keys layerflow keeps in task.internal_data (serialized by SpiffWorkflow, never merged).
CTX_KEY = "lf_ctx"          # name of the context this task runs in
BRANCH_KEY = "lf_branch"    # set on the first task of a branch: the branch id
MULTI_KEY = "lf_multi"      # on a multi-instance task: its activity is open in its context
MAPPED_KEY = "lf_mapped"  # a task spec's extensions: target -> the mapping that sets it (``io_mappings``)
EVENT_OUTPUTS_KEY = "lf_event_outputs"  # an event's spec extensions: its output mappings' Python (``io_mappings``)
PREPARED_KEY = "lf_prepared"  # on a task that waits for a person: its preScript ran (the keys it wrote)
DELIVERED_KEY = "lf_delivered"  # on a catching task: the event came from outside, its payload is in the context
CAUGHT_KEY = "lf_caught"  # on an error end event (an escalation): an (interrupting) event waited for it as it threw it
CAUGHT_UP_KEY = "lf_caught_up"  # ... by an event sub-process of the workflow this many levels up (terminate merges so far)
POSTSCRIPT_RAN_KEY = "lf_postscript_ran"  # on an instance of a multi-instance call: its postScript ran in its scope
THROWN_KEY = "lf_thrown"  # on a catching event: the BPMN error an activity threw (engine.BpmnError): code, message, ...
SENT_FROM_KEY = "lf_sent_from"  # on a catching event of a collaboration: the pool and element that threw its message
CAUGHT_EVENT_KEY = "lf_caught_event"  # on a catching event: a message, signal, error or escalation came ({"code"})
CAUGHT_AT_KEY = "lf_caught_at"  # on a non-interrupting boundary event: the snapshot its path forks from (as it caught)
INTERRUPTED_KEY = "lf_interrupted"  # on a workflow's root task: the interrupting event sub-process that ended the rest
MAIN_CONTEXT = "main"


class Driver(Protocol):
    def run_activity(self, task: Any, default_run: Callable[[], Any]) -> Any: ...
    def evaluate(self, task: Any, expression: str, external: Mapping[str, Any] | None = None) -> Any: ...
    def exec_script(self, task: Any, script: str) -> bool: ...
    def prepare(self, task: Any) -> bool: ...
    def join(self, task: Any) -> bool: ...
    def terminate(self, task: Any) -> None: ...
    def interrupt(self, esp: Any, start: Any) -> None: ...
    def split(self, task: Any) -> None: ...
    def begin_multi(self, task: Any) -> None: ...
    def abort_multi(self, task: Any, err: BaseException) -> None: ...
    def complete_multi(self, task: Any) -> bool: ...
    def timer(self, task: Any) -> None: ...
    def now(self) -> datetime: ...
    def caught(self, task: Any, values: dict[str, Any], sent_from: dict[str, Any] | None = None,
               code: str | None = None) -> None: ...
    def thrown_out(self, task: Any, event: Any) -> None: ...
    def caught_error(self, task: Any, thrown: dict[str, Any], variables: list[str]) -> None: ...
    def io_inputs(self, task: Any) -> dict[str, Any]: ...
    def lookup(self, task: Any, names: Iterable[str]) -> dict[str, Any]: ...
    def boundary_caught(self, task: Any) -> None: ...
    def boundary_path(self, task: Any, path: Any = None) -> None: ...
    def enter_subworkflow(self, task: Any, subworkflow: Any) -> None: ...
    def leave_subworkflow(self, task: Any, subworkflow: Any) -> None: ...
    def cancel_subworkflow(self, task: Any, subworkflow: Any) -> None: ...
    def event_path(self, task: Any, path: Any = None) -> None: ...
    def event_path_ended(self, task: Any) -> None: ...
    def start_caught(self, task: Any) -> None: ...
    def no_branch_taken(self, task: Any) -> Exception: ...


def driver_of(task: Any) -> Driver | None:
    return driver_of_workflow(task.workflow.top_workflow)


def driver_of_workflow(wf: Any) -> Driver | None:
    """The driver ``attach`` gave ``wf`` (None: none, or it is gone)."""
    ref = getattr(wf, "layerflow", None)
    return ref() if ref is not None else None


def _parent_across_subprocess(task: Any) -> Any:
    parent = task.parent
    if parent is None:
        wf = task.workflow
        pid = wf.parent_task_id
        if pid is not None:
            parent = wf.top_workflow.get_task_from_id(pid)
    return parent


def context_name_of(task: Any) -> str:
    """The context a task runs in: its own tag, else the nearest tagged ancestor's."""
    t = task
    while t is not None:
        name = t.internal_data.get(CTX_KEY)
        if name is not None:
            return str(name)
        t = _parent_across_subprocess(t)
    return MAIN_CONTEXT


def bpmn_id_of(task: Any) -> str:
    return spec_bpmn_id(task.task_spec)


def branch_start_id(task: Any) -> str:
    """The BPMN id of the element a branch starts with, from the first task of the branch. An
    activity with boundary events is entered through a split SpiffWorkflow adds before it
    (``<id>.BoundaryEventSplit``, no BPMN id): the branch starts with that activity."""
    return flow_target_id(task.task_spec)


def flow_target_id(spec: Any) -> str:
    """The BPMN id of the element a flow leads to, given the spec SpiffWorkflow connected it to
    (``branch_start_id``)."""
    if isinstance(spec, BoundaryEventSplit):
        main = [s for s in spec.outputs if not isinstance(s, BoundaryEvent)]
        if len(main) == 1:
            return spec_bpmn_id(main[0])
    return spec_bpmn_id(spec)


def spec_bpmn_id(spec: Any) -> str:
    """The BPMN id of a spec (SpiffWorkflow's own specs, which have none: its name)."""
    return str(getattr(spec, "bpmn_id", None) or spec.name)


# --------------------------------------------------------------------------- specs

# Which stock spec classes are *activities* (get begin/complete and a handler).
_ACTIVITY_BASES = (
    spiff_defaults.NoneTask,
    spiff_defaults.UserTask,
    spiff_defaults.ManualTask,
    spiff_defaults.ScriptTask,
    spiff_defaults.ServiceTask,
    spiff_defaults.BusinessRuleTask,
)
_MULTI_BASES = (MultiInstanceTask,)
_GATEWAY_BASES = (
    bpmn_defaults.ExclusiveGateway,
    bpmn_defaults.ParallelGateway,
    bpmn_defaults.InclusiveGateway,
)


class ActivityCancelled(Exception):
    """Why an open activity closes without completing: an interrupting event cancelled its task."""


class ScriptThrew(Exception):
    """A preScript threw a BPMN error (``engine.BpmnError``) as its task became ready, and the driver
    threw it to the events that catch it: the task stops there (STARTED, nothing of it made: no
    sub-process started, no instance, no wait) until the catching event cancels it."""


class _LayerflowSpecMixin:
    """Placed first in the MRO of every twin; ``lf_role`` is set per twin class."""

    lf_role = "flow"  # "activity" | "gateway" | "multi" | "flow"

    def _update_hook(self, my_task: Any) -> Any:
        try:
            return self._update_own(my_task)
        except ScriptThrew:
            my_task._set_state(TaskState.STARTED)
            return None

    def _update_own(self, my_task: Any) -> Any:
        if self.lf_role == "activity" and multi_instance_of(my_task) is not None and driver_of(my_task) is not None:
            # An instance of a multi-instance activity would inherit a deep copy of the activity's
            # task data (the whole input and output collections, which the driver put there for
            # SpiffWorkflow): n instances, n copies of n items, each converted again at every save.
            # It keeps the input item SpiffWorkflow gave it; the rest of its data is the context's.
            own = set(my_task.data)
            try:
                return self._update_task(my_task)
            finally:
                my_task.data = {k: v for k, v in my_task.data.items() if k in own}
        return self._update_task(my_task)

    def _update_task(self, my_task: Any) -> Any:
        # Tag before spiff's own update: a join cancels its sibling instances there,
        # and the join needs every arrived instance tagged.
        if CTX_KEY not in my_task.internal_data:
            parent = _parent_across_subprocess(my_task)
            my_task.internal_data[CTX_KEY] = context_name_of(parent) if parent is not None else MAIN_CONTEXT
        if timer_definition(self) is not None or is_cycle(my_task):
            driver = driver_of(my_task)
            if driver is not None:
                driver.timer(my_task)
        inputs = io_names(self, "data_inputs") if self.lf_role == "activity" else []
        if inputs:
            driver = driver_of(my_task)
            if driver is not None:
                # SpiffWorkflow requires a task's data inputs in its data (and keeps only them there);
                # under layerflow they come from the context, and task.data stays empty
                my_task.data.update(driver.io_inputs(my_task))
                result = super()._update_hook(my_task)  # type: ignore[misc]
                my_task.data = {}
                return result
        if self.lf_role == "multi" and my_task.state in (TaskState.STARTED, TaskState.READY) \
                and "merged" in my_task.internal_data:
            # its instances are made (or done), and SpiffWorkflow would make them again: a cycle
            # timer that completes after its last repetition updates every unfinished task after
            # it, the activity a repetition started too. (A reset clears "merged".)
            return None  # it stays as it is
        if self.lf_role == "multi":
            driver = driver_of(my_task)
            if driver is not None:
                driver.begin_multi(my_task)
                try:
                    return super()._update_hook(my_task)  # type: ignore[misc]
                except ScriptThrew:
                    raise  # its preScript threw a BPMN error: the activity closed as it was thrown
                except BaseException as err:
                    driver.abort_multi(my_task, err)
                    if isinstance(err, Exception):
                        # e.g. a loopCardinality that gives no number: the error names the activity
                        # (SpiffWorkflow raises it bare), and resume retries it
                        my_task._set_state(TaskState.ERROR)
                    raise
        correlations = getattr(getattr(self, "event_definition", None), "process_correlations", None)
        if correlations:
            driver = driver_of(my_task)
            if driver is not None:
                # a catch event's spiffworkflow:processVariableCorrelation expressions are evaluated
                # over task.data as it starts waiting; under layerflow the names they read are in
                # the context (task.data stays empty)
                saved = my_task.data
                my_task.data = {**saved, **driver.lookup(my_task, names_in(
                    p.retrieval_expression for p in correlations))}
                try:
                    return super()._update_hook(my_task)  # type: ignore[misc]
                finally:
                    my_task.data = saved
        return super()._update_hook(my_task)  # type: ignore[misc]

    def _check_threshold_unstructured(self, my_task: Any) -> Any:
        if not isinstance(self, _EndJoin) and len(self.inputs) == 1:  # type: ignore[attr-defined]
            # a gateway with one incoming flow joins nothing: each token goes on at once. SpiffWorkflow
            # waited while the task before it was unfinished, as a cycle timer is between repetitions,
            # and the next repetition's token then cancelled the waiting one
            return True
        if isinstance(self, InclusiveGateway):
            # SpiffWorkflow's check misses the second path of a branch that splits and merges
            # again, and the join fires twice (engine.inclusive_join)
            return inclusive_join.may_fire(self, my_task)
        listening = listening_event_subprocesses(my_task.workflow) if isinstance(self, _EndJoin) else []
        if listening:
            # SpiffWorkflow 3.2 starts a timer event sub-process with its (sub-)process, and the end
            # waited for it: for a timer that had not fired yet, forever. It only listens: once
            # nothing else runs, the (sub-)process ends (and the end cancels it, ``_run_hook``)
            return not any(task is not my_task and not _below_listening(task, listening) for task in
                           my_task.workflow.get_tasks(state=TaskState.NOT_FINISHED_MASK, end_at_spec=my_task.task_spec.name))
        if isinstance(self, ParallelGateway):
            return _parallel_may_fire(self, my_task)
        if isinstance(self, _EndJoin):
            return _end_may_fire(self, my_task)
        return super()._check_threshold_unstructured(my_task)  # type: ignore[misc]

    def _run_hook(self, my_task: Any) -> Any:
        result = self._run_own(my_task)
        postscript = getattr(self, "postscript", None) or (getattr(self, "extensions", None) or {}).get(EVENT_OUTPUTS_KEY)
        ran = my_task.internal_data.pop(POSTSCRIPT_RAN_KEY, None)  # an instance's, in its scope
        if ran == "threw":
            return None
        if result and postscript and self.lf_role == "flow" and ran is None:
            driver = driver_of(my_task)
            # a sub-process, call activity, loop, send or receive task: its postScript runs as it
            # completes (after the outputs came back; an event's output mappings as it fires, after
            # what a message brought went into the context), here rather than in SpiffWorkflow's
            # _on_complete_hook, so a BPMN error it throws leaves the task STARTED for the catching
            # event to cancel, as an activity that throws (Runtime.exec_script)
            if driver is not None and driver.exec_script(my_task, postscript):
                return None
        return result

    def _run_own(self, my_task: Any) -> Any:
        driver = driver_of(my_task)
        if isinstance(self, _EndJoin):
            for listening in listening_event_subprocesses(my_task.workflow):
                listening.cancel()  # its timer has not fired: it ends with its scope
        if driver is None:
            return super()._run_hook(my_task)  # type: ignore[misc]
        if self.lf_role == "activity":
            return driver.run_activity(my_task, lambda: super(_LayerflowSpecMixin, self)._run_hook(my_task))  # type: ignore[misc]
        if self.lf_role == "multi":
            if driver.complete_multi(my_task):
                return None  # its postScript threw a BPMN error: the catching event cancels the activity
            return super()._run_hook(my_task)  # type: ignore[misc]
        if self.lf_role == "gateway" and is_join(self) and driver.join(my_task) is False:
            return None  # waits for a person; the engine runs the task again once answered
        if isinstance(self, ThrowingEvent) and isinstance(getattr(self, "event_definition", None),
                                                          (CodeEventDefinition, CancelEventDefinition)):
            # asked before the throw, which readies the event that catches it: an error (a transaction's
            # cancel) an event catches ends its branch, and so does an escalation that interrupts (an
            # interrupting boundary event or event sub-process catches it)
            catchers = catching_tasks(my_task)
            if isinstance(self.event_definition, (ErrorEventDefinition, CancelEventDefinition)):
                my_task.internal_data[CAUGHT_KEY] = bool(catchers) and isinstance(self, EndEvent)
            else:  # an escalation: caught by an interrupting event sub-process or boundary event
                my_task.internal_data[CAUGHT_KEY] = any(
                    getattr(t.task_spec, "lf_interrupting", False)
                    or isinstance(t.task_spec, BoundaryEvent) and t.task_spec.cancel_activity for t in catchers)
            scopes = [catching_scope(t) for t in catchers if caught_in_scope(t.task_spec)]
            if my_task.internal_data[CAUGHT_KEY] and scopes:
                # an event sub-process of a scope around its own catches it: the branches it ran in
                # there merge too (the event sub-process reads that scope's context)
                my_task.internal_data[CAUGHT_UP_KEY] = _levels_up(my_task.workflow, scopes[0])
        if isinstance(self, ThrowingEvent) and isinstance(getattr(self, "event_definition", None),
                                                          SignalEventDefinition):
            # a signal an interrupting boundary event of a sub-process around catches ends the branch that
            # threw it as an escalation does: what that branch wrote stays, the others are dropped
            event = BpmnEvent(self.event_definition)
            my_task.internal_data[CAUGHT_KEY] = any(
                isinstance(t.task_spec, BoundaryEvent) and t.task_spec.cancel_activity
                and attached_activity(t) is not None and thrown_inside(t, my_task.workflow)
                and t.task_spec.event_definition.catches(t, event)
                for t in my_task.workflow.top_workflow.event_manager.tasks.values())
        if isinstance(self, BoundaryEvent) and self.cancel_activity and my_task.parent is not None:
            # the multi-instance activity it interrupts closes now (its writes undone), before its path
            # begins: SpiffWorkflow cancels it only after, and an activity at the start of the path
            # began while it was still open (a message closes it first: engine.events.deliver)
            for main in my_task.parent.children:
                if not isinstance(main.task_spec, BoundaryEvent) and main.internal_data.get(MULTI_KEY):
                    driver.abort_multi(main, ActivityCancelled(
                        f"activity {bpmn_id_of(main)!r} was interrupted by {bpmn_id_of(my_task)!r}"))
        if isinstance(self, StartEvent) and (timer_definition(self) is not None or caught_in_scope(self)) \
                and in_timer_event_subprocess(my_task):
            # (a cycle timer's paths started with each repetition: EngineCycleTimerEventDefinition)
            driver.event_path(my_task)
        if isinstance(self, BoundaryEvent) and not self.cancel_activity and not is_cycle(my_task):
            # (a cycle timer's paths started with each repetition: EngineCycleTimerEventDefinition)
            driver.boundary_path(my_task)
        if isinstance(self, CatchingEvent):
            # SpiffWorkflow puts a caught payload into task.data (a messageVariable, a signal's,
            # error's or escalation's variableName); under layerflow it belongs in the context.
            # An event sent from outside is there already (engine.events.deliver); one the
            # process threw itself (a throw or end event, a send task) goes there now.
            result = super()._run_hook(my_task)  # type: ignore[misc]
            delivered = my_task.internal_data.pop(DELIVERED_KEY, None)
            values = {name: my_task.data.pop(name) for name in payload_variables(self.event_definition)
                      if name in my_task.data}
            thrown = my_task.internal_data.pop(THROWN_KEY, None)
            sent_from = my_task.internal_data.pop(SENT_FROM_KEY, None)
            came = my_task.internal_data.pop(CAUGHT_EVENT_KEY, None)
            if thrown is not None:  # an activity threw it (throw_activity_error): code, message, payload
                driver.caught_error(my_task, thrown, payload_variables(self.event_definition))
            elif (values or sent_from is not None or came is not None) and not delivered:
                driver.caught(my_task, values, sent_from, (came or {}).get("code"))
            return result
        if isinstance(self, (ExclusiveGateway, InclusiveGateway)):
            try:
                return super()._run_hook(my_task)  # type: ignore[misc]
            except WorkflowException as err:
                if "No conditions satisfied" not in str(err):
                    raise
                raise driver.no_branch_taken(my_task) from None
        if isinstance(self, ThrowingEvent) and any(isinstance(d, (MessageEventDefinition, SignalEventDefinition))
                                                   for d in event_definitions_of(self)):
            # a pool's message names its sender to the pool that catches it, and one nothing catches
            # is recorded as sent out of the instance by its element (_InterruptAwareEvents.catch)
            top = my_task.workflow.top_workflow
            top.lf_throwing = my_task
            try:
                return super()._run_hook(my_task)  # type: ignore[misc]
            finally:
                top.lf_throwing = None
        return super()._run_hook(my_task)  # type: ignore[misc]

    def catch(self, my_task: Any, event: Any) -> None:
        # (catching events only: SpiffWorkflow's event manager calls it)
        super().catch(my_task, event)  # type: ignore[misc]
        definition = getattr(event, "event_definition", None)
        if isinstance(definition, (MessageEventDefinition, ItemAwareEventDefinition)):
            # caught even with no payload (an error end event, a bare signal): recorded as it runs
            my_task.internal_data[CAUGHT_EVENT_KEY] = {"code": getattr(definition, "code", None)}
        sent_from = getattr(event, "lf_sent_from", None)
        if sent_from is not None:
            my_task.internal_data[SENT_FROM_KEY] = dict(sent_from)  # saved with the task until it runs
        driver = driver_of(my_task)
        if isinstance(self, BoundaryEvent) and not self.cancel_activity and driver is not None:
            if not getattr(my_task.workflow.top_workflow, "lf_delivering", False):
                # thrown inside, caught now, run later: SpiffWorkflow runs the steps of the sub-process
                # that threw it first, and the path must not start from what they wrote since (an
                # event from outside runs its path next, its payload written just before: events.deliver)
                driver.boundary_caught(my_task)
            rearm_boundary(my_task)
        if caught_in_scope(self) and driver is not None:
            driver.start_caught(my_task)
            if not getattr(self, "lf_interrupting", False):
                # a non-interrupting event sub-process starts again with each error or escalation
                # its scope throws (each one runs its path once), as a boundary event does
                fresh = my_task.parent._add_child(self, TaskState.FUTURE)
                fresh.task_spec._predict(fresh, mask=TaskState.NOT_FINISHED_MASK)  # its path, as the first one's
                fresh.task_spec._update(fresh)  # waits: SpiffWorkflow's event manager lists it

    def _on_complete_hook(self, my_task: Any) -> None:
        if getattr(self, "lf_interrupting", False):
            driver = driver_of(my_task)
            esp = event_subprocess_of(my_task)
            if driver is not None and esp is not None:
                driver.interrupt(esp, my_task)  # before its path begins
        # an error (cancel) end event that an event catches ends its (sub-)process as a terminate end event
        # does (and so does an escalation that starts an interrupting event sub-process): the
        # catching event's path goes on with what the branch that threw it wrote
        if isinstance(getattr(self, "event_definition", None), TerminateEventDefinition) \
                or my_task.internal_data.pop(CAUGHT_KEY, False):
            driver = driver_of(my_task)
            if driver is not None:
                driver.terminate(my_task)  # before SpiffWorkflow cancels the other branches
        if self.lf_role != "activity":
            _data_objects_from_context(self, my_task)
        outputs_named = io_names(self, "data_outputs") if self.lf_role == "multi" else []
        if outputs_named:
            _io_outputs_from_context(self, my_task, outputs_named)
        super()._on_complete_hook(my_task)  # type: ignore[misc]
        for name in outputs_named:
            my_task.data.pop(name, None)
        if self.lf_role == "activity" and driver_of(my_task):
            # the data objects and data outputs were set from the context (Runtime.run_activity):
            # nothing stays in task.data
            for ref in getattr(self, "data_output_associations", None) or []:
                my_task.data.pop(ref.bpmn_id, None)
            for name in io_names(self, "data_outputs"):
                my_task.data.pop(name, None)
        outputs = self.outputs  # type: ignore[attr-defined]
        if len(outputs) > 1 and (self.lf_role == "gateway" or isinstance(self, StartEvent)):
            # a start event with several outgoing flows is BPMN's implicit parallel split: as in
            # SpiffWorkflow, where each path has data of its own, each gets a context of its own
            driver = driver_of(my_task)
            if driver is not None:
                driver.split(my_task)
        if isinstance(self, BoundaryEvent) and not is_cycle(my_task) and driver_of(my_task) is not None:
            # SpiffWorkflow leaves the path of a fired boundary event predicted (MAYBE) until each of
            # its tasks runs: a split there would see no branch taken, a multi-instance activity could
            # not add its instances. It fired, so its path is certain (as an event-based gateway's;
            # a cycle timer's paths are made with each repetition, EngineCycleTimerEventDefinition).
            my_task._sync_children(self.outputs, TaskState.FUTURE)
            for child in my_task.children:
                child.task_spec._predict(child, mask=TaskState.FUTURE | TaskState.PREDICTED_MASK)
        if isinstance(self, EndEvent) and _repeating_path_ended(my_task):
            driver = driver_of(my_task)
            if driver is not None:
                driver.event_path_ended(my_task)  # the next escalation's path reads what this one wrote
        if self.lf_role == "flow" and driver_of(my_task) is not None:
            # a caught message's or signal's payload went into the context (engine.events), so
            # SpiffWorkflow's variable for it (left empty) stays out of task.data
            for name in payload_variables(getattr(self, "event_definition", None)):
                my_task.data.pop(name, None)

    def merge_child(self, workflow: Any, child: Any) -> Any:
        # (multi-instance twins only: SpiffWorkflow calls it as an instance completes)
        if interrupted(child.parent):
            # an interrupting boundary event on the activity caught an event (an error an instance
            # threw, which ended that instance): the activity is cancelled next, and nothing is
            # collected or started. SpiffWorkflow merged the instance's output item first (it has
            # none: "Expected an output item") or started the next instance
            return None
        result = super().merge_child(workflow, child)  # type: ignore[misc]
        self._drop_instance_items(child.parent)
        return result

    def create_child(self, my_task: Any, *args: Any) -> Any:
        # (loop twins only) a sequential multi-instance activity adds its next instance from merge_child
        if my_task.internal_data.get("merged"):
            self._drop_instance_items(my_task)
        return super().create_child(my_task, *args)  # type: ignore[misc]

    def _drop_instance_items(self, my_task: Any) -> None:
        if not isinstance(self, MultiInstanceTask) or self.data_output is not None:
            return
        # with no output collection SpiffWorkflow merges the whole instance's data into the
        # activity's, its input (and output) item with it: the next sequential instance then
        # finds its item "already exists" (SpiffWorkflow 3.2 fails so on its own). An item
        # belongs to its instance; what the instance changed reached the context already
        for spec_item in (self.input_item, self.output_item):
            if spec_item is not None:
                my_task.data.pop(spec_item.bpmn_id, None)

    def _on_cancel(self, my_task: Any) -> Any:
        if isinstance(self, SubWorkflowTask):
            driver = driver_of(my_task)
            subworkflow = my_task.workflow.top_workflow.subprocesses.get(my_task.id)
            if driver is not None and subworkflow is not None:
                driver.cancel_subworkflow(my_task, subworkflow)  # before its tasks are cancelled
        if self.lf_role == "multi" and my_task.internal_data.get(MULTI_KEY):
            driver = driver_of(my_task)
            if driver is not None:
                # an interrupting event (a boundary event, a terminate end event) cancels the
                # activity while its instances run or wait: it closes, its writes undone
                driver.abort_multi(my_task, ActivityCancelled(f"activity {bpmn_id_of(my_task)!r} was cancelled"))
        result = super()._on_cancel(my_task)  # type: ignore[misc]
        if isinstance(self, LoopTask):  # a multi-instance activity or a standard loop
            _cancel_orphaned_subprocesses(my_task.workflow.top_workflow)
        return result

    def copy_data(self, my_task: Any, subworkflow: Any) -> Any:
        # SubWorkflowTask only: what SpiffWorkflow copies into a sub-process is in the context
        driver = driver_of(my_task)
        if driver is None:
            return super().copy_data(my_task, subworkflow)  # type: ignore[misc]
        driver.enter_subworkflow(my_task, subworkflow)
        return None

    def update_data(self, my_task: Any, subworkflow: Any) -> Any:
        # SubWorkflowTask only: what SpiffWorkflow copies out of a finished sub-process
        driver = driver_of(my_task)
        if driver is None:
            return super().update_data(my_task, subworkflow)  # type: ignore[misc]
        driver.leave_subworkflow(my_task, subworkflow)
        return None

    def execute_script(self, my_task: Any, script: str) -> Any:
        # SpiffBpmnTask runs preScript in _update_hook and postScript in
        # _on_complete_hook against task.data. Under layerflow both run inside the
        # activity (see Runtime.run_activity), so spiff's calls are no-ops here.
        driver = driver_of(my_task)
        if driver is None:
            return super().execute_script(my_task, script)  # type: ignore[misc]
        if self.lf_role == "activity" and self.manual and script == getattr(self, "prescript", None):  # type: ignore[attr-defined]
            # a task that waits for a person: SpiffWorkflow runs its preScript as it becomes ready,
            # so what it prepares is there while the task waits (Runtime.prepare)
            try:
                thrown = driver.prepare(my_task)
            except Exception:
                my_task._set_state(TaskState.ERROR)  # as SpiffWorkflow's own execute_script: resume retries it
                raise
            if thrown:
                raise ScriptThrew(bpmn_id_of(my_task))
            return None
        if call_mappings.IN_MARK in script and (multi_instance_of(my_task) is not None or call_mappings.scoped(self)) \
                and script == getattr(self, "prescript", None):
            return None  # an instance's in mappings run in its scope as it starts (ScopeSteps.enter_subworkflow)
        # the preScript of a multi-instance activity (spiffworkflow:scriptsOnInstances off) runs
        # once, before the instances are made, inside the activity (its postScript runs in
        # Runtime.complete_multi); a sub-process, call activity, send or receive task has no
        # activity to run them in: SpiffWorkflow runs the preScript before the task starts (before
        # a call copies its inputs) and the postScript as it completes (after the outputs came back,
        # ``_run_hook``). A BPMN error a preScript throws stops the task where it is (``ScriptThrew``)
        if self.lf_role in ("multi", "flow") and script != getattr(self, "postscript", None):
            try:
                thrown = driver.exec_script(my_task, script)
            except Exception:
                my_task._set_state(TaskState.ERROR)  # as SpiffWorkflow's own execute_script: resume retries it
                raise
            if thrown:
                raise ScriptThrew(bpmn_id_of(my_task))
        return None


def names_in(expressions: Iterable[str]) -> set[str]:
    """The variable names Python expressions read (a name that does not parse reads nothing)."""
    names: set[str] = set()
    for expression in expressions:
        try:
            tree = ast.parse(python_source(expression or "") or "", mode="eval")
        except SyntaxError:
            continue
        names.update(node.id for node in ast.walk(tree) if isinstance(node, ast.Name))
    return names


def _data_objects_from_context(spec: Any, my_task: Any) -> None:
    """A sub-process, call activity or event that writes a data object (its dataOutputAssociation):
    SpiffWorkflow takes the value from the task's data as it completes; under layerflow the value
    is in the context (the sub-process's steps wrote it there), so it is put in task.data for
    SpiffWorkflow, which moves it into the data object. (An activity's are put there as it ends,
    ``Runtime.run_activity``.) A value nothing set is an error naming the element and the object."""
    names = [ref.bpmn_id for ref in getattr(spec, "data_output_associations", None) or []]
    driver = driver_of(my_task) if names else None
    if driver is None:
        return
    wanted = [name for name in names if name not in my_task.data]
    found = driver.lookup(my_task, wanted)
    missing = [name for name in wanted if name not in found]
    if missing:
        kind = "sub-process" if isinstance(spec, SubWorkflowTask) else "element"
        raise ActivityError(f"{kind} {spec.bpmn_id!r} writes the data object(s) {', '.join(map(repr, missing))} "
                            "(its dataOutputAssociation), and nothing in it set them; set them in a step "
                            "before it ends, or remove the association", task_id=spec.bpmn_id)
    my_task.data.update(found)


def _io_outputs_from_context(spec: Any, my_task: Any, names: list[str]) -> None:
    """A multi-instance activity's ``ioSpecification`` data outputs (its output collection among
    them), which SpiffWorkflow requires in its data as it completes ("Missing data ouput"): under
    layerflow they are in the context (``Runtime.complete_multi``); an error naming those that are not."""
    driver = driver_of(my_task)
    if driver is None:
        return
    found = driver.lookup(my_task, names)
    missing = [name for name in names if name not in found]
    if missing:
        raise ActivityError(f"multi-instance activity {spec.bpmn_id!r} ends without the data output(s) "
                            f"{', '.join(map(repr, missing))} that its ioSpecification names; collect into it "
                            "(loopDataOutputRef) or set it in a step of the activity, or remove it from its "
                            "dataOutput", task_id=spec.bpmn_id)
    my_task.data.update(found)


def _twin(cls: type, role: str) -> type:
    return type(f"Layerflow{cls.__name__}", (_LayerflowSpecMixin, cls), {"lf_role": role, "__module__": __name__})


def _role_of(cls: type) -> str:
    if issubclass(cls, _MULTI_BASES):
        return "multi"
    if issubclass(cls, _ACTIVITY_BASES):
        return "activity"
    if issubclass(cls, _GATEWAY_BASES):
        return "gateway"
    return "flow"


_STOCK_TAGS = {**BpmnParser.PARSER_CLASSES, **SpiffBpmnParser.OVERRIDE_PARSER_CLASSES}
_EXTRA_SPECS = (
    spiff_defaults.StandardLoopTask,
    spiff_defaults.ParallelMultiInstanceTask,
    spiff_defaults.SequentialMultiInstanceTask,
    spiff_defaults.EventSubprocess,
    spiff_defaults.BusinessRuleTask,
    spiff_defaults.UserTask,
)

#: stock spec class -> layerflow twin
TWINS: dict[type, type] = {}
for _stock in [spec for _, spec in _STOCK_TAGS.values()] + list(_EXTRA_SPECS):
    if _stock not in TWINS:
        TWINS[_stock] = _twin(_stock, _role_of(_stock))
        globals()[TWINS[_stock].__name__] = TWINS[_stock]


# The implicit join every process ends in: all its end events lead to it, so branches of a
# split that end in end events of their own (no joining gateway) merge there, as in
# SpiffWorkflow, where it merges their data.
TWINS[_EndJoin] = LayerflowEndJoin = _twin(_EndJoin, "gateway")


class LayerflowCollaborationStart(_LayerflowSpecMixin, BpmnStartTask):  # type: ignore[misc]
    """The start of a collaboration (``LayerflowBpmnParser.get_collaboration``): SpiffWorkflow starts
    each executable pool's process from it, as a call activity; each pool runs in a context of its
    own (``engine.collaboration``), merged at the collaboration's end join (the spec's name is the
    collaboration's id)."""

    lf_role = "flow"  # it splits as each pool starts (``_Runtime.enter_pool``): some start later, by a message


_START_EVENT_TWIN = TWINS[_STOCK_TAGS[full_tag("startEvent")][1]]


class LayerflowInterruptingEventStart(_START_EVENT_TWIN):  # type: ignore[misc,valid-type]
    """The start event of an interrupting event sub-process (``isInterrupting`` true, BPMN's
    default). SpiffWorkflow does not read the attribute; this class records it, and as the
    event fires the rest of its (sub-)process is cancelled (``_Runtime.interrupt``)."""

    lf_interrupting = True


def rearm_boundary(task: Any) -> None:
    """A non-interrupting boundary event that a message, signal or escalation fired waits for the
    next one while its activity runs, as BPMN says: a fresh event waits beside the one that fired
    (each firing runs the path once). SpiffWorkflow 3.2 fired it once per run of the activity: a
    second message was refused, and the escalation of a second instance of a multi-instance
    activity was lost. Timers keep their own rule (a duration or date fires once; a cycle repeats
    by itself), and a conditional event would fire again at once."""
    definitions = event_definitions_of(task.task_spec)
    if not definitions or not all(isinstance(d, _REARMED) for d in definitions):
        return  # (an event with several definitions, a message or a signal say: as each of them)
    main = attached_activity(task)
    if main is None or main.has_state(TaskState.FINISHED_MASK):
        return
    fresh = task.parent._add_child(task.task_spec, TaskState.WAITING)
    fresh.task_spec._update(fresh)  # waits: SpiffWorkflow's event manager lists it


_REARMED = (MessageEventDefinition, SignalEventDefinition, EscalationEventDefinition)


def thrown_inside(task: Any, workflow: Any) -> bool:
    """Whether boundary event ``task`` may catch an error or escalation thrown in ``workflow``: BPMN has
    a boundary event catch only what is thrown inside its activity (a sub-process or call activity
    running ``workflow``, or one around it; an instance of a multi-instance one). SpiffWorkflow 3.2
    throws it to every boundary event of its code in the process around the thrower: the error of one
    call activity cancelled a call beside it, in a parallel branch, that waited for a person. Any
    other catching task, or no ``workflow``: True."""
    attached = attached_activity(task)
    if attached is None or workflow is None:
        return True
    while workflow is not None and getattr(workflow, "parent_task_id", None) is not None:
        runner = workflow.top_workflow.get_task_from_id(workflow.parent_task_id)
        if runner is attached or runner.is_descendant_of(attached):
            return True
        workflow = workflow.parent_workflow
    return False


def event_definitions_of(spec: Any) -> list[Any]:
    """The event definitions of event ``spec``: the one it has, or each of a multiple event's (several
    definitions on one event, BPMN's "Multiple" and "Parallel Multiple"); none for a task or gateway."""
    definition = getattr(spec, "event_definition", None)
    if isinstance(definition, MultipleEventDefinition):
        return list(definition.event_definitions)
    return [] if definition is None else [definition]


def attached_activity(task: Any) -> Any:
    """The run of the activity boundary event ``task`` is attached to (its sibling under the
    boundary event split that is no boundary event); None for any other task."""
    if not isinstance(task.task_spec, BoundaryEvent) or task.parent is None:
        return None
    return next((c for c in task.parent.children if not isinstance(c.task_spec, BoundaryEvent)), None)


def interrupts_around(task: Any) -> list[Any]:
    """The interrupting boundary events of the activities around ``task``'s workflow (the sub-process
    it runs in, or one around that) that are READY: they caught what ``task`` just threw (a signal,
    an escalation; an error end event's error, on an activity around the one it ends). BPMN
    interrupts the activity as the event is caught, so they run before anything else of it;
    SpiffWorkflow 3.2 runs the sub-process's own ready tasks first (the deepest first),
    so the steps after the throw ran, and wrote, inside an activity already interrupted.
    An instance of a multi-instance sub-process (or call activity) is looked through to the activity:
    the boundary event sits on that, and its interrupt closes every instance, the activity's writes
    undone (``Runtime.abort_multi``), as any interrupt of it does."""
    found: list[Any] = []
    if not isinstance(task.task_spec, ThrowingEvent):
        return found
    # after an end event nothing comes on its path: the sub-process (called process) it ends ends as
    # SpiffWorkflow ends it; but an activity around that one, whose boundary event caught the error, is
    # interrupted now, before the steps after the ended one in it run (a booking after the fee failed).
    # An event sub-process that ends so hands its error on as it ends: nothing comes after it in its scope
    skip = isinstance(task.task_spec, EndEvent)
    definition = getattr(task.task_spec, "event_definition", None)
    if definition is None:
        return found
    event = BpmnEvent(definition)
    workflow = task.workflow
    top = workflow.top_workflow
    while getattr(workflow, "parent_task_id", None) is not None:
        runner = top.get_task_from_id(workflow.parent_task_id)
        if runner is None:
            break
        if skip and is_event_subprocess(runner):
            break
        runner = multi_instance_of(runner) or runner
        if runner.parent is not None and not skip:
            # only those that caught this throw: a timer boundary event that came due meanwhile runs in
            # its turn, as SpiffWorkflow runs it
            found.extend(t for t in runner.parent.children if isinstance(t.task_spec, BoundaryEvent)
                         and t.task_spec.cancel_activity and t.state == TaskState.READY
                         and t.task_spec.event_definition.catches(t, event))
        skip = False
        workflow = runner.workflow
    return found


def interrupted(task: Any) -> bool:
    """Whether an interrupting boundary event attached to ``task`` has caught its event (it is
    about to cancel ``task``: SpiffWorkflow's ``BoundaryEventJoin`` test)."""
    split = task.parent
    return split is not None and any(
        isinstance(t.task_spec, BoundaryEvent) and t.task_spec.cancel_activity
        and t.has_state(TaskState.READY | TaskState.COMPLETED) for t in split.children)


def _cancel_orphaned_subprocesses(top: Any) -> None:
    """Cancel and forget the sub-processes whose task is gone. SpiffWorkflow drops the instances of
    a cancelled multi-instance activity from its tree without cancelling them: the sub-processes of
    its instances ran on, and the next step (which looks for their tasks) failed with "A task with
    id ... was not found", as a load would."""
    while True:
        known = set(top.tasks).union(*(sp.tasks for sp in top.subprocesses.values()))
        orphans = [key for key, sp in top.subprocesses.items() if sp.parent_task_id not in known]
        if not orphans:
            return
        for key in orphans:
            top.cancel(top.subprocesses.pop(key))


def is_activity(spec: Any) -> bool:
    return getattr(spec, "lf_role", None) == "activity"


def is_join(spec: Any) -> bool:
    return isinstance(spec, UnstructuredJoin) and (len(spec.inputs) > 1 or isinstance(spec, _EndJoin))


def boundary_of_subworkflow(task: Any) -> bool:
    """Whether boundary event ``task`` is attached to a sub-process or call activity."""
    return isinstance(getattr(attached_activity(task), "task_spec", None), SubWorkflowTask)


def catching_tasks(task: Any) -> list[Any]:
    """The waiting tasks that will catch the error or escalation throwing event ``task`` is about to
    throw: those of the nearest workflow, its own or one around it, where one waits for it, the
    nearest of them (``nearest_catchers``; ``_InterruptAwareEvents.catch``)."""
    event = BpmnEvent(task.task_spec.event_definition)
    waiting = list(task.workflow.top_workflow.event_manager.tasks.values())
    workflow = task.workflow
    while workflow is not None:
        found = [t for t in waiting if catching_scope(t) is workflow and t.task_spec.event_definition.catches(t, event)
                 and thrown_inside(t, task.workflow)]
        if found:
            return nearest_catchers(found, event)
        workflow = workflow.parent_workflow
    return []


def nearest_catchers(found: list[Any], event: Any) -> list[Any]:
    """Of the tasks of one workflow that catch an error or escalation ``event``, those that do: an
    error or escalation is caught once, by the nearest catch (BPMN; Camunda: "caught by one catch event
    at most"). The boundary events of the activity it is thrown in come before the event sub-processes
    of the process around that activity, which wait in the same workflow; and of those, the ones of its
    code before the catch-all ones (no errorRef / escalationRef, or one with no code), as for an error a
    task raises (``error_catchers``). SpiffWorkflow 3.2 ran every one of them: an escalation caught by a
    sub-process's boundary event started the process's escalation event sub-process too, and an error
    so caught started its error event sub-process, which interrupted the whole process."""
    if not isinstance(event.event_definition, CodeEventDefinition):
        return found
    chosen = [t for t in found if isinstance(t.task_spec, BoundaryEvent)] or found
    code = event.event_definition.code
    specific = [t for t in chosen if code is not None and any(
        isinstance(d, CodeEventDefinition) and d.code == code for d in event_definitions_of(t.task_spec))]
    return specific or chosen


def error_catchers(task: Any, code: str) -> tuple[list[Any], int, bool]:
    """Where the BPMN error ``code`` that activity ``task`` throws (``engine.BpmnError``) is caught,
    as BPMN says: the error boundary events of the activity (of its multi-instance activity, for
    an instance); else the error event sub-processes of its (sub-)process; else the boundary
    events of the sub-process (call activity) around, then its scope's event sub-processes, and
    so on up. At each step the events whose errorCode is ``code`` win over catch-all ones (no
    errorRef, or an error with no code). Returns the catching tasks, how many workflows up they
    catch (0: the task's own), and whether they are boundary events of the activity itself."""
    event = BpmnEvent(EngineErrorEventDefinition(code, code=code))
    waiting = list(task.workflow.top_workflow.event_manager.tasks.values())

    def catching(t: Any) -> bool:
        return bool(t.task_spec.catches(t, event))

    def best(found: list[Any]) -> list[Any]:
        specific = [t for t in found if getattr(t.task_spec.event_definition, "code", None) == code]
        return specific or found

    attached = loop_of(task) or task  # an instance of a multi-instance activity, a pass of a loop: the activity
    workflow = task.workflow
    levels = 0
    while workflow is not None:
        bounds = [t for t in waiting if isinstance(t.task_spec, BoundaryEvent)
                  and isinstance(t.task_spec.event_definition, ErrorEventDefinition)
                  and attached_activity(t) is attached and catching(t)]
        if bounds:
            return best(bounds), levels, levels == 0
        starts = [t for t in waiting if caught_in_scope(t.task_spec)
                  and isinstance(t.task_spec.event_definition, ErrorEventDefinition)
                  and catching_scope(t) is workflow and catching(t)]
        if starts:
            return best(starts), levels, False
        if workflow.parent_task_id is None:
            break
        owner = workflow.top_workflow.get_task_from_id(workflow.parent_task_id)
        attached = loop_of(owner) or owner
        workflow = owner.workflow
        levels += 1
    return [], 0, False


def arm_error_boundaries(task: Any) -> None:
    """Make the error boundary events of ``task``'s activity wait before it throws from a preScript.
    SpiffWorkflow updates the activity before its boundary events as their split completes, and a
    preScript runs in that update: the events would not be waiting for the error yet."""
    split = (loop_of(task) or task).parent
    if split is None or not isinstance(split.task_spec, BoundaryEventSplit):
        return
    waiting = task.workflow.top_workflow.event_manager.tasks
    for t in split.children:
        if isinstance(t.task_spec, BoundaryEvent) and isinstance(t.task_spec.event_definition, ErrorEventDefinition) \
                and t.id not in waiting and not t.has_state(TaskState.FINISHED_MASK):
            t.task_spec._update(t)


def throw_activity_error(catchers: list[Any], code: str, thrown: dict[str, Any]) -> None:
    """Throw the BPMN error ``code`` an activity raised to the events ``error_catchers`` found:
    each one fires (an interrupting boundary event cancels its activity once it runs; an error
    event sub-process starts right after the throwing task, ``Driver.start_caught``). ``thrown``
    (JSON: code, message, payload, the thrower's id) reaches the catching event's context
    (``Driver.caught_error``)."""
    for t in catchers:
        t.internal_data[THROWN_KEY] = dict(thrown)
        event = BpmnEvent(EngineErrorEventDefinition(code, code=code), target=t.workflow)
        t.task_spec.catch(t, event)
        t.task_spec._update(t)


def _levels_up(workflow: Any, around: Any) -> int:
    """How many workflows up from ``workflow`` workflow ``around`` is (0: it is ``workflow``)."""
    levels = 0
    while workflow is not None and workflow is not around:
        workflow = workflow.parent_workflow
        levels += 1
    return levels


def start_form(spec: Any, subprocess_specs: Mapping[str, Any] | None = None) -> tuple[str, dict[str, Any]] | None:
    """(start event id, form) of the form on the process's none start event, the one an instance
    starts from, or None. A message, signal or timer start gets its data from what triggers it."""
    found = start_forms(spec, subprocess_specs)
    return found[0][:2] if found else None


def start_forms(spec: Any, subprocess_specs: Mapping[str, Any] | None = None
                ) -> list[tuple[str, dict[str, Any], Any]]:
    """(start event id, form, its process's spec) of every form the start data must fit: the process's none start
    event's, or in a collaboration each pool's whose none start event starts with the instance
    (``subprocess_specs`` holds the pools' processes)."""
    out = []
    for each in _started_processes(spec, subprocess_specs):
        for ts in each.task_specs.values():
            if _is_none_start(ts):
                form = (getattr(ts, "extensions", None) or {}).get("form")
                if isinstance(form, dict):
                    out.append((str(ts.bpmn_id), form, each))
                    break
    return out


def start_data_inputs(spec: Any, subprocess_specs: Mapping[str, Any] | None = None) -> list[tuple[Any, list[str]]]:
    """(process spec, its ``ioSpecification`` data input ids) of every process the start data must give
    the inputs of: the process run, or in a collaboration each pool's, when a none start event starts it
    with the instance. A process that only an event starts (a message start event) gets its data with
    that event, so its inputs are not asked of the start data."""
    out = []
    for each in _started_processes(spec, subprocess_specs):
        inputs = io_names(each, "data_inputs")
        if inputs and any(_is_none_start(ts) for ts in each.task_specs.values()):
            out.append((each, inputs))
    return out


def _started_processes(spec: Any, subprocess_specs: Mapping[str, Any] | None) -> list[Any]:
    """The process run, or in a collaboration the processes of its pools."""
    if is_collaboration(spec) and subprocess_specs:
        return [subprocess_specs[ts.spec] for ts in spec.task_specs.values()
                if isinstance(ts, SubWorkflowTask) and ts.spec in subprocess_specs]
    return [spec]


def _is_none_start(spec: Any) -> bool:
    return isinstance(spec, StartEvent) and type(getattr(spec, "event_definition", None)) is NoneEventDefinition


def caught_in_scope(spec: Any) -> bool:
    """Whether ``spec`` is the start event of an event sub-process that waits for an error or an
    escalation thrown in its scope (``_LayerflowProcessParser.add_tasks``)."""
    return isinstance(spec, StartEvent) and isinstance(getattr(spec, "event_definition", None), CodeEventDefinition)


def _repeating_path_ended(task: Any) -> bool:
    """Whether end event ``task`` ended the last running path of a non-interrupting error or
    escalation event sub-process: it only listens again (each event starts a path of its own)."""
    workflow = task.workflow
    if not any(caught_in_scope(s) and not getattr(s, "lf_interrupting", False) for s in workflow.spec.start.outputs):
        return False
    if not in_timer_event_subprocess(task):
        return False
    return all(t.state == TaskState.WAITING and isinstance(t.task_spec, (StartEvent, _EndJoin))
               for t in workflow.tasks.values() if t.has_state(TaskState.READY | TaskState.STARTED | TaskState.WAITING))


def catching_scope(task: Any) -> Any:
    """The workflow whose errors and escalations waiting task ``task`` catches: its own, but for
    the start event of an error or escalation event sub-process, whose task waits in the
    sub-workflow of the event sub-process: the scope around it."""
    workflow = task.workflow
    if caught_in_scope(task.task_spec) and workflow.parent_workflow is not None:
        return workflow.parent_workflow
    return workflow


def is_end_join(spec: Any) -> bool:
    return isinstance(spec, _EndJoin)


def is_event_subprocess(task: Any) -> bool:
    """Whether ``task`` is an event sub-process (SpiffBpmnParser builds it as a plain sub-process):
    one an event started (``BpmnStartTask.trigger_wf``), or one whose start is a timer, which
    SpiffWorkflow starts with its process (the internal start task is its parent) to wait there."""
    if not isinstance(task.task_spec, SubWorkflowTask) or is_pool(task):  # a pool starts from there too
        return False
    return started_by_its_event(task) or task.parent is not None and isinstance(task.parent.task_spec, BpmnStartTask)


def started_by_its_event(task: Any) -> bool:
    """Whether ``task`` is an event sub-process that a message or signal started (SpiffWorkflow
    makes it as the event comes, ``BpmnStartTask.trigger_wf``); a timer's is made with its scope."""
    return isinstance(task.task_spec, SubWorkflowTask) and \
        task.task_spec.name in getattr(task.workflow.spec.start, "trigger_specs", ())


def is_timer_event_subprocess(task: Any) -> bool:
    """Whether ``task`` is an event sub-process that SpiffWorkflow made with its scope, to wait
    there for its timer (not one a message or signal started)."""
    return is_event_subprocess(task) and not started_by_its_event(task)


def event_subprocess_of(task: Any) -> Any:
    """The event sub-process task whose workflow ``task`` is in; None outside one."""
    pid = task.workflow.parent_task_id
    if pid is None:
        return None
    parent = task.workflow.top_workflow.get_task_from_id(pid)
    return parent if parent is not None and is_event_subprocess(parent) else None


def listening_event_subprocesses(workflow: Any) -> list[Any]:
    """The timer event sub-processes of ``workflow`` (one scope, not the ones inside it) that wait
    for their timer, none of their paths running: they listen, and hold no token. (SpiffWorkflow
    3.2 starts them with their scope; an event starts a message or signal one when it comes.)"""
    out: list[Any] = []
    if not any(isinstance(spec, SubWorkflowTask) for spec in workflow.spec.start.outputs):
        return out  # (the cheap test: no timer event sub-process in this scope)
    for task in workflow.tasks.values():
        # (saved and loaded, its spec is a plain sub-process: SpiffWorkflow's serializer says so)
        if not (task.state == TaskState.STARTED and is_timer_event_subprocess(task)):
            continue
        sub = workflow.top_workflow.subprocesses.get(task.id)
        active = [t for t in sub.tasks.values() if t.has_state(TaskState.READY | TaskState.WAITING | TaskState.STARTED)
                  ] if sub is not None else []
        # (its own end waits for the start event: a path an event started has ended)
        if active and all(t.state == TaskState.WAITING and isinstance(t.task_spec, (StartEvent, _EndJoin))
                          for t in active) and any(isinstance(t.task_spec, StartEvent) for t in active):
            out.append(task)
    return out


def in_timer_event_subprocess(task: Any) -> bool:
    """Whether ``task`` belongs to an event sub-process that SpiffWorkflow started with its scope
    (a timer one: ``listening_event_subprocesses``)."""
    esp = event_subprocess_of(task)
    return esp is not None and is_timer_event_subprocess(esp)


def wake_end_joins(workflow: Any) -> None:
    """Check the waiting end of ``workflow`` again when a timer event sub-process there only listens
    now: the path its event started has ended since the end began to wait (nothing else wakes it)."""
    if listening_event_subprocesses(workflow):
        for task in list(workflow.tasks.values()):
            if isinstance(task.task_spec, _EndJoin) and task.state == TaskState.WAITING:
                task.task_spec._update(task)


def _below_listening(task: Any, listening: list[Any]) -> bool:
    """Whether ``task`` is one of the ``listening`` event sub-processes or a task after or inside one."""
    while task is not None:
        if task in listening:
            return True
        parent_id = getattr(task.workflow, "parent_task_id", None) if task.parent is None else None
        task = task.workflow.top_workflow.get_task_from_id(parent_id) if parent_id is not None else task.parent
    return False


def is_collaboration(spec: Any) -> bool:
    """Whether a workflow spec is a collaboration's (its pools' processes start from it)."""
    return isinstance(getattr(spec, "start", None), LayerflowCollaborationStart)


def is_pool(task: Any) -> bool:
    """Whether ``task`` is the call activity that runs a pool's process in a collaboration."""
    return isinstance(task.task_spec, SubWorkflowTask) and task.workflow.parent_task_id is None \
        and is_collaboration(task.workflow.spec)


def pool_process_of(task: Any) -> str:
    """The process id of the pool ``task`` runs in (the workflow a pool's call activity started,
    around any sub-process of it); a task outside a collaboration: its process's."""
    workflow = task.workflow
    while workflow.parent_workflow is not None and workflow.parent_workflow is not workflow.top_workflow:
        workflow = workflow.parent_workflow
    return str(workflow.spec.name)


def is_split(spec: Any) -> bool:
    return getattr(spec, "lf_role", None) == "gateway" and len(spec.outputs) > 1


def is_multi(spec: Any) -> bool:
    return getattr(spec, "lf_role", None) == "multi"


def io_names(spec: Any, which: str) -> list[str]:
    """The names of a spec's ``ioSpecification`` data inputs (``which="data_inputs"``) or outputs."""
    io = getattr(spec, "io_specification", None)
    return [str(var.bpmn_id) for var in getattr(io, which, None) or []]


def loop_of(task: Any) -> Any:
    """The loop or multi-instance task that ``task`` is an instance (an iteration) of, else None."""
    parent = task.parent
    if parent is None:
        return None
    spec = parent.task_spec
    if isinstance(spec, LoopTask) and getattr(spec, "task_spec", None) == task.task_spec.name:
        return parent
    return None


def multi_instance_of(task: Any) -> Any:
    """The multi-instance task (the activity) that ``task`` is one instance of, else None."""
    loop = loop_of(task)
    return loop if loop is not None and isinstance(loop.task_spec, MultiInstanceTask) else None


def in_instance_order(task: Any, collected: list[Any]) -> list[Any]:
    """The output list of multi-instance task ``task`` in the order of its instances (the
    positions of their input items, or their numbers over a cardinality). SpiffWorkflow appends
    each output item as its instance finishes: parallel instances that wait for people finish
    in any order."""
    merged = task.internal_data.get("merged", [])
    instances = {str(c.id): c.internal_data for c in task.children}
    # a sequential activity over a count keeps the number as the instance's item only
    by_count = task.task_spec.data_input is None
    positions: list[Any] = [instances[i].get("key_or_index", instances[i].get("item") if by_count else None)
                            if i in instances else None for i in merged]
    if len(positions) != len(collected) or not all(type(p) is int for p in positions):
        return collected
    return [value for _, value in sorted(zip(positions, collected), key=lambda pair: int(pair[0]))]


def data_name(ref: Any) -> str | None:
    """The variable name of a spiff data reference (loopDataInputRef, inputDataItem, ...)."""
    if ref is None:
        return None
    return str(getattr(ref, "bpmn_id", None) or getattr(ref, "name", None) or "") or None


def _engine_now(task: Any) -> datetime:
    """The engine's clock for ``task`` (UTC); the wall clock for a workflow no engine drives."""
    driver = driver_of(task)
    return driver.now() if driver is not None else datetime.now(timezone.utc)


def _parse_cycle(expression: str, now: datetime) -> tuple[int, datetime, timedelta]:
    """SpiffWorkflow's reading of an ISO 8601 repeating interval (cycles, first due time,
    period), except that an interval with no start or end date starts at ``now`` (the
    engine's clock), where SpiffWorkflow takes the wall clock."""
    components = expression.upper().replace("--", "/").strip("R").split("/")
    if len(components) == 2 and components[1].startswith("P"):
        cycles = int(components[0]) if components[0] else -1
        parsed = TimerEventDefinition.parse_iso_duration(components[1])
        period: timedelta = TimerEventDefinition.get_timedelta_from_start(parsed, now)
        return cycles, now + period, period
    cycles, start, period = TimerEventDefinition.parse_iso_recurring_interval(expression)
    return int(cycles), start, period


def start_cycle(task: Any, now: datetime) -> dict[str, Any]:
    """A cycle timer's state (SpiffWorkflow's ``event_value``: ``cycles`` left, ``next`` due
    time, ``duration`` in seconds), fixed from ``now`` the first time its task waits."""
    event_value = task.internal_data.get("event_value")
    if event_value is None:
        expression = task.workflow.script_engine.evaluate(task, task.task_spec.event_definition.expression)
        cycles, start, period = _parse_cycle(str(expression), now)
        if cycles < 0 and period.total_seconds() <= 0:  # it would fire without end at one instant
            raise ValueError(f"{expression!r} repeats without end with no time between repetitions; give it "
                             "a period above zero (\"R/PT10M\") or a count (\"R3/PT0S\")")
        event_value = {"cycles": cycles, "next": start.isoformat(), "duration": period.total_seconds()}
        task.internal_data["event_value"] = event_value
    return dict(event_value)


class _ThrownToItsProcess:
    """An error or escalation goes to the process it is thrown in, then to the one around it, and
    so on, as in BPMN (and in SpiffWorkflow's own bpmn flavour). The spiff flavour throws it to
    every waiting boundary event of its code: an error in one instance of a multi-instance
    sub-process interrupted every instance."""

    expression: Any

    def throw(self, my_task: Any) -> None:
        payload = None if self.expression is None else my_task.workflow.script_engine.evaluate(my_task, self.expression)
        my_task.workflow.top_workflow.catch(BpmnEvent(self, payload=payload, target=my_task.workflow))


class EngineErrorEventDefinition(_ThrownToItsProcess, SpiffErrorEventDefinition):  # type: ignore[misc]
    """An error event thrown to its own process first (``_ThrownToItsProcess``)."""


class EngineEscalationEventDefinition(_ThrownToItsProcess, SpiffEscalationEventDefinition):  # type: ignore[misc]
    """An escalation event thrown to its own process first (``_ThrownToItsProcess``)."""


_THROWN_TO_ITS_PROCESS = {SpiffErrorEventDefinition: EngineErrorEventDefinition,
                          SpiffEscalationEventDefinition: EngineEscalationEventDefinition}


class EngineCycleTimerEventDefinition(CycleTimerEventDefinition):  # type: ignore[misc]
    """A repeating timer (``timeCycle``) on the engine's clock.

    SpiffWorkflow's ``CycleTimerEventDefinition`` with its clock swapped; the rest is its
    semantics: "R<n>/..." fires n times ("R/..." without end), the first one period after the
    wait starts (or at the interval's start date), each next one a period after the previous
    due time; each firing starts the event's outgoing path once; after the last one the event
    itself completes (an interrupting boundary event cancels its activity only then). The
    state is SpiffWorkflow's own ``event_value`` (``cycles``, ``next``, ``duration``), saved
    with the task. One difference: once the last repetition fires, the event is marked fired
    at once (SpiffWorkflow marks it on its next update), so a run that has nothing else to do
    still completes it."""

    def cycle_complete(self, my_task: Any) -> bool:
        now = _engine_now(my_task)
        event_value = start_cycle(my_task, now)
        ready = False
        if event_value["cycles"] != 0:
            next_event = datetime.fromisoformat(event_value["next"])
            if next_event <= now:  # due at its time, as layerflow's other timers
                event_value["next"] = (next_event + timedelta(seconds=event_value["duration"])).isoformat()
                event_value["cycles"] -= 1
                ready = True
                if getattr(my_task.task_spec, "lf_interrupting", False):
                    # an interrupting event sub-process starts once: the rest of its process stops
                    event_value["cycles"] = 0
        if event_value["cycles"] == 0:
            my_task.internal_data.pop("event_value", None)
            my_task.internal_data["event_fired"] = True
            return ready
        my_task.internal_data["event_value"] = event_value
        return ready

    def update_task(self, my_task: Any) -> None:
        if not self.cycle_complete(my_task):
            return
        driver = driver_of(my_task)
        for output in my_task.task_spec.outputs:
            child = my_task._add_child(output, TaskState.FUTURE)
            if driver is not None and isinstance(my_task.task_spec, BoundaryEvent):
                # the repetition's path runs beside the activity, which goes on (an interrupting
                # cycle cancels it only after its last repetition), as a non-interrupting
                # boundary event's path does
                driver.boundary_path(my_task, child)
            elif driver is not None and in_timer_event_subprocess(my_task):
                driver.event_path(my_task, child)  # beside the rest of the process, which goes on
            child.task_spec._predict(child, mask=TaskState.NOT_FINISHED_MASK)
            child.task_spec._update(child)


class LayerflowBoundaryEventJoin(BoundaryEventJoin):  # type: ignore[misc]
    """SpiffWorkflow's join after an activity with boundary events, which cancels the boundary events
    still waiting once the activity is done (or interrupted). A cycle timer waits between its
    repetitions with the paths it started below it: the cancel dropped those still running (a
    person's task on a reminder's path, gone without a word) and the end the finished ones waited
    at, so the process's end never merged them. BPMN: a path that left a boundary event is a token
    of its own, which the activity's end does not stop. Such a cycle closes instead: its later
    repetitions never come, the paths it started go on (``_close_cycle``)."""

    def _check_threshold_structured(self, my_task: Any) -> Any:
        finished, cancel = super()._check_threshold_structured(my_task)
        if finished:
            for task in [t for t in cancel if is_cycle(t) and _started_paths(t)]:
                cancel.remove(task)
                _close_cycle(task)
        return finished, cancel


def _started_paths(task: Any) -> list[Any]:
    return [c for c in task.children if not c.has_state(TaskState.PREDICTED_MASK)]


def _close_cycle(task: Any) -> None:
    """End a cycle timer's waiting without a further repetition, keeping the paths it started."""
    for child in [c for c in task.children if c.has_state(TaskState.PREDICTED_MASK)]:
        task.workflow._remove_task(child.id)
    task.internal_data.pop("event_value", None)
    task.internal_data["event_fired"] = True
    task._set_state(TaskState.COMPLETED)


class _FiredByTheEngineClock:
    """A duration or date timer fires when the engine's clock reaches its due time, and only then.
    SpiffWorkflow's own check reads the wall clock: under an engine with a clock of its own (a
    test's, a simulation's) a timer due by the wall clock fired at once."""

    def has_fired(self, my_task: Any) -> bool:
        driver = driver_of(my_task)
        if driver is None:
            return bool(super().has_fired(my_task))  # type: ignore[misc]
        driver.timer(my_task)  # fixes the due time, and marks the event fired once it is due
        return bool(my_task.internal_data.get("event_fired", False))


class EngineDurationTimerEventDefinition(_FiredByTheEngineClock, DurationTimerEventDefinition):  # type: ignore[misc]
    """A ``timeDuration`` timer on the engine's clock (``_FiredByTheEngineClock``)."""


class EngineTimeDateEventDefinition(_FiredByTheEngineClock, TimeDateEventDefinition):  # type: ignore[misc]
    """A ``timeDate`` timer on the engine's clock (``_FiredByTheEngineClock``)."""


_ON_THE_ENGINE_CLOCK = {DurationTimerEventDefinition: EngineDurationTimerEventDefinition,
                        TimeDateEventDefinition: EngineTimeDateEventDefinition}

_TIMERS = (DurationTimerEventDefinition, TimeDateEventDefinition)


def timer_definition(spec: Any) -> Any:
    """The timer (duration or date) a spec waits for: its own event definition, or the timer
    among the events of an event-based gateway; else None."""
    ed = getattr(spec, "event_definition", None)
    if isinstance(ed, MultipleEventDefinition):
        return next((d for d in ed.event_definitions if isinstance(d, _TIMERS)), None)
    return ed if isinstance(ed, _TIMERS) else None


def is_cycle(task: Any) -> bool:
    """A repeating timer (``timeCycle``) on the engine's clock: a start, catch or boundary event."""
    return isinstance(getattr(task.task_spec, "event_definition", None), EngineCycleTimerEventDefinition)


def cycle_repetitions_left(task: Any) -> int | None:
    """How many times a cycle timer still fires; None when it repeats without end."""
    value = task.internal_data.get("event_value")
    if not isinstance(value, Mapping):
        return 0
    cycles = int(value["cycles"])
    return cycles if cycles >= 0 else None


def is_timer(task: Any) -> bool:
    """A timer event that layerflow times: catch events, boundary events, the timer branch of an
    event-based gateway (duration or date), and cycle timers."""
    return timer_definition(task.task_spec) is not None or is_cycle(task)


def timer_event_id(task: Any) -> str:
    """The BPMN id of the timer event a timer task waits for (an event-based gateway: the timer
    event of its branch)."""
    spec = task.task_spec
    ed = getattr(spec, "event_definition", None)
    if isinstance(ed, MultipleEventDefinition):
        timer = timer_definition(spec)
        index = next((i for i, d in enumerate(ed.event_definitions) if d is timer), None)
        if index is not None and index < len(spec.outputs):
            return spec_bpmn_id(spec.outputs[index])
    return spec_bpmn_id(spec)


def gateway_branch(task: Any, event_id: str) -> Any | None:
    """The task of the branch of event-based gateway ``task`` whose catch event is ``event_id``: what
    runs when that event comes first (None: ``task`` waits for its own event, no gateway's)."""
    if event_id == bpmn_id_of(task):
        return None
    return next((child for child in task.children if bpmn_id_of(child) == event_id), None)


def timer_due(task: Any, now: datetime | None = None) -> datetime | None:
    """When a timer event's task is due (UTC), fixing it from ``now`` the first time (a duration
    starts when the task starts waiting); None for other tasks, or a timer not yet started.
    A cycle timer: its next repetition (fixed by the cycle itself, ``now`` is not used)."""
    if is_cycle(task):
        cycle = task.internal_data.get("event_value")
        return datetime.fromisoformat(cycle["next"]) if isinstance(cycle, Mapping) and cycle["cycles"] != 0 else None
    ed = timer_definition(task.task_spec)
    if ed is None:
        return None
    value = task.internal_data.get("event_value")
    if value is None:
        if now is None:
            return None
        expression = task.workflow.script_engine.evaluate(task, ed.expression)
        if isinstance(ed, DurationTimerEventDefinition):
            try:
                parsed = parse_duration(str(expression))
            except Exception as err:
                raise ValueError(_timer_value_problem("timeDuration", ed.expression, expression,
                                                      '"PT1H" or "P2DT30M"')) from err
            value = (now + TimerEventDefinition.get_timedelta_from_start(parsed, now)).isoformat()
        else:
            value = expression if isinstance(expression, str) else getattr(expression, "isoformat", lambda: None)()
            try:
                parsed_date = TimerEventDefinition.parse_time_or_duration(value) if isinstance(value, str) else None
            except Exception:  # noqa: BLE001 - reported below with what to write
                parsed_date = None
            if not isinstance(parsed_date, datetime):
                raise ValueError(_timer_value_problem("timeDate", ed.expression, expression,
                                                      '"2026-01-05T09:00:00+00:00"'))
        task.internal_data["event_value"] = value
    if isinstance(ed, DurationTimerEventDefinition):
        when: datetime = TimerEventDefinition.get_datetime(value)
        return when
    due = TimerEventDefinition.parse_time_or_duration(value)
    return due if isinstance(due, datetime) else None


def _timer_value_problem(field: str, expression: str, value: Any, example: str) -> str:
    what = "duration" if field == "timeDuration" else "date and time"
    return (f"its {field} {expression!r} gave {value!r} ({type(value).__name__}), which is no ISO 8601 {what}"
            f"{duration_hint(value) if field == 'timeDuration' else ''}: make the expression give ISO 8601 text "
            f"such as {example}")


_NUMBER = r"\d+(?:[.,]\d+)?"
_ISO_DURATION = re.compile(rf"P(?=\d|T\d)(?:{_NUMBER}Y)?(?:{_NUMBER}M)?(?:{_NUMBER}W)?(?:{_NUMBER}D)?"
                           rf"(?:T(?=\d)(?:{_NUMBER}H)?(?:{_NUMBER}M)?(?:{_NUMBER}S)?)?", re.IGNORECASE)
_REPEATING = re.compile(r"R(\d*)/(?:[^/]+/)?(P[^/]+)(?:/[^/]+)?", re.IGNORECASE)


def parse_duration(text: str) -> dict[str, Any]:
    """SpiffWorkflow's reading of an ISO 8601 duration (``parse_iso_duration``), for a duration only:
    that parser skips what it cannot read ahead of the time part, so a repeating interval
    (``R3/PT4H``, a cycle typed into a timeDuration) or ``P1XT4H`` read as four hours, silently."""
    if not _ISO_DURATION.fullmatch(text.strip()):
        raise ValueError(f"{text!r} is no ISO 8601 duration{duration_hint(text)}")
    parsed: dict[str, Any] = TimerEventDefinition.parse_iso_duration(text.strip())
    return parsed


def duration_hint(value: Any) -> str:
    """What a repeating interval given as a duration is, and what to write instead; "" otherwise."""
    cycle = _REPEATING.fullmatch(value.strip()) if isinstance(value, str) else None
    if cycle is None:
        return ""
    times = f"{cycle[1]} times" if cycle[1] else "without end"
    return (f" but a repeating interval (a cycle, {times}), and a timeDuration waits once: to repeat, make it a "
            f"<bpmn:timeCycle> (\"{value.strip()}\"); to wait once, write the duration \"{cycle[2]}\"")


def payload_variables(event_definition: Any) -> list[str]:
    """The task-data variables SpiffWorkflow puts a caught event's payload in (a message's
    ``messageVariable``, a signal's, error's or escalation's ``variableName``); of every
    event of a multiple event (an event-based gateway)."""
    if isinstance(event_definition, MultipleEventDefinition):
        return list(dict.fromkeys(v for d in event_definition.event_definitions for v in payload_variables(d)))
    if isinstance(event_definition, (MessageEventDefinition, ItemAwareEventDefinition)):
        name = getattr(event_definition, "message_var", None) or getattr(event_definition, "variable", None)
        return [name] if isinstance(name, str) and name else []
    return []


def _parallel_may_fire(spec: Any, my_task: Any) -> bool:
    """SpiffWorkflow's ``ParallelGateway._check_threshold_unstructured``: whether every incoming flow
    of the join has a completed task, the gateway's tasks found by ``tasks_in_state`` (the tasks
    ``workflow.get_tasks(spec_name=...)`` gives, in its order, without its iterator's bookkeeping:
    a join checks after every task that reaches it) and ancestors traced without recursion."""
    waiting_inputs = set(spec.inputs)
    for task in tasks_in_state(my_task.workflow, TaskState.ANY_MASK, spec.name):
        if task.is_descendant_of(my_task):
            # the first pass of a loop: this task is reached only after the join completes, so the
            # flow its nearest ancestor among the inputs comes by is not waited for
            ancestor = task
            while ancestor is not None:
                if ancestor.task_spec in waiting_inputs:
                    waiting_inputs.remove(ancestor.task_spec)
                    break
                ancestor = ancestor.parent
        elif my_task.is_descendant_of(task):
            continue  # a later pass: the parents of earlier passes do not count
        elif task.parent.state == TaskState.COMPLETED and task.parent.task_spec in waiting_inputs:
            waiting_inputs.remove(task.parent.task_spec)
    return len(waiting_inputs) == 0


def _end_may_fire(spec: Any, my_task: Any) -> bool:
    """SpiffWorkflow's ``_EndJoin._check_threshold_unstructured``: whether no task but ``my_task`` is
    unfinished (below the end's own tasks, the walk does not look), without ``TaskIterator``'s
    bookkeeping (the end of a process and of each sub-process checks after every task that reaches it)."""
    stack = [my_task.workflow.task_tree]
    while stack:
        task = stack.pop()
        if task._state & TaskState.NOT_FINISHED_MASK and task.last_state_change >= 0 and task is not my_task:
            return False
        if task._children and task.state >= TaskState.MAYBE and task.task_spec.name != spec.name:
            stack.extend(task.children)
    return True


def tasks_in_state(wf: Any, state: int = TaskState.ANY_MASK, spec_name: str | None = None) -> list[Any]:
    """``wf.get_tasks(state=state, spec_name=spec_name)`` (a workflow or a sub-workflow), the
    same tasks in the same order, for one state or mask (and the tasks of one spec).

    The engine asks for the READY tasks after every task it runs, and SpiffWorkflow's
    ``BpmnTaskIterator`` spends most of its time on bookkeeping this search does not need:
    the depth of each task (``engine.deep_trees`` lifts its limit, so it decides nothing),
    each parent looked up again on the way back up. This is the same walk without it:
    depth first, a task before its children, a sub-process task's own workflow before its
    children, below a task only while its state is at least the iterator's ``min_state``
    (always below a sub-process task)."""
    if state & TaskState.PREDICTED_MASK:
        min_state = TaskState.MAYBE
    elif state & TaskState.DEFINITE_MASK:
        min_state = TaskState.FUTURE
    else:
        min_state = TaskState.COMPLETED
    subprocesses = wf.top_workflow.subprocesses
    if state == TaskState.READY and spec_name is None and not subprocesses:
        found = _lone_ready_task(wf, min_state)
        if found is not None:
            return found
    out = []
    stack = [wf.task_tree]
    while stack:
        task = stack.pop()
        current = task._state
        if current & state and (spec_name is None or task.task_spec.name == spec_name):
            out.append(task)
        sub = subprocesses.get(task.id) if subprocesses else None
        if sub is not None:
            tasks = task.workflow.tasks
            stack.extend([tasks.get(c) for c in reversed(task._children)])
            stack.append(sub.task_tree)
        elif task._children and current >= min_state:
            tasks = task.workflow.tasks
            stack.extend([tasks.get(c) for c in reversed(task._children)])
    return out


def _lone_ready_task(wf: Any, min_state: int) -> list[Any] | None:
    """``tasks_in_state(wf, READY)`` of a workflow with no sub-processes when at most one task is
    READY (a sequence, a loop: most steps), or None when the walk must decide (several, whose
    order it gives). A loop's task tree is a chain as long as its passes: a scan of the
    workflow's tasks is the same O(n) as the walk, without a stack push for every task."""
    ready = [t for t in wf.tasks.values() if t._state == TaskState.READY]
    if len(ready) > 1:
        return None
    if not ready:
        return []
    task = ready[0]
    parent = task.parent  # the walk reaches it only through ancestors at min_state or later
    while parent is not None:
        if parent._state < min_state:
            return None
        parent = parent.parent
    return ready


def arrived_branch_tasks(join_task: Any) -> list[Any]:
    """The join instances that arrived, in arrival order, ``join_task`` (the one that fires) last.

    Each instance was tagged with its branch's context in ``_update_hook``.
    """
    wf = join_task.workflow
    others = [
        t for t in tasks_in_state(wf, spec_name=join_task.task_spec.name)
        if t is not join_task and t.has_state(TaskState.FINISHED_MASK) and not join_task.is_descendant_of(t)
    ]
    others.sort(key=lambda t: t.last_state_change)
    return others + [join_task]


# --------------------------------------------------------------------------- parser

def _local(tag: Any) -> str:
    return etree.QName(tag).localname if isinstance(tag, str) else ""


def element_config_texts(node: Any) -> dict[str, str]:
    """Raw JSON texts of ``spiffworkflow:activityConfig`` and ``layerflow:config`` on one element."""
    found: dict[str, str] = {}
    for ext in node.iterfind(f"{{{_BPMN_NS}}}extensionElements"):
        for child in ext:
            if not isinstance(child.tag, str):
                continue
            qn = etree.QName(child.tag)
            if qn.namespace == SPIFF_NS and qn.localname == "activityConfig":
                found["activityConfig"] = child.text or ""
            elif qn.namespace == LAYERFLOW_NS and qn.localname == "config":
                found["layerflow"] = child.text or ""
    return found


def branch_conditions_of(node: Any, from_file: Mapping[str, Mapping[str, str]] | None) -> dict[str, str]:
    """Branch id -> condition text of a gateway's config: its extension elements' ``branches``,
    then the config file's (``from_file``: gateway id -> {branch id: condition}), which wins.
    Unreadable config is left to ``engine.validate``, which reports it."""
    found: dict[str, str] = {}
    for text in element_config_texts(node).values():
        try:
            data = json.loads(text) if text.strip() else {}
        except ValueError:
            continue
        for branch in (data.get("branches") or []) if isinstance(data, dict) else []:
            if isinstance(branch, dict) and isinstance(branch.get("id"), str) \
                    and isinstance(branch.get("condition"), str) and branch["condition"].strip():
                found[branch["id"]] = branch["condition"].strip()
    found.update((from_file or {}).get(node.get("id"), {}))
    return found


class _ExtensionsParserMixin:
    """Adds layerflow's config elements to ``task_spec.extensions`` (tasks and gateways) and
    swaps any stock spec class the parser hard-codes for its layerflow twin."""

    STANDARD_LOOP_CLASS = TWINS[spiff_defaults.StandardLoopTask]
    PARALLEL_MI_CLASS = TWINS[spiff_defaults.ParallelMultiInstanceTask]
    SEQUENTIAL_MI_CLASS = TWINS[spiff_defaults.SequentialMultiInstanceTask]
    EVENT_SUBPROCESS_CLASS = TWINS[spiff_defaults.EventSubprocess]

    node: Any
    process_parser: Any
    bpmn_id: str
    filename: str | None

    def _add_boundary_event(self, children: Any) -> Any:
        split = super()._add_boundary_event(children)  # type: ignore[misc]
        self.spec.task_specs[f"{self.bpmn_id}.BoundaryEventJoin"].__class__ = LayerflowBoundaryEventJoin  # type: ignore[attr-defined]
        return split
    task: Any

    def _add_multiinstance_task(self, loop_characteristics: Any) -> None:
        """A loopDataInputRef / loopDataOutputRef names a dataInput or dataOutput of the task's own
        ioSpecification by its id, as BPMN says. SpiffWorkflow 3.2 compares it with a ``name`` that
        its data specs lack, so it refused every such task ("The loop input data reference is missing
        from the IO specification"): each spec answers to its id while the loop is parsed."""
        io = self.task.io_specification
        items = [*io.data_inputs, *io.data_outputs] if io is not None else []
        for item in items:
            item.name = item.bpmn_id
        try:
            super()._add_multiinstance_task(loop_characteristics)  # type: ignore[misc]
        finally:
            for item in items:
                del item.name

    def parse_extensions(self, node: Any = None) -> dict[str, Any]:
        ext = dict(super().parse_extensions(node))  # type: ignore[misc]
        texts = element_config_texts(self.node if node is None else node)
        ext.update(texts)
        if node is None:
            # who sets each mapping's target, for an error about its write (``Runtime``)
            named = {m.target: f"{m.field} {m.target!r}" for m in [*io_mappings.caught(self.node),
                                                                   *io_mappings.mappings(self.node)] if m.python}
            if _local(self.node.tag) == "callActivity":
                named.update({t: f"{etree.QName(el.tag).localname} source={s!r} target={t!r}"
                              for _, s, t, el in call_mappings.renames(self.node)})
            if named:
                ext[MAPPED_KEY] = named
        if node is None and _local(self.node.tag).endswith("Event"):
            # an event's output mappings (a start event's, a message catch event's: Camunda 8 maps
            # what the message brought): run as the event completes (``_run_hook``); extensions
            # travel with the saved spec, as an event's spec has no postScript. The variables Camunda 7
            # sets to the error or escalation caught come first, as Camunda sets them on catching
            outputs = io_mappings.script([*io_mappings.caught(self.node),
                                          *(m for m in io_mappings.mappings(self.node) if m.direction == "output")])
            if outputs:
                ext[EVENT_OUTPUTS_KEY] = outputs
        if node is None and _local(self.node.tag) in ("userTask", "startEvent"):
            from .forms import parse_form

            # a start event's form checks the start data (``start_form``); it travels with the spec
            # as a user task's does: a resumed instance checks answers without the files
            form = parse_form(self.node, getattr(self, "filename", None))
            if form is not None:
                ext["form"] = form
        return ext

    def parse_condition(self, sequence_flow: Any) -> Any:
        """A flow out of an exclusive gateway with no ``conditionExpression`` (and not the
        default) takes the condition the gateway's config gives its branch (``branches:
        [{id: <the flow's target>, condition: ...}]``): a sentence the model decides
        (``_Runtime.decide_exclusive``), or an expression. SpiffWorkflow would refuse the flow."""
        cond = super().parse_condition(sequence_flow)  # type: ignore[misc]
        if cond is None and _local(self.node.tag) == "exclusiveGateway" \
                and sequence_flow.get("id") != self.node.get("default"):
            cond = branch_conditions_of(self.node, getattr(self.process_parser.parser, "branch_conditions", None)) \
                .get(sequence_flow.get("targetRef"))
        return cond

    def parse_timer_event(self, event: Any) -> Any:
        definition = super().parse_timer_event(event)  # type: ignore[misc]
        if type(definition) is CycleTimerEventDefinition:
            # a cycle timer runs on the engine's clock, as the duration and date timers do
            definition = EngineCycleTimerEventDefinition(definition.name, definition.expression,
                                                         description=definition.description)
        engine_class = _ON_THE_ENGINE_CLOCK.get(type(definition))
        if engine_class is not None:
            definition.__class__ = engine_class  # the subclass changes one method only
        return definition

    def parse_error_event(self, event: Any) -> Any:
        return _thrown_to_its_process(super().parse_error_event(event))  # type: ignore[misc]

    def get_event_definition(self, xpaths: list[str]) -> Any:
        # (event parsers only) SpiffWorkflow's StartEventParser reads message, signal, timer and
        # conditional triggers; the start event of an event sub-process may wait for an error or
        # an escalation too (``_LayerflowProcessParser.add_tasks`` starts it with its scope)
        if _local(self.node.tag) == "startEvent" and _in_event_subprocess(self.node):
            xpaths = [*xpaths, ERROR_EVENT_XPATH, ESCALATION_EVENT_XPATH]
        return super().get_event_definition(xpaths)  # type: ignore[misc]

    def parse_escalation_event(self, event: Any) -> Any:
        return _thrown_to_its_process(super().parse_escalation_event(event))  # type: ignore[misc]

    def parse_node(self) -> Any:
        """A link throw event goes on at its catch event, which no sequence flow reaches: the
        catch is parsed here, from the throw (``engine.links``), and the throw connected to it,
        so the path runs through the catch (a none event: it fires at once) to its flows."""
        spec = super().parse_node()  # type: ignore[misc]
        if links.is_link_throw(self.node):
            catches = links.catch_of(self.node)
            if len(catches) != 1:
                raise ValidationException(
                    f"link throw event {self.bpmn_id!r} (link {links.link_name(self.node)!r}) finds "
                    f"{len(catches) or 'no'} link catch events of its link in its process level; give exactly one "
                    "intermediate catch event beside it that link's name (`layerflow validate` says more)",
                    node=self.node, file_name=self.filename)
            self.task.connect(self.process_parser.parse_node(catches[0]))
        return spec

    def create_task(self) -> Any:
        task = super().create_task()  # type: ignore[misc]
        twin = TWINS.get(type(task))
        if twin is not None:
            # UserTaskParser and BusinessRuleTaskParser name their class in code; the twin
            # adds methods only, so changing the class of the fresh object is safe.
            task.__class__ = twin
        if type(task) is _START_EVENT_TWIN and _interrupting_event_start(self.node):
            task.__class__ = LayerflowInterruptingEventStart  # adds one attribute
        if hasattr(task, "prescript") and _local(self.node.tag) != "callActivity":
            self._add_mappings(task)  # (a call activity's: ``_LayerflowCallActivityParser``)
        return task

    def _add_mappings(self, task: Any) -> None:
        """Another engine's input and output mappings of an activity (``io_mappings``:
        camunda:inputOutput, zeebe:ioMapping) run as Python around its work: the inputs before it,
        as its preScript does, the outputs after it, as its postScript does. A spiffworkflow:preScript
        runs before them, a postScript after: the mappings are closest to the work (a script task's
        too; a call activity's are ``_LayerflowCallActivityParser``'s)."""
        if _local(self.node.tag) == "scriptTask" and task.prescript is None and task.postscript is None:
            # SpiffWorkflow's ScriptTaskParser reads the script only: it dropped a script task's
            # spiffworkflow:preScript and postScript without a word
            extensions = self.parse_extensions()
            task.prescript, task.postscript = extensions.get("preScript"), extensions.get("postScript")
        found = io_mappings.mappings(self.node)
        before = io_mappings.script([m for m in found if m.direction == "input"])
        after = io_mappings.script([m for m in found if m.direction == "output"])
        self._lf_mappings = (task.prescript, before, after, task.postscript)
        task.prescript = "\n".join(filter(None, [task.prescript, before])) or None
        task.postscript = "\n".join(filter(None, [after, task.postscript])) or None

    def _copy_task_attrs(self, original: Any, loop_characteristics: Any = None) -> None:
        """A loop or multi-instance activity: SpiffWorkflow moves its pre- and postScript to the
        loop (run once), unless spiffworkflow:scriptsOnInstances says otherwise; its mappings stay
        with each instance (run for each, as Camunda maps each instance's variables)."""
        super()._copy_task_attrs(original, loop_characteristics)  # type: ignore[misc]
        pre, before, after, post = getattr(self, "_lf_mappings", (None, "", "", None))
        if (before or after) and original.prescript is None and original.postscript is None:
            self.task.prescript, self.task.postscript = pre, post
            original.prescript, original.postscript = before or None, after or None


def _in_event_subprocess(node: Any) -> bool:
    """Whether an element is a child of a ``triggeredByEvent`` sub-process."""
    parent = node.getparent()
    return parent is not None and _local(parent.tag) == "subProcess" and parent.get("triggeredByEvent") == "true"


def _interrupting_event_start(node: Any) -> bool:
    """Whether a startEvent element starts an interrupting event sub-process: an event (not a
    plain start) in a ``triggeredByEvent`` sub-process, ``isInterrupting`` not false; an error
    start always (BPMN's error start event interrupts, whatever the attribute says)."""
    kinds = [_local(c.tag) for c in node if _local(c.tag).endswith("EventDefinition")]
    return _in_event_subprocess(node) and bool(kinds) and (
        node.get("isInterrupting", "true") != "false" or "errorEventDefinition" in kinds)


def _thrown_to_its_process(definition: Any) -> Any:
    engine_class = _THROWN_TO_ITS_PROCESS.get(type(definition))
    if engine_class is not None:
        definition.__class__ = engine_class  # the subclass adds a method only
    return definition


class _LayerflowServiceTaskParser(ServiceTaskParser):  # type: ignore[misc]
    """A service task may be run by a registered handler: no spiff operator needed."""

    def create_task(self) -> Any:
        extensions = SpiffTaskParser.parse_extensions(self)
        if extensions.get("serviceTaskOperator") is not None:
            return super().create_task()
        return self.spec_class(
            self.spec, self.bpmn_id, operation_name=self.bpmn_id, operation_params={}, result_variable=None,
            prescript=extensions.get("preScript"), postscript=extensions.get("postScript"), **self.bpmn_attributes,
        )


class _LayerflowBusinessRuleTaskParser(BusinessRuleTaskParser):  # type: ignore[misc]
    """A business rule task runs its DMN decision (named as SpiffArena or Camunda Modeler name
    it), or, naming none, a registered handler (validate refuses it with neither)."""

    @staticmethod
    def get_decision_ref(node: Any) -> str | None:
        return dmn.decision_ref(node)

    def create_task(self) -> Any:
        if dmn.decision_ref(self.node) is not None:
            task = super().create_task()
            # the decision's result in one variable, as Camunda 7 and 8 name it (Runtime runs it)
            task.result_variable, task.result_mapping = dmn.result_variable(self.node) or (None, None)
            return task
        extensions = self.parse_extensions()
        return self.spec_class(self.spec, self.bpmn_id, dmnEngine=None, prescript=extensions.get("preScript"),
                               postscript=extensions.get("postScript"), **self.bpmn_attributes)


class _LayerflowCallActivityParser(CallActivityParser):  # type: ignore[misc]
    """A call activity's renaming ``in`` mappings run as its preScript does, in the caller's context
    before the called process starts, and its ``out`` mappings as its postScript does, after it
    ends (``call_mappings.renames``): a Camunda 7 model that passes ``claimId`` in as ``ref`` and gets
    ``ok`` back as ``claimOk`` runs as it does there. Its input mappings run before the ``in`` ones,
    its output mappings after the ``out`` ones (``io_mappings``); a spiffworkflow:preScript runs
    before all of them, a postScript after."""

    def create_task(self) -> Any:
        task = super().create_task()
        self._lf_scripts = (task.prescript, task.postscript)  # the model's own, before the mappings
        ins, outs = self._mapping_scripts()
        task.prescript = "\n".join(filter(None, [task.prescript, ins])) or None
        task.postscript = "\n".join(filter(None, [outs, task.postscript])) or None
        return task

    def _mapping_scripts(self) -> tuple[str | None, str | None]:
        """The Python of the mappings before the call and after it: its input mappings
        (``io_mappings``: camunda:inputOutput, zeebe:ioMapping) before its ``in`` mappings, its
        ``out`` mappings before its output mappings, in Camunda's order."""
        mappings = call_mappings.renames(self.node)
        ins = [(s, t) for d, s, t, _ in mappings if d == "in"]
        outs = [(s, t) for d, s, t, _ in mappings if d == "out"]
        found = io_mappings.mappings(self.node)
        before = "\n".join(filter(None, [io_mappings.script([m for m in found if m.direction == "input"]),
                                          call_mappings.script(ins) if ins else None]))
        out_script = call_mappings.script(outs, out=True) if outs else None
        if out_script and call_mappings.all_out(self.node):
            out_script += "\n" + call_mappings.ALL_OUT_MARK
        after = "\n".join(filter(None, [out_script,
                                         io_mappings.script([m for m in found if m.direction == "output"])]))
        return before or None, after or None

    def _copy_task_attrs(self, original: Any, loop_characteristics: Any) -> None:
        """A multi-instance call activity: the model's preScript and postScript go where
        SpiffWorkflow puts them (the activity, or each instance with scriptsOnInstances), but the
        mappings run on each instance, as Camunda maps each call of a multi-instance call activity
        (the in mapping reads that instance's input item, the out mapping sets its output item)."""
        ins, outs = self._mapping_scripts()
        original.prescript, original.postscript = getattr(self, "_lf_scripts", (None, None))
        super()._copy_task_attrs(original, loop_characteristics)
        original.prescript = "\n".join(filter(None, [original.prescript, ins])) or None
        original.postscript = "\n".join(filter(None, [outs, original.postscript])) or None


class _LayerflowEndEventParser(SpiffEndEventParser):  # type: ignore[misc]
    """An end event that throws a signal (BPMN's signal end event) throws it as the path ends, as an
    intermediate signal throw event does: SpiffWorkflow 3.2's parser looks for every other event
    definition on an end event but that one, and ran it as a plain end event that threw nothing."""

    def create_task(self) -> Any:
        event_definition = self.get_event_definition(
            [MESSAGE_EVENT_XPATH, SIGNAL_EVENT_XPATH, CANCEL_EVENT_XPATH, ERROR_EVENT_XPATH, ESCALATION_EVENT_XPATH,
             TERMINATION_EVENT_XPATH])
        task = self._create_task(event_definition)
        task.connect(self.spec.end)
        return task


_PARSER_TWINS: dict[type, type] = {}


def _parser_twin(cls: type) -> type:
    if cls is SpiffEndEventParser:
        cls = _LayerflowEndEventParser
    elif cls is ServiceTaskParser:
        cls = _LayerflowServiceTaskParser
    elif cls is BusinessRuleTaskParser:
        cls = _LayerflowBusinessRuleTaskParser
    elif cls is CallActivityParser:
        cls = _LayerflowCallActivityParser
    if cls not in _PARSER_TWINS:
        _PARSER_TWINS[cls] = type(f"Layerflow{cls.__name__}", (_ExtensionsParserMixin, cls), {"__module__": __name__})
    return _PARSER_TWINS[cls]


class _LayerflowProcessParser(SpiffProcessParser):  # type: ignore[misc]
    def create_spec(self) -> Any:
        spec = super().create_spec()
        spec.end.__class__ = LayerflowEndJoin  # made by BpmnProcessSpec itself, not by a task parser
        return spec

    def add_tasks(self) -> None:
        """An event sub-process whose start waits for an error or an escalation is made with its
        scope, as a timer one is (``BpmnStartTask.connect_or_add_trigger``), and waits there: the
        event is thrown to that scope (``_InterruptAwareEvents.catch``), in the process or in any
        sub-process. SpiffWorkflow would list it with the message and signal ones, which it starts
        only at the top level, as an event comes from outside (``trigger_specs``)."""
        super().add_tasks()
        start = self.spec.start
        for name in list(start.trigger_specs):
            task_spec = self.spec.task_specs[name]
            sp_spec = self.parser.process_parsers[task_spec.spec].get_spec()
            if any(isinstance(ts.event_definition, CodeEventDefinition) for ts in sp_spec.bpmn_start_events):
                start.trigger_specs.remove(name)
                start.connect(task_spec)
                task_spec.connect(self.spec.end)


class LayerflowBpmnParser(SpiffBpmnParser):  # type: ignore[misc]
    """SpiffBpmnParser that builds layerflow's spec twins and reads layerflow config elements.
    ``branch_conditions`` (gateway id -> {branch id: condition}, from the config file) give the
    flows of an exclusive gateway that have no ``conditionExpression`` their condition."""

    def __init__(self, *args: Any, branch_conditions: Mapping[str, Mapping[str, str]] | None = None,
                 **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.branch_conditions = branch_conditions

    OVERRIDE_PARSER_CLASSES = {tag: (_parser_twin(p), TWINS[s]) for tag, (p, s) in _STOCK_TAGS.items()}
    PROCESS_PARSER_CLASS = _LayerflowProcessParser

    def add_bpmn_xml(self, bpmn: Any, filename: str | None = None) -> None:
        """The file's XML without its comments and processing instructions, which say nothing to
        run: SpiffWorkflow's Spiff parser takes every child of a script task for an element (a
        comment there stopped the load with an AttributeError), and a script's text stops at a
        comment inside it. Elements keep their line numbers."""
        etree.strip_elements(bpmn, etree.Comment, etree.ProcessingInstruction, with_tail=False)
        super().add_bpmn_xml(bpmn, filename=filename)
        # SpiffWorkflow's parser follows the flows recursively, three frames per element it
        # passes (deep_trees.make_room); every element of the file bounds how many it can pass
        self._elements = getattr(self, "_elements", 0) + sum(1 for _ in bpmn.iter())
        deep_trees.make_room(3 * self._elements)

    def add_dmn_xml(self, dmn: Any, filename: str | None = None) -> None:
        """As ``add_bpmn_xml``, for a DMN file."""
        etree.strip_elements(dmn, etree.Comment, etree.ProcessingInstruction, with_tail=False)
        super().add_dmn_xml(dmn, filename=filename)

    def get_collaboration(self, name: str) -> tuple[Any, dict[str, Any]]:
        """SpiffWorkflow's collaboration spec (a call activity per executable pool, started together),
        with layerflow's start (a split: ``LayerflowCollaborationStart``) and end join."""
        spec, subprocess_specs = super().get_collaboration(name)
        spec.start.__class__ = LayerflowCollaborationStart
        spec.end.__class__ = LayerflowEndJoin
        return spec, subprocess_specs


# --------------------------------------------------------------------------- scripts

class LayerflowScriptEngine(PythonScriptEngine):  # type: ignore[misc]
    """Routes expressions and scripts to the workflow's driver (the context), else stock."""

    def evaluate(self, task: Any, expression: str, external_context: Any = None) -> Any:
        driver = driver_of(task)
        if driver is None:
            return super().evaluate(task, expression, external_context)
        if external_context:  # e.g. the workflow's data objects, which a conditional event reads
            return driver.evaluate(task, expression, external_context)
        return driver.evaluate(task, expression)

    def execute(self, task: Any, script: str, external_context: Any = None) -> Any:
        driver = driver_of(task)
        if driver is None:
            return super().execute(task, script, external_context)
        if driver.exec_script(task, script):
            # thrown to its catching events already: whatever ran the script must not go on as if it ran
            raise ScriptThrew(bpmn_id_of(task))
        return True


# --------------------------------------------------------------------------- serializer

def _spec_shape(spec: Any) -> int:
    """What of a spec changes after parsing: SpiffWorkflow connects an event sub-process to
    the start (and the end) of its process's spec the first time an event starts one
    (``BpmnStartTask.trigger_wf``). A text of the spec from before no longer loads the
    workflow: its sub-process task then has no way on and fails as it ends."""
    start = getattr(spec, "start", None)
    return len(start.outputs) if start is not None else 0


class _SpecCachingWorkflowConverter(BpmnWorkflowConverter):  # type: ignore[misc]
    """Serializes a process spec once per shape (``_spec_shape``): the engine serializes
    its workflow after every activity, and the spec is half the work."""

    _cache: "weakref.WeakKeyDictionary[Any, dict[tuple[bool, int], Any]]" = weakref.WeakKeyDictionary()

    def _spec(self, spec: Any) -> Any:
        key = (bool(getattr(self.registry, "_encoder_mode", False)), _spec_shape(spec))
        per_spec = self._cache.setdefault(spec, {})
        if key not in per_spec:
            per_spec[key] = self.registry.convert(spec)
        return per_spec[key]

    def to_dict(self, workflow: Any) -> dict[str, Any]:
        dct = WorkflowConverter.to_dict(self, workflow)
        dct["spec"] = self._spec(workflow.spec)
        dct["subprocess_specs"] = {str(k): self._spec(v) for k, v in workflow.subprocess_specs.items()}
        dct["subprocesses"] = self.mapping_to_dict(workflow.subprocesses)
        dct["bpmn_events"] = self.registry.convert(workflow.bpmn_events)
        return dict(dct)


class _BusinessRuleTaskConverter(BusinessRuleTaskConverter):  # type: ignore[misc]
    """Also a business rule task that names no decision (run by a handler): no decision table;
    and the result variable, when the task names one (absent from records saved before)."""

    def to_dict(self, spec: Any) -> dict[str, Any]:
        if spec.dmnEngine is not None:
            dct = dict(super().to_dict(spec))
        else:
            dct = dict(self.get_default_attributes(spec))
            dct.update(SpiffBpmnTaskConverter.to_dict(self, spec))
            dct["decision_table"] = None
        if getattr(spec, "result_variable", None):
            dct["result_variable"] = spec.result_variable
            dct["result_mapping"] = spec.result_mapping
        return dct

    def from_dict(self, dct: dict[str, Any]) -> Any:
        result = dct.pop("result_variable", None), dct.pop("result_mapping", None)
        if dct.get("decision_table") is not None:
            spec = super().from_dict(dct)
        else:
            dct.pop("decision_table", None)
            dct["dmnEngine"] = None
            spec = self.task_spec_from_dict(dct)
        spec.result_variable, spec.result_mapping = result
        return spec


class _SenderKeepingEventConverter(BpmnEventConverter):  # type: ignore[misc]
    """A message waiting for its receiver (``workflow.bpmn_events``) keeps its sender across a save."""

    def to_dict(self, event: Any) -> dict[str, Any]:
        dct: dict[str, Any] = super().to_dict(event)
        sent_from = getattr(event, "lf_sent_from", None)
        if sent_from is not None:
            dct["lf_sent_from"] = dict(sent_from)
        return dct

    def from_dict(self, dct: dict[str, Any]) -> Any:
        event = super().from_dict(dct)
        if dct.get("lf_sent_from") is not None:
            event.lf_sent_from = dict(dct["lf_sent_from"])
        return event


def _serializer() -> BpmnWorkflowSerializer:
    config = dict(SPIFF_CONFIG)
    for stock, twin in TWINS.items():
        config[twin] = config[stock]
    config[EngineCycleTimerEventDefinition] = config[CycleTimerEventDefinition]
    for stock, engine_class in (*_THROWN_TO_ITS_PROCESS.items(), *_ON_THE_ENGINE_CLOCK.items()):
        config[engine_class] = config[stock]
    config[LayerflowInterruptingEventStart] = config[_STOCK_TAGS[full_tag("startEvent")][1]]
    config[LayerflowCollaborationStart] = config[BpmnStartTask]
    config[LayerflowBoundaryEventJoin] = config[BoundaryEventJoin]
    config[TWINS[spiff_defaults.BusinessRuleTask]] = _BusinessRuleTaskConverter
    config[BpmnWorkflow] = _SpecCachingWorkflowConverter
    config[BpmnEvent] = _SenderKeepingEventConverter
    return BpmnWorkflowSerializer(BpmnWorkflowSerializer.configure(config))


SERIALIZER = _serializer()
_ENCODER = create_encoder(SERIALIZER.registry)
# One encoder (json.dumps builds one per call). Strict (no NaN): the text goes into stored
# records as it is. Compact: it is stored after every activity.
_STRICT = _ENCODER(separators=(",", ":"), allow_nan=False)
_ENCODE = fast_encode(_STRICT)
_SCALARS = frozenset({str, int, float, bool, type(None)})
# spec -> (its shape, its JSON text in that shape): see _spec_shape
_SPEC_JSON: "weakref.WeakKeyDictionary[Any, tuple[int, str]]" = weakref.WeakKeyDictionary()


@dataclass
class _TaskTexts:
    """What ``serialize_json`` keeps of one workflow's tasks from one save to the next."""

    # task id -> (fingerprint, JSON text of the task). Ids, not tasks: a task refers to its
    # workflow, which would then never leave the weak cache.
    tasks: dict[Any, tuple[tuple[Any, ...], str]] = field(default_factory=dict)
    ids: dict[Any, str] = field(default_factory=dict)  # task id (a UUID) -> its JSON string
    # task id -> (its children's ids, their JSON list): for a task with many children
    children: dict[Any, tuple[tuple[Any, ...], str]] = field(default_factory=dict)

    # task id -> (its parent's id when the parent is in the workflow, spec name, type, and the
    # texts they make: see fixed)
    fixed_parts: dict[Any, tuple[Any, str, type, tuple[str, str, str]]] = field(default_factory=dict)

    def quoted(self, task_id: Any) -> str:
        text = self.ids.get(task_id)
        if text is None:
            text = self.ids[task_id] = f'"{task_id}"'  # str(UUID) is slow Python
        return text

    def fixed(self, task: Any, has_parent: bool, registry: Any) -> tuple[str, str, str]:
        """The parts of a plain task's text that stay as long as the task does (its id, parent,
        spec and typename): ``'{"id":..,"parent":..,"children":['``, ``'"task_spec":..,'`` and
        ``',"typename":..}'``, written once per task, not at each of its changes. ``has_parent``:
        whether the parent is in the task's workflow (a sub-workflow's root names one outside)."""
        known = self.fixed_parts.get(task.id)
        parent_id = task._parent if has_parent else None
        name, kind = task.task_spec.name, type(task)
        if known is None or known[0] != parent_id or known[1] != name or known[2] is not kind:
            parent = self.quoted(parent_id) if has_parent else "null"
            texts = (f'{{"id":{self.quoted(task.id)},"parent":{parent},"children":[', f'"task_spec":{_scalar_json(name)},',
                     f',"typename":{_scalar_json(registry.typenames.get(kind))}}}')
            known = self.fixed_parts[task.id] = (parent_id, name, kind, texts)
        return known[3]


_TASK_JSON: "weakref.WeakKeyDictionary[Any, _TaskTexts]" = weakref.WeakKeyDictionary()


def serialize_json(workflow: Any) -> str:
    """``SERIALIZER.serialize_json(workflow)``, for a workflow that is saved again and again.

    The engine saves after every activity, and most of a save is the same text as the
    last one: the spec, and every task that did not change since. Both are kept as JSON
    text: a spec once per shape (``_spec_shape``), a task until its fingerprint changes (state, time of the last
    state change, children, ``internal_data``, and for the instances of a multi-instance
    activity their scalar items and the keys of the activity's data); a sub-workflow's tasks
    the same way. A task with other data is converted every time, as are events. The
    result loads with ``SERIALIZER.deserialize_json`` to the same workflow (the same
    JSON value as SpiffWorkflow's own text; only the order of the top-level keys and the
    spacing differ). It is strict JSON: a value JSON cannot hold (NaN, an object the
    serializer does not know) raises ``ValueError`` / ``TypeError``.
    """
    registry = SERIALIZER.registry
    registry._encoder_mode = True
    try:
        head = {**_workflow_head(workflow, registry), "bpmn_events": registry.convert(workflow.bpmn_events),
                SERIALIZER.VERSION_KEY: SERIALIZER.VERSION}
        text = _ENCODE(head)
        tasks = _tasks_json(workflow, registry)
        quoted = _texts_of(workflow).quoted
        subprocesses = ",".join(f"{quoted(k)}:{_subworkflow_json(v, registry)}" for k, v in workflow.subprocesses.items())
        subspecs = ",".join(f"{encode_basestring_ascii(str(k))}:{_spec_json(v, registry)}"
                            for k, v in workflow.subprocess_specs.items())
        spec = _spec_json(workflow.spec, registry)
    finally:
        registry._encoder_mode = False
    return (f'{text[:-1]},"tasks":{tasks},"subprocesses":{{{subprocesses}}},"spec":{spec},'
            f'"subprocess_specs":{{{subspecs}}}}}')


def _workflow_head(workflow: Any, registry: Any) -> dict[str, Any]:
    """What SpiffWorkflow's ``WorkflowConverter`` writes for a workflow or a sub-workflow, but
    its tasks, and the typename the registry adds."""
    return {
        "data": registry.convert(registry.clean(workflow.data)),
        "correlations": workflow.correlations,
        "last_task": str(workflow.last_task.id) if workflow.last_task is not None else None,
        "success": workflow.success,
        "completed": workflow.completed,
        "root": str(workflow.task_tree.id),
        "typename": registry.typenames[type(workflow)],
    }


def _subworkflow_json(sub: Any, registry: Any) -> str:
    """What SpiffWorkflow's ``BpmnSubWorkflowConverter`` writes for a sub-process, its tasks
    kept as text between saves as the workflow's are (a loop through a sub-process leaves one
    finished sub-workflow per pass, each written again at every save)."""
    head = {**_workflow_head(sub, registry), "parent_task_id": str(sub.parent_task_id), "spec": sub.spec.name}
    return f'{_ENCODE(head)[:-1]},"tasks":{_tasks_json(sub, registry)}}}'


def deserialize(workflow: str | Mapping[str, Any]) -> BpmnWorkflow:
    """The workflow a record holds: as JSON text (``serialize_json``; records of format 1)
    or as the object that text encodes (records of format 2). The object is migrated in
    place: pass one you own (a record just loaded)."""
    if isinstance(workflow, str):
        wf = SERIALIZER.deserialize_json(workflow)
    else:
        dct = dict(workflow)
        SERIALIZER.migrate(dct)
        wf = SERIALIZER.from_dict(dct)
    _room_to_predict(wf.spec, wf.subprocess_specs)  # for the sub-processes it starts from here on
    return wf


def _spec_json(spec: Any, registry: Any) -> str:
    shape = _spec_shape(spec)
    hit = _SPEC_JSON.get(spec)
    if hit is None or hit[0] != shape:
        hit = _SPEC_JSON[spec] = (shape, _ENCODE(registry.convert(spec)))
    return hit[1]


def _texts_of(workflow: Any) -> _TaskTexts:
    texts = _TASK_JSON.get(workflow)
    if texts is None:
        texts = _TASK_JSON[workflow] = _TaskTexts()
    return texts


def _tasks_json(workflow: Any, registry: Any) -> str:
    texts = _texts_of(workflow)
    cache = texts.tasks
    tasks = workflow.tasks
    # whether any task has data (usually none: the engine keeps data in its contexts); when none
    # has, no task's parent is looked up (UUIDs hash in Python)
    any_data = any(task.data for task in tasks.values())
    parents: dict[int, tuple[bool, Any, tuple[Any, ...]]] = {}  # _task_fingerprint's, for this save
    parts = []
    scalars = _SCALARS
    for tid, task in tasks.items():
        if any_data:
            mark = _task_fingerprint(task, tasks, any_data, parents)
        else:  # _task_fingerprint of a task without data, inline: it runs for every task at every save
            internal = tuple(task.internal_data.items())
            mark = (task._state, task.last_state_change, task.triggered, tuple(task._children), internal,
                    task._parent, task.task_spec.name, (), ())
            for _, value in internal:
                if type(value) not in scalars:
                    mark = None
                    break
        hit = cache.get(tid)
        if hit is not None and mark is not None and hit[0] == mark:
            parts.append(hit[1])
            continue
        body = _plain_task_json(task, registry, texts) if mark is not None else _encoded_task_json(task, registry, texts)
        if body is None:
            body = _ENCODE(registry.convert(task))
        text = f"{texts.quoted(tid)}:{body}"
        if mark is not None:
            cache[tid] = (mark, text)
        elif hit is not None:
            del cache[tid]
        parts.append(text)
    if len(cache) > len(tasks):  # tasks were dropped (a reset): forget theirs
        for tid in [t for t in cache if t not in tasks]:
            del cache[tid]
            texts.ids.pop(tid, None)
            texts.children.pop(tid, None)
            texts.fixed_parts.pop(tid, None)
    return "{" + ",".join(parts) + "}"


# the delta of a task whose parent has no data, and it none either
_NO_DELTA = '{"updates":{},"deletions":[]}'
# does _plain_task_json write what the registry builds? checked once for each form: (has a
# parent, has data or a parent with data)
_PLAIN_TASKS: dict[tuple[bool, bool], bool] = {}


def _scalar_json(value: Any) -> str:
    """JSON for the scalars a plain task holds, as the (strict, ASCII) encoder writes them."""
    if type(value) is str:
        return encode_basestring_ascii(value)
    if value is None or type(value) is bool:
        return "null" if value is None else "true" if value else "false"
    if type(value) is int or (type(value) is float and math.isfinite(value)):
        return repr(value)
    raise ValueError(f"{value!r} is not a JSON scalar")  # the caller takes the long way


def _key_json(key: Any) -> str:
    if type(key) is str:
        return encode_basestring_ascii(key)
    raise ValueError(f"{key!r} is not a str key")  # the caller takes the long way


def _plain_task_json(task: Any, registry: Any, texts: _TaskTexts) -> str | None:
    """The JSON text of SpiffWorkflow's ``TaskConverter.to_dict`` (with its typename) for a
    task its fingerprint describes (``_task_fingerprint``): written directly, its fields being
    ids, numbers, names and scalar data (a dict and an encoder call would cost more than the
    text). A task with a parent stores its data as a delta against the parent's: with no key
    in common, every key of its own is an update and every key of the parent's a deletion.
    The first use of each form compares it with the registry's own result; on a difference
    that form is never used again (None)."""
    parent_task = task.parent
    has_parent = parent_task is not None
    parent_data = parent_task.data if has_parent else {}
    form = (has_parent, bool(task.data or parent_data))
    if _PLAIN_TASKS.get(form) is False:
        return None
    children = ",".join(map(texts.quoted, task._children))
    try:
        if has_parent and (task.data or parent_data):
            updates = ",".join(f"{_key_json(k)}:{_scalar_json(v)}" for k, v in task.data.items())
            deletions = ",".join(map(_key_json, parent_data))
            delta = f'{{"updates":{{{updates}}},"deletions":[{deletions}]}}'
        else:
            delta = _NO_DELTA if has_parent else "{}"
        internal = ",".join(f"{_key_json(k)}:{_scalar_json(v)}" for k, v in task.internal_data.items()) \
            if task.internal_data else ""
        head, spec, tail = texts.fixed(task, has_parent, registry)
        changed, state, triggered = task.last_state_change, task._state, task.triggered
        # the usual types written here (a float time, an int state, a bool), the others by _scalar_json
        text = (f'{head}{children}],"last_state_change":'
                f'{repr(changed) if type(changed) is float and math.isfinite(changed) else _scalar_json(changed)},'
                f'"state":{int.__repr__(state) if type(state) is int else _scalar_json(state)},{spec}'
                f'"triggered":{("true" if triggered else "false") if type(triggered) is bool else _scalar_json(triggered)},'
                f'"internal_data":{{{internal}}},"data":{{}},"delta":{delta}{tail}')
    except ValueError:
        return None
    if form not in _PLAIN_TASKS:
        _PLAIN_TASKS[form] = json.loads(text) == registry.convert(task)
        if not _PLAIN_TASKS[form]:
            return None
    return text


# does _encoded_task_json write what the registry builds? checked at its first use
_ENCODED_TASKS: dict[str, bool] = {}


def _encoded_task_json(task: Any, registry: Any, texts: _TaskTexts) -> str | None:
    """The JSON text of SpiffWorkflow's ``TaskConverter.to_dict`` (with its typename) for a
    task with data no fingerprint describes (a multi-instance activity's task, holding its
    input and output collections): its fields encoded in one call, its ids from ``texts``.
    The converter writes ``str(UUID)`` of every child, and such a task lists every instance
    of the activity as a child, at every save. The first use compares the text with the
    registry's own result; on a difference it is never used again (None)."""
    if _ENCODED_TASKS.get("checked") is False:
        return None
    parent_task = task.parent
    if parent_task is None:
        data, delta = task.data, {}
    else:
        data, delta = {}, {"updates": DeepMerge.get_updated_keys(parent_task.data, task.data),
                           "deletions": DeepMerge.get_deleted_keys(parent_task.data, task.data)}
    fields = _ENCODE({"last_state_change": task.last_state_change, "state": task._state,
                      "task_spec": task.task_spec.name, "triggered": task.triggered,
                      "internal_data": registry.convert(task.internal_data), "data": data, "delta": delta})
    parent = texts.quoted(task._parent) if parent_task is not None else "null"
    ids = tuple(task._children)
    known = texts.children.get(task.id)
    if known is None or known[0] != ids:
        known = texts.children[task.id] = (ids, ",".join(map(texts.quoted, ids)))
    text = (f'{{"id":{texts.quoted(task.id)},"parent":{parent},"children":[{known[1]}],'
            f'{fields[1:-1]},"typename":{_ENCODE(registry.typenames.get(type(task)))}}}')
    if "checked" not in _ENCODED_TASKS:
        _ENCODED_TASKS["checked"] = text == _ENCODE(registry.convert(task))
        if not _ENCODED_TASKS["checked"]:
            return None
    return text


def _task_fingerprint(task: Any, tasks: Mapping[Any, Any], any_data: bool,
                      parents: dict[int, tuple[bool, Any, tuple[Any, ...]]]) -> tuple[Any, ...] | None:
    """What SpiffWorkflow's task converter reads, when it can be compared cheaply; else None.

    Data is stored as changes against the parent's data. A task whose own data holds only
    scalars under keys its parent's data does not have (an instance of a multi-instance
    activity: its input and output items) stores them all as updates and the parent's keys
    as deletions, whatever the parent's values: its own items and the parent's keys
    decide its text. The engine keeps every other task's data empty (``any_data``: whether
    any task of the workflow has some).

    ``parents``: the parents looked up so far in this save (whether there is one, its data when
    not empty, its keys), by ``id`` of the parent's id object: the instances of a
    multi-instance activity share theirs, so it is looked up (a UUID hashes in Python) once."""
    data = task.data
    pid = task._parent
    has_parent, parent_data, parent_keys = False, None, ()
    if pid is not None and (data or any_data):  # a task without data: only a parent with data matters
        known = parents.get(id(pid))
        if known is None:
            parent = tasks.get(pid)
            pdata = parent.data if parent is not None else None
            known = parents[id(pid)] = (parent is not None, pdata or None, tuple(pdata) if pdata else ())
        has_parent, parent_data, parent_keys = known
    items: tuple[Any, ...] = ()
    if data:
        if not has_parent:
            return None  # a root task's data is written whole
        if parent_data is not None and not parent_data.keys().isdisjoint(data):
            return None
        items = tuple(data.items())
        for key, value in items:
            if type(key) is not str or type(value) not in _SCALARS:
                return None
    internal = tuple(task.internal_data.items())
    for _, value in internal:
        if type(value) not in _SCALARS:
            return None
    return (task._state, task.last_state_change, task.triggered, tuple(task._children), internal, pid,
            task.task_spec.name, items, parent_keys)


def _room_to_predict(spec: Any, subprocess_specs: Mapping[str, Any]) -> None:
    """SpiffWorkflow predicts the steps ahead of a new workflow (and of each sub-process it starts)
    recursively, a frame per step: room for the longest way through any of the specs."""
    deep_trees.make_room(len(spec.task_specs) + sum(len(s.task_specs) for s in subprocess_specs.values()))


def new_workflow(spec: Any, subprocess_specs: dict[str, Any] | None = None) -> BpmnWorkflow:
    if spec.start.trigger_specs:
        # An event can start an event sub-process here, and SpiffWorkflow then connects it to
        # the start of the spec itself (see _spec_shape). The instances of a process share its
        # spec: every later one would run that sub-process as a branch and wait for its event.
        # Such a workflow runs on a spec of its own, from the spec's text (as a loaded one does;
        # SpiffWorkflow's dict of a spec shares its lists of inputs and outputs with the spec).
        spec = SERIALIZER.registry.restore(json.loads(_spec_json(spec, SERIALIZER.registry)))
    _room_to_predict(spec, subprocess_specs or {})
    return BpmnWorkflow(spec, subprocess_specs or {}, script_engine=LayerflowScriptEngine())


class _InterruptAwareEvents(EventManager):  # type: ignore[misc]
    """SpiffWorkflow's routing of messages and signals, except that a process an interrupting
    event sub-process interrupted (``_Runtime.interrupt``) starts none of its other event
    sub-processes: it is over but for the interrupting one. SpiffWorkflow started one for a
    message or signal the interrupting one threw itself (layerflow refuses those sent from
    outside before they reach SpiffWorkflow: ``events.waiting_catches``)."""

    def update_collaboration(self, event: Any) -> None:
        if self.workflow.task_tree.internal_data.get(INTERRUPTED_KEY) is None:
            super().update_collaboration(event)

    def catch(self, event: Any, internal: bool = True) -> int:
        """An error or escalation thrown to its process (``_ThrownToItsProcess``) goes to the events
        that wait for it there, then in the process around it, and so on: as in SpiffWorkflow, but
        the start event of an error or escalation event sub-process waits in the scope around its
        own sub-workflow (``catching_scope``). A message a pool of a collaboration throws carries
        its sender (``lf_sent_from``: the throwing element and its pool's process), saved with it
        while it waits for its receiver."""
        thrower = getattr(self.workflow, "lf_throwing", None)
        if thrower is not None and isinstance(event.event_definition, MessageEventDefinition) \
                and getattr(event, "lf_sent_from", None) is None and is_collaboration(self.workflow.spec):
            event.lf_sent_from = {"element": bpmn_id_of(thrower), "process": pool_process_of(thrower)}
        target = event.target
        # an error or escalation is thrown to the thrower's own workflow (a cancel event to the one around
        # its transaction): a boundary event catches it only from inside its activity
        origin = target if isinstance(event.event_definition, CodeEventDefinition) else None
        if target is None:
            caught = int(super().catch(event, internal))
            if not caught and internal:
                self._left_the_instance(thrower, event)
            return caught
        while target is not None:
            tasks = [t for t in self.tasks.values()
                     if catching_scope(t) is target and t.task_spec.event_definition.catches(t, event)
                     and thrown_inside(t, origin)]
            if tasks:
                tasks = nearest_catchers(tasks, event)
                for task in tasks:
                    task.task_spec.catch(task, event)
                    task.task_spec._update(task)
                return len(tasks)
            target = target.parent_workflow
        # caught nowhere on the way up: to any event of the instance that catches it, as in
        # SpiffWorkflow, but an event sub-process's start, which catches what its scope throws only
        event.target = None
        self.update_collaboration(event)
        tasks = [t for t in self.tasks.values() if not caught_in_scope(t.task_spec) and t.task_spec.catches(t, event)
                 and thrown_inside(t, origin)]
        if not tasks and internal:
            self.workflow.bpmn_events.append(event)
            self._left_the_instance(thrower, event)
        for task in tasks:
            task.task_spec.catch(task, event)
            task.task_spec._update(task)
        return len(tasks)

    def _left_the_instance(self, thrower: Any, event: Any) -> None:
        """A message or signal the process threw that nothing in the instance caught: SpiffWorkflow
        leaves it in ``bpmn_events`` for the application; the driver records it (``thrown_out``).
        In a collaboration a pool's message that a pool can catch waits there for its receiver
        instead (``deliver_pending``); one no pool catches, and a signal (a broadcast, never kept
        for later), leave the instance as a single process's do."""
        driver = driver_of_workflow(self.workflow)
        if thrower is None or driver is None:
            return
        if is_collaboration(self.workflow.spec) and isinstance(event.event_definition, MessageEventDefinition) \
                and event.event_definition.name in message_catch_names(self.workflow):
            return
        driver.thrown_out(thrower, event)


def message_catch_names(workflow: Any) -> frozenset[str]:
    """The names of the messages some catch event (a start, intermediate or boundary event, a receive
    task) of ``workflow``'s process or of a process it runs (a pool, a called process) waits for."""
    names: set[str] = set()
    for spec in (workflow.spec, *workflow.subprocess_specs.values()):
        for ts in spec.task_specs.values():
            if not isinstance(ts, CatchingEvent):
                continue
            definition = ts.event_definition
            for one in getattr(definition, "event_definitions", None) or [definition]:
                if isinstance(one, MessageEventDefinition) and one.name:
                    names.add(str(one.name))
    return frozenset(names)


def attach(wf: BpmnWorkflow, driver: Driver | None) -> BpmnWorkflow:
    """Make ``driver`` the hook object of ``wf`` (after creating or deserializing it), held weakly
    (``driver_of_workflow``): SpiffWorkflow's tasks and workflow refer to one another, and a strong
    reference would hang all the driver holds on that cycle, for the cyclic garbage collector to
    free. Whoever drives the workflow keeps the driver alive (the engine's instance does)."""
    wf.script_engine = LayerflowScriptEngine()
    wf.layerflow = weakref.ref(driver) if driver is not None else None
    if type(wf.event_manager) is EventManager:
        events = _InterruptAwareEvents(wf)
        events.tasks = wf.event_manager.tasks  # the tasks waiting for an event, as loaded
        wf.event_manager = events
    return wf


def iter_user_specs(spec: Any) -> Iterator[Any]:
    """Task specs that appear on the diagram (skips spiff's internal Start/EndJoin/End)."""
    for ts in spec.task_specs.values():
        if getattr(ts, "bpmn_id", None):
            yield ts


def parse_json_config(text: str) -> Any:
    return json.loads(text) if text and text.strip() else {}
