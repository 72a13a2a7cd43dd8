"""The driver's steps for scopes and events (a base class of ``engine.runtime._Runtime``).

* **timers** are due by the engine's clock (``Engine(clock=...)``), not the wall clock.
* a **sub-process or call activity** runs in the context of the task that starts it; an
  **event sub-process** runs in a context forked as its event comes (a timer's, a
  message's) and is merged back when it ends; an interrupting one cancels the rest of
  its scope (``interrupt``).
* a **boundary event's path** runs in a side branch of its own, merged back where the
  path it left goes (``boundary_path``, ``_merge_side``).
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any

from SpiffWorkflow.bpmn.specs.mixins.events.end_event import EndEvent
from SpiffWorkflow.bpmn.specs.mixins.events.intermediate_event import BoundaryEvent
from SpiffWorkflow.specs.Join import Join
from SpiffWorkflow.util.task import TaskState

from context_layers import DELETED, Layer, LayeredContext, json_equal, thaw
from context_layers.canonical import canonical_key
from context_layers.config import ActivityExtensionConfig
from context_layers.context import BRANCH_MARKERS, RECORD_PREFIXES, Snapshot
from context_layers.errors import ActivityError, ContextWriteDenied, MergeConflictError
from gateways import (MergedConflict, Resolution, ResolutionOutcome, ResolutionStep, reduce_values,
                      resolve_conflicts)
from gateways.conflicts import jsonable
from gateways.join import (MERGED_CONFLICTS_KEY, base_json, free_record_key, side_counters_told, single_counts,
                           single_summaries, written_layer)
from gateways.splitter import ContextSplitter, branch_context_name

from . import call_mappings, collaboration, events, spiff
from .gateway_steps import RECORD_KEY_PREFIXES

if TYPE_CHECKING:
    from .process import Process
    from .runtime import Engine, Instance


ABSENT = object()
# a multi-instance activity's internal data: key -> the id of the instance whose value its context holds
MI_OWNERS_KEY = "instance_owners"


def _settles_instances(cfg: ActivityExtensionConfig) -> bool:
    """Whether a multi-instance activity's config says how its parallel instances' conflicts are
    settled: a ``mergeStrategy`` written down (``MERGE_WITH_CONFLICT_DETECT`` too: then what
    nothing settles fails the activity), a ``conflictPolicy``, a model (``llm``) or ``humanConfirm``."""
    return ("merge_strategy" in cfg.model_fields_set or cfg.conflict_policy is not None or cfg.llm is not None
            or cfg.human_confirm is not None)


def _last_instance_kept(bpmn_id: str, branch_id: str, conflicts: Sequence[MergedConflict]) -> ResolutionOutcome:
    """With no merge settings and no model, a multi-instance activity keeps the value of the instance
    that ended last, as SpiffWorkflow merges its instances, and says so: every such conflict is listed
    (``conflicts``, ``_mergedConflicts``, the tape) with this reason, never taken silently."""
    reason = (f"no merge settings on multi-instance activity {bpmn_id!r}: instance {branch_id!r} ended last and "
              "its value is kept, as SpiffWorkflow merges instances; give the activity a mergeStrategy "
              "(FAIL_ON_CONFLICT to stop here), reducers or a conflictPolicy to decide otherwise")
    pairs = [(c, Resolution(c.conflicting_values[branch_id], "strategy", reason)) for c in conflicts]
    return ResolutionOutcome(pairs, [], [ResolutionStep(c.key, "strategy", "resolved", reason) for c in conflicts])


def _json_safe(value: Any) -> Any:
    """``value`` as JSON holds it (a tape event's data is JSON): what is not JSON as its text."""
    return json.loads(json.dumps(thaw(value), default=str))


def _same(a: Any, b: Any) -> bool:
    if a is ABSENT or b is ABSENT:
        return a is b
    return json_equal(a, b)


def _plain(value: Any) -> Any:
    return None if value is ABSENT else thaw(value)


def _snapshot_values(snap: Any) -> dict[str, Any]:
    """Every key of a snapshot with the value a read would have given (the lowest layer wins)."""
    out: dict[str, Any] = {}
    for layer in reversed(list(Layer)):
        out.update(snap.layer(layer).items())
    return out


def _unfolded_history(base: Any, branch: LayeredContext, parent: LayeredContext) -> tuple[dict[str, Any], list[str]]:
    """The side branch's HISTORY as it merges into ``parent``: a compaction record of the branch
    that summarises base entries a record ``parent`` added since ``base`` summarises too is left
    behind, and the branch's own entries it folded come back where they stood, as a join does
    (``gateways.join.single_summaries``); the flow's record always stays. And the records left."""
    history = branch.layer(Layer.HISTORY)
    if not any(k.startswith("compaction:") for k in history):
        return dict(history.items()), []
    unfolded = single_summaries(base, {"flow": parent, "side": branch}, {"flow": None, "side": None},
                                kept={"flow"})
    values, places = unfolded.values.get("side", {}), unfolded.places.get("side", {})
    if not values:
        return dict(history.items()), []
    at = {k: history.order_of(k) for k in history}
    at.update({k: n for k, n in places.items() if n is not None})
    merged = {**dict(history.items()), **values}
    return ({k: merged[k] for k in sorted(merged, key=lambda k: at.get(k, -1)) if merged[k] is not DELETED},
            [f.key for f in unfolded.dropped])


def _bring_side(parent: LayeredContext, branch: LayeredContext, changes: list[tuple[Layer, str, Any]],
                dropped: list[str], *, branch_name: str, gateway: str, actor: str | None = None) -> None:
    """Apply a side branch's changes to ``parent`` in one ``side_merge`` event, with the keys the
    branch's activities preserved: they stay preserved after it merges back, as after a join
    (no compression of ``parent`` may drop what the path's preserveKeys protected)."""
    preserve = sorted(set(branch.preserved) - set(parent.preserved))
    if changes:
        parent.apply_changes(changes, kind="side_merge", actor=actor or gateway, data={
            "branch": branch_name, "gateway_id": gateway, **({"dropped_compactions": dropped} if dropped else {}),
            **({"preserve": preserve} if preserve else {})})
    elif preserve:
        parent.mark_preserved(preserve, actor=actor or gateway)


def close_cancelled(instance: Instance, confirmation: dict[str, Any]) -> None:
    """Close a confirmation nobody will answer (its instance or its join was cancelled); the join
    conflict it asked about stays unresolved, and says so: ``"cancelled": true``. That conflict is
    the one of the same join, key and values merging into the same context: two lines of a
    multi-instance can report equal conflicts, and only the cancelled line's is closed (a record
    saved before conflicts and questions named their context: by the rest alone)."""
    confirmation.update(answered=True, cancelled=True)
    for conflict in instance.conflicts:
        if conflict.get("resolution") is None and conflict.get("gateway_id") == confirmation.get("task_id") \
                and conflict.get("key") == confirmation.get("key") \
                and ("values" not in confirmation or json_equal(conflict.get("values"), confirmation["values"])) \
                and ("context" not in confirmation or conflict.get("context", confirmation["context"])
                     == confirmation["context"]):
            conflict["cancelled"] = True


def close_at_completion(instance: Instance) -> None:
    """Close the questions still open as the instance completes: a ``human_confirm`` an operator's
    governance model asked outside any activity (REST ``tools/human_confirm``), which no step waits
    for, so the process ran to its end without it. Nothing reads an answer any more: each is closed
    as ``cancelled`` with ``closed_by: "completion"``, a ``confirmation_closed`` note on the tape of
    its context, so the pending lists drop it and a late answer is refused (409), not recorded on a
    finished instance."""
    for c in instance.confirmations:
        if c.get("answered"):
            continue
        close_cancelled(instance, c)
        c["closed_by"] = "completion"
        ctx = instance.contexts.get(str(c.get("context") or "main"), instance.main)
        ctx.record("confirmation_closed", actor="engine", data={
            "confirmation_id": c["id"], "reason": "the instance completed before anyone answered it"})


def close_open_branches(instance: Instance, actor: str) -> list[str]:
    """Close, as ``cancelled``, the contexts of a cancelled instance that a join or the end of a
    sub-process would still have merged (a split's open branches, a scope, a boundary path, a running
    event sub-process): nothing runs them any more, as for those an interrupting event cancels. Each
    gets a ``cancelled`` event on its own tape; returns their names."""
    closed = [name for name, info in instance.branches.items() if info["status"] in ("open", "scope", "side", "event")]
    for name in closed:
        close_branch(instance, name, actor)
    return closed


def close_branch(instance: Instance, name: str, actor: str) -> None:
    """Close the branch context ``name`` as ``cancelled``: an activity left open in it is put back as
    it was before it began, and a ``cancelled`` event by ``actor`` goes on its tape."""
    instance.branches[name]["status"] = "cancelled"
    ctx = instance.contexts[name]
    if ctx.current_activity is not None:
        ctx.abort_activity(ctx.current_activity, reason=f"cancelled with {actor!r}", actor=actor)
    ctx.record("cancelled", actor=actor, data={"by": actor})


def _task_lives(top: Any, task_id: str) -> bool:
    """Whether the task of that id is in the workflow's tree, not cancelled, and so is the task of
    each sub-process around it (a cancelled sub-process keeps the tasks that had finished)."""
    key: uuid.UUID | None = uuid.UUID(task_id)
    while key is not None:
        workflow = next((w for w in (top, *top.subprocesses.values()) if key in w.tasks), None)
        if workflow is None or workflow.tasks[key].has_state(TaskState.CANCELLED):
            return False
        key = None if workflow is top else workflow.parent_task_id
    return True


def no_output_item(bpmn_id: str, index: Any, output_item: Any) -> ActivityError:
    """An instance of a multi-instance activity ended without its output item."""
    out = spiff.data_name(output_item)
    name = getattr(output_item, "bpmn_name", None)
    hint = (f"; SpiffWorkflow names an outputDataItem by its id, not by its name {name!r}: set {out!r}, or give "
            f"the item id={name!r}") if name and name != out else f": set {out!r} in each instance"
    return ActivityError(f"instance {index!r} of multi-instance activity {bpmn_id!r} set no output item {out!r} "
                         f"(outputDataItem){hint}", task_id=bpmn_id)


class ScopeSteps:
    """Timers, sub-processes, event sub-processes and boundary-event paths."""

    engine: Engine
    process: Process

    _caught_starts: list[Any]  # start events to run next (``start_caught``)

    if TYPE_CHECKING:  # the rest of the driver: engine.runtime._Runtime and engine.gateway_steps.GatewaySteps
        @property
        def instance(self) -> Instance: ...  # held weakly (see _Runtime.__init__)
        def context_of(self, task: Any) -> LayeredContext: ...
        def abort_multi(self, task: Any, err: BaseException) -> None: ...
        def exec_script(self, task: Any, script: str) -> bool: ...
        def _fork(self, task: Any, parent_name: str, parent: LayeredContext, gw: str,
                  cfg: ActivityExtensionConfig | None, taken: list[Any], at: Snapshot | None = None) -> None: ...
        def _in_workflow(self, name: str, workflow: Any) -> bool: ...
        @contextmanager
        def _noting_calls(self, client: Any, ctx: LayeredContext, element_id: str,
                          purpose: str) -> Iterator[None]: ...
        def _set_conflicts(self, gw: str, records: list[dict[str, Any]], *, resolved: bool,
                           context: str, refire: bool = False) -> None: ...

    def now(self) -> datetime:
        """The engine's clock, as SpiffWorkflow's timers read it (a cycle timer's repetitions)."""
        return datetime.fromtimestamp(self.instance.clock(), timezone.utc)

    def timer(self, task: Any) -> None:
        """A timer event is (re)checked: its due time is fixed by the engine's clock when it starts
        waiting, and it fires once the engine's clock reaches it (SpiffWorkflow also fires it by
        the wall clock; with the default clock they agree). A cycle timer's first due time is
        fixed here too, so that an expression that is no repeating interval names the timer."""
        now = self.now()
        try:
            if spiff.is_cycle(task):
                # its repetitions fire by the cycle itself (spiff.EngineCycleTimerEventDefinition)
                spiff.start_cycle(task, now)
                return
            due = spiff.timer_due(task, now)
        except Exception as err:  # noqa: BLE001
            detail = str(err) if isinstance(err, (ActivityError, ValueError)) else f"{type(err).__name__}: {err}"
            raise ActivityError(f"timer {spiff.bpmn_id_of(task)!r}: {detail}", task_id=spiff.bpmn_id_of(task)) from err
        if due is not None and due <= now and not task.internal_data.get("event_fired"):
            if _cycle_due_before(task, due):
                # a run after several periods: the repetitions of a cycle on an activity that were
                # due before this timer fire first (the next steps), as they would have on time; an
                # interrupting deadline fired beside the first one and cancelled the rest
                return
            task.internal_data["event_fired"] = True

    # ----- sub-processes and call activities ----------------------------------------------

    def enter_subworkflow(self, task: Any, subworkflow: Any) -> None:
        """A sub-process or call activity starts. Its tasks run in the context of ``task``, except:

        * an instance of a multi-instance sub-process runs in a scope of its own (a context
          forked from the activity's), its input item in WORKING, so parallel instances never
          see nor overwrite each other's items;
        * a called process whose ``ioSpecification`` names data outputs runs in a scope of its
          own too: only those outputs come back (``leave_subworkflow``), as in SpiffWorkflow;
        * so does a call activity with camunda:out mappings (``call_mappings.scoped``): its in
          mappings, the called process and its out mappings run there, and only what the out
          mappings set comes back, as in Camunda.

        The called process's data inputs must be in the context (SpiffWorkflow's check)."""
        if spiff.is_pool(task):
            self.enter_pool(task)
            return
        spec = task.task_spec
        bpmn_id = spiff.bpmn_id_of(task)
        ctx = self.context_of(task)
        inputs = spiff.io_names(subworkflow.spec, "data_inputs")
        missing = [name for name in inputs if name not in ctx]
        if missing:
            raise ActivityError(f"{bpmn_id!r} calls {spec.spec!r}, whose ioSpecification needs the data input(s) "
                                f"{', '.join(map(repr, missing))}; none is in the context. Set them before "
                                f"{bpmn_id!r} (an earlier task, the instance's data) or remove them from the "
                                "called process's dataInput", task_id=bpmn_id)
        multi = spiff.multi_instance_of(task)
        outputs = spiff.io_names(subworkflow.spec, "data_outputs")
        cfg = self.process.config(bpmn_id)
        if cfg is not None and cfg.effective_preserve_keys and not spiff.is_event_subprocess(task):
            # a sub-process's (call activity's) preserveKeys hold while its steps run: marked as it
            # starts, not as it ends, or the compressions after its steps would fold them first
            ctx.mark_preserved(cfg.effective_preserve_keys, actor=bpmn_id)
        if spiff.is_event_subprocess(task):
            if spiff.is_timer_event_subprocess(task):
                # made as its process starts, it waits for its timer there: each path the timer
                # starts gets a context of its own as it fires (event_path)
                return
            # the process goes on meanwhile, and may split this context: it must then stay as the
            # split left it (the join merges against it), so the event sub-process, the payload
            # that started it included, runs in a side branch, merged back as it ends, or once
            # the branches split meanwhile have joined
            self._fork(task, ctx.name, ctx, bpmn_id, None, [task])
            name = spiff.context_name_of(task)
            self.instance.branches[name]["status"] = "event"
            self._event_forked(name)
            subworkflow.task_tree.internal_data[spiff.CTX_KEY] = name
            return
        scoped_call = multi is None and call_mappings.scoped(spec)
        if multi is None and not outputs and not scoped_call:
            return
        inject: dict[str, Any] = {}
        if multi is not None:
            item = spiff.data_name(multi.task_spec.input_item)
            if item is not None and item in task.data:
                inject[item] = task.data[item]
        if multi is not None:
            instances = [c for c in multi.children if c.task_spec is spec]
            branch_id = f"{bpmn_id}#{instances.index(task) + 1}"
        else:
            branch_id = bpmn_id
        parent_name = ctx.name
        snap = ctx.snapshot(label=f"scope:{branch_id}", actor=bpmn_id)
        name = branch_context_name(parent_name, branch_id, snap.seq)
        scope = LayeredContext.fork(snap, name=name, branch_id=branch_id, inject=inject, actor=bpmn_id,
                                    encoding=ctx.encoding, clock=ctx.clock)
        ctx.record("scope", actor=bpmn_id, data={"activity": bpmn_id, "context": name, "snapshot_id": snap.id,
                                                  "inject": thaw(dict(inject))})
        self.instance.contexts[name] = scope
        self.instance.branches[name] = {
            "parent": parent_name, "branch_id": branch_id, "gateway": bpmn_id, "split": f"{bpmn_id}@{task.id}",
            "snapshot_id": snap.id, "injected": thaw({**inject, "_branch_id": branch_id, "_snapshot_id": snap.id}),
            "status": "scope", "join": None}
        subworkflow.task_tree.internal_data[spiff.CTX_KEY] = name  # the sub-process's tasks run in the scope
        prescript = getattr(spec, "prescript", None)
        if (multi is not None or scoped_call) and prescript and call_mappings.IN_MARK in prescript:
            # an instance of a multi-instance call activity that maps variables in: its preScript runs
            # here, in the instance's scope, so what it maps reaches that call only (Camunda's in
            # mappings set the called instance's variables), not the caller (``spiff.execute_script``)
            if self._in_scope(task, name, prescript):
                raise spiff.ScriptThrew(bpmn_id)

    def enter_pool(self, task: Any) -> None:
        """A pool's process starts in a collaboration (``engine.collaboration``): with the others, or
        when a message another pool sent starts it (its message start event). It runs in a branch
        of its own, forked from the instance's context: SYSTEM and PROCESS shared, WORKING and
        HISTORY its own, so no pool reads or overwrites another's. Every pool is a branch of one
        split (the collaboration's start), merged at the collaboration's end join; branch id: the
        pool's process id (``#2``, ``#3`` ... for further instances a message started)."""
        inst = self.instance
        start = task.parent  # the collaboration's start (SpiffWorkflow starts every pool from it)
        gw = str(task.workflow.spec.name)  # the collaboration's id
        if not task.children:
            # one a message started (``BpmnStartTask.trigger_wf``) was made without its path to the
            # collaboration's end join: SpiffWorkflow would end the collaboration without it
            task._sync_children(task.task_spec.outputs, TaskState.FUTURE)
            for child in task.children:
                child.task_spec._predict(child, mask=TaskState.FUTURE | TaskState.PREDICTED_MASK)
        parent_name = spiff.context_name_of(start)
        parent = inst.contexts[parent_name]
        split = f"{gw}@{start.id}"
        pid = spiff.bpmn_id_of(task)
        before = sum(1 for i in inst.branches.values() if i["split"] == split
                     and str(i["branch_id"]).split("#", 1)[0] == pid)
        branch_id = pid if not before else f"{pid}#{before + 1}"
        cfg = self.process.config(gw)
        try:
            forked = ContextSplitter().split(parent, gw, [branch_id], cfg, actor=gw, gateway_type="parallel")[0]
        except ContextWriteDenied as err:  # a contextInject the layer rules refuse (on the tape already)
            raise ActivityError(f"collaboration {gw!r}: {err}", task_id=gw) from None
        name = forked.context.name
        inst.contexts[name] = forked.context
        inst.branches[name] = {
            "parent": parent_name, "branch_id": branch_id, "gateway": gw, "split": split,
            "snapshot_id": forked.snapshot_id, "injected": thaw(dict(forked.injected)), "status": "open", "join": None}
        task.internal_data[spiff.CTX_KEY] = name
        task.internal_data[spiff.BRANCH_KEY] = branch_id

    def interrupt(self, esp: Any, start: Any) -> None:
        """An interrupting event sub-process started: the rest of the (sub-)process it belongs to
        stops, as BPMN says. Every other unfinished task of that process is cancelled (running
        sub-processes, waiting people and timers, other event sub-processes); the branches of its
        splits and the contexts of what it cancels are closed as ``cancelled``, their changes
        dropped, as their tokens are; an activity left open is put back as it was before it began,
        and the confirmations it waited for are closed. What finished before stays. When the event
        sub-process ends, so does its process (its end join has nothing else to wait for)."""
        by = spiff.bpmn_id_of(start)
        wf = esp.workflow
        top = wf.top_workflow
        # its message / signal starts listen no more (``events.waiting_catches``)
        wf.task_tree.internal_data[spiff.INTERRUPTED_KEY] = by
        keep = {esp.id}
        stack = list(esp.children)
        while stack:
            t = stack.pop()
            keep.add(t.id)
            stack.extend(t.children)
        doomed = [t for t in wf.get_tasks(state=TaskState.NOT_FINISHED_MASK) if t.workflow is wf and t.id not in keep]
        doomed_ids = {t.id for t in doomed}

        def inside(workflow: Any) -> bool:  # below a doomed task (a sub-process in a cancelled one too)
            while workflow is not None and workflow.parent_task_id is not None:
                if workflow.parent_task_id in doomed_ids:
                    return True
                workflow = top.get_task_from_id(workflow.parent_task_id).workflow
            return False

        gone_workflows = [w for w in top.subprocesses.values() if inside(w)]
        inst = self.instance
        own = spiff.context_name_of(start)  # the context the event sub-process's path runs in
        mine = set()  # ... and the contexts that one came from
        name = own
        while name in inst.branches and name not in mine:
            mine.add(name)
            name = str(inst.branches[name]["parent"])
        # the contexts the cancelled tasks ran in: an activity left open there is put back (one open
        # in a context of the process around, e.g. the multi-instance activity whose instance this
        # event sub-process interrupts, goes on)
        affected = {spiff.context_name_of(t) for t in doomed}
        affected.update(spiff.context_name_of(t) for w in gone_workflows for t in w.tasks.values())
        for name, info in inst.branches.items():
            if name in mine or info["status"] not in ("open", "event", "side", "scope"):
                continue
            split_id = uuid.UUID(info["split"].rsplit("@", 1)[1])
            if split_id in wf.tasks or any(split_id in w.tasks for w in gone_workflows):
                info["status"] = "cancelled"
                info["join"] = by
                inst.contexts[name].record("cancelled", actor=by, data={"by": by})
                affected.add(name)
        gone_keys = {str(i) for i in doomed_ids} | {str(t) for w in gone_workflows for t in w.tasks}
        for c in inst.confirmations:
            if not c.get("answered") and c.get("task") in gone_keys:
                close_cancelled(inst, c)
        for key in [k for k in inst.suspended if k in gone_keys]:
            del inst.suspended[key]
        for t in doomed:
            if t.parent is None or t.parent.id not in doomed_ids:
                t.cancel()
        for name, ctx in inst.contexts.items():
            status = inst.branches[name]["status"] if name in inst.branches else None
            if ctx.current_activity is not None and status not in ("cancelled", "joined") and name != own \
                    and name in affected:
                ctx.abort_activity(ctx.current_activity, reason=f"interrupted by event sub-process "
                                   f"{spiff.bpmn_id_of(esp)!r}", actor=by)

    def close_dead_joins(self) -> None:
        """Close what nobody will answer or finish any more because an interrupting boundary event
        (an error, a deadline timer) cancelled the sub-process it was in: SpiffWorkflow cancels the
        sub-process's tasks, or drops them with the instance of a multi-instance activity. A
        confirmation whose join task is so gone is closed (``close_cancelled``: its conflict keeps
        ``"resolution": null`` and says ``"cancelled": true``), and a branch or an instance's scope
        whose split task is gone is closed as ``cancelled``, its open activity put back, as
        ``interrupt`` does for what an interrupting event sub-process cancels; so is a branch split
        off a cancelled one (a terminate end event cancels the branch, not the splits inside it)."""
        inst = self.instance
        top = inst.workflow
        for c in inst.confirmations:
            if not c.get("answered") and c.get("task") and not _task_lives(top, c["task"]):
                close_cancelled(inst, c)
        for name, info in inst.branches.items():  # (a branch is listed after the one it was split off)
            if info["status"] not in ("open", "scope"):
                continue
            parent = inst.branches.get(str(info["parent"]))
            if (parent is None or parent["status"] != "cancelled") \
                    and _task_lives(top, str(info["split"]).rsplit("@", 1)[1]):
                continue
            close_branch(inst, name, str(info["gateway"]))

    def leave_subworkflow(self, task: Any, subworkflow: Any) -> None:
        """A sub-process or call activity finished: what its scope (``enter_subworkflow``) gives back."""
        name = subworkflow.task_tree.internal_data.get(spiff.CTX_KEY)
        info = self.instance.branches.get(name) if name is not None else None
        if info is not None and info["status"] == "event":
            self._event_done(info)
            self._merge_events(str(info["parent"]))
            if info["status"] == "joined":
                # merged back: what follows it (its process's end join) runs in that context
                for t in [task, *task.children]:
                    if t.internal_data.get(spiff.CTX_KEY) in (None, name):
                        t.internal_data[spiff.CTX_KEY] = info["parent"]
            return
        if info is None or info["status"] != "scope":
            return
        bpmn_id = spiff.bpmn_id_of(task)
        scope = self.instance.contexts[name]
        parent = self.instance.contexts[info["parent"]]
        outputs = spiff.io_names(subworkflow.spec, "data_outputs")
        multi = spiff.multi_instance_of(task)
        if multi is not None:
            mspec = multi.task_spec
            out = spiff.data_name(mspec.output_item) if mspec.data_output is not None else None
            item = spiff.data_name(mspec.input_item)
            if out is not None and out not in task.data and out in scope:
                task.data[out] = thaw(scope.resolve(out))  # the item the instance set, as its postScript reads it
            if self._instance_postscript(task, name):
                return  # it threw a BPMN error: its catcher runs next, nothing is collected
            if out is not None:
                # SpiffWorkflow collects the instance's output item from its data (its postScript,
                # an out mapping, may have set or changed it there)
                value = task.data[out] if out in task.data else scope.get(out, ABSENT)
                if value is ABSENT and spiff.interrupted(multi):
                    # an error the instance threw ended it, caught by an interrupting boundary event
                    # on the activity: nothing is collected (``merge_child``)
                    task.data = {}
                elif value is ABSENT:
                    index = task.internal_data.get("key_or_index", task.internal_data.get("item"))
                    err = no_output_item(mspec.bpmn_id, index, mspec.output_item)
                    self.abort_multi(multi, err)  # as when an instance's script fails
                    task._set_state(TaskState.ERROR)  # so a resume runs the activity again (reset_failed)
                    raise err
                else:
                    task.data = {out: thaw(value)}
            else:
                # no output collection: what the instance changed reaches the activity, met with what
                # the instances that ended before it brought (``_merge_instance``)
                base = _snapshot_values(parent.get_snapshot(info["snapshot_id"]))
                changed = {k: thaw(v) for k, v in scope.resolved().items()
                           if not k.startswith(RECORD_KEY_PREFIXES) and k != item
                           and (k not in base or not json_equal(base[k], v))}
                try:
                    self._merge_instance(multi, parent, str(info["branch_id"]), base, changed)
                except MergeConflictError as err:
                    self.abort_multi(multi, err)
                    task._set_state(TaskState.ERROR)  # so a resume runs the activity again (reset_failed)
                    raise
                task.data = {}
        else:
            if spiff.interrupted(task) and not call_mappings.scoped(task.task_spec):
                # it ended at an error end event (an escalation) that an interrupting boundary event of
                # the call catches: the call did not complete, so it has no outputs (SpiffWorkflow gives
                # the boundary path none, Camunda propagates no variable of an interrupted call), not
                # even those set on the way, nor any it never set; its scope closes as when a boundary
                # timer interrupts it
                close_branch(self.instance, name, spiff.bpmn_id_of(task))
                return
            given: dict[str, Any] = {}
            if call_mappings.scoped(task.task_spec):
                # a call with out mappings (and no out variables="all") gives back what they set, as
                # Camunda does: they run here, in its scope, and only what they changed comes back
                before = scope.resolved()
                if self._instance_postscript(task, name):
                    return  # it threw a BPMN error: its catcher runs next
                given = {k: v for k, v in scope.resolved().items()
                         if not k.startswith(RECORD_KEY_PREFIXES) and k not in BRANCH_MARKERS
                         and (k not in before or not json_equal(before[k], v))}
            missing = [o for o in outputs if o not in scope]
            if missing:
                raise ActivityError(f"{bpmn_id!r} calls {task.task_spec.spec!r}, whose ioSpecification names the data "
                                    f"output(s) {', '.join(map(repr, missing))}; the called process set none of "
                                    "them. Set them in the called process or remove them from its dataOutput",
                                    task_id=bpmn_id)
            given.update({o: scope.resolve(o) for o in outputs})
            parent.begin_activity(bpmn_id, actor=bpmn_id)
            parent.write_many(Layer.WORKING, given, actor=bpmn_id)
            parent.complete_activity(bpmn_id, summary=f"outputs of {task.task_spec.spec}: {', '.join(given)}",
                                     actor=bpmn_id)
        info["status"] = "joined"
        info["join"] = bpmn_id
        scope.record("joined", actor=bpmn_id, data={"gateway_id": bpmn_id, "into": info["parent"]})

    def _merge_instance(self, multi: Any, parent: LayeredContext, branch_id: str, base: Mapping[str, Any],
                        changed: Mapping[str, Any]) -> None:
        """Bring what an instance of multi-instance activity ``multi`` (a sub-process or call
        activity without an output collection) changed into the activity's context, three-way as
        a join does: against what the instance started from (``base``), a key that an instance
        ended before it changed since (``MI_OWNERS_KEY`` says which) and this one changed to
        another value is a conflict. Parallel instances each start from the activity's context,
        so two of them deciding one key differently never silently keep the last one's value:
        the activity's own join settings settle it (``reducers``, ``mergeStrategy`` with
        ``branchPriority`` over the instances' ids ``ACTIVITY#N``, ``conflictPolicy``, the model);
        with none that does, the activity fails naming every conflict. Sequential instances each
        start from what the one before left, so they never conflict."""
        bpmn_id = multi.task_spec.bpmn_id
        owners: dict[str, str] = multi.internal_data.setdefault(MI_OWNERS_KEY, {})
        cfg = self.process.config(bpmn_id) or ActivityExtensionConfig()
        writes: dict[str, Any] = {}
        conflicts: list[MergedConflict] = []
        for key, value in changed.items():
            now, was = parent.get(key, ABSENT), base.get(key, ABSENT)
            other = owners.get(key, bpmn_id)
            if key in cfg.reducers and not _same(now, was):  # two equal sums still add up
                writes[key] = reduce_values(cfg.reducers[key], key, DELETED if was is ABSENT else thaw(was),
                                            {other: thaw(now), branch_id: value})
                owners[key] = bpmn_id
                continue
            if _same(now, was) or _same(now, value):
                writes[key] = value
                owners[key] = branch_id
                continue
            conflicts.append(MergedConflict(key, DELETED if was is ABSENT else thaw(was),
                                            {other: thaw(now), branch_id: value}, layer=Layer.WORKING))
        if conflicts:
            arbiter = self.engine.arbiter_for(self.process, cfg.llm)
            try:
                if arbiter is None and not _settles_instances(cfg):
                    outcome = _last_instance_kept(bpmn_id, branch_id, conflicts)
                else:
                    with self._noting_calls(arbiter, parent, bpmn_id, "conflict_resolution"):
                        outcome = resolve_conflicts(conflicts, config=cfg, variables=parent.resolved(),
                                                    gateway_id=bpmn_id, arbiter=arbiter,
                                                    arrival_order=[b for c in conflicts for b in c.conflicting_values])
            except MergeConflictError as err:
                self._note_instance_conflicts(parent, bpmn_id, [(c, None) for c in conflicts], [])
                listed = "; ".join(f"{c.key!r}: " + ", ".join(f"{b} {_plain(v)!r}" for b, v in
                                                              c.conflicting_values.items()) for c in conflicts)
                failed = MergeConflictError(
                    f"multi-instance activity {bpmn_id!r}: its parallel instances changed {len(conflicts)} key(s) "
                    f"differently ({listed}), and nothing settles it ({str(err).splitlines()[0]}). Each instance "
                    "runs in a scope of its own, as a parallel branch does, so the last one's value is never "
                    f"taken silently: give {bpmn_id!r} a mergeStrategy (LAST_WRITER_WINS, BRANCH_PRIORITY with "
                    f"branchPriority over {bpmn_id}#1, {bpmn_id}#2, ...), reducers for the key(s) or a conflictPolicy "
                    "rule in its config, or collect what each instance decides in its output item "
                    "(loopDataOutputRef and outputDataItem)", conflicts=err.conflicts, gateway_id=bpmn_id)
                failed.task_id = bpmn_id  # type: ignore[attr-defined]  # the instance's error names the activity
                raise failed from err
            for conflict, resolution in outcome.resolved:
                writes[conflict.key] = resolution.value
                owners[conflict.key] = next((b for b, v in conflict.conflicting_values.items()
                                             if json_equal(v, resolution.value)), bpmn_id)
            self._note_instance_conflicts(parent, bpmn_id, outcome.resolved, outcome.steps)
        for key, value in writes.items():
            parent.write(Layer.WORKING, key, value, actor=bpmn_id)

    def _note_instance_conflicts(self, parent: LayeredContext, bpmn_id: str,
                                 pairs: Sequence[tuple[MergedConflict, Any]], steps: Sequence[Any]) -> None:
        """The conflicts of a multi-instance activity's instances, as a join reports its own: on the
        tape (``conflict``, ``resolution``), in ``_mergedConflicts`` once settled, in ``conflicts``."""
        for conflict, _ in pairs:
            data = conflict.to_dict()
            if conflict.base_value is DELETED:
                data.update(base_value=None, base_absent=True)
            parent.record("conflict", actor=bpmn_id, data={"gateway_id": bpmn_id, **data})
        for step in steps:
            parent.record("resolution", actor=bpmn_id, data={"gateway_id": bpmn_id, **step.to_dict()})
        records = [{"gateway_id": bpmn_id, "layer": str(Layer.WORKING), "key": c.key, "base_value": base_json(c.base_value),
                    "values": {b: jsonable(v) for b, v in c.conflicting_values.items()},
                    "resolution": None if r is None else r.to_dict(),
                    **({"base_absent": True} if c.base_value is DELETED else {})} for c, r in pairs]
        # as a join reports them: a report of an earlier run of the activity (it failed on them, and
        # runs again) is replaced, not listed beside the new one
        self._set_conflicts(bpmn_id, records, resolved=all(r["resolution"] is not None for r in records),
                            context=parent.name)
        settled = [r for r in records if r["resolution"] is not None]
        if settled:
            target = Layer.HISTORY if MERGED_CONFLICTS_KEY in parent.layer(Layer.HISTORY) else Layer.WORKING
            before = parent.layer(target).get(MERGED_CONFLICTS_KEY)
            log = [*(thaw(before) if isinstance(before, (list, tuple)) else []), *(
                {"gatewayId": bpmn_id, "layer": r["layer"], "key": r["key"], "baseValue": r["base_value"],
                 **({"baseAbsent": True} if r.get("base_absent") else {}),
                 "conflictingValues": list({canonical_key(v): v for v in r["values"].values()}.values()),
                 "values": r["values"], "sourceBranches": list(r["values"]), "resolution": r["resolution"]}
                for r in settled)]
            parent.apply_changes([(target, MERGED_CONFLICTS_KEY, log)], kind="instance_merge", actor=bpmn_id,
                                 data={"activity": bpmn_id, "conflicts": len(settled)})

    def _in_scope(self, task: Any, name: str, script: str) -> bool:
        """Run ``script`` of ``task`` (an instance of a multi-instance call activity) in its scope
        ``name``: True when it threw a BPMN error (its writes then go with the aborted activity)."""
        held = task.internal_data.get(spiff.CTX_KEY)
        task.internal_data[spiff.CTX_KEY] = name
        try:
            threw = self.exec_script(task, script)
        finally:
            if held is None:
                task.internal_data.pop(spiff.CTX_KEY, None)
            else:
                task.internal_data[spiff.CTX_KEY] = held
        scope = self.instance.contexts[name]
        bpmn_id = spiff.bpmn_id_of(task)
        if threw and scope.current_activity == bpmn_id:
            scope.abort_activity(bpmn_id, reason="its script threw a BPMN error", actor="engine")
        return threw

    def _instance_postscript(self, task: Any, name: str) -> bool:
        """The postScript of an instance of a multi-instance call activity that maps variables out
        (camunda:out, ``call_mappings``) runs as the instance ends, in the instance's scope, before its
        output item is collected: it reads what the called process set there and may set the item, as
        Camunda maps each call's variables out. True when it threw a BPMN error. It runs once: the
        task's own completion (``spiff._run_hook``) skips it."""
        postscript = getattr(task.task_spec, "postscript", None)
        if not postscript or call_mappings.OUT_MARK not in postscript or spiff.POSTSCRIPT_RAN_KEY in task.internal_data:
            return False
        threw = self._in_scope(task, name, postscript)
        task.internal_data[spiff.POSTSCRIPT_RAN_KEY] = "threw" if threw else "ran"
        return threw

    def cancel_subworkflow(self, task: Any, subworkflow: Any) -> None:
        """A sub-process or call activity is cancelled (an interrupting event; a timer event
        sub-process that only listens, at the end of its scope): what its steps wrote stays, and
        so does what the paths of its non-interrupting boundary events (or of its timer start
        event) that ran to their end inside it wrote. Such a path runs in a branch of its own
        (``boundary_path``, ``event_path``), merged where it ends, at the end of the sub-process,
        which now never comes: it merges now. (A path that still runs is cancelled with the
        sub-process, as the branches of its splits are.)"""
        gw = spiff.bpmn_id_of(task)
        running = self._running_contexts(subworkflow)
        for name, info in list(self.instance.branches.items()):
            if info["status"] == "side" and name not in running and self._in_workflow(name, subworkflow):
                self._merge_side(gw, name)
        for parent in self._end_event_paths(subworkflow):
            self._merge_events(parent)

    @staticmethod
    def _running_contexts(workflow: Any) -> set[str]:
        """The contexts of the paths of ``workflow`` that still run (a path that ended waits at joins only)."""
        return {spiff.context_name_of(t) for t in workflow.tasks.values()
                if t.has_state(TaskState.READY | TaskState.STARTED | TaskState.WAITING)
                and not isinstance(t.task_spec, Join)}

    def _end_event_paths(self, workflow: Any) -> list[str]:
        """Mark the paths a timer started in ``workflow`` (``event_path``) that have ended as done;
        returns the contexts they came from."""
        running = self._running_contexts(workflow)
        parents = []
        for name, info in self.instance.branches.items():
            if info.get("event_path") and info["status"] == "event" and name not in running \
                    and self._in_workflow(name, workflow):
                self._event_done(info)
                parents.append(str(info["parent"]))
        return list(dict.fromkeys(parents))

    def event_path(self, task: Any, path: Any = None) -> None:
        """A timer starts the path of an event sub-process (``task``: its start event; ``path``: the
        first task of one repetition's path, for a cycle). SpiffWorkflow started the event
        sub-process with its scope, whose context its tasks run in; the process went on meanwhile
        and may have split that context: the path runs in a context of its own, forked from it
        now, and comes back at the end of the event sub-process, or once the branches split
        meanwhile have joined (as a message event sub-process does, ``enter_subworkflow``)."""
        start = task if path is None else path
        ctx = self.context_of(task)
        owner = task.workflow.top_workflow.get_task_from_id(task.workflow.parent_task_id)
        self._fork(start, ctx.name, ctx, spiff.bpmn_id_of(owner), None, [start])
        self.instance.branches[spiff.context_name_of(start)].update(status="event", event_path=True)
        self._event_forked(spiff.context_name_of(start))

    def event_path_ended(self, task: Any) -> None:
        """The paths of a non-interrupting error or escalation event sub-process have ended (``task``:
        the end event of the last one): they merge back now, as the event sub-process would as it
        ends (it does not: it waits for the next event until its scope ends), so that the next
        path an event starts reads what they wrote (``_event_forked``)."""
        for parent in self._end_event_paths(task.workflow):
            self._merge_events(parent)

    def start_caught(self, task: Any) -> None:
        """The start event of an event sub-process caught an error or escalation its scope threw: it
        runs as soon as the task that threw it has (``_Runtime._run_ready``), before any other task
        of its scope (an interrupting one stops them)."""
        self._caught_starts.append(task)

    def _event_done(self, info: dict[str, Any]) -> None:
        """An event sub-process (a timer's path) ended: it merges back once no branch split from
        its context runs, after those that ended before it (``_events_done``)."""
        info["status"] = "event_done"
        info["ended"] = sum(1 for i in self.instance.branches.values() if "ended" in i)

    def boundary_caught(self, task: Any) -> None:
        """Non-interrupting boundary event ``task`` caught a message, signal or escalation. Its path
        starts here, in BPMN: the snapshot its branch forks from is taken now (``boundary_path``),
        though its task runs later (an escalation thrown inside a sub-process: SpiffWorkflow runs the
        sub-process's next steps first). So the path neither reads what those steps wrote since nor,
        at its merge, takes a key both changed as its own: the base holds the key as it was here."""
        ctx = self.context_of(task)
        if not self._forks_path(task, ctx):
            return
        self._merge_ended_side_paths(task, ctx)
        gw = spiff.bpmn_id_of(task)
        task.internal_data[spiff.CAUGHT_AT_KEY] = ctx.snapshot(label=f"split:{gw}", actor=gw).id

    @staticmethod
    def _forks_path(task: Any, ctx: LayeredContext) -> bool:
        """Whether the path of boundary event ``task`` runs in a branch of its own (``boundary_path``)."""
        # a sub-process goes on in this context meanwhile: its splits and activities must not
        # see the path's writes come and go
        return ctx.current_activity is not None or spiff.boundary_of_subworkflow(task)

    def _merge_ended_side_paths(self, task: Any, ctx: LayeredContext) -> None:
        # (a non-interrupting event only: an interrupting cycle ends its activity, and a multi-instance
        # activity's writes with it, at its last repetition, which would undo paths merged into it now)
        if getattr(task.task_spec, "cancel_activity", False):
            return
        for name in self._ended_side_paths(task, ctx.name):
            # the event's earlier paths that have ended come back first: this one reads what they
            # wrote (the second reminder of a cycle sees the first), as it would had they run in
            # the flow; one still running (waiting for a person) merges where it ends
            self._merge_side(spiff.bpmn_id_of(task), name)

    def boundary_path(self, task: Any, path: Any = None) -> None:
        """A non-interrupting boundary event fires. Its path runs beside the activity it is attached
        to, in the same context, unless that activity is open there (a multi-instance activity
        whose instances wait for people) or is a sub-process or call activity (whose tasks run in
        that context): then in a branch of its own, forked from the context (as it stood when the
        event was caught: ``boundary_caught``) and merged back where the path joins (at the latest,
        at the end of the process).
        ``path``: the first task of the path when it is not ``task`` itself (each repetition of a
        cycle timer starts one)."""
        ctx = self.context_of(task)
        if not self._forks_path(task, ctx):
            return
        start = task if path is None else path
        gw = spiff.bpmn_id_of(task)
        caught = task.internal_data.pop(spiff.CAUGHT_AT_KEY, None)
        at = ctx.snapshots.get(caught) if caught is not None else None
        if at is None:
            self._merge_ended_side_paths(task, ctx)
        self._fork(start, ctx.name, ctx, gw, None, [start], at=at)
        # the context it came from goes on meanwhile: the path's changes come back at its join as
        # they stand (``_merge_side``), not by a three-way merge against an untouched parent
        self.instance.branches[spiff.context_name_of(start)]["status"] = "side"

    def _ended_side_paths(self, task: Any, parent: str) -> list[str]:
        """The paths boundary event ``task`` started from context ``parent`` (``boundary_path``) that
        have reached an end event and wait, not merged, for the end of their process."""
        gw = spiff.bpmn_id_of(task)
        # (the tasks below a waiting cycle event are not in get_tasks' walk)
        ended = {spiff.context_name_of(t) for t in task.workflow.tasks.values()
                 if t.state == TaskState.COMPLETED and isinstance(t.task_spec, EndEvent)}
        return [name for name, info in self.instance.branches.items()
                if info["status"] == "side" and info["gateway"] == gw and info["parent"] == parent
                and name in ended and self._in_workflow(name, task.workflow)]

    def _merge_side(self, gw: str, name: str, what: str = "boundary path") -> str:
        """Bring a side branch (``boundary_path``) back into the context it came from: every key it
        changed since it forked, in its layer, unless the parent changed that key too (then the
        parent's value stays, both are on the tape as ``side_conflict`` and the clash is listed in
        the run's ``conflicts``, settled by that rule). Returns the context it merged into."""
        inst = self.instance
        info = inst.branches[name]
        # a path that outlived the branch it left (joined meanwhile) merges where that branch went
        into = str(info["parent"])
        while into in inst.branches and inst.branches[into]["status"] == "joined":
            into = str(inst.branches[into]["parent"])
        branch, parent = inst.contexts[name], inst.contexts[into]
        changes, kept, dropped = self._side_changes(name, parent)
        _bring_side(parent, branch, changes, dropped, branch_name=name, gateway=gw)
        if kept:
            parent.record("side_conflict", actor=gw, data={"branch": name, "gateway_id": gw, "keys": kept})
            # listed with the run's conflicts too, settled by this rule: the flow the activity is on
            # keeps its value (the path ran beside it, from a copy); never only on the tape
            side, own = str(info.get("branch_id") or name), into
            reason = (f"the {what} {side!r} ran beside the flow and changed this key, and so did "
                      f"{own!r}; the value of {own!r} stays (a {what} never overwrites the flow it "
                      "left); its value is on the tape (side_conflict)")
            self._set_conflicts(gw, [
                {"gateway_id": gw, "layer": k["layer"], "key": k["key"],
                 "base_value": k["base"],
                 "values": {side: k["dropped"], own: k["kept"]},
                 "resolution": {"value": k["kept"], "resolver": "strategy", "reason": reason}} for k in kept],
                resolved=True, context=into)
        info["status"] = "joined"
        info["join"] = gw
        branch.record("joined", actor=gw, data={"gateway_id": gw, "into": into})
        return into

    def _side_changes(self, name: str, parent: LayeredContext
                      ) -> tuple[list[tuple[Layer, str, Any]], list[dict[str, Any]], list[str]]:
        """What side branch ``name`` brings into ``parent`` (``_merge_side``): the changes to apply,
        the keys both changed, where ``parent``'s value stays, and the branch's compaction records
        left behind because ``parent`` summarised the same entries (``_unfolded_history``)."""
        info = self.instance.branches[name]
        branch = self.instance.contexts[name]
        # (an event sub-process that read what others had done before it started: ``_event_forked``)
        base = self.instance.contexts[info.get("base_context", info["parent"])].get_snapshot(
            info.get("base_snapshot", info["snapshot_id"]))
        history, dropped = _unfolded_history(base, branch, parent)
        # both counted with one count_only rule: one counter, the flow's count in it (as at a join)
        counters = single_counts(base, {"flow": parent, "side": branch}).get("side", {})
        history.update(counters)
        changes: list[tuple[Layer, str, Any]] = []
        kept: list[dict[str, Any]] = []
        for layer in (Layer.KNOWLEDGE, Layer.HISTORY, Layer.WORKING):
            before, now = dict(base.layer(layer).items()), parent.layer(layer)
            after: Mapping[str, Any] = history if layer is Layer.HISTORY else branch.layer(layer)
            for key in dict.fromkeys([*before, *after]):
                old, new = before.get(key, ABSENT), after.get(key, ABSENT)
                if key.startswith("_") or _same(old, new):
                    continue
                current = now.get(key, ABSENT)
                if layer is Layer.HISTORY and key in counters:
                    changes.append((layer, key, new))
                    continue
                if layer is Layer.HISTORY and key.startswith(RECORD_PREFIXES) and old is ABSENT and current is not ABSENT:
                    # another run of the same activity (a path of each pass of a loop) got there first:
                    # two records, no conflict (as at a join)
                    key = free_record_key(key, [now, {k: None for _, k, _ in changes}])
                    current = ABSENT
                if not _same(current, old) and not _same(current, new):
                    kept.append({"key": key, "layer": str(written_layer(layer, key)), "kept": _plain(current), "dropped": _plain(new),
                                 "base": None if old is ABSENT else _plain(old)})
                    continue
                changes.append((layer, key, DELETED if new is ABSENT else new))
        # a counter lists as kept only what the merged HISTORY holds (as at a join)
        told = side_counters_told(parent, branch, [(k, v) for layer, k, v in changes if layer is Layer.HISTORY])
        changes = sorted([*(c for c in changes if c[0] is not Layer.HISTORY), *((Layer.HISTORY, k, v) for k, v in told)],
                         key=lambda c: c[0])  # (stable: the layers in the order above)
        return changes, kept, dropped

    def _event_forked(self, name: str) -> None:
        """Event sub-process context ``name`` was forked from its process's. The event
        sub-processes that ended before it started but wait to merge back (branches split from
        that context run: ``_merge_events``) are part of what it reads: their changes come into
        it as they will into the process's, and it merges back against the context so made."""
        inst = self.instance
        info, ctx = inst.branches[name], inst.contexts[name]
        done = self._events_done(str(info["parent"]))
        for other in done:
            changes, _, dropped = self._side_changes(other, ctx)
            _bring_side(ctx, inst.contexts[other], changes, dropped, branch_name=other,
                        gateway=str(inst.branches[other]["gateway"]), actor=str(info["gateway"]))
        if done:
            info["base_context"] = name
            info["base_snapshot"] = ctx.snapshot(label=f"event:{info['gateway']}", actor=str(info["gateway"])).id

    def _splits_open(self, name: str) -> bool:
        """Whether branches split from context ``name`` run (not yet joined)."""
        return any(info["parent"] == name and info["status"] == "open" for info in self.instance.branches.values())

    def _merge_events(self, name: str) -> None:
        """Bring the finished event sub-processes that ran beside the branches of context ``name``
        (``enter_subworkflow``) back into it, once no branch split from it runs."""
        if self._splits_open(name):
            return
        for branch in self._events_done(name):
            info = self.instance.branches[branch]
            info["status"] = "side"
            self._merge_side(str(info["gateway"]), branch, "event sub-process")

    def _events_done(self, name: str) -> list[str]:
        """The finished event sub-processes of context ``name`` that wait to merge back, in the
        order they ended (``leave_subworkflow``), as each would have merged then."""
        done = [b for b, i in self.instance.branches.items() if i["parent"] == name and i["status"] == "event_done"]
        return sorted(done, key=lambda b: int(self.instance.branches[b].get("ended", 0)))

    def thrown_out(self, task: Any, event: Any) -> None:
        """A message or signal ``task`` threw that nothing in the instance caught: a ``message_out``
        note on the tape of its context (name, kind, payload, correlations), which
        ``Instance.messages_out`` lists, so the run says it left rather than dropping it silently."""
        definition = event.event_definition
        kind = "signal" if type(definition).__name__.endswith("SignalEventDefinition") else "message"
        bpmn_id = spiff.bpmn_id_of(task)
        data: dict[str, Any] = {"event": str(getattr(definition, "name", "") or ""), "event_kind": kind,
                                "element": bpmn_id, "payload": _json_safe(event.payload)}
        correlations = getattr(event, "correlations", None)
        if correlations:
            data["correlations"] = _json_safe(dict(correlations))
        self.context_of(task).record("message_out", actor=bpmn_id, data=data)

    def caught(self, task: Any, values: dict[str, Any], sent_from: dict[str, Any] | None = None,
               code: str | None = None) -> None:
        """A catching event ran with the payload of an event this process threw (none, maybe): into
        its context; in a collaboration, the record names the pool and message flow that sent it; an
        error's or escalation's record names its ``code``."""
        sender = None
        if sent_from is not None:
            sender = collaboration.sender_of(self.process.paths, self.process.id, sent_from, spiff.bpmn_id_of(task),
                                             spiff.pool_process_of(task))
        events.catch_thrown(self.context_of(task), task, values, sent_from=sender, code=code)


def _cycle_due_before(task: Any, due: datetime) -> bool:
    """Whether a cycle timer on an activity of ``task``'s instance waits with a repetition due
    before ``due`` (a boundary cycle always fires; one on an event-based gateway's branch never does)."""
    top = task.workflow.top_workflow
    for workflow in (top, *top.subprocesses.values()):
        for other in workflow.get_tasks(state=TaskState.WAITING):
            value = other.internal_data.get("event_value")
            if other is not task and spiff.is_cycle(other) and isinstance(other.task_spec, BoundaryEvent) \
                    and isinstance(value, Mapping) and value.get("cycles") != 0 \
                    and datetime.fromisoformat(value["next"]) < due:
                return True
    return False
