"""Running processes: ``Engine``, ``Instance`` and the per-instance driver SpiffWorkflow calls.

SpiffWorkflow decides *which* task runs next; layerflow decides what each task sees
and may change. The driver (``_Runtime``) is attached to the workflow
(``engine.spiff.attach``) and called from the spec twins:

* an **activity** (script, user, manual, plain, service, business rule task): the
  context is ``begin_activity``-ed, KNOWLEDGE is retrieved, the handler runs (model
  call, registered function, BPMN script, or the user's submitted data), its writes go
  through ``LayeredContext.write``, and ``complete_activity`` moves WORKING into
  HISTORY with the activity's ``preserveKeys``. A failure aborts the activity (every
  layer back as at its start) and leaves the instance in ``error``, resumable.
* a **split**: XOR continues in the same context (the taken branch's
  ``contextInject``, ``_branch_id``, ``_snapshot_id`` are injected, a snapshot and a
  split note go on the tape); AND / inclusive fork one context per taken branch from
  one snapshot.
* a **join** (AND / inclusive): the arrived branch contexts are merged three-way
  against the split snapshot into the context the split came from.
* a **condition**: evaluated over the task's context (reads only the names it uses).
  An XOR gateway whose branches carry natural-language conditions (in its config, or a
  sentence as a flow's own ``conditionExpression``) is decided by ``decide_exclusive``
  (the expression rules, the model checks, and decides the flows that have only a sentence).
* an **LLM activity with tools** (``llm.tools: true``) runs the model's governance tool
  calls on this instance; a ``human_confirm`` among them makes the instance wait with the
  activity open (SpiffWorkflow: the task stays STARTED, its conversation in
  ``Instance.suspended``); the answer runs the task again and the model goes on with it.
* a **confirmation** (a person's answer to a join conflict or to a model's
  ``human_confirm``) carries a deadline (``created + timeout``). Past it, the
  configured default is taken, or, with
  ``onTimeout: escalate`` (or no default), the confirmation is marked ``escalated`` and
  the instance keeps waiting for a person: see ``_Runtime.time_out``.
* a **message or signal** from outside (``Engine.send_event``) is caught where SpiffWorkflow
  catches it; its payload goes into the catching task's context: see ``engine.events``.

The instance is saved after every activity.

The driver's steps at gateways (splits, XOR decisions, joins, the confirmations joins wait
for) are in ``engine.gateway_steps``; its steps for timers, sub-processes, event
sub-processes and boundary-event paths in ``engine.scope_steps``: base classes of
``_Runtime``, kept apart so each module reads in one sitting.
"""

from __future__ import annotations

import difflib
import json
import marshal
import re
import time
import traceback
import uuid
import weakref
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from datetime import datetime, timezone
from dataclasses import dataclass, field, fields, replace
from typing import Any, Literal, NoReturn, get_args

from SpiffWorkflow.bpmn.specs.event_definitions.conditional import ConditionalEventDefinition
from SpiffWorkflow.bpmn.specs.mixins.events.start_event import StartEvent
from SpiffWorkflow.bpmn.specs.mixins.exclusive_gateway import ExclusiveGateway
from SpiffWorkflow.bpmn.specs.mixins.inclusive_gateway import InclusiveGateway
from SpiffWorkflow.bpmn.specs.mixins.none_task import NoneTask as NoneTaskMixin
from SpiffWorkflow.bpmn.specs.mixins.script_task import ScriptTask as ScriptTaskMixin
from SpiffWorkflow.bpmn.specs.mixins.service_task import ServiceTask as ServiceTaskMixin
from SpiffWorkflow.bpmn.specs.mixins.user_task import UserTask as UserTaskMixin
from SpiffWorkflow.dmn.specs.business_rule_task_mixin import BusinessRuleTaskMixin
from SpiffWorkflow.util.task import TaskState

from context_layers import DELETED, Layer, LayeredContext, json_equal, thaw
from context_layers.canonical import freeze, key_problem
from context_layers.tape import TAPE_FORMAT, EventKind
from context_layers.compression import after_activity
from context_layers.config import ActivityExtensionConfig, LLMConfig
from context_layers.errors import (ActivityError, ContextKeyError, ContextWriteDenied, LayerflowError, ProcessError,
                                   VersionConflict)
from context_layers.stores import StoreUnavailable

from . import collaboration, dmn, events, forms, spiff
from gateways.conditions import FOREIGN_LITERALS
from gateways.conflicts import jsonable
from gateways.join import MERGED_CONFLICTS_KEY
from gateways.policy import ESCALATE, MODEL_NOT_ASKED, SETTLE_FAILED_JOIN

from .gateway_steps import (COUNTER_PREFIX, ENGINE_KEY_RULE, ENGINE_RECORD_PREFIXES, RETRIEVAL_PREFIX, GatewaySteps,
                            condition_context, is_engine_key, option_value, short, short_json)
from .gateway_steps import _deadline as confirmation_deadline
from .answer import answer_problems
from .handlers import REGISTRY, ActivityContext, BpmnError, Handler, HandlerRegistry, evaluate_expression, file_handlers, load_handler_reference, run_script, write_result
from .knowledge import BM25Retriever, Hit, Retriever
from .process import Process, config_file_changes, config_file_section_changes
from .scope_steps import (ABSENT, MI_OWNERS_KEY, ScopeSteps, close_at_completion, close_cancelled, close_open_branches,
                          no_output_item)
from .store import READ_FORMATS, RECORD_FORMAT, InstanceRecords, InvalidRecord, JSONText, Store, json_text, open_store

__all__ = ["Engine", "Instance", "RECORD_FORMAT", "STATUSES", "TimedOut", "Unattended"]

Status = Literal["running", "completed", "waiting", "error", "cancelled"]
STATUSES: tuple[str, ...] = get_args(Status)
MAIN = spiff.MAIN_CONTEXT
_WORK_LAYERS = (Layer.PROCESS, Layer.KNOWLEDGE, Layer.HISTORY, Layer.WORKING)


def confirmation_item(confirmation: Mapping[str, Any]) -> dict[str, Any]:
    """The ``waiting_for`` item of an open confirmation. ``context`` names the context it asks for
    (its own ``context``): of several lines of a multi-instance, or firings of one join, asking at
    once under one ``task_id`` and ``key``, the line each question belongs to."""
    return {"kind": "confirmation", "id": confirmation["id"], "task_id": confirmation["task_id"],
            "key": confirmation.get("key"), "context": str(confirmation.get("context") or MAIN)}


@dataclass(frozen=True)
class TimedOut:
    """What an ``ask`` callback returns when a person did not answer before the deadline.
    The engine then applies the confirmation's own timeout rule (its default, or an
    escalation), whatever ``value`` says; ``value`` is kept for callers that show it."""

    value: Any = None


@dataclass(frozen=True)
class Unattended:
    """What an ``ask`` callback returns for an answer no person gave: ``value``, what the policy or
    the model proposed (or the configured default), taken as it is by ``actor`` (``layerflow --yes``).
    It is recorded as that: the tape's note is by ``actor`` and marked ``unattended``, and a join's
    resolution (resolver ``human``, the step that settled it) says in its reason whose proposal it took."""

    value: Any
    actor: str = "unattended"


class InstanceClock:
    """An instance's clock: the engine's clock (``Engine(clock=)``: the wall clock, or ``--now``'s),
    never behind the latest time the instance has seen (``floor``). README: the clock only runs forward.
    An instance run on a clock ahead of the wall (``resume --now``) and loaded again on the wall clock
    runs on from where it was, at the wall clock's pace, as ``--now`` does: a confirmation is not
    answered before it was asked, a tape's times do not go back, a deadline set on it comes after the
    time it was set for. The lead shrinks while the instance sits idle and is gone once the wall
    clock has caught up. Every time source of an instance (its contexts' tape stamps, its timers,
    confirmations, saves; the CLI, REST, workers) reads this one."""

    __slots__ = ("base", "floor", "_ahead")

    def __init__(self, base: Callable[[], float], floor: float = 0.0) -> None:
        self.base = base
        self.floor = floor
        self._ahead: float | None = None  # set by the first reading: a base that ticks is read once per time

    def __call__(self) -> float:
        now = self.base()
        if self._ahead is None:
            self._ahead = max(0.0, self.floor - now)
        now += self._ahead
        if now < self.floor:
            return self.floor
        self.floor = now
        return now


def _floor_of(record: Mapping[str, Any], contexts: Mapping[str, LayeredContext]) -> float:
    """The latest time a stored instance has seen: its record's ``updated`` (stamped by its clock at
    every save), or a later time on its tapes (a record some other writer stamped)."""
    times = [float(record.get(k) or 0.0) for k in ("created", "updated")]
    times += [float(ctx.tape[-1].time) for ctx in contexts.values() if len(ctx.tape)]
    return max(times)


@dataclass
class Instance:
    """One run of a process: the workflow, its contexts, and the engine's bookkeeping."""

    id: str
    process: Process
    workflow: Any
    contexts: dict[str, LayeredContext]
    status: str = "running"
    error: dict[str, Any] | None = None
    waiting_for: list[dict[str, Any]] = field(default_factory=list)
    conflicts: list[dict[str, Any]] = field(default_factory=list)
    compressions: list[dict[str, Any]] = field(default_factory=list)
    confirmations: list[dict[str, Any]] = field(default_factory=list)
    # branch context name -> {"parent", "branch_id", "gateway", "split", "snapshot_id", "inject", "status", "join"};
    # status "open" (a split's branch), "scope" (a sub-process instance's, see enter_subworkflow), "side" (a
    # boundary path beside an open activity, see boundary_path), "event" / "event_done" (an event sub-process
    # beside open branches, running / finished, see enter_subworkflow), "joined", "cancelled"
    branches: dict[str, dict[str, Any]] = field(default_factory=dict)
    version: int = 0
    created: float = field(default_factory=time.time)
    updated: float = field(default_factory=time.time)
    error_task: str | None = None
    activities: int = 0
    # task uuid -> {"task_id", "context", "confirmations", "state"}: LLM activities with tools
    # that wait, open, for a person's answer to their human_confirm (see _Runtime.run_with_tools)
    suspended: dict[str, dict[str, Any]] = field(default_factory=dict)
    # {"by", "reason", "time", "status"} once cancelled (``Engine.cancel``); status: what it was before
    cancelled: dict[str, Any] | None = None
    # the version before the saves since that only recorded refused requests (their notes on the tape,
    # nothing else changed), None when the last save changed the instance: a client's expected_version
    # from before those refusals is current still (``is_current``)
    refusals_since: int | None = None
    # the store this instance lives in, when ``start(store=...)`` chose one other than the engine's
    store: Any = field(default=None, repr=False, compare=False)
    # what the last ``run`` wants its caller to know (an answer it did not give again); not saved
    notices: list[str] = field(default_factory=list, repr=False, compare=False)
    # the waiting item the last ``complete_user_task`` completed ({"id", "task_id"}, and "instance" and
    # "input" for an instance of a multi-instance task): which one a BPMN id named; not saved
    completed_user_task: dict[str, Any] | None = field(default=None, repr=False, compare=False)
    # set while one request runs all or nothing (``Engine.all_or_nothing``): its saves wait for its end
    held: "_Held | None" = field(default=None, repr=False, compare=False)
    # set by whoever holds the instance's lease and must not run on without it (a worker): called with
    # the BPMN id of each task before it runs; raises ``engine.leases.LeaseLost`` when the lease is gone
    lease_check: Callable[[str], None] | None = field(default=None, repr=False, compare=False)
    # the instance's clock (``InstanceClock``): every time of the instance is read from it; not saved (its
    # floor is: ``updated``, the latest time the instance has seen, stamped by it at every save)
    clock: "InstanceClock" = field(default_factory=lambda: InstanceClock(time.time), repr=False, compare=False)
    # the engine's driver of the workflow (``_Runtime``), held here: the workflow holds it weakly
    # (``spiff.attach``) and it holds this instance weakly, so a run leaves no reference cycle
    # beyond SpiffWorkflow's own; not saved
    runtime: Any = field(default=None, init=False, repr=False, compare=False)

    @property
    def process_id(self) -> str:
        return self.process.id

    @property
    def instance_id(self) -> str:
        """``id``, by the name the ``--json`` document gives it."""
        return self.id

    @property
    def main(self) -> LayeredContext:
        return self.contexts[MAIN]

    @property
    def context(self) -> LayeredContext:
        """The main-line context (branches merge back into it at their join)."""
        return self.contexts[MAIN]

    def tape_length(self) -> int:
        return sum(len(c.tape) for c in self.contexts.values())

    def to_document(self) -> dict[str, Any]:
        """The ``run --json`` document of DESIGN.md "Interfaces" (plus ``contexts``)."""
        ctx = self.main
        return {
            "instance_id": self.id,
            "process_id": self.process_id,
            "status": self.status,
            "error": self.error if self.status == "error" else None,  # a stale one never outlives its retry
            "layers": ctx.as_dict(),
            "tokens": ctx.token_report(),
            "conflicts": list(self.conflicts),
            "compressions": self.compression_records(),
            "confirmations": list(self.confirmations),
            "waiting_for": list(self.waiting_for),
            "tape_length": self.tape_length(),
            "cancelled": self.cancelled,
            "model_fallbacks": self.model_fallbacks(),
            "messages_out": self.messages_out(),
            # the definition it runs: the one it started with, whatever its files say now
            "definition": self.process.definition(),
            "contexts": {
                name: {"parent": info["parent"], "branch_id": info["branch_id"], "gateway": info["gateway"],
                       "status": info["status"], "tokens": self.contexts[name].tokens()}
                for name, info in self.branches.items() if name in self.contexts
            },
        }

    def compression_records(self) -> list[dict[str, Any]]:
        """``compressions`` as they stand: one whose HISTORY was put back says so with ``"undone"``:
        made inside an activity that then failed (a model's ``context_compress`` before its model
        call failed), put back with the rest of the activity's changes, ``{"by": "abort", "task_id",
        "seq"}``; undone by ``decompress`` (``{"by": "decompress", "seq"}``, plus the ``context`` it
        was undone on when that is the one a branch merged into) or by a rollback of HISTORY to a
        snapshot from before it (``{"by": "rollback", "seq", "snapshot_id"}``). A later restore of
        a snapshot taken after it brings it back: no longer undone."""
        out = []
        merged: dict[tuple[str, str], dict[str, Any]] | None = None
        for record in self.compressions:
            name = str(record.get("context") or MAIN)
            ctx = self.contexts.get(name)
            seq = record.get("event_seq")
            undone = self._undone(ctx, seq, record.get("snapshot_id")) if ctx is not None and isinstance(seq, int) \
                else None
            if undone is None and (self.branches.get(name) or {}).get("status") == "joined":
                if merged is None:
                    merged = self._decompressed_merged()
                undone = merged.get((name, str(record.get("snapshot_id"))))
            out.append({**record, "undone": undone} if undone else dict(record))
        return out

    @staticmethod
    def _undone(ctx: LayeredContext, seq: int, snapshot_id: Any = None) -> dict[str, Any] | None:
        """How the compression whose event is ``seq`` of ``ctx`` (its snapshot ``snapshot_id``) was
        last undone there (``None``: it stands)."""
        undone = None
        for e in ctx.tape.since(seq + 1):
            if e.kind not in (EventKind.ABORT, EventKind.RESTORE):
                continue
            if e.kind == EventKind.RESTORE and int(Layer.HISTORY) not in (e.data.get("layers") or ()):
                continue
            if e.data.get("note") == "decompress" and e.data.get("snapshot_id") != snapshot_id:
                # undoing another compression re-applies what HISTORY gained since it, this one's
                # compaction included: it neither undoes this one nor brings it back
                continue
            snap = e.snapshot
            if snap is None:
                try:
                    snap = ctx.get_snapshot(str(e.data.get("snapshot_id")))
                except ContextKeyError:
                    continue
            if snap.context != ctx.name:
                continue
            if snap.seq >= seq:
                if e.kind == EventKind.RESTORE:
                    undone = None  # a state the compression had made, back
                continue
            if e.kind == EventKind.ABORT:
                undone = {"by": "abort", "task_id": e.data.get("task_id"), "seq": e.seq}
            elif e.data.get("note") == "decompress":
                undone = {"by": "decompress", "seq": e.seq}
            else:
                undone = {"by": "rollback", "seq": e.seq, "snapshot_id": snap.id}
        return undone

    def _decompressed_merged(self) -> dict[tuple[str, str], dict[str, Any]]:
        """Branches' compressions undone, once joined, on the context they merged into: by (branch
        context, compression snapshot id), the last such decompress."""
        out: dict[tuple[str, str], dict[str, Any]] = {}
        for other, ctx in self.contexts.items():
            for e in ctx.tape:
                source, sid = e.data.get("context"), e.data.get("snapshot_id")
                if e.data.get("note") == "decompress" and isinstance(source, str) and isinstance(sid, str):
                    out[(source, sid)] = {"by": "decompress", "seq": e.seq, "context": other}
        return out

    def messages_out(self) -> list[dict[str, Any]]:
        """The messages and signals the process threw that nothing in the instance caught, oldest
        first: ``{"name", "kind" ("message" | "signal"), "element_id", "payload", "context", "seq"}``
        (plus ``"correlations"`` when the message has them). They left the instance: deliver one to an
        instance that waits for it with ``Engine.send_event`` (``layerflow send``, REST
        ``POST /api/instances/{id}/events``)."""
        found: list[tuple[float, int, dict[str, Any]]] = []
        for name, ctx in self.contexts.items():
            for e in ctx.tape:
                if e.kind == EventKind.NOTE and e.data.get("note") == "message_out":
                    item = {"name": e.data.get("event"), "kind": e.data.get("event_kind"),
                            "element_id": e.data.get("element"), "payload": e.data.get("payload"),
                            "context": name, "seq": e.seq}
                    if e.data.get("correlations"):
                        item["correlations"] = e.data["correlations"]
                    found.append((e.time, e.seq, item))
        return [item for _, _, item in sorted(found, key=lambda f: (f[0], f[1]))]

    def model_fallbacks(self) -> list[dict[str, Any]]:
        """Where a configured model gave no usable answer and something else decided, from the
        tapes: a natural-language XOR condition decided by its expression or the default flow,
        a compression summary made extractively, a compression plan replaced by the rules, a join
        conflict the model could not resolve (``"key"`` added; ``"fallback"``: the resolver that
        took over, ``"human"`` for a person asked without the model's suggestion), a model
        activity whose failure its ``llm.onError`` threw as a BPMN error.
        Each ``{"element_id", "purpose", "fallback", "error", "context", "seq"}``: a run that
        completed with the model unreachable says so, not only on the tape."""
        found: list[dict[str, Any]] = []
        for name, ctx in self.contexts.items():
            failure: dict[str, str] = {}  # gateway -> its last failed attempt's error
            arbiter_failed: dict[tuple[str, str], Any] = {}  # (join, key) -> the model's failed step
            for e in ctx.tape:
                note = e.data.get("note") if e.kind == EventKind.NOTE else None
                if note is None:
                    continue
                item: dict[str, Any] | None = None
                if note == "condition_model_failed":
                    failure[str(e.data.get("gateway"))] = str(e.data.get("error"))
                elif note == "condition_decision" and e.data.get("model_configured") and e.data.get("decided_by") != "model":
                    gw = str(e.data.get("gateway"))
                    error = failure.pop(gw, None) or (
                        f"the model named {e.data['model'].get('branch')!r}, no branch of the gateway"
                        if e.data.get("model") else None)
                    item = {"element_id": gw, "purpose": "condition", "fallback": str(e.data.get("decided_by")),
                            "error": error}
                elif note == "resolution" and e.data.get("resolver") == "model" and (
                        e.data.get("outcome") == "failed" or e.data.get("outcome") == "skipped"
                        and str(e.data.get("detail")).startswith(MODEL_NOT_ASKED)):
                    arbiter_failed[(str(e.data.get("gateway_id")), str(e.data.get("key")))] = e
                elif note == "resolution" and e.data.get("resolver") == "model" and (
                        str(e.data.get("gateway_id")), str(e.data.get("key"))) in arbiter_failed:
                    # the retry got a usable answer (a decision, or a suggestion for a person): no fallback
                    arbiter_failed.pop((str(e.data.get("gateway_id")), str(e.data.get("key"))))
                elif note == "resolution" and (str(e.data.get("gateway_id")), str(e.data.get("key"))) in arbiter_failed:
                    # a join conflict the model could not resolve: what decided it instead (a person)
                    failed = arbiter_failed.pop((str(e.data.get("gateway_id")), str(e.data.get("key"))))
                    item = {"element_id": str(e.data.get("gateway_id")), "purpose": "conflict_resolution",
                            "fallback": str(e.data.get("resolver")), "error": failed.data.get("detail"),
                            "key": e.data.get("key")}
                elif note == "activity_model_failed":  # llm.onError.throw routed the failure
                    item = {"element_id": e.data.get("task_id"), "purpose": "activity",
                            "fallback": f"BPMN error {e.data.get('thrown')!r} thrown", "error": e.data.get("error")}
                elif note == "compression_model_failed":
                    item = {"element_id": e.data.get("task_id"), "purpose": f"compression_{e.data.get('purpose')}",
                            "fallback": e.data.get("fallback"), "error": e.data.get("error")}
                elif note == "compression_fallback":
                    item = {"element_id": e.data.get("task_id"), "purpose": "compression_plan",
                            "fallback": e.data.get("fallback"),
                            "error": e.data.get("error") or f"the plan was rejected ({e.data.get('reason')})"}
                if item is not None:
                    found.append({**item, "context": name, "seq": e.seq})
            for (gateway, key), failed in arbiter_failed.items():  # nothing decided after it (yet)
                found.append({"element_id": gateway, "purpose": "conflict_resolution", "fallback": None,
                              "error": failed.data.get("detail"), "key": key, "context": name, "seq": failed.seq})
        return found

    def __repr__(self) -> str:
        return f"<Instance {self.id} {self.process_id} {self.status}>"


def _check_plugin(plugin: Any, name: str, protocol: str, methods: tuple[str, ...]) -> None:
    """Refuse, as the Engine is made, a plug-in that lacks a method of its protocol (else the
    first activity or join that needs it would fail with an AttributeError far from the cause)."""
    missing = [m for m in methods if plugin is not None and not callable(getattr(plugin, m, None))]
    if missing:
        raise TypeError(f"Engine({name}=...): {type(plugin).__name__} has no {', '.join(f'{m}()' for m in missing)} "
                        f"method; a {name} implements {protocol} ({', '.join(f'{m}()' for m in methods)})")


class Engine:
    """Starts, runs, resumes and persists instances.

    ``store``: a ``Store`` (an engine record store, or a ``context_layers.stores`` store, which it
    wraps) or a URL (``memory://``, ``sqlite:///path``); default memory.
    ``handlers``: extra ``{name: fn}`` looked up before the ``@activity`` registry; a
    ``HandlerRegistry`` is used alone (``engine.handlers.REGISTRY.layered(...)`` chains one).
    ``retriever``: replaces the BM25 default (one per process folder).
    ``model``: the model name for activities with ``llm`` config (none: offline handlers), and
    for the compression after any activity (summaries; plans with ``compressionPlanner: model``).
    ``arbiter``: a ``gateways.ConflictArbiter`` for join conflicts (default: built from ``model``, else
    from the join's own ``llm.model``).
    ``progress(instance, task_id, context)``: called after every completed activity (one that threw a
    BPMN error that something catches too: the context's last tape event, its ``complete``, has
    ``"status": "error_thrown"``).
    ``save``: ``"activity"`` (default) saves after every activity, so a crash loses at most
    the running one; ``"stop"`` saves only when a run stops (waits, completes, fails).
    ``compress``: run the compression hook after each activity (``_after_activity``).
    ``chooser``: a ``gateways.BranchChooser`` for natural-language XOR conditions (default:
    built from ``model`` or the gateway's ``llm.model``; none: the expressions decide alone).
    ``clock``: seconds since the epoch (confirmation deadlines); tests pass a fake one.
    """

    def __init__(self, store: Store | str | None = None, handlers: Mapping[str, Handler] | HandlerRegistry | None = None,
                 *, retriever: Retriever | None = None, model: str | None = None, arbiter: Any = None,
                 progress: Callable[[Instance, str, LayeredContext], None] | None = None,
                 save: str = "activity", compress: bool = True, chooser: Any = None,
                 clock: Callable[[], float] = time.time) -> None:
        if save not in ("activity", "stop"):
            raise ValueError(f"save={save!r}: use 'activity' or 'stop'")
        self.save_after_activity = save == "activity"
        self.compress = compress
        if isinstance(store, str) or store is None:
            store = open_store(store)
        elif hasattr(store, "acquire_lease"):  # a context_layers store (tapes, leases): the engine's view of it
            store = InstanceRecords(store)  # type: ignore[arg-type]
        else:
            _check_plugin(store, "store", "engine.Store", ("create", "load", "save", "list"))
        _check_plugin(retriever, "retriever", "engine.Retriever", ("retrieve",))
        _check_plugin(arbiter, "arbiter", "gateways.ConflictArbiter", ("arbitrate",))
        _check_plugin(chooser, "chooser", "gateways.BranchChooser", ("choose",))
        self.store: Store = store
        if isinstance(handlers, HandlerRegistry):
            self.handlers = handlers
        else:
            self.handlers = REGISTRY.layered(handlers)
        self.retriever = retriever
        self.model = model
        self.arbiter = arbiter
        self.chooser = chooser
        self.clock = clock
        self.progress = progress
        self._retrievers: dict[str, Retriever] = {}
        # due_timers: id -> (version, floor, timers)
        self._timers_seen: dict[str, tuple[int, float, list[dict[str, Any]]]] = {}

    # ----- lifecycle ---------------------------------------------------------------

    def start(self, process: Process, data: Mapping[str, Any] | None = None, *, instance_id: str | None = None,
              store: "str | Store | None" = None) -> Instance:
        """Create an instance (SYSTEM from the config's ``system:``, data into PROCESS or where
        ``data_layers`` says) and save it, in ``store`` (a URL or a store) when given, else
        in the engine's. ``run`` advances it."""
        return self._create(process, *_prepared_start(process, data, clock=self.clock), instance_id=instance_id,
                            store=store)

    @contextmanager
    def starting(self, process: Process, data: Mapping[str, Any] | None = None, *, instance_id: str | None = None,
                 answers: Mapping[str, Any] | None = None) -> Iterator[Instance]:
        """A new instance (``start``) for a request that runs it on inside the block with ``answers``
        (``run(process, data, answers=...)``, REST's start, ``layerflow run``). Given answers, it is
        created in the store when the block ends (the run's saves wait for it): a start whose answer
        the task's form refuses (``FormAnswerInvalid``) leaves nothing behind, so a client that retries
        it makes no duplicate; any other refused answer (an option a confirmation does not offer, one
        the layer rules refuse, no JSON value) leaves the instance created, waiting for a valid answer,
        and the error names it. Without answers it is created at once, as ``start`` does."""
        if not any((answers or {}).get(section) for section in ANSWER_SECTIONS):
            yield self.start(process, data, instance_id=instance_id)
            return
        instance = self._create(process, *_prepared_start(process, data, clock=self.clock), instance_id=instance_id,
                                create=False)
        from .governance import FormAnswerInvalid, InvalidAnswer

        instance.held = _Held()
        try:
            yield instance
        except (InvalidAnswer, AnswerWriteDenied) as err:
            instance.held = None
            if isinstance(err, FormAnswerInvalid):
                _not_created(err, instance)
                raise
            self._save(instance)  # as the run left it: waiting for a valid answer
            if getattr(err, "instance_id", None) is None:
                err.instance_id = instance.id
            raise
        finally:
            instance.held = None
        self._save(instance)

    def _create(self, process: Process, ctx: LayeredContext, wf: Any, *, instance_id: str | None = None,
                store: "str | Store | None" = None, create: bool = True) -> Instance:
        """``start`` once its checks are done: ``ctx`` and ``wf`` are ``_prepared_start``'s (``worker.submit``
        prepares them itself, so the checks it makes first are the ones it starts from). ``create``
        False: not in the store yet (version 0); its first ``save`` creates it."""
        clock = InstanceClock(self.clock, float(ctx.tape[-1].time) if len(ctx.tape) else 0.0)
        ctx.clock = clock
        now = clock()
        instance = Instance(id=instance_id or uuid.uuid4().hex[:12], process=process, workflow=wf, contexts={MAIN: ctx},
                            created=now, updated=now, clock=clock)
        _Runtime(self, instance)
        if store is not None:
            instance.store = open_store(store) if isinstance(store, str) else store
        if create:
            self._insert(instance)
        return instance

    def _insert(self, instance: Instance) -> None:
        store_of = self._store_of(instance)
        instance.version = store_of.create(_record_for(store_of, instance))

    def run(self, instance: Instance | Process | str, data: Mapping[str, Any] | None = None, *,
            answers: Mapping[str, Any] | None = None,
            ask: Callable[[dict[str, Any]], Any] | None = None, by: str | None = None) -> Instance:
        """Advance until the instance completes, waits (user task, confirmation) or fails.

        ``answers`` (the ``--answers`` document) completes user tasks and answers
        confirmations as they come; ``ask(item)`` is asked for the rest (return None to
        leave the instance waiting); ``by``: the person who gives them, when named (the tape's actor;
        a join's resolution names them). Given a process (and its start ``data``), starts it
        first: ``run(process, data)`` is ``run(start(process, data))``; given an instance id,
        loads it. A ``confirmations`` key that can match no confirmation of the process, or a
        ``user_tasks`` key that names no element of it, raises ``InvalidAnswer`` first, with
        nothing started or run (``check_answer_keys``); an answer its task's form refuses as the run
        gives it leaves no instance behind either (``starting``).
        """
        if isinstance(instance, Process):
            check_answer_keys(instance, answers)
            with self.starting(instance, data, answers=answers) as started:  # a refused answer: none created
                return self._run(started, answers, ask, by)
        instance = self._instance(instance)
        check_answer_keys(instance, answers)
        if data is not None:
            raise TypeError(f"Engine.run: instance {instance.id!r} has started already; start data goes to "
                            "Engine.start(process, data) or Engine.run(process, data), and a running instance "
                            "takes answers= (or Engine.inject)")
        return self._run(instance, answers, ask, by)

    def _run(self, instance: Instance, answers: Mapping[str, Any] | None,
             ask: Callable[[dict[str, Any]], Any] | None, by: str | None) -> Instance:
        """``run`` once its answers are checked."""
        if instance.status in ("error", "cancelled"):
            return instance
        from .governance import InvalidAnswer

        rt = _runtime_of(instance)
        mark = rt.change_mark()
        instance.status = "running"
        instance.notices = []
        given: set[str] = set()  # each answer given in this run, with the state it was given in
        # user tasks waiting now with an answer given for them: one that stops waiting without it
        # (a boundary timer that came due, an interrupting event) is named in the notices, so
        # the person who answered learns it was not used
        answered_for = [w for w in instance.waiting_for if w["kind"] == "user_task"
                        and _lookup_answer(answers, w) is not _NO_ANSWER]
        # answers for user tasks done before this run: used only if one comes back (a loop)
        passed = passed_user_tasks(instance, (answers or {}).get("user_tasks") or {})
        used: set[str] = set()  # the waiting ids and BPMN ids of the user tasks answered
        rt.advance_answers = {str(k): v for k, v in ((answers or {}).get("confirmations") or {}).items()}
        rt.advance_taken, rt.advance_missed = set(), {}
        try:
            while True:
                rt.step()
                rt.settle()
                if not self._answer_from(instance, answers, ask, given, used, by=by):
                    break
        except (InvalidAnswer, AnswerWriteDenied):
            # a given answer that is not an offered option, or data the layer rules refuse, is
            # bad input, not a failure of the process: nothing of it was applied, the instance
            # is saved (a refusal is on the tape) still waiting for that answer
            self._save(instance)
            raise
        except (VersionConflict, StoreUnavailable):
            # a save between two steps lost to another writer, or the store did not answer: not a
            # failure of the process. Nothing after the last committed save stands; whoever runs it
            # next (a worker retrying its entry) starts from there. Turned into the instance's error,
            # a blip of the store would be saved as one by the save below, once the store is back.
            raise
        except Exception as err:  # noqa: BLE001 - every other failure becomes the instance's error
            rt.fail(err)
            rt.settle()
        still = {w["id"] for w in instance.waiting_for}
        for item in answered_for:
            if item["id"] not in used and item["id"] not in still and instance.status == "error":
                # the task was not cancelled: the instance failed elsewhere before the answer was given
                failed = (instance.error or {}).get("task_id")
                instance.notices.append(
                    f"user task {item['task_id']!r}: the given answer was not used: the instance failed first"
                    + (f" (at {failed!r})" if failed else "") + " before the answer was given; give it again "
                    "to the `resume` that retries once the cause is fixed")
            elif item["id"] not in used and item["id"] not in still:
                instance.notices.append(
                    f"user task {item['task_id']!r}: the given answer was not used: the task no longer waits (it was "
                    f"cancelled before the answer could be given, by a boundary event or timer that came due "
                    f"first); the instance is {instance.status} now")
        instance.notices.extend(passed_answer_notices(instance, {k: t for k, t in passed.items() if k not in used}))
        # the tasks that waited as the run began are named above (or were used): the rest were never reached
        named = {str(w[k]) for w in answered_for for k in ("id", "task_id")}
        instance.notices.extend(unreached_answer_notices(instance, answers, used | set(passed) | named))
        instance.notices.extend(unused_confirmation_notices(
            instance, _without(answers, rt.advance_taken | set(rt.advance_missed)), star_taken="*" in used))
        instance.notices.extend(unmet_instance_answers(rt.advance_answers, rt.advance_missed, rt.advance_taken))
        rt.advance_answers, rt.advance_taken, rt.advance_missed = {}, set(), {}
        if rt.change_mark() != mark:  # a resume that finds nothing to do writes nothing (no new version)
            self._save(instance)
        return instance

    def complete_user_task(self, instance: Instance | str, task_id: str, data: Mapping[str, Any] | None = None, *,
                           run: bool = True, actor: str = "person") -> Instance:
        """Complete a waiting user (or manual) task with ``data`` (written to WORKING), then run on.
        Who gave the data (``actor``) is on the tape (``user_input``), before the task's writes.
        An instance in ``error`` is resumed first (``resume``, which takes the answers too).

        ``task_id`` is the ``id`` of a ``waiting_for`` item, or a BPMN id. Several instances of a
        multi-instance task wait under one BPMN id: the BPMN id completes one of them, the first
        ``waiting_for`` lists (call again for the next). ``instance.completed_user_task`` names the
        one completed (its ``id``, ``task_id``, ``instance`` and ``input``), as the tape's
        ``user_input`` note names its ``instance``."""
        instance = self._instance(instance)
        if data is not None and not isinstance(data, Mapping):
            from .governance import InvalidAnswer

            raise InvalidAnswer(f"the answer to user task {task_id!r} must be an object of the task's fields "
                                f"({{key: value}}), got {type(data).__name__}; nothing was applied",
                                instance_id=instance.id, task_id=task_id)
        rt = _runtime_of(instance)
        instance.completed_user_task = None
        _refuse_if_failed(instance, f"complete {task_id!r}")
        now = datetime.fromtimestamp(instance.clock(), timezone.utc)
        due = [w for w in instance.waiting_for if w["kind"] == "timer" and w.get("due") and _utc(w["due"]) <= now]
        if due:
            # A timer that came due fires before the answer, as a run or resume after its due time
            # fires it (``resume --answer``): a boundary timer that cancels this task wins whichever
            # interface brings the answer, not whoever comes first, the person or ``timers --fire``.
            instance = self.run(instance)
            if not any(w["kind"] == "user_task" and task_id in (w["id"], w["task_id"]) for w in instance.waiting_for):
                from .governance import InstanceStateError

                timers = ", ".join(f"{w['task_id']!r} came due at {w['due']}" for w in due)
                err = InstanceStateError(
                    f"instance {instance.id} no longer waits for user task {task_id!r}: its boundary timer {timers} "
                    f"and ran first (a timer that is due fires before any answer); the answer was not used, the "
                    f"instance is {instance.status} now")
                err.task_id = task_id  # type: ignore[attr-defined]
                raise err
        item = _first_waiting_user_task(instance, task_id)
        task = rt.find_waiting_task(item["id"] if item is not None else task_id)
        tape = instance.tape_length()
        try:
            rt.give_user_data(task, data, actor=actor)
        except LayerflowError:  # AnswerWriteDenied, or an answer that does not fit the task's form
            if instance.tape_length() != tape:
                self._save(instance, refusal=True)  # the refusal is on the tape; the task still waits
            raise
        instance.completed_user_task = {"id": str(task.id), "task_id": spiff.bpmn_id_of(task), **rt._instance_of(task)}
        instance.status = "running"
        try:
            task.run()
        except Exception as err:  # noqa: BLE001
            rt.fail(err)
            rt.settle()
            self._save(instance)
            return instance
        self._save(instance)
        return self._run_on(instance) if run else instance

    def answer_confirmation(self, instance: Instance | str, confirmation_id: str, value: Any, *, run: bool = True,
                            timed_out: bool = False, actor: str = "person", reason: str | None = None,
                            resolver: str = "human", by: str | None = None) -> Instance:
        """Answer a pending human confirmation (a join conflict, id ``GATEWAY_ID/KEY``), then run on.

        An answer that is not one of the offered options raises ``InvalidAnswer`` (an
        ``engine.governance.OptionNotOffered``, also an ``ActivityError``) and changes nothing. ``actor`` and ``reason`` go on the tape with the decision; ``by``: the
        person who answered, when named (the join's resolution names them);
        ``resolver`` is who decided (``"model"``: a model settled it with its tools), as the
        conflict's resolution names it."""
        instance = self._instance(instance)
        rt = _runtime_of(instance)
        _refuse_if_failed(instance, f"answer {confirmation_id!r}")
        settled = settled_answer(instance, confirmation_id)
        if settled is None and not any(c["id"] == confirmation_id and not c.get("answered")
                                       for c in instance.confirmations):
            # the id of one firing's question, answered, while the join's other firings (the lines of a
            # multi-instance body) still ask theirs: a second answer all the same, as REST says
            settled = next((c for c in reversed(instance.confirmations)
                            if c["id"] == confirmation_id and c.get("answered") and not c.get("cancelled")), None)
        if settled is not None:  # a second answer: who gave the first, when, and what to do instead
            from .governance import AnsweredAlready, AnsweredByTimeout

            raise (AnsweredByTimeout if settled.get("answered_by_timeout") else AnsweredAlready)(instance, settled, value)
        rt.check_answer(confirmation_id, value)
        instance.status = "running"
        try:
            rt.answer(confirmation_id, value, timed_out=timed_out, actor=actor, reason=reason, resolver=resolver,
                      by=by)
        except Exception as err:  # noqa: BLE001 - e.g. a person escalated: the join fails
            rt.fail(err)
            rt.settle()
            self._save(instance)
            return instance
        self._save(instance)
        return self._run_on(instance) if run else instance

    def send_event(self, instance: Instance | str, name: str, payload: Any = None, *, kind: str = "message",
                   actor: str = "operator", run: bool = True) -> Instance:
        """Deliver a BPMN message named ``name`` (``kind="signal"``: broadcast a signal) to what
        waits for it (catch events, receive tasks, event-based gateways, boundary events, the
        start of an event sub-process), then run on.

        The payload goes into the context of each catching task, through the layer rules,
        and is recorded in its HISTORY as ``event:<catch event id>`` (``engine.events``).
        An event nobody waits for raises ``InstanceStateError`` naming what the instance
        waits for; a key the layer rules refuse raises ``ContextWriteDenied`` (the refusal
        is on the tape, and saved); a payload that is not an object raises ``BadRequest``.
        None of them changes the instance otherwise.
        """
        instance = self._instance(instance)
        _runtime_of(instance)  # an instance from Engine.start / Engine.load
        _refuse_if_failed(instance, "send the event")
        now = datetime.fromtimestamp(instance.clock(), timezone.utc)
        due = [w for w in instance.waiting_for if w["kind"] == "timer" and w.get("due") and _utc(w["due"]) <= now]
        if due:
            # A timer that came due fires before the event, as it does before an answer: the timer
            # branch of an event-based gateway (or an interrupting boundary timer) came first, and the
            # event must not take a second path beside it.
            instance = self.run(instance)
            if not any(c.kind == kind and c.name == name for c in events.waiting_catches(instance.workflow)):
                from .governance import InstanceStateError

                timers = ", ".join(f"{w['task_id']!r} came due at {w['due']}" for w in due)
                raise InstanceStateError(
                    f"instance {instance.id} no longer waits for {kind} {name!r}: its timer {timers} and ran "
                    f"first (a timer that is due fires before any event or answer); the {kind} was not delivered, "
                    f"the instance is {instance.status} now")
            _refuse_if_failed(instance, "send the event")  # the timer's path failed: nothing runs past it
        if instance.status == "completed":
            from .governance import InstanceStateError

            raise InstanceStateError(f"instance {instance.id} is completed and does not wait for {kind} {name!r} "
                                     "any more: a completed instance takes no events")
        if instance.status == "running" and not instance.waiting_for and not any(
                c.kind == kind and c.name == name for c in events.waiting_catches(instance.workflow)):
            from .governance import InstanceStateError

            # not at rest: submitted and on the queue, or run by a worker right now ("waits for: nothing"
            # read as if it had ended or lost its wait)
            raise InstanceStateError(
                f"instance {instance.id} does not wait for {kind} {name!r} yet: it is running (submitted and on "
                f"the queue for a worker, or run by one) and waits for nothing until it reaches a step that waits; "
                f"send the {kind} once `layerflow inspect {instance.id}` lists it in waiting_for")
        tape = instance.tape_length()
        try:
            events.deliver(instance.workflow, instance.contexts, name, payload, kind=kind, actor=actor,
                           instance_id=instance.id, waiting_for=instance.waiting_for)
        except ContextWriteDenied:
            if instance.tape_length() != tape:
                self._save(instance, refusal=True)  # the refusal is on the tape; nothing else changed
            raise
        instance.status = "running"
        self._save(instance)
        return self._run_on(instance) if run else instance

    def correlate(self, name: str, payload: Any = None, *, match: Mapping[str, Any] | None = None,
                  process: Process | Iterable[Process] | None = None, actor: str = "operator",
                  run: bool = True) -> Instance:
        """Deliver message ``name`` to the one waiting instance of the store it is meant for, not named
        by id (message correlation, ``engine.correlate``): the instance whose catch waits for ``name``,
        takes the payload's correlation properties, and whose context holds the values of ``match``
        (``{"claim_id": "CL-1042"}``) there; then ``send_event`` and run on. No instance takes it: an
        instance of ``process`` (one, or several to choose from) whose message start event is ``name``
        is started and gets it. Returns the instance it reached.

        Several instances take it: ``InstanceStateError`` naming their ids; none, and no process to
        start: ``ContextKeyError`` naming what waits for the message with which values. Nothing is
        changed by either."""
        from .correlate import find

        target = find(self, name, payload, match=match, process=process)
        if not isinstance(target, Process):
            return self.send_event(target, name, payload, actor=actor, run=run)
        return self.start_for_message(target, name, payload, actor=actor, run=run)

    def start_for_message(self, process: Process, name: str, payload: Any = None, *, actor: str = "operator",
                          run: bool = True, instance_id: str | None = None) -> Instance:
        """An instance of ``process`` started for message ``name`` (its message start event's), given the
        message. It is created once the message is in: a payload it refuses leaves nothing behind (a
        client's corrected retry starts no second instance), as a start's refused form does."""
        instance = self._create(process, *_prepared_start(process, None, clock=self.clock), create=False,
                                instance_id=instance_id)
        instance.main.record("started", actor=actor, data={"process_id": process.id, "via": "correlate"})
        instance.held = _Held()
        try:
            instance = self.send_event(self.run(instance), name, payload, actor=actor, run=run)
        except LayerflowError as err:
            err.instance_id = None  # type: ignore[attr-defined]
            err.args = (f"{err}; instance {instance.id} of process {instance.process_id!r}, started for message "
                        f"{name!r}, was not created (nothing was saved): send the message again corrected",)
            raise
        finally:
            instance.held = None
        self._save(instance)
        return instance

    def _run_on(self, instance: Instance) -> Instance:
        """Run on after an answer or an event, saying (``notices``) what of its files changed since the
        instance started, as ``resume`` does: an answer is no moment to believe an edit applies."""
        drift = config_file_notices(instance)
        instance = self.run(instance)
        instance.notices[:0] = drift
        return instance

    def resume(self, instance: Instance | str, *, answers: Mapping[str, Any] | None = None,
               ask: Callable[[dict[str, Any]], Any] | None = None, by: str | None = None) -> Instance:
        """Continue an instance: retry the failed activity of an ``error`` instance (its context
        is as before the activity; fix the cause first, e.g. with ``inject``), or run on.
        ``instance`` may be its id (``layerflow resume ID``): it is loaded from the store.

        With ``answers`` the resume is one request, all or nothing (``all_or_nothing``): when
        an answer is refused (``InvalidAnswer``, ``AnswerWriteDenied``), the steps the other
        answers drove before it are undone and not saved.

        A completed instance is given back as it is, nothing of it run, changed or saved (a resume
        is the retry of a request whose answer was lost, or comes after the instance completed
        meanwhile): ``instance.notices`` names each answer given, which it uses none of; a
        ``user_tasks`` key that names no user task of its process is a typo all the same
        (``InvalidAnswer``: ``check_completed_answer_keys``)."""
        instance = self._instance(instance)
        if instance.status == "completed":
            check_answers_shape(answers)
            refuse_late_answers(instance, answers)
            check_completed_answer_keys(instance, answers)
            # its waiting_for ids are gone: answers keyed by them are no typo, only too late
            given = [*((answers or {}).get("confirmations") or {}), *((answers or {}).get("user_tasks") or {})]
            instance.notices = [f"answer {key!r} was not used: instance {instance.id} is completed and waits for "
                                "nothing" for key in dict.fromkeys(given)]
            return instance
        check_answer_keys(instance, answers)  # before a failed activity is reset for its retry
        drift = config_file_notices(instance)
        if not answers:
            instance = self._resume(instance, answers=answers, ask=ask, by=by)
        else:
            with self.all_or_nothing(instance):
                instance = self._resume(instance, answers=answers, ask=ask, by=by)
        instance.notices[:0] = drift
        return instance

    def _resume(self, instance: Instance, *, answers: Mapping[str, Any] | None,
                ask: Callable[[dict[str, Any]], Any] | None, by: str | None = None) -> Instance:
        rt = _runtime_of(instance)
        refuse_if_cancelled(instance, "resume it")
        if instance.status == "error":
            try:
                rt.reset_failed()
            except (VersionConflict, StoreUnavailable):
                raise
            except Exception as err:  # noqa: BLE001 - the retry failed again (a user task's preScript
                # runs as the reset makes its task ready): the instance's error, as in ``run``
                rt.fail(err)
                rt.settle()
                self._save(instance)
                return instance
        return self.run(instance, answers=answers, ask=ask, by=by)

    def cancel(self, instance: Instance | str, *, reason: str, actor: str = "operator") -> Instance:
        """Stop an instance for good: nothing of it runs again (resume, answers, events and
        timers are refused), its open tasks are cancelled, an activity left open (waiting for
        a person's answer) is put back as it was before it began, and its pending
        confirmations are closed. ``reason`` and ``actor`` go on the main context's tape
        (``cancelled``) and into the instance's ``cancelled``; nothing is deleted. A
        completed or already cancelled instance raises ``InstanceStateError``."""
        from .governance import InstanceStateError

        instance = self._instance(instance)
        _runtime_of(instance)
        if instance.status in ("completed", "cancelled"):
            raise InstanceStateError(f"instance {instance.id} is {instance.status}; only an unfinished instance "
                                     "(waiting or in error) can be cancelled")
        if not reason or not reason.strip():
            raise InstanceStateError("give a reason for cancelling: it is recorded on the tape")
        before = instance.status
        for ctx in instance.contexts.values():
            if ctx.current_activity is not None:
                ctx.abort_activity(ctx.current_activity, reason=f"instance cancelled: {reason}", actor=actor)
        instance.workflow.cancel()
        closed = []
        for c in instance.confirmations:
            if not c.get("answered"):
                close_cancelled(instance, c)
                closed.append(c["id"])
        instance.suspended.clear()
        closed_contexts = close_open_branches(instance, actor)
        instance.main.record("cancelled", actor=actor, data={
            "reason": reason, "status": before, "waiting_for": [w.get("id") for w in instance.waiting_for],
            "confirmations": closed, "contexts": closed_contexts})
        instance.cancelled = {"by": actor, "reason": reason, "time": instance.clock(), "status": before}
        instance.status = "cancelled"
        instance.waiting_for = []
        self._save(instance)
        return instance

    def inject(self, instance: Instance | str, values: Mapping[str, Any], *, layer: Layer | str = Layer.WORKING,
               context: str | None = None, actor: str = "operator") -> Instance:
        """Write values into a context from outside any activity (to fix the cause of an error).

        The context defaults to the one of the failed task, else the main context. Writes
        obey the layer rules (a PROCESS key cannot be changed).
        """
        from .governance import GovernanceService, refuse_engine_key

        instance = self._instance(instance)
        rt = _runtime_of(instance)
        failed = instance.error or {}
        if context is None and instance.status == "error" and failed.get("kind") == "merge_conflict":
            # the failed "task" is the join: its context is one arriving branch, where a value is one
            # more for the join to merge (another conflicting value), never the decision it lacks
            from .governance import InstanceStateError

            gateway = failed.get("task_id")
            branches = sorted({str(b["branch_id"]) for b in instance.branches.values()
                               if b.get("status") == "open" and b.get("branch_id")})
            raise InstanceStateError(
                f"instance {instance.id} failed at join {gateway!r} on its conflicts: a value written without a "
                f"context would go into one arriving branch, one more value for the join to merge, not a "
                f"decision. Settle the join: {SETTLE_FAILED_JOIN} (`layerflow resume {instance.id}`). To "
                f"correct one branch's own value, name that branch (--context / `context`: "
                f"{', '.join(branches) or 'a branch id'})")
        # a context named: by its name or its branch's id, an unknown one refused naming those there are
        ctx = (GovernanceService.context_of(instance, context) if context is not None
               else instance.contexts[rt.failed_context_name() or MAIN])
        # a branch already merged (or cancelled) is read by nothing, and a context whose branches
        # are open is merged against its split snapshot: a write there would reach nothing
        GovernanceService._writable(instance, ctx, "inject", values)
        for key in values:  # data only, as REST inject: never a join's log, a record or a counter
            refuse_engine_key(ctx, str(Layer.parse(layer)), key)
        for key, value in sorted(values.items()):  # in key order: a JSON object has none
            ctx.write(layer, key, value, actor=actor)
        self._save(instance)
        return instance

    @staticmethod
    def new_key_hints(instance: Instance, keys: Iterable[str], *, context: str | None = None) -> list[str]:
        """For each of ``keys`` that no layer of the context ``inject`` would write holds yet, but that
        is close to a data key it does hold (``window_hour`` beside ``window_hours``): a line naming
        both, as a misspelt fix writes a new key and the retried step fails as before."""
        name = context or _runtime_of(instance).failed_context_name() or MAIN
        ctx = instance.contexts.get(name)
        if ctx is None:
            return []
        held = {key: layer for layer in reversed(Layer) for key in ctx.layer(layer) if not is_engine_key(key)}
        hints = []
        for key in keys:
            close = [] if key in held else difflib.get_close_matches(key, list(held), n=1, cutoff=0.8)
            if close:
                hints.append(f"{key}: no layer of context {name!r} held this key, so a new one was written; "
                             f"did you mean {close[0]!r} ({held[close[0]]})?")
        return hints

    def load(self, instance_id: str) -> Instance:
        """Load a saved instance (for ``resume``, ``inspect``, another process)."""
        return from_record(self, self.store.load(instance_id))

    def _instance(self, instance: "Instance | str") -> Instance:
        """The instance itself, or the one its id names in the store (``resume(ID)``, as the CLI)."""
        if isinstance(instance, str):
            return self.load(instance)
        if not isinstance(instance, Instance):
            raise TypeError(f"expected an Instance (from Engine.start or Engine.load) or its id, "
                            f"got {type(instance).__name__}")
        return instance

    def due_timers(self) -> list[dict[str, Any]]:
        """The timers of waiting instances in the store that are due by the clock of each
        instance, the one a resume fires them by: the engine's clock, never behind the latest
        time the instance has seen (``InstanceClock``; an engine ahead saved it); earliest first:
        their ``waiting_for`` items with ``instance_id`` and ``version``; a
        confirmation whose timeout has run out is one too (``"kind": "confirmation"``: resuming
        the instance applies its timeout rule, the default or an escalation). Read
        from the record heads (no instance rebuilt) of only the instances the store's timer
        index lists as due (``Store.due_instances``); a store of another kind is scanned.
        Nothing fires a timer by itself: resume these instances (``layerflow timers --fire``,
        run from cron, does)."""
        from .store import record_head

        clock = self.clock()
        due = []
        # id -> (version, the instance's latest time, its timers): a record head is read again only once it changed
        seen = self._timers_seen
        if isinstance(self.store, InstanceRecords):
            # the index compares seconds, the check below datetimes rounded to the microsecond:
            # a millisecond's slack lets the index miss nothing the check would take (the index
            # lists a timer due by the instance's own latest time whatever the bound, ``timer_due``)
            rows = self.store.list_due(clock + 1e-3)
        else:
            rows = self.store.list()
        waiting = [row for row in rows if row.get("status") == "waiting"]
        for row in waiting:
            known = seen.get(row["id"])
            if known is None or known[0] != row.get("version"):
                try:
                    head = record_head(self.store, row["id"])
                except ContextKeyError:
                    continue  # deleted meanwhile
                known = seen[row["id"]] = (head["version"], _floor_of(head, {}), [
                    {**item, "instance_id": row["id"], "version": head["version"]}
                    for item in head.get("engine", {}).get("waiting_for", [])
                    if item.get("kind") in ("timer", "confirmation") and item.get("due")])
            # what the instance's clock reads once loaded: the engine's, or its floor when that is later
            now = datetime.fromtimestamp(max(clock, known[1]), timezone.utc)
            due += [item for item in known[2] if _utc(item["due"]) <= now]
        for gone in seen.keys() - {row["id"] for row in waiting}:
            del seen[gone]
        return sorted(due, key=lambda item: _utc(item["due"]))

    def run_process(self, process: Process, data: Mapping[str, Any] | None = None, **kw: Any) -> Instance:
        with self.starting(process, data, answers=kw.get("answers")) as started:  # as run(process, data, ...)
            return self.run(started, **kw)

    # ----- internals -----------------------------------------------------------------

    def retriever_for(self, process: Process) -> Retriever:
        if self.retriever is not None:
            return self.retriever
        root = str(process.knowledge_dir)
        r = self._retrievers.get(root)
        if r is None:
            r = self._retrievers[root] = BM25Retriever(process.knowledge_dir)
        return r

    def arbiter_for(self, process: Process, llm: LLMConfig | None = None) -> Any:
        """The model that settles join conflicts (``gateways.ConflictArbiter``), if any.

        Given to the constructor, or built by ``engine.llm`` (``LiteLLMArbiter``) when a
        model is configured (``model``, else the join's own ``llm.model``, as a step's and a
        gateway's condition model are), with the join's ``llm`` settings (``maxRetries``,
        ``timeout``, ``apiBase``, ...); else None: conflicts go to policy, then to a person.
        """
        if self.arbiter is not None or (self.model is None and (llm is None or not llm.model)):
            return self.arbiter
        from .llm import LiteLLMArbiter, declared_values  # imports litellm only when a model call happens

        arbiter = LiteLLMArbiter.from_config(llm, model_override=self.model)
        arbiter.value_schemas = declared_values(process.configs)
        return arbiter

    def compression_model(self, cfg: ActivityExtensionConfig | None) -> str | None:
        """The model that summarizes (and, with ``compressionPlanner: model``, plans) the
        compression after an activity: ``model``, else the activity's ``llm.model``; None
        offline."""
        if self.model is not None:
            return self.model
        return cfg.llm.model if cfg is not None and cfg.llm is not None else None

    def chooser_for(self, process: Process, gateway_id: str) -> Any:
        """The model that reads a gateway's natural-language conditions (``gateways.BranchChooser``),
        or None: given to the constructor, else built from ``model`` / the gateway's ``llm.model``."""
        if self.chooser is not None:
            return self.chooser
        cfg = process.config(gateway_id)
        if self.model is None and (cfg is None or cfg.llm is None or not cfg.llm.model):
            return None  # offline: nothing imports engine.llm, let alone litellm
        from .conditions import make_chooser

        return make_chooser(self.model, cfg)

    def save(self, instance: Instance, *, refusal: bool = False) -> None:
        """Save the instance with the version it was loaded with (``VersionConflict`` when stale).
        Inside ``all_or_nothing`` the save waits for the end of the request. ``refusal``: the save
        only records a refused request (its note on the tape): a client's version from before it
        stays current (``Instance.refusals_since``)."""
        if instance.held is not None:
            instance.held.pending = True
            return
        if not refusal:
            instance.refusals_since = None
        elif instance.refusals_since is None:
            instance.refusals_since = instance.version
        instance.updated = instance.clock()
        if instance.version == 0:  # not in the store yet (``starting``): its first save creates it
            self._insert(instance)
            return
        store_of = self._store_of(instance)
        try:
            instance.version = store_of.save(_record_for(store_of, instance), instance.version)
        except VersionConflict as err:
            # the store's words name its own method; an Engine user holds this engine, not the store
            raise _engine_version_conflict(err, instance.id) from None

    def _store_of(self, instance: Instance) -> Store:
        return instance.store if instance.store is not None else self.store

    _save = save

    @contextmanager
    def all_or_nothing(self, instance: Instance) -> Iterator[Instance]:
        """One request's changes to ``instance``, kept whole or not at all: the engine's saves
        inside wait for its end (one save, when something changed). When it raises, the instance
        (this object) is put back as it was when the request came and nothing is written, so the
        store keeps its version and every tape its length. One exception, the audit a refused
        answer always leaves: a user task's answer that is refused (a ``FormAnswerInvalid``, an
        ``AnswerWriteDenied``) for a task that waited when the request came is refused there again,
        and that refusal note saved. ``resume`` with answers runs in one; ``layerflow resume``
        holds one around its ``--set``, its answers to open confirmations and the resume. Nested,
        the outer one decides."""
        if instance.held is not None:
            yield instance
            return
        from .governance import InvalidAnswer

        before = _copy_record(instance)
        instance.held = held = _Held()
        try:
            yield instance
        except BaseException as err:
            instance.held = None
            self._put_back(instance, before)
            refused = getattr(err, "refused_answer", None)
            if isinstance(err, (InvalidAnswer, AnswerWriteDenied)) and refused is not None:
                self._note_refusal(instance, before, *refused)
            raise
        instance.held = None
        if held.pending:
            self._save(instance)

    def _put_back(self, instance: Instance, record: Mapping[str, Any]) -> None:
        """``instance`` (the caller's object) as ``record`` holds it, with a runtime of its own."""
        fresh = from_record(self, json.loads(json.dumps(record)))
        for f in fields(Instance):
            if f.name not in ("store", "notices", "held", "lease_check"):
                setattr(instance, f.name, getattr(fresh, f.name))
        _Runtime(self, instance)

    def _note_refusal(self, instance: Instance, record: Mapping[str, Any], waiting_id: str, value: Any) -> None:
        """The refusal note of a user task's answer, on the instance as the request found it, when the
        task waited there (as a refused answer to a waiting task always leaves it); else nothing."""
        if not any(w["kind"] == "user_task" and w["id"] == waiting_id for w in instance.waiting_for):
            return
        rt = _runtime_of(instance)
        tape = instance.tape_length()
        try:
            rt.give_user_data(rt.find_waiting_task(waiting_id), value, actor="person")
        except LayerflowError:
            if instance.tape_length() != tape:
                try:
                    self._save(instance, refusal=True)
                except (VersionConflict, StoreUnavailable):
                    self._put_back(instance, record)  # the refusal stands; its note could not be kept
            return
        self._put_back(instance, record)  # taken here (the task's context differs): nothing to note

    def _answer_from(self, instance: Instance, answers: Mapping[str, Any] | None,
                     ask: Callable[[dict[str, Any]], Any] | None, given: set[str] | None = None,
                     used: set[str] | None = None, *, by: str | None = None) -> bool:
        """Answer what the instance waits for from ``answers`` / ``ask``; True when something was answered.

        An answer from ``answers`` is given each time its step comes back, but not twice in one run
        to the same step with every context as it was the time before: the process would only go
        round again, for ever (a loop back to a person's step on that answer). Such a step is left
        waiting, with a note in ``instance.notices``."""
        if instance.status != "waiting":
            return False
        from .governance import InvalidAnswer

        rt = _runtime_of(instance)
        for item in list(instance.waiting_for):
            value = _lookup_answer(answers, item)
            if value is not _NO_ANSWER and given is not None and item["kind"] in ("user_task", "confirmation"):
                step, mark = _answer_mark(instance, item, value)
                if mark in given:
                    instance.notices.append(
                        f"{item['kind'].replace('_', ' ')} {item.get('task_id')!r}: the given answer was given here "
                        "before in this run and nothing changed since (the process would go round the same way "
                        "for ever); left waiting for another answer")
                    continue
                # A round that changes something (a counter, a draft's version) is no proof the loop ends:
                # a rejection given in advance sent a rework loop round for ever. Past ANSWER_ROUNDS the
                # step waits for a person, who sees where the rounds got to.
                rounds = sum(1 for m in given if m.startswith(step + "\n"))
                if rounds >= ANSWER_ROUNDS:
                    instance.notices.append(
                        f"{item['kind'].replace('_', ' ')} {item.get('task_id')!r}: the given answer was given here "
                        f"{rounds} times in this run (a loop that comes back to the step on that answer, however "
                        "often it is given, would go round for ever); left waiting for another answer")
                    continue
                given.add(mark)
            if value is _NO_ANSWER and item["kind"] == "confirmation" and rt.overdue(item["id"]):
                # An explicit answer (answers file, --answer) beats the deadline; the deadline beats the prompt.
                if rt.time_out(item["id"]):
                    self._save(instance)
                    return True
                self._save(instance)  # escalated: still waiting, now marked
            if item["kind"] == "timer":
                continue  # nobody answers a clock: a run or a resume after the due time goes on
            if value is _NO_ANSWER and ask is not None:
                asked = ask(rt.describe(item))
                if isinstance(asked, TimedOut) and item["kind"] == "confirmation":
                    answered = rt.time_out(item["id"])
                    self._save(instance)
                    if answered:
                        return True
                    continue
                value = _NO_ANSWER if asked is None else asked
            if value is _NO_ANSWER:
                continue
            taken = value if isinstance(value, Unattended) and item["kind"] == "confirmation" else None
            if taken is not None:
                value = taken.value
            if item["kind"] == "confirmation":
                try:
                    _check_given_answer(rt, item["id"], value)
                except InvalidAnswer:
                    if not any(c["id"] == item["id"] and c.get("answered") and _same_answer(c, value)
                               for c in instance.confirmations):
                        raise
                    # the answer was taken by an earlier round of this step (a loop back through the
                    # join); this round offers other options, so it waits for its own answer
                    instance.notices.append(
                        f"confirmation {item['id']!r}: the given answer {short_json(value)} answered an earlier round of "
                        "it and is not one of the options offered now; left waiting for another answer")
                    continue
            if item["kind"] == "user_task":
                task = rt.find_waiting_task(item["id"])
                try:
                    rt.give_user_data(task, value, actor=by or "person")  # refused: run saves the refusal, still waiting
                except LayerflowError as err:
                    err.refused_answer = (item["id"], value)  # type: ignore[attr-defined]  # see all_or_nothing
                    raise
                if used is not None:
                    used.update((item["id"], item["task_id"]))
            instance.status = "running"
            if item["kind"] == "user_task":
                task.run()
            elif item["kind"] == "confirmation":
                rt.check_answer(item["id"], value)
                if used is not None and _answer_key(answers, item) == "*":
                    used.add("*")  # a '*' nothing takes is named after the run (unused_confirmation_notices)
                if taken is not None:
                    rt.answer(item["id"], value, actor=taken.actor, unattended=True)
                else:
                    rt.answer(item["id"], value, actor=by or "person", by=by)
            else:
                continue
            self._save(instance)
            return True
        return False


@dataclass
class _Held:
    """The saves an ``Engine.all_or_nothing`` request put off: whether one was asked for."""

    pending: bool = False


def _plain_record(instance: Instance) -> dict[str, Any]:
    """The instance's record as plain JSON values (its ``JSONText`` parts decoded): a copy nothing
    that runs on the instance can change (``to_record`` shares lists with the instance)."""
    from context_layers.stores.base import encode_record

    record: dict[str, Any] = json.loads(encode_record(to_record(instance), f"instance {instance.id!r}"))
    return record


def _copy_record(instance: Instance) -> dict[str, Any]:
    """``_plain_record`` with the instance's version."""
    record = _plain_record(instance)
    record["version"] = instance.version
    return record


def _record_for(store: Store, instance: Instance) -> dict[str, Any]:
    """The record ``store`` is given: the engine's own stores (``InstanceRecords``) write its
    ``JSONText`` parts as they are; a ``Store`` of the application's own gets the JSON-able dict
    its protocol promises (it may keep the object, or ``json.dumps`` it, and give it back)."""
    return to_record(instance) if isinstance(store, InstanceRecords) else _plain_record(instance)


class UncaughtBpmnError(ActivityError):
    """An activity threw a BPMN error (``engine.BpmnError``) that no event catches: the instance
    fails, as for any exception of an activity (``resume`` runs the activity again)."""

    def __init__(self, err: BpmnError, task_id: str) -> None:
        self.error_code = err.code
        self.error_message = err.message
        what = f" ({err.message})" if err.message else ""
        super().__init__(f"activity {task_id!r} threw BPMN error {err.code!r}{what} and nothing catches it: no error "
                         f"boundary event on {task_id!r} or on a sub-process around it, and no error event "
                         f"sub-process, catches code {err.code!r}. Add one whose errorRef names a bpmn:error with "
                         f"errorCode=\"{err.code}\" (or an error event with no errorRef, which catches every error)",
                         task_id=task_id)


class AnswerWriteDenied(ContextWriteDenied):
    """A person's answer to a user task writes what the layer rules refuse (a SYSTEM key, a
    PROCESS key already set): refused before anything of it was applied, the refusal on the
    tape, the task still waiting. ``task_id``: the user task's BPMN id."""

    def __init__(self, denied: ContextWriteDenied, *, task_id: str) -> None:
        super().__init__(denied.key, denied.requested, denied.effective, denied.reason)
        self.task_id = task_id
        self.instance_id: str | None = None  # set where the instance was just started (the caller has no id yet)

    def __str__(self) -> str:
        return f"the answer to user task {self.task_id!r} writes what the layer rules refuse: {super().__str__()}"

    def to_dict(self) -> dict[str, Any]:
        out = {**super().to_dict(), "task_id": self.task_id}
        if self.instance_id is not None:
            out["instance_id"] = self.instance_id
        return out


def _not_created(err: LayerflowError, instance: Instance) -> None:
    """``err``, refusing an answer to the run of a start that was never created (``Engine.starting``), told
    so: it names no instance (``instance_id`` None) and says that nothing waits, nothing was saved."""
    from .governance import FormAnswerInvalid

    err.instance_id = None  # type: ignore[attr-defined]
    text = str(err).replace(FormAnswerInvalid.WAITS, "")
    err.args = (f"{text}; instance {instance.id} of process {instance.process_id!r} was not created (nothing was "
                "saved): start it again with a corrected answer",)


def _utc(iso: str) -> datetime:
    """A stored due time; one without a zone is UTC."""
    when = datetime.fromisoformat(iso)
    return when if when.tzinfo is not None else when.replace(tzinfo=timezone.utc)


def refuse_if_cancelled(instance: Instance, what: str) -> None:
    """``InstanceStateError`` naming who cancelled ``instance`` and why, when it is cancelled."""
    if instance.status == "cancelled":
        from .governance import InstanceStateError

        info = instance.cancelled or {}
        raise InstanceStateError(f"instance {instance.id} was cancelled by {info.get('by')!r} ({info.get('reason')}); "
                                 f"nothing of it runs again, so it cannot {what}: start a new instance")


def _refuse_if_failed(instance: Instance, what: str) -> None:
    """A failed instance runs nothing until it is resumed: work done beside the failure would
    run on past it, and its error would be replaced by a join that can never fire. A
    cancelled one never runs again."""
    refuse_if_cancelled(instance, what)
    if instance.status == "error":
        from .governance import InstanceStateError

        raise InstanceStateError(f"instance {instance.id} is in error ({(instance.error or {}).get('message')}); "
                                 f"fix the cause and resume it first (`layerflow resume {instance.id}`, which takes "
                                 f"--answer/--answers too), then {what}")


def _check_given_answer(rt: "_Runtime", confirmation_id: str, value: Any) -> None:
    """Raise ``InvalidAnswer`` (bad input) before anything changes when ``value`` is not offered."""
    try:
        rt.check_answer(confirmation_id, value)
    except ActivityError as err:
        from .governance import InvalidAnswer

        raise InvalidAnswer(f"{err}; instance {rt.instance.id} still waits for it: answer with one of those "
                            f"values (`layerflow resume {rt.instance.id} --answer {confirmation_id}=VALUE`)",
                            instance_id=rt.instance.id) from err


_NO_ANSWER = object()

#: How often one answer (``--answers``, ``--answer``, ``Engine.run(answers=...)``) is given to one step
#: in one run: a loop that comes back to a person's step on that answer goes round at most this often.
ANSWER_ROUNDS = 100
_SUSPENDED = object()  # a handler's result: the activity waits, open, for a person


_LOOP_COUNTERS = ("iteration", "key_or_index", "current")  # SpiffWorkflow's loop and multi-instance bookkeeping


def _answer_mark(instance: Instance, item: Mapping[str, Any], value: Any) -> tuple[str, str]:
    """An answer to a waiting step, and the same with the state it is given in: every context's data
    keys (records name their task and differ each round) and what the instance waits for. Both name
    the counters of the loops and multi-instance activities the step is in (the next instance of a
    sequential multi-instance activity is no round again)."""
    state = {name: condition_context(ctx, limit=10**9) for name, ctx in instance.contexts.items()}
    waits = sorted((w["kind"], str(w.get("task_id"))) for w in instance.waiting_for)
    counters = []
    task = _runtime_of(instance).find_waiting_task(item["id"]) if item["kind"] == "user_task" else None
    while task is not None:
        found = {k: task.internal_data[k] for k in _LOOP_COUNTERS if k in task.internal_data}
        if found:
            counters.append([task.task_spec.name, found])
        parent, wf = task.parent, task.workflow
        if parent is None and getattr(wf, "parent_workflow", None) is not None:  # a sub-process: go on in its caller
            parent = wf.parent_workflow.get_task_from_id(wf.parent_task_id)
        task = parent
    # A standard loop's iteration tells its rounds apart, as the state does, but it is no other step:
    # counted with it, every round of a loop that never ends was the first one of its step.
    step = json.dumps([item["kind"], item.get("task_id"), item.get("key"), value,
                       [[name, {k: v for k, v in found.items() if k != "iteration"}] for name, found in counters]],
                      sort_keys=True, default=str)
    return step, step + "\n" + json.dumps([counters, waits, state], sort_keys=True, default=str)


def _first_waiting_user_task(instance: Instance, task_id: str) -> dict[str, Any] | None:
    """The ``waiting_for`` item of the user task ``task_id`` names: the item with that ``id``, else the
    first item (in the list's order) with that BPMN id -- one of several instances of a multi-instance
    task; None when none waits."""
    tasks = [w for w in instance.waiting_for if w.get("kind") == "user_task"]
    return next((w for w in tasks if w.get("id") == task_id), None) or \
        next((w for w in tasks if w.get("task_id") == task_id), None)


_MODEL_CONFIRMATION = re.compile(r"model:[0-9]+")


def _on_a_loop(spec: Any) -> bool:
    """Whether a flow leads from ``spec`` back to it (a rework loop may bring it round again)."""
    before = {id(spec), *(id(s) for s in spec.inputs)}  # an input reached again closes the loop too
    seen: set[int] = set()
    todo = list(spec.outputs)
    while todo:
        s = todo.pop()
        if id(s) in before:
            return True
        if id(s) not in seen:
            seen.add(id(s))
            todo.extend(s.outputs)
    return False


def settled_joins(instance: Instance) -> set[str]:
    """The BPMN ids of the joins of ``instance``'s own process that can ask a person nothing more: on
    no loop, each of their tasks done, or (a join waiting for its answers) started.
    Those of sub-processes and called processes are left out: one may run again, or twice at once."""
    wf = instance.workflow
    states: dict[str, list[int]] = {}
    for task in wf.get_tasks():
        spec = task.task_spec
        if task.workflow is wf and spiff.is_join(spec):
            states.setdefault(spec.name, []).append(task.state)
    done = (TaskState.COMPLETED, TaskState.STARTED)
    return {spiff.spec_bpmn_id(wf.spec.task_specs[name]) for name, seen in states.items()
            if any(s in done for s in seen) and all(s in (*done, TaskState.CANCELLED, TaskState.ERROR) for s in seen)
            and not _on_a_loop(wf.spec.task_specs[name])}


def _answer_scope(target: Instance | Process) -> tuple[Process, set[str], set[str], set[str]]:
    """What answers' keys may name of ``target``: its process, the ids of its confirmations (and the
    ids their joins asked under) and of what it waits for, the ids of what it waits for, and the
    joins that can ask nothing more (``settled_joins``). A process about to start has none."""
    if isinstance(target, Process):
        return target, set(), set(), set()
    waiting = {str(w["id"]) for w in target.waiting_for if w.get("id")}
    return target.process, known_confirmation_ids(target), waiting, settled_joins(target)


def unmatchable_confirmation_keys(target: Instance | Process, keys: Iterable[str]) -> list[str]:
    """The keys of ``keys`` that can match no confirmation of ``target`` (see ``check_confirmation_keys``)."""
    keys = list(keys)
    if not keys:
        return []
    process, known, _, settled = _answer_scope(target)
    joins = set(process.join_ids()) - settled
    return [key for key in keys if not (key == "*" or key in known or _MODEL_CONFIRMATION.fullmatch(key)
                                        or "/" in key and key.partition("/")[0] in joins
                                        and not _misspelt_open_question(target, key))]


def _misspelt_open_question(target: Instance | Process, key: str) -> bool:
    """Whether ``GATEWAY/KEY`` names a join of ``target`` (an instance) that waits for its answers now,
    with a ``KEY`` it never asked that is close to one it asks now: a typo. A join on a loop may ask
    other keys in a later round, but while it waits this round asks nothing more, and a near miss of
    an open question is a misspelling of it, as it is for a join on no loop (``check_confirmation_keys``
    then names the key it meant)."""
    if isinstance(target, Process):
        return False
    gateway, _, context_key = key.partition("/")
    mine = [c for c in target.confirmations if c.get("gateway_id") == gateway and c.get("key") is not None]
    opened = sorted({str(c["key"]) for c in mine if not c.get("answered")})
    return bool(opened) and context_key not in {str(c["key"]) for c in mine} \
        and bool(difflib.get_close_matches(context_key, opened, n=1, cutoff=0.6))


def check_confirmation_keys(target: Instance | Process, keys: Iterable[str], *, source: str = "answers") -> None:
    """Raise ``InvalidAnswer`` naming every key of answers' ``confirmations`` that can match no
    confirmation of ``target`` (a typo, or answers meant for another process): bad input, refused
    before anything runs, as an answer for a task the process does not have is. A key may match
    when it is ``*``, a confirmation's id (of an instance: its confirmations', what it waits for),
    a model's confirmation (``model:N``, which an activity may ask for later), or ``GATEWAY_ID/KEY``
    of a join of the process, its sub-processes or the processes it calls that may still ask (a
    conflict not met yet, maybe never, is no typo: its join exists). A join an instance passed, or
    waits at now, on no loop, asked all it will: only its confirmations' ids name it then."""
    bad = unmatchable_confirmation_keys(target, keys)
    if not bad:
        return
    from .governance import InvalidAnswer

    process, _, _, settled = _answer_scope(target)
    joins = process.join_ids()
    to_come = [j for j in joins if j not in settled]
    hints = [f"{key!r} is a join: add the conflicting context key, {key + '/KEY'!r}" for key in bad if key in to_come]
    matching = []
    if not isinstance(target, Process):
        opened = sorted(str(c["id"]) for c in target.confirmations if not c.get("answered"))
        matching.append(f"the open confirmations {', '.join(map(repr, opened))}" if opened else "none is open")
    matching.append(f"GATEWAY_ID/CONTEXT_KEY of a join that may still ask ({', '.join(map(repr, to_come))})"
                    if to_come else "no join may still ask")
    asked = [j for j in joins if j in settled]
    if asked:
        matching.append(f"not another key of a join that asked all it will ({', '.join(map(repr, asked))})")
    matching.append("model:N for a model's confirmation; * for any")
    hints += nearest_answer_keys(target, [key for key in bad if key not in to_come])
    what = f"process {process.id!r}" if isinstance(target, Process) else f"instance {target.id} of process {process.id!r}"
    raise InvalidAnswer(
        f"{source}: {', '.join(map(repr, bad))} can match no confirmation of {what} "
        f"(its joins: {', '.join(map(repr, joins)) or 'none'}); the keys that match: {'; '.join(matching)}"
        f"{''.join('; ' + h for h in hints)}{' ' if hints and hints[-1].endswith('?') else '. '}Nothing was run or "
        "saved")


def known_confirmation_ids(instance: Instance) -> set[str]:
    """What an answer's key may name of ``instance`` as it is: its confirmations' ids (and the ids
    their joins asked under) and the ids of what it waits for."""
    return ({str(c["id"]) for c in instance.confirmations} | {str(c["request_id"]) for c in instance.confirmations
                                                              if c.get("request_id")}
            | {str(w["id"]) for w in instance.waiting_for if w.get("id")})


def nearest_answer_keys(target: Instance | Process, keys: Iterable[str]) -> list[str]:
    """``did you mean`` for each key of ``keys`` (answers' keys that name nothing of ``target``: a typo)
    that is close to what an answer may name: a user task's BPMN id and, of an instance, what it
    waits for and its open confirmations, by id or as ``GATEWAY_ID/CONTEXT_KEY``."""
    process = target if isinstance(target, Process) else target.process
    names = set(process.user_task_ids())
    if not isinstance(target, Process):
        names |= known_confirmation_ids(target)
        names |= {f"{c['task_id']}/{c['key']}" for c in target.confirmations
                  if not c.get("answered") and c.get("task_id") and c.get("key") is not None}
    hints = []
    for key in keys:
        close = difflib.get_close_matches(str(key), sorted(names - {key}), n=1, cutoff=0.6)
        if close:
            hints.append(f"{key!r}: did you mean {close[0]!r}?")
    return hints


def passed_user_tasks(instance: Instance, keys: Iterable[str]) -> dict[str, str]:
    """The keys of ``keys`` (answers' ``user_tasks``: BPMN ids, ``waiting_for`` ids) that name a user
    task ``instance`` has done and does not wait for now, each with the task's BPMN id. An answer is
    used only by the run or resume it is given to, so one of these is used only when its task comes
    back in that run (a loop); else ``passed_answer_notices`` names it."""
    keys = [str(k) for k in keys]
    if not keys:
        return {}
    waiting = {str(w[k]) for w in instance.waiting_for if w["kind"] == "user_task" for k in ("id", "task_id")
               if w.get(k)}
    done: dict[str, str] = {}
    for task in instance.workflow.get_tasks():  # filtered by state, it skips finished sub-processes
        if task.state == TaskState.COMPLETED and getattr(task.task_spec, "manual", False):
            bpmn_id = spiff.bpmn_id_of(task)
            done[str(task.id)] = done[bpmn_id] = bpmn_id
    return {key: done[key] for key in keys if key in done and key not in waiting}


def _waiting_steps(instance: Instance) -> str:
    """The steps ``instance`` waits at, as a notice names them: the BPMN ids of its tasks, the ids of its
    confirmations."""
    return ", ".join(sorted({str(w["task_id"] if w["kind"] != "confirmation" else w["id"])
                             for w in instance.waiting_for})) or "nothing"


def passed_answer_notices(instance: Instance, passed: Mapping[str, str]) -> list[str]:
    """A notice for each answer of ``passed`` (``passed_user_tasks``) that the run did not use, as
    ``unused_confirmation_notices`` names a confirmation answer's: the CLI's stderr, REST's ``notices``.
    One whose task came back and waits again (a loop, left waiting by ``_answer_from``) has its notice."""
    steps = _waiting_steps(instance)
    again = {str(w[k]) for w in instance.waiting_for if w["kind"] == "user_task" for k in ("id", "task_id")}
    return [f"answer {key!r} was not used: user task {task!r} of instance {instance.id} is done (it waits for: "
            f"{steps}); an answer is used only by the run or resume in which its step waits"
            for key, task in passed.items() if key not in again]


def unreached_answer_notices(instance: Instance, answers: Mapping[str, Any] | None, settled: set[str]) -> list[str]:
    """A notice for each user task's answer of ``answers`` that the run did not use because it never
    reached the task (the adjuster's answer given while the instance waits at the first notice): an
    answer is used only by the run or resume it is given to, not kept for a later one, so the person
    who gave it must learn to give it again. ``settled``: the keys used, or named already (done
    before this run: ``passed_answer_notices``). A key of no user task is no answer here (the same
    ``--answer KEY={...}`` may be a confirmation's)."""
    tasks = (answers or {}).get("user_tasks") or {}
    if not tasks:
        return []
    steps = _waiting_steps(instance)
    waiting = {str(w[k]) for w in instance.waiting_for if w["kind"] == "user_task" for k in ("id", "task_id")}
    ids = set(instance.process.user_task_ids())
    where = f"it waits at: {steps}" if instance.status == "waiting" else f"the instance is {instance.status}"
    return [f"answer {key!r} was not used: this run did not reach user task {key!r} ({where}); an answer is used "
            f"only by the run or resume it is given to, not kept for a later one: give it again to the `resume` "
            f"that reaches the task (REST: the resume request, or POST .../user-tasks/{key} once it waits)"
            for key in map(str, tasks) if key in ids and key not in settled and key not in waiting]


def _without(answers: Mapping[str, Any] | None, keys: set[str]) -> Mapping[str, Any] | None:
    """``answers`` without the confirmation answers ``keys`` names."""
    if not keys or not answers:
        return answers
    return {**answers, "confirmations": {k: v for k, v in (answers.get("confirmations") or {}).items()
                                         if k not in keys}}


def unmet_instance_answers(answers: Mapping[str, Any], missed: Mapping[str, list[Any]], taken: set[str]) -> list[str]:
    """A notice for each answer ``ACTIVITY/KEY`` to a multi-instance activity's instances that no
    meeting of theirs on the key took: none of them brought the value (``_answer_awaited``)."""
    notices = []
    for key, values in missed.items():
        if key in taken:
            continue
        activity, _, context_key = key.partition("/")
        met = ", ".join(dict.fromkeys(json.dumps(jsonable(v), ensure_ascii=False) for v in values))
        notices.append(f"answer {key!r} was not used: the instances of multi-instance activity {activity!r} that met on "
                       f"{context_key!r} brought {met}, not {json.dumps(jsonable(answers[key]), ensure_ascii=False)}; "
                       "the key keeps the value of the instance that ended last (see its conflicts). Answer with one "
                       "of the values they brought")
    return notices


def unused_confirmation_notices(instance: Instance, answers: Mapping[str, Any] | None, *,
                                star_taken: bool = True) -> list[str]:
    """A notice for each confirmation answer of ``answers`` (the ``confirmations`` keys that are no
    user task's answer too) that names no confirmation ``instance`` ever had, as the run that was
    given it leaves it: a join's context key misspelt (the join met no conflict on it), a conflict the
    join settled without a person (a policy rule, its mergeStrategy, the model), a join not reached yet (the answer is used only by the run or resume it is given to), or a key of no join.
    A ``*`` answer that no confirmation of the run took (``star_taken`` False) has one too.
    ``Engine.run`` adds them to ``instance.notices``: the CLI's stderr and REST's ``notices``."""
    answers = answers or {}
    tasks = answers.get("user_tasks") or {}
    keys = [str(k) for k in (answers.get("confirmations") or {}) if k not in tasks and k != "*"]
    notices = []
    if "*" in (answers.get("confirmations") or {}) and "*" not in tasks and not star_taken:
        notices.append(f"answer '*' was not used: no confirmation took it, none was asked in this run without an "
                       f"answer of its own (instance {instance.id} waits for: {_waiting_steps(instance)}); an answer "
                       "is used only by the run or resume it is given to: give it again to the `resume` that reaches "
                       "the question (REST: the resume request)")
    known: set[str] = set()
    for c in instance.confirmations:
        known.add(str(c.get("id")))
        if c.get("gateway_id") and c.get("key") is not None:
            known.add(f"{c['gateway_id']}/{c['key']}")
    # the joins whose branches met: one that has not may still ask (the instance stopped before it)
    joined = {b.get("join") for b in instance.branches.values() if b.get("status") == "joined"}
    waiting = ", ".join(sorted(str(w["id"]) for w in instance.waiting_for if w.get("id"))) or "nothing"
    for key in keys:
        if key in known:
            answered = _answered_otherwise(instance, key, answers["confirmations"][key])
            if answered is not None:  # kept for a round of the join's loop that this run did not reach
                by = f" by {answered['answered_by']}" if answered.get("answered_by") else ""
                settle = (SETTLE_FAILED_JOIN if answered.get("answer") == ESCALATE
                          else "`resume --set` (REST: inject) corrects the value after the join")
                notices.append(f"answer {key!r} was not used: confirmation {answered['id']!r} of instance "
                               f"{instance.id} was answered {json.dumps(answered.get('answer'))}{by} already and "
                               f"this run did not reach its join again (the instance is {instance.status}, waiting "
                               f"for: {waiting}); an answer is final: {settle}")
            continue
        gateway, _, context_key = key.partition("/")
        asked = sorted({str(c["key"]) for c in instance.confirmations
                        if c.get("gateway_id") == gateway and c.get("key") is not None})
        settled = [c for c in instance.conflicts if c.get("gateway_id") == gateway
                   and c.get("key") == context_key and c.get("resolution")]
        if context_key and settled:
            # the join met the conflict and settled it without a person (a policy rule, a strategy, the model)
            how = settled[0]["resolution"]
            notices.append(f"answer {key!r} matches no confirmation of instance {instance.id}: join {gateway!r} "
                           f"settled its conflict on {context_key!r} by {how.get('resolver')}: "
                           f"{json.dumps(how.get('value'))} ({how.get('reason')}), without asking a person; it was "
                           f"not used (the instance waits for: {waiting}); a `resume --set` or an `inject` corrects "
                           "the value after the join")
        elif context_key and (gateway in joined or asked):
            notices.append(f"answer {key!r} matches no confirmation of instance {instance.id}: join {gateway!r} met "
                           f"no conflict on {context_key!r}"
                           + (f" (it asked: {', '.join(repr(f'{gateway}/{k}') for k in asked)})" if asked else "")
                           + f"; it was not used (the instance waits for: {waiting})")
        elif context_key and instance.status in ("waiting", "running"):
            # a join of the process that may still ask (``check_confirmation_keys`` refused the rest)
            steps = _waiting_steps(instance)
            notices.append(f"answer {key!r} matches no confirmation of instance {instance.id} yet and was not used: "
                           f"join {gateway!r} has not been reached (it waits at: {steps}); an answer is used only by "
                           f"the run or resume it is given to: give it again to the `layerflow resume` that reaches the join "
                           "(REST: the resume request)")
        else:
            notices.append(f"answer {key!r} matches no confirmation of instance {instance.id} (it waits for: "
                           f"{waiting}); it was not used. Key a join conflict GATEWAY_ID/CONTEXT_KEY, as "
                           "`waiting_for` names it")
    return notices


def unknown_user_task_keys(target: Instance | Process, keys: Iterable[str]) -> list[str]:
    """The keys of ``keys`` that name no user task of ``target`` (see ``check_user_task_keys``)."""
    keys = list(keys)
    if not keys:
        return []
    process, _, waiting, _ = _answer_scope(target)
    ids = set(process.user_task_ids()) | waiting
    return [key for key in keys if key not in ids]


def has_user_task(instance: Instance, task_id: str) -> bool:
    """Whether ``task_id`` names a user task of ``instance`` (a BPMN id of its process, a ``waiting_for``
    id) or a task its workflow had: one it may wait for, have waited for, or wait for later. An id that
    is none of these is not the instance's at all (REST answers 404, not 409)."""
    return not unknown_user_task_keys(instance, [task_id]) or bool(_TASK_UUID.fullmatch(task_id)) and _had_task(
        instance, task_id)


def why_not_waiting(instance: Instance, task_id: str) -> str:
    """Why ``instance`` cannot take a person's answer posted to ``task_id`` that it does not wait for
    (``Engine.complete_user_task``, REST ``POST .../user-tasks/{task}``, both refused as a state):
    an id that names no user task of the process (a typo, a script task's id; named with the likely
    task), or a user task it has done; empty when the task is one still to come."""
    if passed_user_tasks(instance, [task_id]):
        return f" (user task {task_id!r} is done: a person's answer is taken once)"
    ended = [t for t in instance.workflow.get_tasks() if spiff.bpmn_id_of(t) == task_id
             and t.state == TaskState.CANCELLED]
    # interrupted before anyone answered: name the boundary event of it that fired (a task SpiffWorkflow
    # cancelled for another reason, a branch not taken, is left unnamed)
    fired = [spiff.bpmn_id_of(c) for t in ended[-1:] for c in (t.parent.children if t.parent else [])
             if c is not t and c.state == TaskState.COMPLETED and "Boundary" in type(c.task_spec).__name__]
    if fired:
        return (f" (user task {task_id!r} was cancelled before it was answered: its boundary event {fired[0]!r} "
                "fired first; the answer was not used)")
    if has_user_task(instance, task_id):
        return ""
    process = instance.process
    tasks = process.user_task_ids()
    close = difflib.get_close_matches(task_id, tasks, n=1, cutoff=0.6)
    spec = process.spec.task_specs.get(task_id)
    what = (f"is the {str(spec.description).lower()} of process {process.id!r}, not a user task"
            if spec is not None and getattr(spec, "bpmn_id", None) else f"names no element of process {process.id!r}")
    likely = f"; did you mean {close[0]!r}?" if close else ""
    named = ", ".join(map(repr, tasks)) or "none"
    return f" ({task_id!r} {what}{likely}; its user tasks: {named})"


def check_user_task_keys(target: Instance | Process, keys: Iterable[str], *, source: str = "answers") -> None:
    """Raise ``InvalidAnswer`` naming every key of answers' ``user_tasks`` that names no user task of
    ``target`` (a typo, an element that is no user task, answers meant for another process), before
    anything runs: its task would wait with the answer unused. An instance's ``waiting`` ids name one
    instance of a multi-instance task too. A task done already is named as an answered confirmation
    is: a script gives the same answers to every resume."""
    bad = unknown_user_task_keys(target, keys)
    if not bad:
        return
    from .governance import InvalidAnswer

    process, _, waiting, _ = _answer_scope(target)
    tasks = process.user_task_ids()
    near = "".join(f" {h}" for h in nearest_answer_keys(target, bad))
    raise InvalidAnswer(f"{source}: user_tasks names {', '.join(map(repr, bad))}, not an element of process "
                        f"{process.id!r} that is a user task;{near} key user_tasks by the BPMN id of a user "
                        f"task ({', '.join(map(repr, tasks)) or 'the process has none'}) or, on resume, "
                        f"by its waiting_for id{' (' + ', '.join(sorted(waiting)) + ')' if waiting else ''}. "
                        "Nothing was run or saved")


def check_start(process: Process, data: Mapping[str, Any] | None = None) -> None:
    """Everything ``Engine.start(process, data)`` checks before it creates the instance, with no store
    opened, read or written: the data against the start event's form and the process's data inputs
    (``StartDataInvalid``, ``StartInputsMissing``), the layers' rules (``ContextWriteDenied``: a SYSTEM key,
    an engine record's key, a key ``data_layers`` sends where it is refused) and whether SpiffWorkflow
    can start the process (``ProcessError``). The CLI's ``run``, ``demo`` and ``submit`` and
    ``engine.worker.submit`` call it first, so refused data leaves no empty sqlite file, no Redis key and
    nothing on the queue behind, and is the error reported even when the store named is unusable too."""
    _prepared_start(process, data)


def _prepared_start(process: Process, data: Mapping[str, Any] | None,
                    clock: Callable[[], float] = time.time) -> tuple[LayeredContext, Any]:
    """The new instance's main context (SYSTEM, then the start data as one ``input`` event; its
    events stamped by ``clock``) and its workflow, or the error that refuses the start (``check_start``)."""
    if data is not None and not isinstance(data, Mapping):  # a caller's programming slip: a plain TypeError
        raise TypeError(f"Engine.start: initial data must be a mapping of context keys to values (a JSON "
                        f"object), got {type(data).__name__}")
    data = _checked_start_data(process, data)
    ctx = LayeredContext(system=process.system, name=MAIN, actor="engine", clock=clock)
    if data:
        # One event for all initial data. The layers' rules still hold: SYSTEM keys are
        # refused, PROCESS only gains keys.
        system = ctx.layer(Layer.SYSTEM)
        clash = [k for k in data if k in system]
        if clash:
            raise ContextWriteDenied(clash[0], process.data_layers.get(clash[0], Layer.PROCESS), Layer.SYSTEM,
                                     "initial data cannot replace a SYSTEM key from the config's system:")
        if MERGED_CONFLICTS_KEY in data:
            # the joins append their conflicts to it (in WORKING): held in PROCESS, that log
            # would be lost; a branch marker's name (_branch_id) stays the data's own key
            layer = process.data_layers.get(MERGED_CONFLICTS_KEY, Layer.PROCESS)
            raise ContextWriteDenied(MERGED_CONFLICTS_KEY, layer, layer, "the engine keeps this key: every "
                                     "parallel join logs its conflicts in it; initial data cannot set it, rename "
                                     "the key")
        records = [k for k in data if k.startswith((*ENGINE_RECORD_PREFIXES, COUNTER_PREFIX, RETRIEVAL_PREFIX))]
        if records:
            # read before HISTORY (reads go L0 to L5), such a key would stand in for the record the
            # engine or the compressor writes (a forged audit entry, a count of entries never removed),
            # or for the passage the retrieval finds (whose write it would then refuse: PROCESS is
            # append-only)
            layer = process.data_layers.get(records[0], Layer.PROCESS)
            raise ContextWriteDenied(records[0], layer, layer, "keys starting with 'activity:', 'event:' or "
                                     "'compaction:' are HISTORY's records, written by the engine and the "
                                     "compressor, 'summary:count:' keys the compressor's count_only counters, "
                                     "and 'kb:' keys the retrieval's passages; initial data cannot set them, "
                                     "rename the key")
        # in key order: a JSON object has none, and the same data must make the same context (and the
        # same model requests) whatever order its keys came in
        ctx.apply_changes([(process.data_layers.get(k, Layer.PROCESS), k, v) for k, v in sorted(data.items())],
                          kind="input", actor="input")
    try:
        wf = spiff.new_workflow(process.spec, process.subprocess_specs)
    except RecursionError:
        # SpiffWorkflow predicts the steps ahead of a new instance and stops only at a gateway
        # that decides; validate refuses the shape (loop_without_gateway), this is for a process
        # loaded without validation
        raise ProcessError(f"process {process.id!r}: SpiffWorkflow cannot start an instance of it (a "
                           "RecursionError while it predicts the steps ahead): a loop that passes no exclusive, "
                           "inclusive or event-based gateway does this; run `layerflow validate` on "
                           f"{', '.join(process.paths) or 'its BPMN'} to find it") from None
    return ctx, wf


ANSWER_SECTIONS = ("user_tasks", "confirmations")


def check_answers_shape(answers: Any, *, source: str = "answers") -> None:
    """An answers document is ``{"user_tasks": {TASK: {field: value}}, "confirmations": {KEY: VALUE}}``
    (either section may be left out): anything else raises ``InvalidAnswer`` naming the part, as the
    CLI's ``--answers`` and REST refuse it, before anything runs. Unchecked, a misspelt section was
    never used (the task went on waiting, without a word) and an answer that is no object failed the
    instance inside the step that took it."""
    from .governance import InvalidAnswer

    def refuse(message: str) -> NoReturn:
        raise InvalidAnswer(f"{source}: {message}")

    if answers is None:
        return
    if not isinstance(answers, Mapping):
        raise InvalidAnswer(f"{source} must be an object with user_tasks and confirmations ({{\"user_tasks\": "
                            f"{{TASK_ID: {{...}}}}, \"confirmations\": {{KEY: VALUE}}}}), got {type(answers).__name__}")
    for key in answers:
        if key not in ANSWER_SECTIONS:
            close = difflib.get_close_matches(str(key), ANSWER_SECTIONS, n=1, cutoff=0.6)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            refuse(f"unknown section {key!r}{hint}; use user_tasks and confirmations")
    for section, keyed in (("user_tasks", "a user task's BPMN id or waiting_for id"),
                           ("confirmations", "a confirmation id, GATEWAY_ID/CONTEXT_KEY or *")):
        if answers.get(section) is not None and not isinstance(answers[section], Mapping):
            refuse(f"{section} must be an object keyed by {keyed}, got {type(answers[section]).__name__}")
    for task_id, values in (answers.get("user_tasks") or {}).items():
        if not isinstance(values, Mapping):
            refuse(f"user_tasks[{task_id!r}] must be an object of the task's fields ({{key: value}}), "
                   f"got {type(values).__name__}")


def check_answer_keys(target: Instance | Process, answers: Mapping[str, Any] | None, *,
                      source: str = "answers") -> None:
    """The one check of the keys of an answers document (``Engine.run`` / ``resume``, REST, the
    CLI's ``--answers``): ``check_confirmation_keys`` and ``check_user_task_keys``, for a process
    about to start or an instance as it is (its confirmations and what it waits for name more, what
    it passed names less)."""
    check_answers_shape(answers, source=source)
    tasks = (answers or {}).get("user_tasks") or {}
    conf = (answers or {}).get("confirmations") or {}
    if not isinstance(target, Process):
        refuse_late_answers(target, answers)
    check_confirmation_keys(target, [key for key in conf if key not in tasks], source=source)
    # one answer in both sections (``--answer KEY={...}``: a user task's answer, whatever else it
    # is) may name a task or a confirmation
    either = set(conf) - set(unmatchable_confirmation_keys(target, [k for k in tasks if k in conf]))
    check_user_task_keys(target, [key for key in tasks if key not in either], source=source)


#: a ``waiting_for`` id of a user task (its SpiffWorkflow task's uuid)
_TASK_UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")


def check_completed_answer_keys(instance: Instance, answers: Mapping[str, Any] | None, *,
                                source: str = "answers") -> None:
    """``check_user_task_keys`` for an instance that has completed, whose answers are all unused: a
    ``user_tasks`` key that names no user task of its process is a typo (``InvalidAnswer``), one that
    does (an answers file given to several instances) is only not used. Its ``waiting_for`` ids are
    gone: one (the uuid of a task the instance has had) is taken as too late, not a typo; so is a
    key that may name a confirmation of the instance or of its process (``--answer KEY={...}`` is in
    both sections). A uuid no task of the instance ever had is a typo, named as such."""
    tasks = (answers or {}).get("user_tasks") or {}
    conf = [key for key in ((answers or {}).get("confirmations") or {}) if key in tasks]
    bad = set(unmatchable_confirmation_keys(instance, conf)) & set(unmatchable_confirmation_keys(instance.process,
                                                                                                  conf))
    either = set(conf) - bad
    shaped = [str(key) for key in tasks if key not in either and _TASK_UUID.fullmatch(str(key))]
    strangers = [key for key in shaped if not _had_task(instance, key)]
    if strangers:
        from .governance import InvalidAnswer

        raise InvalidAnswer(f"{source}: user_tasks names {', '.join(map(repr, strangers))}, shaped like a "
                            f"waiting_for id, but no task of instance {instance.id} ever had that id (a typo, or an "
                            f"id of another instance); instance {instance.id} is completed and waits for nothing. "
                            "Nothing was run or saved")
    check_user_task_keys(instance.process, [key for key in tasks if key not in either and key not in shaped],
                         source=source)


def _had_task(instance: Instance, task_id: str) -> bool:
    """Whether ``task_id`` (a ``waiting_for`` id) is the id of a task of ``instance``'s workflow, a
    sub-process's included (SpiffWorkflow keeps finished tasks in the tree)."""
    key = uuid.UUID(task_id)
    workflow = instance.workflow
    return key in workflow.tasks or any(key in sub.tasks for sub in workflow.subprocesses.values())


def config_file_notices(instance: Instance) -> list[str]:
    """A notice for each element the process's config file configures otherwise now than the
    instance runs with: an instance keeps the definition it started with (its BPMN and its
    configs travel in its record), as in every serious engine, and a join whose person was asked
    keeps the terms it asked with; but a user who edited the file must not believe it applies. Its
    ``system:`` and ``process:`` sections, likewise (``config_file_section_changes``)."""
    process = instance.process
    started: dict[str, Any] = {}  # an element changed at runtime started with the first change's `previous`
    for event in instance.main.tape.filter(kind="config_change"):
        started.setdefault(str(event.data.get("activity_id")), thaw(event.data.get("previous")) or {})
    changes = config_file_changes(process, [instance.workflow.spec, *instance.workflow.subprocess_specs.values()],
                                  started)
    waits_at = {str(w.get("task_id")) for w in instance.waiting_for}
    notes = []
    for element_id, (file, changed) in changes.items():
        where = " (the instance waits there now)" if element_id in waits_at else ""
        notes.append(
            f"the config file {file} changed since instance {instance.id} started: element "
            f"{element_id!r}{where}: {'; '.join(changed)}. The instance keeps the config it started with (an "
            "instance keeps its definition; a join's pending confirmations keep the options, default and deadline "
            "they were asked with); new instances get the new file. To apply a change to this instance, POST "
            f"/api/context-governance/config (instance_id {instance.id!r}, activityId {element_id!r}), or cancel it "
            "and start a new one")
    notes.extend(definition_file_notices(instance))
    kept = {"system": "SYSTEM (L0) is frozen when an instance starts: the instance keeps its own values",
            "process": "the instance keeps the process options it started with"}
    for section, changed in config_file_section_changes(process).items():
        notes.append(f"the config file {process.config_path} changed since instance {instance.id} started: "
                     f"{section}: {'; '.join(changed)}. {kept[section]}; new instances get the new file")
    return notes


def definition_file_notices(instance: Instance) -> list[str]:
    """A notice for each BPMN or DMN file the instance started from that reads otherwise now: the
    instance goes on with the definition it started with (its spec travels in its record), so a
    step added, removed or renamed, a condition or a script changed in the file is not what it
    runs. (Config files are told field by field; a file that is gone, on a worker of another
    machine, is no news.)"""
    definition = instance.process.definition()
    models = set(instance.process.paths)
    changed = [f["path"] for f in definition["files"] if f["now"] == "changed" and f["path"] in models]
    return [f"the file {path} changed since instance {instance.id} started: the instance goes on with the definition "
            f"it started with (version {definition['version']}; its BPMN travels in its record), so the steps, "
            "conditions and scripts of the file as it reads now do not apply to it; new instances get the new file. "
            "To run this instance on the new definition, cancel it (`layerflow cancel ID --reason ...`) and start a "
            "new one" for path in changed]


def settled_answer(instance: Instance, key: str) -> dict[str, Any] | None:
    """The confirmation ``key`` (its id, or ``GATEWAY_ID/KEY``) names when it was answered (by a
    person, a model, an unattended run or its timeout) and no round of it is open now (a loop back
    through the join asks again under the same id: an answer is for that round then)."""
    if key == "*":
        return None
    named = [c for c in instance.confirmations if not c.get("cancelled")
             and key in (c.get("id"), c.get("request_id"), f"{c.get('task_id')}/{c.get('key')}")]
    if not named or any(not c.get("answered") for c in named):
        return None
    return named[-1]


def may_ask_again(instance: Instance, entry: Mapping[str, Any]) -> bool:
    """Whether the element that asked confirmation ``entry`` can ask it again in a later round: the
    instance is not completed and that element lies on a loop of the process (a sequence flow leads
    back to it), or is not one of the top-level process (a sub-process may be called again: assumed)."""
    if instance.status in ("completed", "cancelled"):
        return False
    specs = instance.process.spec.task_specs.values()
    asked = [ts for ts in specs if getattr(ts, "bpmn_id", None) == entry.get("task_id")]
    if len(asked) != 1:
        return True
    seen, todo = set(), list(asked[0].outputs)
    while todo:
        spec = todo.pop()
        if spec is asked[0]:
            return True
        if id(spec) not in seen:
            seen.add(id(spec))
            todo.extend(spec.outputs)
    return False


def _answered_otherwise(instance: Instance, key: str, value: Any) -> dict[str, Any] | None:
    """The confirmation ``key`` names (its id, or GATEWAY/KEY) when it was answered with another value
    than ``value`` and no question of that key is open: an answer that nothing used."""
    named = [c for c in instance.confirmations if key in (c.get("id"), f"{c.get('gateway_id')}/{c.get('key')}")]
    if not named or any(not c.get("answered") for c in named):
        return None
    last = named[-1]
    return None if last.get("cancelled") or _same_answer(last, value) else last


def _same_answer(entry: Mapping[str, Any], value: Any) -> bool:
    """Whether ``value`` gives the answer a confirmation ``entry`` recorded: that value, or what
    stands for it among the entry's options (its label, its JSON text), as the answer was taken."""
    return json_equal(entry.get("answer"), option_value(entry.get("options") or [], value))


def refuse_late_answers(instance: Instance, answers: Mapping[str, Any] | None) -> None:
    """Raise ``AnsweredByTimeout`` for an answer in ``answers`` to a confirmation its timeout settled
    with another value, and ``AnsweredAlready`` for one a person (a model, an unattended run)
    answered with another value and nothing can ask again (``may_ask_again``: an answers file may
    hold the answer to the next round of a loop): it came too late, and neither applying it over
    the answer that stands nor dropping it unseen would be right. One that agrees with the answer
    that stands loses nothing and passes (a script's answers file given to every resume)."""
    for key, value in ((answers or {}).get("confirmations") or {}).items():
        entry = settled_answer(instance, str(key))
        if entry is None or _same_answer(entry, value):
            continue
        from .governance import AnsweredAlready, AnsweredByTimeout

        if entry.get("answered_by_timeout"):
            raise AnsweredByTimeout(instance, entry, value)
        if not may_ask_again(instance, entry):
            raise AnsweredAlready(instance, entry, value)


def _answer_key(answers: Mapping[str, Any] | None, item: Mapping[str, Any]) -> str | None:
    """The key of ``answers`` whose answer the waiting ``item`` takes, or None: a user task's waiting id
    before its BPMN id; a confirmation's id, then ``GATEWAY_ID/CONTEXT_KEY``, then ``*``."""
    if not answers or item["kind"] not in ("user_task", "confirmation"):
        return None
    if item["kind"] == "user_task":
        keys, section = [item["id"], item["task_id"]], answers.get("user_tasks") or {}
    else:
        keys = [item["id"], *([f"{item['task_id']}/{item['key']}"] if item.get("key") else []), "*"]
        section = answers.get("confirmations") or {}
    return next((key for key in keys if key in section), None)


def _lookup_answer(answers: Mapping[str, Any] | None, item: Mapping[str, Any]) -> Any:
    key = _answer_key(answers, item)
    if key is None or answers is None:
        return _NO_ANSWER
    return answers["user_tasks" if item["kind"] == "user_task" else "confirmations"][key]


# =============================================================================== driver

def _runtime_of(instance: Instance) -> "_Runtime":
    rt = spiff.driver_of_workflow(instance.workflow)
    if not isinstance(rt, _Runtime):
        raise LayerflowError(f"instance {instance.id} has no engine attached; load it with Engine.load")
    return rt


def _expression_kind(task: Any, expression: str) -> str:
    """What an expression SpiffWorkflow evaluates at ``task`` is: an entry of the decision table a
    business rule task runs (its rule named), else a condition."""
    engine = getattr(task.task_spec, "dmnEngine", None)
    table = getattr(engine, "decision_table", None)
    for rule in getattr(table, "rules", None) or ():
        entries = [*(getattr(rule, "outputEntries", None) or ()), *(getattr(rule, "inputEntries", None) or ())]
        for entry in entries:
            texts = [getattr(entry, "text", None), *(getattr(entry, "lhs", None) or ())]
            if any(isinstance(t, str) and t.strip() == expression.strip() for t in texts):
                kind = "output" if entry in (getattr(rule, "outputEntries", None) or ()) else "input"
                return (f"{kind} entry of rule {getattr(rule, 'id', '?')!r} of decision table "
                        f"{getattr(table, 'id', '?')!r}:")
    if table is not None:
        return "decision table expression"
    return "condition"


def _flow_of(task: Any, expression: str) -> str:
    """`` of the flow to 'X'`` when ``expression`` is the condition of a gateway's outgoing flow
    (several flows leave a gateway: the message says which one failed), else nothing."""
    for condition, name in getattr(task.task_spec, "cond_task_specs", None) or ():
        if condition is not None and condition.args and condition.args[0] == expression:
            target = task.workflow.spec.get_task_spec_from_name(name)
            return f" of the flow to {spiff.flow_target_id(target)!r}"
    return ""


def _unanswered_field(task: Any, err: BaseException) -> str:
    """The user task whose form asks for the name an expression could not read, and whose answer
    left it out (a field with no default that is not required writes nothing): the person's
    answer, not an earlier step, is what to look at."""
    if not isinstance(err, NameError) or not err.name:
        return ""
    done = [t for t in task.workflow.get_tasks() if t.state == TaskState.COMPLETED]
    for asked in sorted(done, key=lambda t: t.last_state_change, reverse=True):
        form = (getattr(asked.task_spec, "extensions", None) or {}).get("form")
        fields = form.get("fields") if isinstance(form, Mapping) else None
        if any(isinstance(f, Mapping) and f.get("id") == err.name for f in fields or ()):
            source = form.get("source") if isinstance(form, Mapping) else None
            start = isinstance(asked.task_spec, StartEvent)
            return (f"; {'start event' if start else 'user task'} {spiff.bpmn_id_of(asked)!r} asks for {err.name!r} "
                    f"in its form{f' ({source})' if source else ''}, and {'the start data' if start else 'its answer'} "
                    "left it out (the field has no default and is not required): "
                    f"{'give it in the start data' if start else 'answer it there'}, or give the field a default or "
                    "make it required")
    return ""


# a DMN input's typeRef -> the JSON types that fit it (Camunda refuses another value as the input's)
_DMN_TYPES: dict[str, tuple[type, ...]] = {
    "number": (int, float), "integer": (int,), "long": (int,), "double": (int, float), "string": (str,),
    "boolean": (bool,)}


def _dmn_type_hint(task: Any, err: BaseException, ctx: LayeredContext) -> str:
    """The input of the decision table a business rule task runs whose key holds a value of another
    type than the input's ``typeRef`` (a string where a number is declared, null), when an entry's
    comparison failed on it: SpiffWorkflow's TypeError names neither."""
    table = getattr(getattr(task.task_spec, "dmnEngine", None), "decision_table", None)
    if not isinstance(err, TypeError) or table is None:
        return ""
    for item in getattr(table, "inputs", None) or ():
        key, declared = (getattr(item, "expression", None) or "").strip(), (getattr(item, "typeRef", None) or "")
        fits = _DMN_TYPES.get(declared.lower())
        if not fits or not key.isidentifier() or key not in ctx:
            continue
        value = thaw(ctx.resolve(key))
        if isinstance(value, fits) and (declared.lower() == "boolean" or not isinstance(value, bool)):
            continue
        kind = {str: "a string", bool: "a boolean", int: "a number", float: "a number", list: "a list",
                dict: "an object"}.get(type(value), type(value).__name__)
        shown = "null" if value is None else f"{json.dumps(value)} ({kind})"
        label = getattr(item, "label", None) or getattr(item, "id", None) or key
        return (f"; input {label!r} of decision table {getattr(table, 'id', '?')!r} declares typeRef {declared!r}, "
                f"and {key!r} holds {shown}: give {key!r} a {declared} (the start data or an earlier task's "
                "output), or change the input's typeRef and the rules")
    return ""


def _name_hint(err: BaseException, where: str | None, source: str = "expression") -> str:
    """What to do about a name an expression (or a script: ``source``) reads and the context does not hold."""
    if not isinstance(err, NameError) or not err.name:
        return ""
    if err.name in FOREIGN_LITERALS:
        return f"; expressions are Python: write True, False or None, not {err.name!r}"
    return (f"; the context holds no key {err.name!r} here: give {err.name!r} a value before {where!r} "
            f"(the start data or an earlier task's output), or correct the {source}")


def _not_set_yet(task: Any, expression: str, err: BaseException, ctx: LayeredContext) -> bool:
    """A conditional catch event's (intermediate or boundary) condition reading a key nothing set
    yet: the condition does not hold yet, and the event waits for it (BPMN; Camunda 7's
    ``Condition.tryEvaluate`` is false on an unknown variable), as a conditional start of an event
    sub-process does (``_condition_holds``). Any other error still stops the instance."""
    definition = getattr(task.task_spec, "event_definition", None)
    return (isinstance(definition, ConditionalEventDefinition) and expression == definition.expression
            and isinstance(err, NameError) and bool(err.name) and err.name not in ctx
            and err.name not in FOREIGN_LITERALS and not _compressed_away(ctx, err))


def _stuck_error(wf: Any) -> LayerflowError:
    """Nothing ready, nothing to wait for: name the join that waits for branches that cannot
    come (branches of an exclusive gateway met in a parallel one), when one does."""
    joins: dict[str, Any] = {}
    for task in _all_tasks(wf, TaskState.WAITING):
        if spiff.is_join(task.task_spec) and not spiff.is_end_join(task.task_spec):
            joins.setdefault(spiff.bpmn_id_of(task), task)
    if not joins:
        return LayerflowError("the process neither completed nor waits for anything; check gateways and joins of "
                              "this process")
    gw, task = next(iter(joins.items()))
    kind = "parallel" if not isinstance(task.task_spec, InclusiveGateway) else "inclusive"
    err = LayerflowError(
        f"the process neither completed nor waits for anything: {kind} gateway {gw!r} waits for "
        f"{len(task.task_spec.inputs)} incoming flows and the others can no longer arrive (their branches were "
        "not taken, e.g. an exclusive gateway chose one path); branches of which only one runs meet in an "
        "exclusive gateway, not a parallel one: change that join, or make every incoming path run")
    err.task_id = gw  # type: ignore[attr-defined]
    return err


def _cardinality(task_id: str, expression: str, value: Any) -> int:
    """A loopCardinality as SpiffWorkflow counts it (``range(value)``): a whole number. JSON has one
    number type, so 3.0 (a JSON client's, a YAML file's) is 3; anything else stops the instance
    naming the task and the value, not with Python's "'float' object cannot be interpreted"."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    raise ActivityError(f"loopCardinality {expression.strip()!r} of multi-instance task {task_id!r} is "
                        f"{short(thaw(value))} ({type(value).__name__}); it must be a whole number of instances: "
                        "give that key an integer before the task, or write an expression that gives one "
                        "(e.g. int(...) or len(...))", task_id=task_id)


def _refresh_conditions(wf: Any, holds: Callable[[Any, str], bool] | None = None) -> None:
    """A waiting conditional catch fires once its condition holds (BPMN): SpiffWorkflow 3.2 checks
    it only as the event becomes ready, and a condition false then waited for ever, whatever
    changed later (a ``resume --set``, another activity's write the catch can read). An event
    sub-process of the process with a conditional start starts as its condition comes to hold
    (``holds(task, condition)``): SpiffWorkflow 3.2 connects it to nothing, and no event is ever
    thrown for a condition, so it never started."""
    for task in list(wf.event_manager.tasks.values()):
        if isinstance(task.task_spec.event_definition, ConditionalEventDefinition) and task.state == TaskState.WAITING:
            task.task_spec._update(task)
    if holds is not None:
        _start_conditional_event_subprocesses(wf, holds)


def _fired_conditional_catches(wf: Any) -> list[Any]:
    """The waiting conditional catch events (intermediate, boundary) whose condition holds now,
    made READY: BPMN fires one as its condition comes to hold, so a boundary event reading what
    the last step of its sub-process wrote fires before that sub-process ends."""
    fired = []
    for task in list(wf.event_manager.tasks.values()):
        if isinstance(task.task_spec.event_definition, ConditionalEventDefinition) and task.state == TaskState.WAITING:
            task.task_spec._update(task)
            if task.state == TaskState.READY:
                fired.append(task)
    return fired


#: (the process's root task's internal data) the conditional starts of event sub-processes whose
#: condition held when last checked: BPMN starts one as its condition comes to hold, not while it holds
CONDITIONS_HELD_KEY = "lf_conditions_held"


def _start_conditional_event_subprocesses(wf: Any, holds: Callable[[Any, str], bool]) -> int:
    """Start the event sub-processes of ``wf`` and of its running sub-processes whose conditional
    start's condition came to hold since it was last checked; how many started."""
    started = 0
    for scope in (wf, *wf.get_active_subprocesses()):
        start = scope.spec.start
        if not getattr(start, "trigger_specs", None) or not scope.task_tree.children or scope.is_completed():
            continue
        held = dict(scope.task_tree.internal_data.get(CONDITIONS_HELD_KEY) or {})
        for name in list(start.trigger_specs):
            sp_spec = wf.subprocess_specs.get(name)
            for event in getattr(sp_spec, "bpmn_start_events", ()):
                definition = event.event_definition
                if not isinstance(definition, ConditionalEventDefinition):
                    continue
                now = holds(scope.task_tree.children[0], definition.expression)
                if now and not held.get(event.name):
                    # as SpiffWorkflow starts one a message catches; its start event then evaluates
                    # the condition itself and fires (interrupting its scope when it interrupts)
                    start.trigger_wf(scope.task_tree, name)
                    started += 1
                held[event.name] = now
        if held:
            scope.task_tree.internal_data[CONDITIONS_HELD_KEY] = held
    return started


class _Runtime(ScopeSteps, GatewaySteps):
    """The per-instance driver that the spec twins call (see ``engine.spiff.Driver``)."""

    def __init__(self, engine: Engine, instance: Instance) -> None:
        self.engine = engine
        # The instance holds its runtime, and the runtime (like the workflow, see ``spiff.attach``)
        # holds it weakly: a strong reference back would put everything a run builds (contexts,
        # tapes, snapshots) on a reference cycle (with SpiffWorkflow's task <-> workflow one), freed
        # only by the cyclic garbage collector, ~800 objects a loan demo run, ~10% of its time.
        # Whoever drives the workflow holds the instance.
        self._instance = weakref.ref(instance)
        instance.runtime = self
        self.process = instance.process
        self.user_data: dict[str, dict[str, Any]] = {}
        # confirmation id -> {"value", "resolver"}: answers waiting for their join to re-run
        self.answers: dict[str, dict[str, Any]] = {}
        # the confirmation answers the run or resume under way was given: a multi-instance activity's
        # instances meet mid-activity, where nobody can be asked, and take theirs from here
        self.advance_answers: dict[str, Any] = {}
        self.advance_taken: set[str] = set()
        self.advance_missed: dict[str, list[Any]] = {}
        self._handler_cache: dict[str, Handler | None] = {}
        # gateway task id -> {expression text: verdict} for the XOR being decided (see decide_exclusive)
        self._xor: dict[str, dict[str, bool]] = {}
        # task id -> internal data a reset must give back before the task updates (see reset_failed)
        self._restore: dict[Any, dict[str, Any]] = {}
        self._caught_starts: list[Any] = []  # see start_caught
        self._numbers_memo: dict[tuple[Any, str], dict[Any, int]] | None = None  # see _instance_numbers
        self.record_cache = _RecordCache()
        spiff.attach(instance.workflow, self)

    @property
    def instance(self) -> Instance:
        instance = self._instance()
        if instance is None:
            raise LayerflowError("this workflow's instance is gone (nothing holds it any more); keep the Instance "
                                 "that Engine.start, run or load returned while you drive its workflow")
        return instance

    # ----- running the workflow ------------------------------------------------------

    def step(self) -> None:
        """Run every READY engine task (and plain tasks that have a handler), in SpiffWorkflow's
        own order (``do_engine_steps``), saving after each activity."""
        wf = self.instance.workflow
        while True:
            # an answer, a resume --set or the start data may have made a conditional start's condition hold
            _start_conditional_event_subprocesses(wf, self._condition_holds)
            active = wf.get_active_subprocesses()
            for sp in sorted(active, key=lambda v: v.depth, reverse=True):
                # (an interrupt thrown in it or in one deeper cancels a multi-instance activity: SpiffWorkflow
                # drops its instances, and their sub-processes with them, as it runs)
                while sp.parent_task_id in wf.subprocesses and self._run_ready(sp):
                    pass
                if sp.parent_task_id in wf.subprocesses:
                    task = wf.get_task_from_id(sp.parent_task_id)
                    task.task_spec._update(task)
            if not self._run_ready(wf) and len(wf.get_active_subprocesses()) <= len(active):
                if collaboration.deliver_pending(wf):
                    continue  # a pool caught a message another pool sent before it waited for it
                # timers that are due (by the engine's clock) fire now, and the run goes on
                before = {t.id for t in _ready_tasks(wf)}
                cycles = _cycle_states(wf)
                wf.refresh_timers()
                _refresh_conditions(wf, self._condition_holds)
                for scope in (wf, *wf.get_active_subprocesses()):
                    spiff.wake_end_joins(scope)
                # a cycle timer fires one repetition per refresh (or, after its last one, completes
                # on the next): refresh until none moves, so a late run catches up every missed
                # period, as SpiffWorkflow's do_engine_steps does, even when a path waits for a person
                if not any(t.id not in before and (not t.task_spec.manual or self._runs_unattended(t.task_spec))
                           for t in _ready_tasks(wf)) and _cycle_states(wf) == cycles:
                    break

    def _run_ready(self, wf: Any) -> int:
        count = 0
        for task in spiff.tasks_in_state(wf, TaskState.READY):
            if task.state != TaskState.READY:
                continue
            if task.task_spec.manual and not self._runs_unattended(task.task_spec):
                continue
            if self.instance.lease_check is not None:
                self.instance.lease_check(str(getattr(task.task_spec, "bpmn_id", None) or task.task_spec.name))
            before = self.instance.activities
            task.run()
            count += 1
            while self._caught_starts:
                # an error or escalation that task threw starts an event sub-process: an interrupting
                # one stops the rest of its scope before any other task there runs
                start = self._caught_starts.pop(0)
                if start.state == TaskState.READY:
                    start.run()
                    count += 1
            for catch in spiff.interrupts_around(task):  # it threw what interrupts its sub-process
                if catch.state == TaskState.READY:
                    catch.run()
                    count += 1
            if self.instance.activities != before:
                for catch in _fired_conditional_catches(self.instance.workflow):
                    # what the activity wrote made a waiting condition hold: it fires now, before its
                    # scope goes on (a sub-process's end event after that activity would cancel it)
                    catch.run()
                    count += 1
            if self.instance.activities != before and self.engine.save_after_activity:
                self.engine._save(self.instance)
            if self.instance.activities != before and _start_conditional_event_subprocesses(
                    self.instance.workflow, self._condition_holds):
                break  # what the activity wrote started an event sub-process: it runs before the next step
        return count

    def _runs_unattended(self, spec: Any) -> bool:
        """A plain task with a handler (or model config) runs without a person."""
        if isinstance(spec, UserTaskMixin) or not isinstance(spec, NoneTaskMixin):
            return False
        cfg = self.process.config(spec.bpmn_id)
        return self._handler_for(spec.bpmn_id, cfg) is not None or bool(cfg and cfg.llm and self._model_for(cfg))

    def _instance_of(self, task: Any) -> dict[str, Any]:
        """Which instance of a multi-instance user task this is (several wait under one BPMN id):
        ``instance`` (from 1, in SpiffWorkflow's order) and ``input``, its input data item; on a
        standard loop, which ``round`` (from 1). A user
        task inside a multi-instance sub-process (or call activity) waits once per instance of
        that activity under one BPMN id too: it is told apart by the instance it runs in."""
        loop = spiff.loop_of(task)
        if loop is not None and spiff.multi_instance_of(task) is None:
            # a standard loop: one round at a time, each a child of the loop task (the earlier ones done)
            return {"round": [c.task_spec for c in loop.children].count(task.task_spec)}
        multi = spiff.multi_instance_of(task)
        while multi is None and getattr(task.workflow, "parent_task_id", None) is not None:
            task = task.workflow.top_workflow.get_task_from_id(task.workflow.parent_task_id)
            multi = spiff.multi_instance_of(task)
        if multi is None:
            return {}
        out: dict[str, Any] = {"instance": self._instance_numbers(multi, task.task_spec)[task.id]}
        name = spiff.data_name(multi.task_spec.input_item)
        if name is not None and name in task.data:
            out["input"] = {name: thaw(task.data[name])}
        return out

    def _instance_numbers(self, multi: Any, spec: Any) -> dict[Any, int]:
        """Task id -> its number (from 1) among ``multi``'s instances of ``spec``. Inside ``settle``
        it is worked out once per multi-instance: listing the siblings for each waiting instance cost
        the square of the items (1,000 voters answered in one resume took minutes)."""
        memo = self._numbers_memo
        slot = (multi.id, spec.name)
        if memo is not None and slot in memo:
            return memo[slot]
        numbers = {c.id: n for n, c in enumerate((c for c in multi.children if c.task_spec is spec), 1)}
        if memo is not None:
            memo[slot] = numbers
        return numbers

    def _where(self, task: Any) -> dict[str, Any]:
        """An event item's ``context`` (the one it waits in) and, in a multi-instance, its ``instance``."""
        return {"context": spiff.context_name_of(task), **self._instance_of(task)}

    def change_mark(self) -> tuple[Any, ...]:
        """What a run changes when it does anything: the status, what the instance waits for, the
        tapes, the confirmations, the error and every task's state (sub-workflows too)."""
        inst, wf = self.instance, self.instance.workflow
        states = [(t.id, t.state) for t in wf.tasks.values()]
        for sp in wf.subprocesses.values():
            states.extend((t.id, t.state) for t in sp.tasks.values())
        return (inst.status, [dict(w) for w in inst.waiting_for], inst.tape_length(), inst.activities,
                inst.error and dict(inst.error), [dict(c) for c in inst.confirmations], states)

    def settle(self) -> None:
        """Work out status and what the instance waits for."""
        self._numbers_memo = {}  # the task tree stands still while it is read
        try:
            self._settle()
        finally:
            self._numbers_memo = None

    def _settle(self) -> None:
        inst = self.instance
        if inst.status in ("error", "cancelled"):
            inst.waiting_for = []
            return
        wf = inst.workflow
        self.close_dead_joins()
        if wf.is_completed():
            inst.status = "completed"
            inst.waiting_for = []
            close_at_completion(inst)
            return
        waiting: list[dict[str, Any]] = []
        for c in inst.confirmations:
            if c.get("answer") is None and not c.get("answered"):
                item = confirmation_item(c)
                deadline = confirmation_deadline(c)
                if c.get("escalated"):
                    item["escalated"] = True
                elif deadline is not None:
                    # when its timeout rule applies: the store's timer index, `timers --fire` and the
                    # workers resume the instance then, as for a timer (a run or resume applies the rule)
                    item["due"] = datetime.fromtimestamp(deadline, timezone.utc).isoformat()
                waiting.append(item)
        for task in _ready_tasks(wf):
            if task.task_spec.manual:
                item = {"kind": "user_task", "id": str(task.id), "task_id": spiff.bpmn_id_of(task),
                        "name": task.task_spec.bpmn_name}
                lane = getattr(task.task_spec, "lane", None)
                if lane:  # the name of the lane it is drawn in (a lane's flowNodeRef): whose task it is
                    item["lane"] = lane
                doc = getattr(task.task_spec, "documentation", None)
                if doc:  # what the person is asked to enter
                    item["documentation"] = doc
                extensions = getattr(task.task_spec, "extensions", None) or {}
                if extensions.get("instructionsForEndUser"):  # SpiffArena's instructions (a template, as written)
                    item["instructions"] = extensions["instructionsForEndUser"]
                form = extensions.get("form")
                prepared = task.internal_data.get(spiff.PREPARED_KEY)
                ctx = self.context_of(task) if isinstance(form, Mapping) or prepared else None
                if isinstance(form, Mapping) and ctx is not None:  # the fields the modeler's form asks for
                    item["form"] = forms.public_form(_with_options(form, ctx))
                    for fld in item["form"]["fields"]:  # what the form shows instead of the default
                        if fld.get("id") in ctx:
                            fld["value"] = thaw(ctx.resolve(fld["id"]))
                if prepared and ctx is not None:  # what its preScript set as it became ready: what the form starts from
                    item["data"] = {key: thaw(ctx.resolve(key)) for key in prepared if key in ctx}
                # ``context``: the one it waits in, as a confirmation's, a timer's and an event's item name theirs
                item.update(self._where(task))
                waiting.append(item)
        timers = [t for t in _all_tasks(wf, TaskState.WAITING) if spiff.is_timer(t)]
        for task in sorted(timers, key=lambda t: (spiff.timer_due(t) or _FAR).isoformat()):
            due = spiff.timer_due(task)
            # ``context``: the one it waits in (a confirmation's item names its own): the lines of a
            # parallel multi-instance wait on timers of one ``task_id``, told apart by it
            item = {"kind": "timer", "id": str(task.id), "task_id": spiff.timer_event_id(task),
                    "due": due.isoformat() if due is not None else None, "context": spiff.context_name_of(task)}
            branch = spiff.gateway_branch(task, item["task_id"])
            if branch is not None:
                # the timer branch of an event-based gateway: an item of its own beside the gateway's
                # message and signal branches, named as theirs are (``events.Catch.item``)
                item.update(id=str(branch.id), event_id=item["task_id"], gateway_id=spiff.bpmn_id_of(task))
            if spiff.is_cycle(task):
                item["repetitions_left"] = spiff.cycle_repetitions_left(task)
            item.update(self._instance_of(task))
            waiting.append(item)
        # a message or signal catch says which event it waits for, and is listed even beside a
        # user task or a timer (a boundary message on a user task): `send` can deliver it
        catches = events.waiting_catches(wf)
        # where each waits, as a timer's item says it: the lines of a multi-instance wait for one
        # event under one ``task_id``, told apart by their context and instance
        caught = [{**c.item(), **self._where(c.task)} if c.task is not None else c.item() for c in catches]
        listed = {str(c.task.id) for c in catches if c.task is not None}
        nothing_else = not waiting
        for task in _all_tasks(wf, TaskState.WAITING):
            # (an error or escalation event sub-process listens for what its scope throws: nothing
            # outside can send it, and it holds no token)
            if spiff.is_join(task.task_spec) or spiff.caught_in_scope(task.task_spec):
                continue
            # a conditional catch is listed even beside a user task or a timer, as a message
            # catch is: nothing sends it, it fires once what its condition reads changes
            # (`resume --set`); so is each conditional branch of an event-based gateway, an item of
            # its own as its message and timer branches are, marked ``never_fires``: SpiffWorkflow 3.2
            # never evaluates its condition (validate's conditional_branch_never_fires), so only the
            # other branches can decide; any other waiting task only when nothing else waits
            conditions = events.conditional_members(task.task_spec)
            for definition, event_id in conditions:
                item = {"kind": "event", "id": str(task.id), "task_id": spiff.bpmn_id_of(task),
                        "event_kind": "conditional", "condition": str(definition.expression).strip(),
                        **self._where(task)}
                branch = spiff.gateway_branch(task, event_id)
                if branch is not None:
                    item.update(id=str(branch.id), event_id=event_id, gateway_id=item["task_id"], never_fires=True)
                waiting.append(item)
            if nothing_else and not conditions and str(task.id) not in listed:
                waiting.append({"kind": "event", "id": str(task.id), "task_id": spiff.bpmn_id_of(task)})
        waiting.extend(caught)
        inst.waiting_for = waiting
        inst.status = "waiting" if waiting else "running"
        if not waiting:
            # nothing ready, nothing to wait for, not completed: the process is stuck
            self.fail(_stuck_error(wf))

    def fail(self, err: BaseException) -> None:
        inst = self.instance
        inst.status = "error"
        task_id = getattr(err, "task_id", None)
        kind = getattr(err, "kind", None) or "activity_failed"
        message = str(err) or type(err).__name__
        if not isinstance(err, LayerflowError):
            message = f"{type(err).__name__}: {message}"
            kind = "engine_error"
        # a join's error is written where the instance is not known (gateways): its `layerflow resume ID`
        # is this instance's, as a person pastes it
        message = message.replace("`layerflow resume ID", f"`layerflow resume {inst.id}")
        inst.error = {"kind": kind, "message": message, "task_id": task_id}
        line = getattr(err, "line", None)
        if line is not None:
            inst.error["line"] = line
        if isinstance(err, UncaughtBpmnError):
            inst.error["error_code"] = err.error_code
        failed = _all_tasks(inst.workflow, TaskState.ERROR)
        inst.error_task = str(failed[0].id) if failed else None
        if task_id is None and failed:
            inst.error["task_id"] = spiff.bpmn_id_of(failed[0])

    def failed_context_name(self) -> str | None:
        tid = self.instance.error_task
        if tid is None:
            return None
        task = self.instance.workflow.get_task_from_id(uuid.UUID(tid))
        return spiff.context_name_of(task) if task is not None else None

    def reset_failed(self) -> None:
        """Make the failed task runnable again; its context tag survives spiff's reset."""
        inst = self.instance
        for task in _all_tasks(inst.workflow, TaskState.ERROR):
            # a failed instance of a multi-instance activity: the whole activity runs again
            task = spiff.multi_instance_of(task) or task
            # spiff resets each enclosing sub-process task too, clearing its internal data: keep
            # their tags as well (a sub-process that starts a branch names the branch's context)
            tagged = [task]
            while tagged[-1].workflow.parent_task_id is not None:
                tagged.append(tagged[-1].workflow.top_workflow.get_task_from_id(tagged[-1].workflow.parent_task_id))
            kept = [{k: t.internal_data[k] for k in (spiff.CTX_KEY, spiff.BRANCH_KEY) if k in t.internal_data}
                    for t in tagged]
            wf = task.workflow.top_workflow
            self._restore[task.id] = kept[0]  # a multi-instance task begins its activity during the reset
            try:
                wf.reset_from_task_id(task.id)
            finally:
                self._restore.pop(task.id, None)
            for t, keep in zip(tagged, kept):
                t.internal_data.update(keep)
        inst.status = "running"
        inst.error = None
        inst.error_task = None
        self._xor.clear()

    def give_user_data(self, task: Any, data: Mapping[str, Any] | None, *, actor: str) -> None:
        """The data a person entered for a waiting user task, for its run; noted on its context's tape.

        A key the layer rules refuse (a SYSTEM key, a PROCESS key already set, a HISTORY record) is
        the person's mistake, not the process's: the refusal goes on the tape and
        ``AnswerWriteDenied`` (a ``ContextWriteDenied``) is raised before anything else changes,
        so the task still waits for a corrected answer (the instance does not fail)."""
        given = self._check_form(task, dict(data or {}), actor)
        self._check_user_data(task, given, actor)
        self._check_output_item(task, given, actor)
        # in key order, as the start data and a model's answer: a JSON object has none, and the same
        # answer (from the CLI, the REST API or the console) must send the same bytes to the next model
        given = dict(sorted(given.items()))
        self.user_data[str(task.id)] = given
        note: dict[str, Any] = {"task_id": spiff.bpmn_id_of(task), "keys": list(given)}
        which = self._instance_of(task).get("instance")
        if which is not None:  # which of the instances waiting under one BPMN id (as waiting_for numbers it)
            note["instance"] = which
        self.context_of(task).record("user_input", actor=actor, data=note)

    def _check_form(self, task: Any, given: dict[str, Any], actor: str) -> dict[str, Any]:
        """The answer checked against the task's form (``engine.forms``), with the defaults of the
        fields it omits; ``FormAnswerInvalid`` (bad input, the refusal on the tape) before anything
        is written when it does not fit, so the task still waits for a corrected answer."""
        form = (getattr(task.task_spec, "extensions", None) or {}).get("form")
        if not isinstance(form, Mapping):
            return given
        ctx = self.context_of(task)
        form = _with_options(form, ctx)  # the options the waiting item shows, from the same context
        # a field starts from the value its key holds (the preScript's, an earlier step's, SYSTEM's),
        # so a default never overwrites it, nor is written to a layer that refuses it
        held = {str(f.get("id")) for f in form.get("fields") or []}
        held.update(task.internal_data.get(spiff.PREPARED_KEY) or [])
        prefilled = {key: thaw(ctx.resolve(key)) for key in held if key in ctx}
        answer, problems = forms.check_answer(form, given, prefilled)
        multi = spiff.multi_instance_of(task)
        output_item = getattr(multi.task_spec, "output_item", None) if multi is not None else None
        out = spiff.data_name(output_item) if output_item is not None else None
        if out is not None and out in prefilled and out not in answer:
            # an instance's output is what its form holds when submitted: the value it started from
            answer[out] = prefilled[out]
        if problems:
            bpmn_id = spiff.bpmn_id_of(task)
            ctx.record("answer_refused", actor=actor, data={
                "task_id": bpmn_id, "form": form.get("source"),
                "problems": [{"field": f, "problem": p} for f, p in problems]})
            from .governance import FormAnswerInvalid

            raise FormAnswerInvalid(bpmn_id, problems, form, instance_id=self.instance.id)
        return answer

    def _check_output_item(self, task: Any, given: dict[str, Any], actor: str) -> None:
        """An instance of a multi-instance user task adds the person's decision to the activity's
        output collection through its output item: an answer without it would fail the whole
        instance once the task ran (``no_output_item``), for a person's slip. It is bad input
        instead, refused before anything is written, and the task still waits. A script, handler
        or model of the task may set the item itself: then the answer need not."""
        multi = spiff.multi_instance_of(task)
        mspec = getattr(multi, "task_spec", None)
        if mspec is None or getattr(mspec, "data_output", None) is None:
            return
        out = spiff.data_name(mspec.output_item)
        spec = task.task_spec
        cfg = self.process.config(spec.bpmn_id)
        if (out is None or out == spiff.data_name(mspec.input_item) or out in self._form_of(task, given)
                or getattr(spec, "prescript", None) or getattr(spec, "postscript", None)
                or (cfg is not None and cfg.llm is not None) or self._handler_for(spec.bpmn_id, cfg) is not None):
            return
        bpmn_id = spiff.bpmn_id_of(task)
        which = self._instance_of(task).get("instance")
        collection = spiff.data_name(mspec.data_output)
        why = (f"the answer sets no {out!r}, the output item each instance adds to {collection!r}: answer "
               f"{{{json.dumps(out)}: ...}} with this instance's decision")
        self.context_of(task).record("answer_refused", actor=actor, data={
            "task_id": bpmn_id, "key": out, "instance": which, "reason": why})
        from .governance import InvalidAnswer

        raise InvalidAnswer(f"user task {bpmn_id!r} (instance {which} of its multi-instance activity): {why}; the "
                            f"task still waits for a corrected answer", instance_id=self.instance.id, task_id=bpmn_id)

    def _check_user_data(self, task: Any, given: dict[str, Any], actor: str) -> None:
        ctx = self.context_of(task)
        form = self._form_of(task, given)
        scope = self.loop_scope(task) or {}
        for key, value in form.items():
            problem = ("is not a non-empty string" if not isinstance(key, str) or not key else key_problem(key))
            if problem is not None:  # no context key can be named so: the person's mistake, as a bad value is
                from .governance import InvalidAnswer

                bpmn_id = spiff.bpmn_id_of(task)
                raise InvalidAnswer(f"the answer to user task {bpmn_id!r} has the key {key!r}, which {problem}"
                                    f"{'' if isinstance(key, str) and key else '; name every field with non-empty text'}",
                                    instance_id=self.instance.id, task_id=bpmn_id)
            if key in scope:
                continue  # an instance's own item
            try:
                freeze(value)
            except (ValueError, TypeError) as err:  # NaN, a lone surrogate, a set or bytes from a Python
                # caller: no JSON value, the person's mistake (a TypeError names neither task nor key)
                from .governance import InvalidAnswer

                bpmn_id = spiff.bpmn_id_of(task)
                raise InvalidAnswer(f"the answer to user task {bpmn_id!r} gives key {key!r} a value that is not "
                                    f"JSON: {err}; answer with null, true/false, numbers, text, lists or objects",
                                    instance_id=self.instance.id, task_id=bpmn_id) from None
            unchanged = key in ctx and json_equal(ctx.resolve(key), value)
            if is_engine_key(key) and not unchanged:
                # as inject refuses them: a person's answer after a join would replace its conflict log
                # (`_mergedConflicts`, still in WORKING), or forge a branch marker or a HISTORY record
                bpmn_id = spiff.bpmn_id_of(task)
                held = ctx.locate(key)
                why = f"{ENGINE_KEY_RULE}; answer with data keys only"
                ctx.record("answer_refused", actor=actor, data={"task_id": bpmn_id, "key": key, "reason": why})
                denied = ContextWriteDenied(key, Layer.WORKING, held if held is not None and held < Layer.WORKING
                                            else Layer.WORKING, why)
                raise AnswerWriteDenied(denied, task_id=bpmn_id)
            reason = ctx.check_write(Layer.WORKING, key)[1]
            if reason is not None and not unchanged:
                bpmn_id = spiff.bpmn_id_of(task)
                try:
                    ctx.write(Layer.WORKING, key, value, actor=actor)  # puts the refusal on the tape, raises
                except ContextWriteDenied as err:
                    # the denied write names no task: the note says which task's answer it was, as a
                    # form's or an engine key's refusal does
                    ctx.record("answer_refused", actor=actor, data={"task_id": bpmn_id, "key": key, "reason": reason})
                    raise AnswerWriteDenied(err, task_id=bpmn_id) from None

    def find_waiting_task(self, task_id: str) -> Any:
        for task in _ready_tasks(self.instance.workflow):
            if task.task_spec.manual and task_id in (str(task.id), spiff.bpmn_id_of(task)):
                return task
        waiting = [spiff.bpmn_id_of(t) for t in _ready_tasks(self.instance.workflow) if t.task_spec.manual]
        # no user task waits: name what does (a timer, a message), not "nothing"
        others = events.describe_waiting(self.instance.waiting_for)
        shown = ", ".join(waiting) or (f"no user task ({others})" if self.instance.waiting_for else "nothing")
        from .governance import InstanceStateError

        # the instance's state refuses the answer, as REST's 409 says; no activity failed
        err = InstanceStateError(f"instance {self.instance.id} ({self.instance.status}) does not wait for task "
                                 f"{task_id!r}{why_not_waiting(self.instance, task_id)}; it waits for: {shown}")
        err.task_id = task_id  # type: ignore[attr-defined]
        raise err

    # ----- activities ------------------------------------------------------------------

    def _condition_holds(self, task: Any, expression: str) -> bool:
        """Whether a conditional start's ``expression`` holds over ``task``'s context: a key it
        reads that is not set yet (or any error) is a condition that does not hold yet."""
        try:
            return bool(evaluate_expression(expression, self.context_of(task)))
        except Exception:  # noqa: BLE001
            return False

    def context_of(self, task: Any) -> LayeredContext:
        return self.instance.contexts[spiff.context_name_of(task)]

    def run_activity(self, task: Any, default_run: Callable[[], Any]) -> Any:
        """Run an activity; ``None`` (SpiffWorkflow: the task stays STARTED) when it waits
        for a person's answer, open, and goes on when ``answer`` runs the task again."""
        multi = spiff.multi_instance_of(task)
        if multi is not None:
            return self._run_instance(task, multi, default_run)
        spec = task.task_spec
        bpmn_id = spec.bpmn_id
        ctx = self.context_of(task)
        cfg = self.process.config(bpmn_id)
        tid = str(task.id)
        resuming = tid in self.instance.suspended and ctx.current_activity == bpmn_id
        # a task that waited for a person ran its preScript as it became ready (``prepare``)
        prepared = spiff.PREPARED_KEY in task.internal_data
        if not resuming:
            self.instance.suspended.pop(tid, None)
            ctx.begin_activity(bpmn_id, actor=bpmn_id)
        try:
            if cfg is not None and cfg.knowledge_config is not None and not resuming:
                self._retrieve(ctx, cfg, task)
            actx = ActivityContext(ctx, task_id=bpmn_id, task_name=spec.bpmn_name, config=cfg,
                                   instance_id=self.instance.id, data=self._form_data(task),
                                   documentation=getattr(spec, "documentation", None))
            prescript = getattr(spec, "prescript", None)
            if prescript and not resuming and not prepared:
                run_script(prescript, actx, filename=_script_name("preScript", bpmn_id))
            result = self._run_handler(task, actx, cfg, default_run)
            if result is _SUSPENDED:
                return None
            postscript = getattr(spec, "postscript", None)
            if postscript:
                run_script(postscript, actx, filename=_script_name("postScript", bpmn_id))
            outputs = spiff.io_names(spec, "data_outputs")
            missing = [name for name in outputs if name not in ctx]
            if missing:
                raise ActivityError(f"task {bpmn_id!r} did not set the data output(s) {', '.join(map(repr, missing))} "
                                    "that its ioSpecification names; set them in the task (its script, handler or "
                                    "form data) or remove them from its dataOutput", task_id=bpmn_id)
            unset = [ref for ref in getattr(spec, "data_output_associations", None) or []
                     if ctx.get(ref.bpmn_id, ABSENT) is ABSENT]
            if unset:
                raise ActivityError(_unset_data_objects(bpmn_id, unset, ctx), task_id=bpmn_id)
            if outputs:
                # as in SpiffWorkflow, only its data outputs leave a task with an ioSpecification: the
                # other keys it wrote itself (a script's temporaries, extra form fields) end with it
                kept = {*outputs, *(ref.bpmn_id for ref in getattr(spec, "data_output_associations", None) or [])}
                for key in ctx.activity_writes:
                    if key not in kept and ctx.locate(key) is Layer.WORKING:
                        ctx.delete(Layer.WORKING, key, actor=bpmn_id)
            preserve = cfg.effective_preserve_keys if cfg is not None else []
            ctx.complete_activity(bpmn_id, preserve_keys=preserve, actor=bpmn_id)
            self.instance.suspended.pop(tid, None)  # e.g. llm.tools turned off while it waited
        except BpmnError as err:
            self.instance.suspended.pop(tid, None)
            return self._throw_error(task, ctx, err)
        except BaseException as err:
            stood = self.instance.suspended.get(tid)
            if stood is not None and stood.get("model_failed"):  # see run_with_tools: resumed where it stood
                del stood["model_failed"]
            else:
                self.instance.suspended.pop(tid, None)
                ctx.abort_activity(bpmn_id, reason=_one_line(err), actor="engine")
            raise _activity_error(bpmn_id, err, ctx, self.instance.contexts.values(), task) from err
        self._activity_done(ctx, cfg, bpmn_id)
        # data objects: the context is the source of truth; SpiffWorkflow copies what it needs
        # from task.data into the workflow's data objects when the task completes
        for name in [ref.bpmn_id for ref in getattr(spec, "data_output_associations", None) or []] + \
                spiff.io_names(spec, "data_outputs"):
            value = ctx.get(name, ABSENT)
            if value is not ABSENT:
                task.data[name] = thaw(value)
        return True if result is None else result

    def prepare(self, task: Any) -> bool:
        """A user (or manual) task with a preScript becomes ready: SpiffWorkflow runs the preScript
        now, before the task waits, so what it sets is there for the person (and for ``inspect``)
        while the instance waits. It runs as a step of its own (its writes move into HISTORY under
        the task's ``activity:`` record, status ``prepared``), once: the task's activity, when the
        person answers, does not run it again, even in another process (``PREPARED_KEY`` is saved
        with the task). A plain task that a handler runs, an instance of a multi-instance task and
        a task whose context has an activity open run it inside their activity, as before."""
        spec = task.task_spec
        bpmn_id = spec.bpmn_id
        ctx = self.context_of(task)
        if spiff.PREPARED_KEY in task.internal_data or spiff.multi_instance_of(task) is not None \
                or self._runs_unattended(spec) or ctx.current_activity is not None:
            return False
        cfg = self.process.config(bpmn_id)
        ctx.begin_activity(bpmn_id, actor=bpmn_id)
        try:
            actx = ActivityContext(ctx, task_id=bpmn_id, task_name=spec.bpmn_name, config=cfg,
                                   instance_id=self.instance.id, documentation=getattr(spec, "documentation", None))
            run_script(spec.prescript, actx, filename=_script_name("preScript", bpmn_id))
            written = list(ctx.activity_writes)
            ctx.complete_activity(bpmn_id, status="prepared", actor=bpmn_id,
                                  preserve_keys=cfg.effective_preserve_keys if cfg is not None else [])
        except BpmnError as err:  # the task never waits: the catching event's path runs instead
            self._throw_script_error(task, ctx, err)
            return True
        except BaseException as err:
            ctx.abort_activity(bpmn_id, reason=_one_line(err), actor="engine")
            raise _activity_error(bpmn_id, err, ctx, self.instance.contexts.values(), task) from err
        task.internal_data[spiff.PREPARED_KEY] = written
        return False

    def lookup(self, task: Any, names: Iterable[str]) -> dict[str, Any]:
        """The values of ``names`` that the task's context holds (a loop's items first)."""
        ctx = self.context_of(task)
        scope = self.loop_scope(task) or {}
        found = {name: thaw(ctx.resolve(name)) for name in names if name in ctx and name not in scope}
        return {**found, **{name: scope[name] for name in names if name in scope}}

    def _form_data(self, task: Any) -> dict[str, Any] | None:
        """What a person gave a waiting task; under a user task's ``spiffworkflow:variableName`` as
        one value, as SpiffWorkflow's ``add_data_from_form`` keeps it (a form's fields, one key)."""
        data = self.user_data.pop(str(task.id), None)
        return self._form_of(task, data) if data is not None else None

    @staticmethod
    def _form_of(task: Any, data: dict[str, Any]) -> dict[str, Any]:
        variable = getattr(task.task_spec, "variable", None) if isinstance(task.task_spec, UserTaskMixin) else None
        return {variable: data} if variable else data

    def io_inputs(self, task: Any) -> dict[str, Any]:
        """An activity's ``ioSpecification`` data inputs, from its context (SpiffWorkflow checks
        them before the task runs); an error naming the missing ones."""
        bpmn_id = spiff.bpmn_id_of(task)
        ctx = self.context_of(task)
        names = spiff.io_names(task.task_spec, "data_inputs")
        missing = [name for name in names if name not in ctx]
        if missing:
            raise ActivityError(f"task {bpmn_id!r} needs the data input(s) {', '.join(map(repr, missing))} that its "
                                "ioSpecification names; none is in the context. Set them before the task or remove "
                                f"them from its dataInput{_folded_hint(ctx, missing[0])}", task_id=bpmn_id)
        return {name: thaw(ctx.resolve(name)) for name in names}

    # ----- multi-instance activities ----------------------------------------------------

    def begin_multi(self, task: Any) -> None:
        """A multi-instance task is about to make its instances: open its activity, and give
        SpiffWorkflow the input collection (and a map output collection) from the context."""
        task.internal_data.update(self._restore.get(task.id, {}))
        spec = task.task_spec
        bpmn_id = spec.bpmn_id
        ctx = self.context_of(task)
        if task.internal_data.get(spiff.MULTI_KEY) and ctx.current_activity == bpmn_id:
            return
        # a preScript on the activity (spiffworkflow:scriptsOnInstances off) runs first and may set
        # the input collection: it is required once the script ran (exec_script)
        data = self._multi_data(task, ctx, required=not getattr(spec, "prescript", None))
        task.internal_data.pop(MI_OWNERS_KEY, None)  # whose values an earlier run of it brought (_merge_instance)
        ctx.begin_activity(bpmn_id, actor=bpmn_id)
        task.internal_data[spiff.MULTI_KEY] = True
        task.data = data

    def _multi_data(self, task: Any, ctx: LayeredContext, *, required: bool) -> dict[str, Any]:
        """What SpiffWorkflow reads of a multi-instance task's data: the input collection (and a map
        output collection), from the context."""
        spec = task.task_spec
        data: dict[str, Any] = {}
        name = spiff.data_name(spec.data_input)
        if name is not None:
            value = ctx.get(name, ABSENT)
            if value is ABSENT and required:
                raise ActivityError(f"multi-instance activity {spec.bpmn_id!r}: its input collection {name!r} "
                                    f"(loopDataInputRef) is in no layer of the context{_folded_hint(ctx, name)}",
                                    task_id=spec.bpmn_id)
            if value is not ABSENT:
                if value is None or isinstance(value, (bool, int, float)):
                    # SpiffWorkflow iterates it: "TypeError: 'int' object is not iterable"
                    raise ActivityError(f"multi-instance activity {spec.bpmn_id!r}: its input collection {name!r} "
                                        f"(loopDataInputRef) is {short(thaw(value))} ({type(value).__name__}), "
                                        "nothing to run an instance per item of; give it a list (one instance per "
                                        "item) or an object (one per key) before the task, or use a "
                                        "loopCardinality for a count", task_id=spec.bpmn_id)
                data[name] = thaw(value)
        out = spiff.data_name(spec.data_output)
        if out is not None and out != name:
            _refuse_a_filled_output_list(ctx, spec.bpmn_id, out)
        # over a count (loopCardinality) SpiffWorkflow starts the output list itself: its check of an
        # output that exists fails (a typo, ``data_ouput``), and it could only append to a map
        if out is not None and out != name and name is not None:
            value = ctx.get(out, ABSENT)
            # a map is updated key by key (SpiffWorkflow's rule); a list starts empty each time, but
            # is handed over: SpiffWorkflow collects into a list, whatever the input collection is
            if isinstance(value, Mapping):
                if isinstance(data.get(name), list):
                    # SpiffWorkflow would key each output by its item's number ({0: ...}), which no JSON
                    # object holds: the write of the collection failed once every instance had run
                    raise ActivityError(
                        f"multi-instance activity {spec.bpmn_id!r} collects into {out!r} (loopDataOutputRef), an "
                        f"object, over the list {name!r} (loopDataInputRef): each output would be keyed by its "
                        f"item's number, and context values are JSON, whose object keys are text; start it as a "
                        f"list ({out} = []) to collect the outputs in the order of the items, or give {name!r} "
                        "as an object (one instance per key)", task_id=spec.bpmn_id)
                data[out] = thaw(value)
            elif value is not ABSENT and isinstance(thaw(value), list):
                data[out] = []
        return data

    def abort_multi(self, task: Any, err: BaseException) -> None:
        ctx = self.context_of(task)
        bpmn_id = task.task_spec.bpmn_id
        if task.internal_data.pop(spiff.MULTI_KEY, None) and ctx.current_activity == bpmn_id:
            ctx.abort_activity(bpmn_id, reason=_one_line(err), actor="engine")
        task.data = {}

    def complete_multi(self, task: Any) -> bool:
        """Every instance merged: the output collection goes to WORKING, the activity completes.
        True when its postScript threw a BPMN error instead: the activity is closed, what it wrote
        (the output collection too) dropped, and the error thrown to the events that catch it."""
        spec = task.task_spec
        bpmn_id = spec.bpmn_id
        ctx = self.context_of(task)
        cfg = self.process.config(bpmn_id)
        out = spiff.data_name(spec.data_output)
        try:
            if ctx.current_activity != bpmn_id:
                raise ActivityError(f"multi-instance activity {bpmn_id!r} completes, but its activity is not open "
                                    f"in context {ctx.name!r}", task_id=bpmn_id)
            actx = ActivityContext(ctx, task_id=bpmn_id, config=cfg, instance_id=self.instance.id)
            if out is not None and out in task.data:
                collected = task.data[out]
                if isinstance(collected, list):
                    collected = spiff.in_instance_order(task, collected)
                write_result(actx, {out: collected})
            postscript = getattr(spec, "postscript", None)  # on the activity: once, after every instance
            if postscript:
                run_script(postscript, actx, filename=_script_name("postScript", bpmn_id))
            preserve = cfg.effective_preserve_keys if cfg is not None else []
            ctx.complete_activity(bpmn_id, preserve_keys=preserve, actor=bpmn_id)
        except BpmnError as err:
            self._throw_error(task, ctx, err, multi=task)
            return True
        except BaseException as err:
            self.abort_multi(task, err)
            raise _activity_error(bpmn_id, err, ctx, self.instance.contexts.values(), task) from err
        task.internal_data.pop(spiff.MULTI_KEY, None)
        task.data = {}  # no successor inherits spiff's bookkeeping
        for child in task.children:
            child.data = {}
        self._activity_done(ctx, cfg, bpmn_id)
        return False

    def _run_instance(self, task: Any, multi: Any, default_run: Callable[[], Any]) -> Any:
        """One instance of a multi-instance activity, inside the activity of ``multi``: its input
        item in EPHEMERAL and in its scope, its output item kept in its scope (then handed to
        SpiffWorkflow, which collects it), any other write into the activity's WORKING."""
        spec = task.task_spec
        bpmn_id = spec.bpmn_id
        mspec = multi.task_spec
        ctx = self.context_of(task)
        cfg = self.process.config(bpmn_id)
        item = spiff.data_name(mspec.input_item)
        out = spiff.data_name(mspec.output_item) if mspec.data_output is not None else None
        index = task.internal_data.get("key_or_index", task.internal_data.get("item"))
        scope: dict[str, Any] = {}
        if item is not None and item in task.data:
            scope[item] = task.data[item]
        scoped = {n for n in (item, out) if n is not None}
        task.data = {}
        if ctx.current_activity != bpmn_id and spiff.THROWN_KEY in multi.internal_data:
            return None  # another instance threw a BPMN error, which ends the activity: its catcher runs next
        if ctx.current_activity != bpmn_id:
            raise ActivityError(f"an instance of multi-instance activity {bpmn_id!r} runs, but the activity is "
                                f"not open in context {ctx.name!r}", task_id=bpmn_id)
        try:
            if item is not None and item in scope:
                ctx.apply_changes([(Layer.EPHEMERAL, item, scope[item])], kind="instance_item", actor=bpmn_id,
                                  data={"activity": bpmn_id, "instance": _jsonable(index)})
            if cfg is not None and cfg.knowledge_config is not None:
                self._retrieve(ctx, cfg, task)
            actx = ActivityContext(ctx, task_id=bpmn_id, task_name=spec.bpmn_name, config=cfg,
                                   instance_id=self.instance.id, data=self._form_data(task),
                                   documentation=getattr(spec, "documentation", None), scope=scope, scoped=scoped)
            prescript = getattr(spec, "prescript", None)
            if prescript:
                run_script(prescript, actx, filename=_script_name("preScript", bpmn_id))
            result = self._run_handler(task, actx, cfg, default_run)
            if result is _SUSPENDED:
                raise ActivityError(f"an instance of multi-instance activity {bpmn_id!r} cannot wait for a "
                                    f"confirmation (llm.tools with human_confirm)", task_id=bpmn_id)
            postscript = getattr(spec, "postscript", None)
            if postscript:
                run_script(postscript, actx, filename=_script_name("postScript", bpmn_id))
            if out is not None and out not in actx.scope:
                raise no_output_item(bpmn_id, index, mspec.output_item)
            if item is not None and item in ctx.layer(Layer.EPHEMERAL):
                ctx.apply_changes([(Layer.EPHEMERAL, item, DELETED)], kind="instance_done", actor=bpmn_id,
                                  data={"activity": bpmn_id, "instance": _jsonable(index),
                                        **({"output": {out: actx.scope[out]}} if out is not None else {})})
        except BpmnError as err:
            return self._throw_error(task, ctx, err, multi=multi)
        except BaseException as err:
            self.abort_multi(multi, err)
            raise _activity_error(bpmn_id, err, ctx, self.instance.contexts.values(), task) from err
        task.data = {n: actx.scope[n] for n in (item, out) if n is not None and n in actx.scope}
        self.instance.activities += 1  # a save point: the instance is saved after each instance
        return True if result is None else result

    def _throw_error(self, task: Any, ctx: LayeredContext, err: BpmnError, multi: Any = None) -> None:
        """Activity ``task`` raised ``BpmnError``: what it wrote is dropped (its activity aborted, as
        a failing one's), an ``activity:<id>`` record with status ``error_thrown`` (its code and
        message) goes into HISTORY, and the error is thrown to the events that catch it
        (``spiff.error_catchers``). Caught by an event sub-process or by a boundary event of a
        sub-process around, the throwing branch ends as at an error end event: it merges up, the
        other branches are dropped (``terminate``). The task stays STARTED until the catching event
        cancels it. Nothing catching it, the instance fails (UncaughtBpmnError), and ``resume``
        runs the activity again."""
        bpmn_id = spiff.bpmn_id_of(task)
        try:
            payload = thaw(freeze(err.payload))
        except (TypeError, ValueError) as bad:
            self._abort_thrower(task, ctx, multi, bad)
            raise ActivityError(f"activity {bpmn_id!r} threw BPMN error {err.code!r} with a payload that is not "
                                f"JSON ({bad}); give BpmnError a payload of JSON values", task_id=bpmn_id) from bad
        catchers, levels, own = spiff.error_catchers(task, err.code)
        self._abort_thrower(task, ctx, multi, err)
        if not catchers:
            raise UncaughtBpmnError(err, bpmn_id)
        if multi is not None:
            multi.internal_data[spiff.THROWN_KEY] = err.code
        by = [spiff.bpmn_id_of(t) for t in catchers]
        ctx.begin_activity(bpmn_id, actor=bpmn_id)
        ctx.complete_activity(bpmn_id, status="error_thrown", actor=bpmn_id,
                              summary=f"threw BPMN error {err.code!r}" + (f": {err.message}" if err.message else "")
                              + f"; caught by {', '.join(by)}",
                              details={"error_code": err.code, "error_message": err.message, "caught_by": by})
        self.instance.activities += 1
        if self.engine.progress is not None:  # it ended, as a completed one does: say so, with its error
            self.engine.progress(self.instance, bpmn_id, ctx)
        if not own:
            # as an error end event in that branch: it merges up to the catching scope (``terminate``)
            if levels and spiff.caught_in_scope(catchers[0].task_spec):
                task.internal_data[spiff.CAUGHT_UP_KEY] = levels
            self.terminate(task)
        spiff.throw_activity_error(catchers, err.code, {"code": err.code, "message": err.message,
                                                        "payload": payload, "by": bpmn_id})
        return None

    def _abort_thrower(self, task: Any, ctx: LayeredContext, multi: Any, err: BaseException) -> None:
        bpmn_id = spiff.bpmn_id_of(task)
        if multi is not None:
            self.abort_multi(multi, err)
        elif ctx.current_activity == bpmn_id:
            ctx.abort_activity(bpmn_id, reason=_one_line(err), actor="engine")

    def caught_error(self, task: Any, thrown: dict[str, Any], variables: list[str]) -> None:
        """The event that caught a BPMN error an activity threw runs: ``error_code`` and
        ``error_message`` go into WORKING of its context, with the payload under the event's
        error variable (``spiffworkflow:variableName``), else as its keys; recorded as
        ``event:<catch event id>`` (``events.catch_thrown``)."""
        payload = dict(thrown.get("payload") or {})
        values: dict[str, Any] = {variables[0]: payload} if variables else payload
        values.update(error_code=thrown["code"], error_message=thrown.get("message"))
        events.catch_thrown(self.context_of(task), task, values, code=thrown["code"])

    def _activity_done(self, ctx: LayeredContext, cfg: ActivityExtensionConfig | None, bpmn_id: str) -> None:
        self.instance.activities += 1
        record = (_after_activity(ctx, cfg, task_id=bpmn_id, model=self.engine.compression_model(cfg),
                                  redact=self.process.redact_for(bpmn_id))
                  if self.engine.compress else None)
        if record is not None:
            slips = _folded_preserve_slips(ctx, record)
            if slips:  # a misspelt preserveKeys entry let the compression fold the key it was meant for
                record["notes"] = [*(record.get("notes") or []), *slips]
                self.instance.notices.extend(f"the compression after {bpmn_id!r}: {slip}" for slip in slips)
            self.instance.compressions.append(record)
        if self.engine.progress is not None:
            self.engine.progress(self.instance, bpmn_id, ctx)

    def loop_scope(self, task: Any) -> dict[str, Any] | None:
        """What a condition at a multi-instance task (cardinality) or one of its instances
        (completionCondition) sees before the context: the collections, the instance's items."""
        if spiff.is_multi(task.task_spec):
            return dict(task.data)
        multi = spiff.multi_instance_of(task)
        if multi is not None:
            return {**multi.data, **task.data}
        return None

    def _run_handler(self, task: Any, actx: ActivityContext, cfg: ActivityExtensionConfig | None,
                     default_run: Callable[[], Any]) -> Any:
        spec = task.task_spec
        model = self._model_for(cfg) if cfg is not None and cfg.llm is not None else None
        if model is not None and cfg is not None and cfg.llm is not None:
            from .llm import ModelCallFailed, run_llm_activity

            try:
                if cfg.llm.tools:
                    answer = self.run_with_tools(task, actx, cfg, model)
                    if answer is None:
                        return _SUSPENDED
                else:
                    answer = run_llm_activity(actx, cfg, model=model, redact=self.process.redact_for(spec.bpmn_id))
            except ModelCallFailed as err:
                if cfg.llm.on_error is None:
                    raise
                # llm.onError.throw: the model's failure is the BPMN error the modeler drew a path for
                self.context_of(task).record("activity_model_failed", actor=spec.bpmn_id, data={
                    "task_id": spec.bpmn_id, "error": f"{type(err).__name__}: {err}"[:2000],
                    "thrown": cfg.llm.on_error.throw})
                raise BpmnError(cfg.llm.on_error.throw, str(err),
                                {"failed_model": err.model, "model_attempts": err.attempts}) from err
            write_result(actx, answer)
            return None
        handler = self._handler_for(spec.bpmn_id, cfg)
        if handler is not None:
            result = handler(actx)
            if cfg is not None and cfg.llm is not None:
                _check_offline_answer(spec.bpmn_id, cfg, result)
            write_result(actx, result)
            if actx.data:
                write_result(actx, actx.data)
            return None
        operator = self._operator_of(spec)
        if operator is not None:
            # a SpiffArena service task: the handler registered under its operator's name (a
            # connector) gets the operator's parameters, evaluated over the context, in
            # actx.params; what it returns is the task's result variable, as SpiffWorkflow sets it
            actx.params = {name: evaluate_expression(str(param.get("value")), actx.context, actx.scope or None)
                           for name, param in (spec.operation_params or {}).items()}
            write_result(actx, {spec.result_variable: operator(actx)})
            return None
        if isinstance(spec, ScriptTaskMixin):
            if not (spec.script or "").strip():  # SpiffWorkflow fails on it too (exec of None)
                raise ActivityError(f"script task {spec.bpmn_id!r} has no script (an empty or missing bpmn:script; "
                                    "a zeebe:script is not run): write its Python script, or give it a handler "
                                    f"(@activity({spec.bpmn_id!r}), or 'handler' in its config)", task_id=spec.bpmn_id)
            run_script(spec.script, actx, filename=_script_name("script", spec.bpmn_id))
            return None
        if isinstance(spec, BusinessRuleTaskMixin):
            if getattr(spec, "result_variable", None):
                self._run_decision_into_variable(task, actx)
                return None
            return self._run_native(task, actx, default_run)
        if isinstance(spec, NoneTaskMixin) or isinstance(spec, UserTaskMixin) or spec.manual:
            write_result(actx, actx.data)
            return None
        if cfg is not None and cfg.llm is not None:  # a model call, run offline: nothing to run it by
            raise ActivityError(f"task {spec.bpmn_id!r} is a model call (its config has an llm: block) but no model "
                                "is configured and it has no offline handler; pass --model (or set llm.model in its "
                                f"config), or give it a handler (@activity({spec.bpmn_id!r}), or 'handler' in its "
                                "config) to run offline", task_id=spec.bpmn_id)
        operation = getattr(spec, "operation_name", None)
        connector = (f"@activity({operation!r}) for its spiffworkflow:serviceTaskOperator (it gets the operator's "
                     "parameters in ctx.params), " if isinstance(spec, ServiceTaskMixin) and operation
                     and operation != spec.bpmn_id else "")
        unread = ""
        if spec.bpmn_id in REGISTRY and spec.bpmn_id not in self.engine.handlers:
            unread = (f" (@activity({spec.bpmn_id!r}) registered one process-wide, which this Engine does not read: "
                      "it was given a HandlerRegistry of its own; register it there with @activity(..., registry=...), "
                      "or give the Engine REGISTRY.layered({...}) or a dict of extra handlers)")
        raise ActivityError(f"task {spec.bpmn_id!r} ({type(spec).__name__.removeprefix('Layerflow')}) has no "
                            f"handler; register one with {connector}@activity({spec.bpmn_id!r}) or set 'handler' "
                            f"in its config{unread}", task_id=spec.bpmn_id)

    def run_with_tools(self, task: Any, actx: ActivityContext, cfg: ActivityExtensionConfig,
                       model: str) -> dict[str, Any] | None:
        """An LLM activity with the governance tools (``llm.tools: true``) on this running
        instance; its answer, or None when it waits for a person (a ``human_confirm``).

        Waiting, the activity stays open (its context keeps the tool calls' effects) and
        the conversation is kept in ``instance.suspended`` (saved with the instance, so
        another process can resume it); the confirmation is bound to this task, so
        ``answer`` runs the task again once every confirmation it asked is answered, and
        the model is given the answers as the results of its ``human_confirm`` calls. A model
        that fails then leaves the activity open and the conversation kept: ``resume`` goes on.
        """
        from .llm import ModelCallFailed, run_llm_tool_activity
        from .tools import LiveGovernance, dispatch_tool, tool_schemas

        inst = self.instance
        key = str(task.id)
        bpmn_id = actx.task_id
        suspended = inst.suspended.pop(key, None)
        answers: dict[str, Any] | None = None
        if suspended is not None:
            waited = set(suspended["confirmations"])
            answers = {c["id"]: {"answer": c.get("answer"), "timed_out": bool(c.get("timed_out")),
                                 **({"unattended": True} if c.get("unattended") else {})}
                       for c in inst.confirmations if c["id"] in waited}
            for cid in waited:
                self.answers.pop(cid, None)  # read here; a join never asks for these
        redact = self.process.redact_for(bpmn_id)
        service = LiveGovernance(self.engine, inst, actx.context, activity_id=bpmn_id, task=key, model=model,
                                 redact=redact)

        def dispatch(name: str, arguments: str) -> dict[str, Any]:
            return dispatch_tool(service, inst.id, name, arguments, actor=bpmn_id)

        try:
            outcome = run_llm_tool_activity(actx.context, bpmn_id, cfg.llm, model=model, dispatch=dispatch,
                                            schemas=tool_schemas(), answers=answers,
                                            state=None if suspended is None else suspended["state"],
                                            scoped=actx.scoped, redact=redact)
        except ModelCallFailed:
            if suspended is not None:
                # the person answered and then the model failed: the conversation stays where it
                # stood (the activity open, ``run_activity`` keeps it), so ``resume`` gives the model
                # the answers it was waiting for instead of starting over and asking again
                inst.suspended[key] = {**suspended, "model_failed": True}
            raise
        if outcome.answer is not None:
            return outcome.answer
        inst.suspended[key] = {"task_id": bpmn_id, "context": actx.context.name,
                               "confirmations": list(outcome.waiting), "state": outcome.state}
        return None

    def _run_native(self, task: Any, actx: ActivityContext, default_run: Callable[[], Any]) -> Any:
        """SpiffWorkflow's own behaviour (DMN) on a task.data filled from the context, diffed back."""
        resolved = actx.context.resolved()
        before = {k: thaw(v) for k, v in resolved.items()}
        # thawed twice: a decision writing into a nested object (an output named
        # ``claim.grade``) must not change the baseline its changes are diffed against
        task.data = {k: thaw(v) for k, v in resolved.items()}
        try:
            result = default_run()
            changed = {k: v for k, v in task.data.items() if k not in before or not json_equal(before[k], v)}
            try:
                write_result(actx, changed)
            except ContextWriteDenied as err:  # the modeler named the key in the table, not in code
                raise ContextWriteDenied(err.key, err.requested, err.effective,
                                         f"{err.reason}; {self._decision_outputs_of(task.task_spec, err.key)}",
                                         op=err.op) from None
        finally:
            task.data = {}
        return result

    @staticmethod
    def _decision_outputs_of(spec: Any, key: str) -> str:
        """Which outputs of a business rule task's decision table write ``key``, and what to do."""
        table = spec.dmnEngine.decision_table
        names = [n for n in (o.name or o.label for o in table.outputs) if n and (n == key or n.startswith(f"{key}."))]
        named = ", ".join(repr(n) for n in names) or repr(key)
        instead = names[0].replace(".", "_") if names else f"{key}_result"
        return (f"the output {named} of decision table {table.id!r} (business rule task {spec.bpmn_id!r}) writes it: "
                f"name the output after a key of its own (e.g. {instead!r}), or keep {key!r} out of the data the "
                "instance starts with")

    @staticmethod
    def _run_decision_into_variable(task: Any, actx: ActivityContext) -> None:
        """A business rule task with a result variable (Camunda's ``resultVariable``): the
        decision's result, shaped by ``engine.dmn.decision_result``, is the one key it writes."""
        spec = task.task_spec
        table = spec.dmnEngine.decision_table
        task.data = {k: thaw(v) for k, v in actx.context.resolved().items()}
        try:
            rows = [dict(rule.output_as_dict(task)) for rule in spec.dmnEngine.decide(task)]
        finally:
            task.data = {}
        if table.hit_policy in ("FIRST", "ANY"):
            rows = rows[:1]  # decide() keeps every match of a table that is not UNIQUE; the first decides
        try:
            value = dmn.decision_result(spec.result_mapping, rows, outputs=[o.name or o.label for o in table.outputs],
                                        multiple_hits=table.hit_policy == "COLLECT")
        except dmn.DecisionResultError as err:
            raise ActivityError(f"business rule task {spec.bpmn_id!r} cannot put the result of decision table "
                                f"{table.id!r} in {spec.result_variable!r}: {err}", task_id=spec.bpmn_id) from None
        try:
            write_result(actx, {spec.result_variable: value})
        except ContextWriteDenied as err:  # the modeler's name for the result, not a handler's key
            raise ContextWriteDenied(err.key, err.requested, err.effective,
                                     f"{err.reason}; it is the result variable {spec.result_variable!r} of business "
                                     f"rule task {spec.bpmn_id!r}: name another result variable (resultVariable)",
                                     op=err.op) from None

    def _handler_for(self, bpmn_id: str, cfg: ActivityExtensionConfig | None) -> Handler | None:
        name = cfg.handler if cfg is not None and cfg.handler else None
        key = name or f"id:{bpmn_id}"
        if key in self._handler_cache:
            return self._handler_cache[key]
        handler: Handler | None
        if name is not None:
            handler = self.engine.handlers.get(name)
            if handler is None:
                if ":" in name:
                    handler = load_handler_reference(name, self.process.base_dir)
                else:
                    raise ActivityError(f"handler {name!r} of task {bpmn_id!r} is not registered; known: "
                                        f"{', '.join(self.engine.handlers.names()) or 'none'}", task_id=bpmn_id)
        else:
            handler = self.engine.handlers.get(bpmn_id) or self._file_handler(bpmn_id)
        self._handler_cache[key] = handler
        return handler

    def _operator_of(self, spec: Any) -> Handler | None:
        """The handler registered under a service task's spiffworkflow:serviceTaskOperator name."""
        name = getattr(spec, "operation_name", None)
        if not isinstance(spec, ServiceTaskMixin) or not name or name == spec.bpmn_id:
            return None  # no operator: the parser names the operation after the task
        key = f"operator:{name}"
        if key not in self._handler_cache:
            self._handler_cache[key] = self.engine.handlers.get(name) or self._file_handler(name)
        return self._handler_cache[key]

    def _file_handler(self, bpmn_id: str) -> Handler | None:
        """A handler registered under ``bpmn_id`` by a handler file this process's config refers to."""
        refs = dict.fromkeys(c.handler for c in self.process.configs.values() if c.handler and ".py:" in c.handler)
        for ref in refs:
            registry = file_handlers(ref, self.process.base_dir)
            found = registry.get(bpmn_id) if registry is not None else None
            if found is not None:
                return found
        return None

    def _model_for(self, cfg: ActivityExtensionConfig) -> str | None:
        if cfg.llm is None:
            return None
        return self.engine.model or cfg.llm.model

    def _retrieve(self, ctx: LayeredContext, cfg: ActivityExtensionConfig, task: Any) -> None:
        kc = cfg.knowledge_config
        assert kc is not None
        retriever = self.engine.retriever_for(self.process)
        query, absent = _knowledge_query(ctx, kc.query, task)
        kept = dropped = 0
        for collection in kc.rag_collections:
            for hit in retriever.retrieve(collection, query, top_k=kc.top_k):
                if not isinstance(hit, Hit):  # a retriever of the application's own, wrongly typed
                    raise TypeError(f"retriever {type(retriever).__name__}.retrieve({collection!r}, ...) returned a "
                                    f"{type(hit).__name__} ({hit!r:.80}), not an engine.Hit: return "
                                    "Hit(collection, source, text, score, confidence) for each passage")
                if hit.confidence < kc.confidence_threshold:
                    dropped += 1
                    continue
                ctx.write(Layer.KNOWLEDGE, hit.key, hit.to_value(), actor="retriever")
                kept += 1
        data: dict[str, Any] = {"collections": list(kc.rag_collections), "query": query[:500], "kept": kept,
                                "dropped": dropped, "threshold": kc.confidence_threshold}
        # a misspelt collection finds nothing; say so where an auditor looks (validate warns too). The
        # retrieval above has just read each folder: it tells, without listing the root every time
        missing = [c for c in kc.rag_collections if not retriever.has_collection(c)] \
            if isinstance(retriever, BM25Retriever) else []
        if missing:
            data["missing"] = missing
        if absent:  # a template field the context lacks reads as "": a misspelt key empties the query
            data["absent"] = absent
        ctx.record("retrieval", actor="retriever", data=data)

    # ----- expressions and scripts ----------------------------------------------------------

    def evaluate(self, task: Any, expression: str, external: Mapping[str, Any] | None = None) -> Any:
        if isinstance(task.task_spec, ExclusiveGateway):
            verdicts = self._xor.get(str(task.id))
            if verdicts is None:
                verdicts = self.decide_exclusive(task)
            if verdicts is not None and expression in verdicts:
                return verdicts[expression]
        if spiff.is_multi(task.task_spec) and expression == getattr(task.task_spec, "cardinality", None):
            return _cardinality(spiff.bpmn_id_of(task), expression, self._evaluate(task, expression, external))
        return self._evaluate(task, expression, external)

    def _evaluate(self, task: Any, expression: str, external: Mapping[str, Any] | None = None) -> Any:
        """``expression`` over the task's context (a loop's items first). ``external`` is read after
        the context, as SpiffWorkflow reads it after task data: a conditional event reads the
        workflow's data objects there, which another branch may have set. A data object the
        branch holds only as it was when the branch began (its copy from before the split) is
        read as the process holds it now: another branch may have written it since (BPMN: a data
        object is the process's), where SpiffWorkflow 3.2 reads the stale copy and waits for ever."""
        if not (expression or "").strip():
            # a conditional event whose condition was never written (SpiffWorkflow: "Error evaluating
            # expression 'None'"); validate refuses it, a process loaded without validation ends here
            where = spiff.bpmn_id_of(task)
            raise ActivityError(f"{where!r} has no condition to evaluate (an empty bpmn:condition, as a modeler "
                                "saves a conditional event not filled in): write the Python expression over the "
                                "context it waits to hold, e.g. approved == True", task_id=where)
        ctx = self.context_of(task)
        scope = self.loop_scope(task)
        if external:
            own = {k for k in external if k in ctx and _set_in_branch(ctx, k)}
            scope = {**{k: v for k, v in external.items() if k not in own}, **(scope or {})}
        try:
            return evaluate_expression(expression, ctx, scope)
        except Exception as err:  # noqa: BLE001
            if _not_set_yet(task, expression, err, ctx):
                return False
            where = spiff.bpmn_id_of(task)
            # a key a compression folded away was there: say which compression, not "give it a value"
            hint = (_compressed_away(ctx, err) or _rolled_back(ctx, err) or _unanswered_field(task, err)
                    or _unknown_name(err, ctx, task, where, "expression") or _name_hint(err, where)
                    or _dmn_type_hint(task, err, ctx))
            raise ActivityError(f"{_expression_kind(task, expression)} {expression.strip()!r}"
                                f"{_flow_of(task, expression)} at {where!r} failed: {type(err).__name__}: {err}{hint}",
                                task_id=where) from err

    def exec_script(self, task: Any, script: str) -> bool:
        """A pre/post script SpiffWorkflow runs outside an activity's run (``spiff.execute_script``):
        True when it threw a BPMN error, which is thrown to the events that catch it as an
        activity's own (``_throw_error``); the task then goes no further."""
        ctx = self.context_of(task)
        bpmn_id = spiff.bpmn_id_of(task)
        spec = task.task_spec
        multi = spiff.is_multi(spec) and task.internal_data.get(spiff.MULTI_KEY)
        where = ("preScript" if script == getattr(spec, "prescript", None)
                 else "postScript" if script == getattr(spec, "postscript", None) else "script")
        # a pre/post script of a task that is no activity (a sub-process, a call activity, a send
        # or receive task) runs as one of its own, so its writes move into HISTORY as any activity's
        own = not multi and ctx.current_activity is None
        # an instance of a multi-instance sub-process (spiffworkflow:scriptsOnInstances) reads and
        # sets its own items, which SpiffWorkflow keeps in the instance's task data
        owner = None if multi else spiff.multi_instance_of(task)
        scoped = {n for n in (spiff.data_name(owner.task_spec.input_item),
                              spiff.data_name(owner.task_spec.output_item)
                              if owner.task_spec.data_output is not None else None) if n is not None} \
            if owner is not None else set()
        if owner is not None and spiff.THROWN_KEY in owner.internal_data and ctx.current_activity != bpmn_id:
            return True  # another instance threw a BPMN error, which ends the activity: its catcher runs next
        actx = ActivityContext(ctx, task_id=bpmn_id, instance_id=self.instance.id,
                               scope={n: task.data[n] for n in scoped if n in task.data}, scoped=scoped)
        if own:
            ctx.begin_activity(bpmn_id, actor=bpmn_id)
        try:
            run_script(script, actx, filename=_script_name(where, bpmn_id))
            task.data.update({n: actx.scope[n] for n in scoped if n in actx.scope})
        except BpmnError as err:
            # the script's activity (its own, the multi-instance activity it runs in) closes
            self._throw_script_error(task, ctx, err, multi=task if multi else owner)
            return True
        except BaseException as err:
            if own:
                ctx.abort_activity(bpmn_id, reason=_one_line(err), actor="engine")
            raise _activity_error(bpmn_id, err, ctx, self.instance.contexts.values(), task) from err
        if own:
            ctx.complete_activity(bpmn_id, summary=f"{where} of {bpmn_id}", actor=bpmn_id)
            self._activity_done(ctx, self.process.config(bpmn_id), bpmn_id)
        if multi:  # the preScript of a multi-instance activity, in its activity: SpiffWorkflow reads the collections next
            task.data.update(self._multi_data(task, ctx, required=True))
        return False

    def _throw_script_error(self, task: Any, ctx: LayeredContext, err: BpmnError, multi: Any = None) -> None:
        """``_throw_error`` for a pre/post script SpiffWorkflow runs as the task updates or completes:
        the activity's error boundary events may not wait yet (``spiff.arm_error_boundaries``)."""
        spiff.arm_error_boundaries(task)
        self._throw_error(task, ctx, err, multi=multi)

# =============================================================================== helpers

def _refuse_a_filled_output_list(ctx: LayeredContext, bpmn_id: str, out: str) -> None:
    """A multi-instance activity collects into a new list each pass (a loop back into it fills anew
    the list it filled before), so items the list holds as the activity first runs would be lost
    without a word: refused, as SpiffWorkflow refuses them ("the output must be empty or it must be
    a map"). Its own earlier pass is known by its record in HISTORY (``activity:ID``, ``#2``...), or in
    what a compression folded (a ``compaction:<n>`` record ``covers`` it), or by the context's count
    of the activity's runs."""
    value = ctx.get(out, ABSENT)
    if isinstance(value, Mapping) or value is ABSENT:
        return
    items = thaw(value)
    if not isinstance(items, list) or not items:
        return
    if ctx.runs(bpmn_id):
        return
    record = f"activity:{bpmn_id}"

    def ours(key: Any) -> bool:
        return isinstance(key, str) and (key == record or key.startswith(record + "#"))

    for key, entry in ctx.layer(Layer.HISTORY).items():
        if ours(key) or (key.startswith("compaction:") and isinstance(entry, Mapping)
                         and any(ours(k) for k in entry.get("covers") or ())):
            return
    raise ActivityError(
        f"multi-instance activity {bpmn_id!r} collects into {out!r} (loopDataOutputRef), which holds "
        f"{len(items)} item{'s' if len(items) != 1 else ''} ({short(items)}) before the activity ever ran: the "
        f"outputs of its instances would replace them. Start it empty ({out} = []) before the activity, "
        f"collect into another name and combine the two after it, or make {out!r} an object to update it key by "
        "key", task_id=bpmn_id)


_FAR = datetime.max.replace(tzinfo=timezone.utc)


def _jsonable(value: Any) -> Any:
    return value if isinstance(value, (str, int, float, bool, type(None))) else str(value)


def _cycle_states(wf: Any) -> dict[Any, tuple[Any, ...]]:
    """Where each waiting cycle timer stands (repetitions left, next due time, fired)."""
    return {t.id: (repr(t.internal_data.get("event_value")), t.internal_data.get("event_fired"))
            for t in _all_tasks(wf, TaskState.WAITING) if spiff.is_cycle(t)}


def _checked_start_data(process: Process, data: Mapping[str, Any] | None) -> Mapping[str, Any] | None:
    """The start data checked against the form on the process's none start event (in a collaboration,
    on each pool's that starts with the instance), as a user task's answer is (``_Runtime._check_form``),
    with the defaults of the fields it omits; ``StartDataInvalid`` before anything exists when it does
    not fit, ``StartInputsMissing`` when it lacks a data input the process's own ioSpecification
    declares (SpiffWorkflow would fail on it later, with a NameError only)."""
    found = spiff.start_forms(process.spec, process.subprocess_specs)
    answer: dict[str, Any] = dict(data or {})
    for event_id, form, owner in found:
        given = dict(data or {})
        # nothing holds a value yet but SYSTEM: what a field shows when its key is a SYSTEM key
        held = {**given, **process.system}
        form = forms.with_options(form, {key: held[key] for key in forms.option_keys(form) if key in held})
        prefilled = {str(f["id"]): process.system[f["id"]] for f in form.get("fields") or [] if f["id"] in process.system}
        checked, problems = forms.check_answer(form, given, prefilled)
        if problems:
            from .governance import StartDataInvalid

            raise StartDataInvalid(event_id, problems, form, process_id=process.id, file=getattr(owner, "file", None),
                                   pool=owner.name if owner is not process.spec else None)
        fields = {str(f["id"]) for f in form.get("fields") or []}
        answer.update({k: v for k, v in checked.items() if k in fields or k not in answer})
    for owner, declared in spiff.start_data_inputs(process.spec, process.subprocess_specs):
        missing = [name for name in declared if name not in answer and name not in process.system]
        if missing:
            from .governance import StartInputsMissing

            raise StartInputsMissing(missing, declared, process_id=process.id, file=getattr(owner, "file", None),
                                     pool=owner.name if owner is not process.spec else None)
    return answer if found or data is None else data


def _with_options(form: Mapping[str, Any], ctx: LayeredContext) -> dict[str, Any]:
    """A user task's form with the options its fields take from the context (SpiffArena's
    ``options_from_task_data_var:``) as the task waits: what its waiting item shows is what its
    answer is checked against."""
    return forms.with_options(form, {key: thaw(ctx.resolve(key)) for key in forms.option_keys(form) if key in ctx})


def _ready_tasks(wf: Any) -> list[Any]:
    tasks: dict[Any, Any] = {}  # by id: the workflow's iterator also reaches some sub-process tasks
    for sp in sorted(wf.get_active_subprocesses(), key=lambda s: s.depth, reverse=True):
        tasks.update((t.id, t) for t in spiff.tasks_in_state(sp, TaskState.READY))
    tasks.update((t.id, t) for t in spiff.tasks_in_state(wf, TaskState.READY) if t.id not in tasks)
    return list(tasks.values())


def _all_tasks(wf: Any, state: int) -> list[Any]:
    if state == TaskState.ERROR:
        # SpiffWorkflow's iterator does not descend below a STARTED task when it looks for
        # finished states, and an instance of a multi-instance task sits below one
        tasks = [t for t in wf.tasks.values() if t.state == state]
        for sp in wf.subprocesses.values():
            tasks.extend(t for t in sp.tasks.values() if t.state == state)
        return tasks
    # SpiffWorkflow's iterator goes down into the sub-processes that have not finished, and
    # the sub-processes are searched again for those below a finished task: each task once
    once = {t.id: t for t in spiff.tasks_in_state(wf, state)}
    for sp in wf.subprocesses.values():
        for t in spiff.tasks_in_state(sp, state):
            once.setdefault(t.id, t)
    return list(once.values())


def _knowledge_query(ctx: LayeredContext, template: str | None, task: Any) -> tuple[str, list[str]]:
    """The retrieval query, and the template's fields the context does not hold (each read as "")."""
    if template:
        fields = _Fields(ctx)
        try:
            return template.format_map(fields), fields.absent
        except (ValueError, IndexError):
            return template, []
    spec = task.task_spec
    parts = [spec.bpmn_name or spec.bpmn_id, getattr(spec, "documentation", None) or ""]
    for value in ctx.layer(Layer.PROCESS).values():
        if isinstance(value, (str, int, float)) and not isinstance(value, bool):
            parts.append(str(value))
    return " ".join(p for p in parts if p), []


class _Fields(dict):  # type: ignore[type-arg]
    """A query template's fields: the context keys it names (thawed on first use), "" for unknown ones
    (listed in ``absent``). Empty as a dict, so filling a template costs the keys it names, not the
    whole context."""

    def __init__(self, ctx: LayeredContext) -> None:
        super().__init__()
        self._ctx = ctx
        self.absent: list[str] = []

    def __missing__(self, key: str) -> Any:
        value = self._ctx.get(key, ABSENT)
        if value is ABSENT:
            self.absent.append(key)
        out = "" if value is ABSENT else thaw(value)
        self[key] = out
        return out


def _check_offline_answer(bpmn_id: str, cfg: ActivityExtensionConfig, result: Any) -> None:
    """A model step's offline handler stands in for the model: its answer is held to the same contract
    (llm.outputSchema / outputKeys), so a run without a model cannot pass what the model's run refuses."""
    llm = cfg.llm
    if llm is None or not isinstance(result, Mapping) or not (llm.output_schema or llm.output_keys):
        return
    problems = answer_problems(result, schema=llm.output_schema, keys=llm.output_keys)
    if problems:
        contract = "llm.outputSchema" if llm.output_schema else "llm.outputKeys"
        by = f" ({cfg.handler})" if cfg.handler else ""
        raise ActivityError(f"model step {bpmn_id!r} ran offline: the answer of its handler{by} does not meet its "
                            f"{contract}: {'; '.join(problems)}; nothing of it was written. A model's answer would be "
                            f"refused the same way: make the handler answer as {contract} says (or correct "
                            f"{contract}), then `layerflow resume` runs the step again", task_id=bpmn_id)


def _script_name(kind: str, bpmn_id: str) -> str:
    return f"<{kind} {bpmn_id}>"


def _set_in_branch(ctx: LayeredContext, key: str) -> bool:
    """Whether ``ctx`` holds ``key`` as it set it, not as its branch began with it (a context
    that is no branch set all it holds)."""
    base = ctx.fork_snapshot
    if base is None:
        return True
    before = base.get(key, ABSENT)
    return before is ABSENT or not json_equal(ctx.get(key), before)


def _unset_data_objects(bpmn_id: str, unset: list[Any], ctx: Any) -> str:
    """What to do about data objects a task's dataOutputAssociation writes and the task did not set
    (SpiffWorkflow would stop with "A data object could not be set", naming no task). A modeler's
    generated id beside the name the task set is named as such."""
    named = [ref.bpmn_name for ref in unset if (ref.bpmn_name or "").isidentifier()
             and ref.bpmn_name != ref.bpmn_id and ctx.get(ref.bpmn_name, ABSENT) is not ABSENT]
    hint = "".join(f"; it set {name!r}, the data object's name, and SpiffWorkflow keys a data object by its id: "
                   f"give the bpmn:dataObject id={name!r} (and its references dataObjectRef={name!r})"
                   for name in named)
    return (f"task {bpmn_id!r} writes the data object(s) {', '.join(repr(ref.bpmn_id) for ref in unset)} (its "
            f"dataOutputAssociation), and did not set them{hint}; set them in the task (its script, handler "
            "or form data), or remove the association")


def _one_line(err: BaseException) -> str:
    text = f"{type(err).__name__}: {err}".splitlines()[0] if str(err) else type(err).__name__
    return text[:500]


def _compressed_away(ctx: LayeredContext | None, err: BaseException,
                     others: Iterable[LayeredContext] = ()) -> str:
    """For a script's NameError on a key a compression removed from HISTORY (in the failing
    context, else in a branch merged into it): which compression, and what to do (the bare
    NameError does not say the data was there)."""
    name = getattr(err, "name", None)
    if not isinstance(err, NameError) or not isinstance(name, str):
        return ""
    return _folded_hint(ctx, name, others)


def _folded_hint(ctx: LayeredContext | None, name: str, others: Iterable[LayeredContext] = ()) -> str:
    """For key ``name`` that a compression removed from HISTORY (and nothing wrote since): which
    compression, and what to do; "" otherwise."""
    if ctx is None or ctx.get(name, ABSENT) is not ABSENT:
        return ""
    for where in [ctx, *(c for c in others if c is not ctx)]:
        for e in reversed(list(where.tape)):
            gone = any(Layer(layer) == Layer.HISTORY and key == name and value is DELETED for layer, key, value in e.changes)
            if any(key == name and value is not DELETED for _, key, value in e.changes):
                break
            if gone:
                if (e.data or {}).get("note") != "compress":
                    break
                branch = "" if where is ctx else f" in context {where.name!r}"
                return (f"; {name!r} was removed from HISTORY by the compression after activity {e.activity or e.actor!r}"
                        f"{branch} (event {e.seq}, snapshot {(e.data or {}).get('snapshot_id')}): add {name!r} to that"
                        f" activity's preserveKeys or narrow its compressRules{_misspelt_preserved(where, name)}")
    return ""


def _rolled_back(ctx: LayeredContext | None, err: BaseException) -> str:
    """For a script's (or condition's) NameError on a key that a rollback took out of the context
    (a restore since the key was last written, and no write or delete of it after): which rollback,
    and what to do. The process did not go back with the context, so the step that wrote the key
    (a message's catch, a person's answer) will not run again to write it."""
    name = getattr(err, "name", None)
    if not isinstance(err, NameError) or not isinstance(name, str) or ctx is None or ctx.get(name, ABSENT) is not ABSENT:
        return ""
    rolled = None
    for e in reversed(list(ctx.tape)):
        if e.kind == "restore":
            rolled = rolled or e  # the latest one: the context holds what its snapshot held since
            continue
        values = [value for _, key, value in e.changes if key == name]
        if not values:
            continue
        if rolled is None or all(value is DELETED for value in values):
            return ""
        by = f" by {e.activity!r}" if e.activity else ""
        return (f"; {name!r} was written{by} (event {e.seq}) and taken out of context {ctx.name!r} by the rollback "
                f"to snapshot {(rolled.data or {}).get('snapshot_id')!r} (event {rolled.seq}); the process did not go "
                f"back with it, so no step writes {name!r} again: give it back with `layerflow resume ID --set "
                f"{name}=VALUE` (REST: inject), or roll back to a snapshot taken after event {e.seq}")
    return ""


def _misspelt_preserved(ctx: LayeredContext, name: str) -> str:
    """A preserved key that no layer holds and that reads like ``name``: the preserveKeys entry the
    process meant for it, misspelt (the advice to preserve ``name`` alone reads as already done)."""
    idle = sorted(k for k in ctx.preserved if k != name and ctx.get(k, ABSENT) is ABSENT)
    close = difflib.get_close_matches(name, idle, n=3, cutoff=0.75)
    if not close:
        return ""
    named = ", ".join(repr(k) for k in close)
    return (f" (preserveKeys name {named}, which no layer holds: a misspelling of {name!r}? "
            f"write {name!r} there instead)")


def _folded_preserve_slips(ctx: LayeredContext, record: Mapping[str, Any]) -> list[str]:
    """A key a compression folded or dropped that reads like a ``preserveKeys`` entry no layer holds:
    the entry was meant for it, misspelt, and its value is gone from the context without a word."""
    gone = [*(record.get("folded") or []), *(record.get("dropped") or [])]
    return [f"it folded {name!r}{hint}" for name in dict.fromkeys(gone) if isinstance(name, str)
            for hint in [_misspelt_preserved(ctx, name)] if hint]


def _start_data(ctx: LayeredContext | None, err: BaseException, others: Iterable[LayeredContext]) -> str:
    """Why a PROCESS key an activity tried to change is there, when it came with the instance's
    start data (a counter or status the process updates, passed in with --data): where to map it."""
    if not isinstance(err, ContextWriteDenied) or ctx is None or Layer.parse(err.effective) != Layer.PROCESS:
        return ""
    for where in [ctx, *others]:
        for e in where.tape:
            if e.actor == "input" and e.activity is None and any(
                    Layer(layer) == Layer.PROCESS and key == err.key for layer, key, _ in e.changes):
                return (f"; {err.key!r} came with the instance's start data, which goes to L1 PROCESS: to let "
                        f"activities change it, map it to WORKING in the process's config "
                        f"(data_layers: {{{err.key}: WORKING}} in PROCESS.layerflow.yaml or the --config file)")
    return ""


def _unset_name(err: BaseException, ctx: LayeredContext | None, task: Any, bpmn_id: str) -> str:
    """For a script's NameError on a key the context does not hold: which bpmn:dataObject the name
    is, if one of the task's process (or a process around it) declares it, and where to give it."""
    if not isinstance(err, NameError) or not err.name or ctx is None or err.name in ctx:
        return ""
    declared = ""
    wf = getattr(task, "workflow", None)
    while wf is not None:
        if err.name in (getattr(wf.spec, "data_objects", None) or {}):
            declared = (f"; {err.name!r} is bpmn:dataObject {err.name!r} of process {wf.spec.name!r}, which holds "
                        "no value until a step writes it")
            break
        wf = getattr(wf, "parent_workflow", None)
    return f"{declared}{_name_hint(err, bpmn_id)}" if declared else ""


def _unknown_name(err: BaseException, ctx: LayeredContext | None, task: Any, bpmn_id: str,
                  source: str = "script") -> str:
    """Any other name a script (or a condition: ``source``) reads and the context does not hold: a
    typo as often as a missing key, so the hint says both (with a key the context holds that reads
    like it), and names the person's answer that came last when its user task has no form to ask
    for the key."""
    if not isinstance(err, NameError) or not err.name or ctx is None or err.name in ctx:
        return ""
    if err.name in FOREIGN_LITERALS:
        return _name_hint(err, bpmn_id, source)
    return f"{_name_hint(err, bpmn_id, source)}{_near_key(ctx, err.name)}{_formless_answer(task, err.name)}"


def _unread_key(err: BaseException, ctx: LayeredContext | None, task: Any, bpmn_id: str) -> str:
    """For a handler's ``ctx[KEY]`` on a key no layer holds (``ContextKeyError`` naming it): where to
    give it, as for a script's NameError, and how to read a key the step may go without."""
    key = getattr(err, "key", None)
    if not isinstance(err, ContextKeyError) or not isinstance(key, str) or ctx is None or key in ctx:
        return ""
    return (f"; the context holds no key {key!r} here: give {key!r} a value before {bpmn_id!r} (the start data "
            f"or an earlier task's output), or correct the handler (ctx.get({key!r}) reads a key it may go "
            f"without){_near_key(ctx, key)}{_formless_answer(task, key)}")


def _near_key(ctx: LayeredContext, name: str) -> str:
    """A data key the context holds that reads like ``name``: the key as misspelt where it was written
    (a person's answer ``desicion`` read as ``decision``)."""
    held = [k for k in ctx.keys() if k != name and not is_engine_key(k)]
    close = difflib.get_close_matches(name, held, n=1, cutoff=0.75)
    return (f"; the context holds {close[0]!r}, which reads like it: was {name!r} written under that name?"
            if close else "")


def _engine_version_conflict(err: VersionConflict, instance_id: str) -> VersionConflict:
    """The store's ``VersionConflict`` with what to do from an ``Engine``: this Instance object is stale."""
    out = VersionConflict(f"{err}; an Engine's Instance object held since is stale: engine.load({instance_id!r}) "
                          f"gives the stored one, or give the Engine call the id {instance_id!r}, which loads it afresh")
    for name in ("instance_id", "expected", "actual"):
        if hasattr(err, name):
            setattr(out, name, getattr(err, name))
    return out


def _formless_answer(task: Any, name: str) -> str:
    """The user task answered last before ``task``, when it has no form (nothing asked the person
    for the key ``name`` a step could not read, and its answer did not give it)."""
    done = [t for t in task.workflow.get_tasks() if t.state == TaskState.COMPLETED
            and isinstance(t.task_spec, UserTaskMixin)] if task is not None else []
    if not done:
        return ""
    last = max(done, key=lambda t: t.last_state_change)
    if (getattr(last.task_spec, "extensions", None) or {}).get("form"):
        return ""  # a form that asks for it is named by _unanswered_field
    return (f"; if a person gives it, the answer to user task {spiff.bpmn_id_of(last)!r} (which has no form "
            f"asking for it) set no {name!r}: answer it there, or inject it and resume")


def _activity_error(bpmn_id: str, err: BaseException, ctx: LayeredContext | None = None,
                    others: Iterable[LayeredContext] = (), task: Any = None) -> LayerflowError:
    """The error an activity failure becomes: task id, script line, message; a write the layer
    rules refused names the variable mapping of ``task`` that made it, if one did."""
    if isinstance(err, ActivityError) and err.task_id is not None:
        return err
    line = None
    where = ""
    for frame in traceback.extract_tb(err.__traceback__):
        if frame.filename.startswith("<") and frame.filename.endswith(f" {bpmn_id}>"):
            line = frame.lineno
            where = frame.filename.strip("<>").split(" ")[0]
    if isinstance(err, SyntaxError) and err.filename and err.filename.endswith(f" {bpmn_id}>"):
        line = err.lineno
        where = err.filename.strip("<>").split(" ")[0]
    what = f"{type(err).__name__}: {err}" if not isinstance(err, LayerflowError) else str(err)
    at = f" at line {line} of its {where}" if line is not None else ""
    mapped = ((getattr(task.task_spec, "extensions", None) or {}).get(spiff.MAPPED_KEY) or {}) if task is not None else {}
    by = (f"; {err.key!r} is set by {mapped[err.key]} of {bpmn_id!r}"
          if isinstance(err, ContextWriteDenied) and err.key in mapped else "")
    away = _compressed_away(ctx, err, others) or _rolled_back(ctx, err)
    unset = ""
    if where == "script" and not away:
        # a form field the person (or the start data) left out names its form, as for a condition
        unset = (_unset_name(err, ctx, task, bpmn_id) or (_unanswered_field(task, err) if task is not None else "")
                 or _unknown_name(err, ctx, task, bpmn_id))
    unread = "" if where else _unread_key(err, ctx, task, bpmn_id)
    message = f"activity {bpmn_id!r} failed{at}: {what}{by}{away}{unset}{unread}{_start_data(ctx, err, others)}"
    out = ActivityError(message, task_id=bpmn_id, line=line)
    if isinstance(err, LayerflowError) and not unread:
        # (a key the step read and the context lacks is the activity's failure, as a script's NameError
        # is: not ``not_found``, which a client reads as an instance or resource it named)
        out.kind = err.kind
    return out


def _after_activity(ctx: LayeredContext, config: ActivityExtensionConfig | None, *, task_id: str,
                    model: str | None = None, redact: bool | list[str] = True) -> dict[str, Any] | None:
    """Compression hook, called after every completed activity.

    Offline (``model`` None): the rule-driven compressor with the extractive summarizer
    (``context_layers.compression.after_activity``); nothing imports litellm. With a
    model: ``engine.model_compression`` (the model's summaries and, with
    ``compressionPlanner: model``, its plan; the rules whenever the model fails).

    Returns the ``compressions`` entry of the ``--json`` document when compression ran:
    ``{"activity_id", "context", "triggers", "tokens_before", "tokens_after", "snapshot_id", ...}``.
    """
    if config is None or not config.compression_configured:
        return None
    if model is None:
        result = after_activity(ctx, config, actor=task_id)
        if result is not None and config.context_strategy.compression_planner == "model":
            result = replace(result, notes=[*result.notes, "planner: no model is configured (--model or "
                                            "llm.model); the rules ran instead"])
    else:
        from .model_compression import compress_after_activity

        result = compress_after_activity(ctx, config, task_id=task_id, model=model, redact=redact)
    if result is None:
        return None
    record = result.to_dict()
    record.setdefault("activity_id", task_id)
    record.setdefault("context", ctx.name)
    return record


# =============================================================================== records

def to_record(instance: Instance) -> dict[str, Any]:
    """The saved form of an instance (format ``RECORD_FORMAT``).

    Built after every activity, so what did not change since the last save is not
    converted again: the parts that are JSON already (``JSONText``, written by the store
    as they are) are the process record (encoded once per process), the workflow
    (``spiff.serialize_json`` keeps its spec and unchanged tasks as text) and the
    snapshots a context carries from another one (encoded when they change); each
    context's tape is kept as dicts, new events converted once (``_RecordCache``).
    Stored and loaded, ``contexts[name]`` equals ``ctx.to_dict()`` and ``workflow`` is
    the object ``spiff.serialize_json`` encodes.
    """
    rt = spiff.driver_of_workflow(instance.workflow)
    cache: _RecordCache = rt.record_cache if isinstance(rt, _Runtime) else _RecordCache()
    try:
        workflow = JSONText(spiff.serialize_json(instance.workflow))
    except (TypeError, ValueError) as exc:
        raise InvalidRecord(f"the workflow of instance {instance.id!r} cannot be saved: {exc}; SpiffWorkflow's task "
                            "data must hold JSON values (no NaN or Infinity) or objects its serializer knows") from None
    return {  # the plain parts first: the store encodes them in one call
        "format": RECORD_FORMAT,
        "id": instance.id,
        "process_id": instance.process_id,
        "status": instance.status,
        "error": instance.error,
        "created": instance.created,
        "updated": instance.updated,
        "engine": cache.parts.of(f"instance record {instance.id!r}['engine']", {
            "branches": instance.branches,
            # a run's checkpoint (status running) waits for nothing yet: what it started from is
            # answered or fired, and what it will wait for is known when it stops
            "waiting_for": instance.waiting_for if instance.status != "running" else [],
            "conflicts": instance.conflicts,
            "compressions": instance.compressions,
            "confirmations": instance.confirmations,
            "error_task": instance.error_task,
            "activities": instance.activities,
            "suspended": instance.suspended,
            "cancelled": instance.cancelled,
            **({"refusals_since": instance.refusals_since} if instance.refusals_since is not None else {}),
        }),
        "process": _process_part(instance),
        "workflow": workflow,
        "contexts": {name: cache.context_part(ctx) for name, ctx in instance.contexts.items()},
    }


# The last process record encoded, and its text: ``Process.to_record`` returns the same
# dict while the process holds, for every instance of it.
_PROCESS_TEXT: tuple[dict[str, Any], JSONText] | None = None


def _process_part(instance: Instance) -> JSONText:
    global _PROCESS_TEXT
    record = instance.process.to_record()
    if _PROCESS_TEXT is None or _PROCESS_TEXT[0] is not record:
        _PROCESS_TEXT = (record, json_text(record, f"the process record of instance {instance.id!r}"))
    return _PROCESS_TEXT[1]


class _RecordCache:
    """Each context's record, kept from one save to the next: its tape as dicts (events are
    immutable; only new ones are converted) and the snapshots it carries from another
    context (a branch: the one it was forked from), as dicts and as JSON text."""

    def __init__(self) -> None:
        self.parts = _UnchangedParts()
        self._contexts: dict[str, _CachedContext] = {}
        # snapshot id -> (snapshot, its JSON text): the branches of one split share the
        # snapshot they were forked from, and it is converted once
        self._foreign: dict[str, tuple[Any, str]] = {}

    def context_part(self, ctx: LayeredContext) -> dict[str, Any]:
        """``ctx.to_dict()`` for a record (equal once encoded): the snapshots as one
        ``JSONText``, joined when they change."""
        cached = self._update(ctx)
        if cached.snapshots_text is None:
            parts = ",".join(f"{json.dumps(sid)}:{text}" for sid, text in cached.snapshots.items())
            cached.snapshots_text = JSONText("{" + parts + "}")
        return {**cached.head(), "snapshots": cached.snapshots_text, "tape": list(cached.events)}

    def _update(self, ctx: LayeredContext) -> _CachedContext:
        cached = self._contexts.get(ctx.name)
        tape = ctx.tape
        if cached is None or cached.ctx is not ctx or len(cached.events) > len(tape):
            cached = self._contexts[ctx.name] = _CachedContext(ctx)  # another context: start over
        for event in tape[len(cached.events):]:
            cached.events.append(event.to_dict())
            snap = event.snapshot
            if snap is not None and snap.context != ctx.name and snap.id not in cached.snapshots:
                known = self._foreign.get(snap.id)
                if known is None or known[0] is not snap:
                    known = self._foreign[snap.id] = (snap, json_text(snap.to_dict(copy=False), f"snapshot {snap.id!r}").text)
                cached.snapshots[snap.id] = known[1]
                cached.snapshots_text = None
        return cached


class _UnchangedParts:
    """The JSON text of the engine's bookkeeping in a record (branches, conflicts, compressions,
    ...), kept while it does not change: most saves change none of it, and its floats (attention
    scores) make it dear to encode. Whether a part changed is told by its ``marshal`` bytes, an
    exact picture of plain Python values (``1``, ``1.0`` and ``True`` differ, so do key orders and
    a list changed in place) that costs a fraction of the JSON. A part marshal cannot take (a
    frozen context value in a conflict, an enum) stays the value it is, encoded by the store."""

    #: parts the stores read (``timer_due``: the timer index): kept values
    READ_BY_STORES = frozenset({"waiting_for"})

    def __init__(self) -> None:
        self._known: dict[str, tuple[bytes, JSONText]] = {}

    def of(self, what: str, parts: dict[str, Any]) -> dict[str, Any]:
        """``parts`` with each list or dict that is as it was at the last call as its JSON text
        (the others encoded now, or left to the store); ``InvalidRecord`` naming ``what`` and the
        part when one is not JSON."""
        out: dict[str, Any] = {}
        for name, value in parts.items():
            if type(value) is not list and type(value) is not dict or not value or name in self.READ_BY_STORES:
                out[name] = value  # a scalar, or empty: as cheap to encode as to compare
                continue
            try:
                mark = marshal.dumps(value)
            except ValueError:  # a type marshal does not know
                self._known.pop(name, None)
                out[name] = value
                continue
            known = self._known.get(name)
            if known is None or known[0] != mark:
                known = self._known[name] = (mark, json_text(value, f"{what}[{name!r}]"))
            out[name] = known[1]
        return out


@dataclass
class _CachedContext:
    ctx: LayeredContext
    events: list[dict[str, Any]] = field(default_factory=list)  # its tape, as dicts
    # id -> JSON text of each snapshot it carries from another context
    snapshots: dict[str, str] = field(default_factory=dict)
    snapshots_text: JSONText | None = None  # all of them as one record part; None: to be joined

    def head(self) -> dict[str, Any]:
        ctx = self.ctx
        return {"format": TAPE_FORMAT, "name": ctx.name, "branch_id": ctx.branch_id, "encoding": ctx.encoding}


def from_record(engine: Engine, record: Mapping[str, Any]) -> Instance:
    """The instance a stored record holds; reads every record format up to ``RECORD_FORMAT``
    (format 1 kept the workflow as JSON text in a string, 2 as an object)."""
    fmt = record.get("format")
    if isinstance(fmt, int) and fmt > max(READ_FORMATS):
        raise LayerflowError(f"instance record {record.get('id')!r} has format {fmt!r}; this layerflow reads "
                             f"formats {', '.join(map(str, READ_FORMATS))}. Upgrade layerflow to load it")
    try:
        if fmt not in READ_FORMATS:
            raise ValueError(f"its format is {fmt!r}, not one of {', '.join(map(str, READ_FORMATS))}")
        return _from_record(engine, record)
    except LayerflowError:
        raise
    except (KeyError, TypeError, ValueError, AttributeError, IndexError) as err:
        # no layerflow writes such a record (a save is all or nothing): something else wrote over it
        raise InvalidRecord(
            f"the saved record of instance {record.get('id')!r} is damaged and cannot be loaded "
            f"({_one_line(err)}): it was written over by something other than layerflow; "
            "restore the instance from a backup of the store") from err


def _from_record(engine: Engine, record: Mapping[str, Any]) -> Instance:
    wf = spiff.deserialize(record["workflow"])
    process = Process.from_record(record["process"], wf.spec, dict(wf.subprocess_specs))
    contexts = {name: LayeredContext.from_dict(d) for name, d in record["contexts"].items()}
    clock = InstanceClock(engine.clock, _floor_of(record, contexts))
    for ctx in contexts.values():  # what happens to it from here on is stamped by its clock (this engine's)
        ctx.clock = clock
    eng = record.get("engine", {})
    instance = Instance(
        id=record["id"], process=process, workflow=wf, contexts=contexts, status=record["status"],
        error=record.get("error"), waiting_for=list(eng.get("waiting_for", [])),
        conflicts=list(eng.get("conflicts", [])), compressions=list(eng.get("compressions", [])),
        confirmations=list(eng.get("confirmations", [])), branches=dict(eng.get("branches", {})),
        version=int(record["version"]), created=float(record.get("created", clock.floor)),
        updated=float(record.get("updated", clock.floor)), error_task=eng.get("error_task"),
        activities=int(eng.get("activities", 0)), suspended=dict(eng.get("suspended", {})),
        cancelled=eng.get("cancelled"), refusals_since=eng.get("refusals_since"), clock=clock,
    )
    _Runtime(engine, instance)
    return instance
