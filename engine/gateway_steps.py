"""The driver's steps at gateways (a base class of ``engine.runtime._Runtime``).

* a **split**: XOR continues in the same context (the taken branch's ``contextInject``,
  ``_branch_id``, ``_snapshot_id`` injected, a snapshot and a split note on the tape); AND /
  inclusive fork one context per taken branch from one snapshot.
* an **XOR decision** with natural-language conditions: the expressions rule, the model
  checks them and decides the flows that have only a sentence (``decide_exclusive``).
* a **join**: the arrived branch contexts are merged three-way against the split snapshot
  into the context the split came from; conflicts are resolved by policy, the join's
  strategy, the model or a person (a confirmation the instance waits for, answered or
  timed out here).
"""

from __future__ import annotations

import itertools
import json
import uuid
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager, nullcontext
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from SpiffWorkflow.bpmn.specs.mixins.exclusive_gateway import ExclusiveGateway
from SpiffWorkflow.bpmn.specs.mixins.inclusive_gateway import InclusiveGateway
from SpiffWorkflow.util.task import TaskState

from context_layers import DELETED, Layer, LayeredContext, json_equal, thaw
from context_layers.canonical import freeze
from context_layers.compress_rules import count_key
from context_layers.config import ActivityExtensionConfig
from context_layers.context import ENGINE_RECORD_PREFIXES as ENGINE_RECORDS, Snapshot
from context_layers.errors import ActivityError, ContextWriteDenied, MergeConflictError
from context_layers.tape import ENGINE_KEY_PREFIXES
from context_layers.hooks import RedactSetting, redact_for_model
from gateways import BranchOption, BranchQuestion, ContextSplitter, apply_join, ask_branch, is_natural_language, join_contexts
from gateways.conditions import is_flow_sentence
from gateways.join import MERGED_CONFLICTS_KEY, base_json, folded_before
from gateways.policy import CONFLICT_CONFIRMATION, ESCALATE, HumanRequest, unfit_option
from gateways.splitter import check_inject

from . import spiff

if TYPE_CHECKING:
    from .process import Process
    from .runtime import Engine, Instance

MAIN = spiff.MAIN_CONTEXT


def short(value: Any, limit: int = 80) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + "..."


def short_json(value: Any, limit: int = 80) -> str:
    """An answer for a message as a person writes it, JSON (``true``, ``"approved"``), cut at ``limit``
    characters; Python's spelling only for what JSON cannot write (NaN, an object)."""
    try:
        text = json.dumps(value, ensure_ascii=False, allow_nan=False)
    except (TypeError, ValueError):
        text = repr(value)
    return text if len(text) <= limit else text[:limit] + "..."


def typed_option(options: Sequence[Mapping[str, Any]], value: Any) -> str | None:
    """The string option value an answer stands for when it is that text read as JSON
    (``--answer KEY=true`` for the option "true"), and no option is the answer itself."""
    if isinstance(value, str) or any(json_equal(value, o.get("value")) for o in options):
        return None
    try:
        text = json.dumps(value, ensure_ascii=False)
    except (TypeError, ValueError):
        return None
    return next((o["value"] for o in options if isinstance(o.get("value"), str) and o["value"] == text), None)


def option_value(options: Sequence[Mapping[str, Any]], value: Any) -> Any:
    """The option value an accepted answer stands for: an option's value itself, else the value of
    the option whose label it is, else of the option whose value's JSON text it is (``"40"`` for 40,
    ``true`` for the option "true"), else ``"$escalate"`` for the word ``escalate`` the CLI offers
    for it (a shell expands ``"$escalate"`` to nothing); anything else (an answer to a question with
    no options) stays as given."""
    if any(json_equal(value, o.get("value")) for o in options):
        return value
    typed = typed_option(options, value)
    if typed is not None:
        return typed
    for option in options:
        if value == option.get("label"):
            return option.get("value")
    if isinstance(value, str):
        for option in options:
            if value == json.dumps(option.get("value"), ensure_ascii=False):
                return option.get("value")
    if value == "escalate" and any(o.get("value") == ESCALATE for o in options):
        return ESCALATE
    return value


def _failed_conflict_record(gateway_id: str, conflict: Any) -> dict[str, Any]:
    """A conflict of a join that failed (FAIL_ON_CONFLICT), in the ``--json`` ``conflicts`` shape."""
    record = dict(conflict.to_dict()) if hasattr(conflict, "to_dict") else dict(conflict)
    absent = record.get("base_value") == DELETED.to_json()
    return {"gateway_id": gateway_id, "layer": record.get("layer"), "key": record.get("key"),
            "base_value": base_json(record.get("base_value")), "values": dict(record.get("conflicting_values") or {}),
            "resolution": None, **({"base_absent": True} if absent else {}),
            **{k: v for k, v in record.items() if k not in ("layer", "key", "base_value")}}


def _deadline(entry: Mapping[str, Any]) -> float | None:
    """When a confirmation's timeout runs out (seconds since the epoch), None without a timeout."""
    if entry.get("deadline") is not None:
        return float(entry["deadline"])
    if entry.get("created") is not None and entry.get("timeout") is not None:
        return float(entry["created"]) + float(entry["timeout"])
    return None


RECORD_KEY_PREFIXES = ("_", "activity:", "kb:", "summary:", "compaction:", "tool:", "event:")

#: HISTORY's records that only the engine and the compressor write (context_layers' own list: a
#: caught event's ``event:`` record is the engine's as an activity's is)
ENGINE_RECORD_PREFIXES = ENGINE_RECORDS
#: KNOWLEDGE's retrieval hits, ``kb:<collection>/<file>#<passage>``: one passage, one key (a join keeps
#: the higher confidence of two branches' hits of it)
RETRIEVAL_PREFIX = "kb:"
#: the compressor's ``count_only`` counters, ``summary:count:<pattern>`` (the compressor and a join take
#: such a value for a real count of the entries it removed)
COUNTER_PREFIX = count_key("")
ENGINE_KEY_RULE = ("keys starting with '_', 'activity:', 'event:' or 'compaction:' are the engine's bookkeeping "
                   "and records, 'summary:count:' keys the compressor's count_only counters, and 'kb:' keys the "
                   "retrieval's passages")


def is_engine_key(key: str) -> bool:
    """The engine's bookkeeping (``_mergedConflicts``, ``_branch_id``, ...), HISTORY's records and
    KNOWLEDGE's retrieval hits: nothing from outside the process writes them (an inject, a person's
    answer, start data, the payload of a message or signal sent to the instance, a model's answer).
    A ``kb:`` key from outside would stand in for the passage the retrieval found (reads go L0 to
    L5, and a join keeps the hit of higher confidence)."""
    return key.startswith(ENGINE_KEY_PREFIXES)


def condition_context(ctx: LayeredContext, limit: int = 1000, *, redact: RedactSetting = False) -> dict[str, Any]:
    """The data keys a branch condition may speak of (no records, no knowledge passages),
    each value cut to ``limit`` characters of JSON so one large value cannot crowd out the rest.
    ``redact``: for a model's question, secrets hidden (``redact_for_model``) before the cut, so a
    secret nested in a long value cannot slip through as text."""
    out: dict[str, Any] = {}
    for key, value in ctx.resolved().items():
        if key.startswith(RECORD_KEY_PREFIXES):
            continue
        plain = redact_for_model({key: thaw(value)}, redact)[key]
        text = json.dumps(plain, ensure_ascii=False, sort_keys=True, default=str)
        out[key] = plain if len(text) <= limit else text[:limit] + "..."
    return out


def _gateway_type(spec: Any) -> str:
    name = type(spec).__name__.removeprefix("Layerflow")
    return {"ParallelGateway": "parallel", "InclusiveGateway": "inclusive", "ExclusiveGateway": "exclusive",
            "StartEvent": "parallel"}.get(name, name)  # a start event splits only as an implicit parallel split


# a join without a config of its own, validated once (the model is frozen; model_copy makes the changed ones)
_NO_CONFIG = ActivityExtensionConfig()


def _join_config(join: ActivityExtensionConfig | None, split: ActivityExtensionConfig | None
                 ) -> ActivityExtensionConfig:
    """The join's config, with the split's ``branches`` (their ``reasonKey``) when the join names none:
    a branch is declared once, at the split where it starts. ``_mergedConflicts`` is a log that
    only grows: what branches' own joins added to it is appended, never a conflict."""
    config = join or _NO_CONFIG
    if split is not None and split.branches and not config.branches:
        config = config.model_copy(update={"branches": list(split.branches)})
    if MERGED_CONFLICTS_KEY not in config.reducers:
        config = config.model_copy(update={"reducers": {**config.reducers, MERGED_CONFLICTS_KEY: "append"}})
    return config


def _inject_of(cfg: ActivityExtensionConfig | None, branch_id: str) -> dict[str, Any]:
    if cfg is None:
        return {}
    b = cfg.branch(branch_id)
    return dict(b.context_inject) if b is not None else {}


def _gateway_denied(gw: str, err: ContextWriteDenied) -> ActivityError:
    failed = ActivityError(f"gateway {gw!r}: {err}", task_id=gw)
    failed.kind = err.kind
    return failed


def _inject(ctx: LayeredContext, values: Mapping[str, Any], *, actor: str, data: Mapping[str, Any]) -> None:
    """Inject into WORKING, or into the layer that already holds the key (else a lower
    layer's copy would shadow the injected value). The config's keys are checked before
    (``check_inject``); an engine marker (``_branch_id``) that a process fixed in SYSTEM or
    PROCESS is left as it is, and that is recorded."""
    changes = []
    refused = []
    for key, value in values.items():
        where = ctx.locate(key)
        if where in (Layer.SYSTEM, Layer.PROCESS):
            refused.append(key)
            continue
        layer = where if where is not None and where < Layer.WORKING else Layer.WORKING
        changes.append((layer, key, value))
    if changes:
        ctx.apply_changes(changes, kind="inject", actor=actor, data=dict(data))
    if refused:
        ctx.record("inject_refused", actor=actor, data={**data, "keys": refused,
                                                          "reason": "the key is fixed in SYSTEM or PROCESS"})


def _unique_branch_ids(targets: list[str]) -> list[str]:
    """A branch is named by its first element; two flows of one split to the same element (two
    empty branches straight to the join) are two branches: the second is ``<id>#2``."""
    seen: dict[str, int] = {}
    ids = []
    for target in targets:
        seen[target] = seen.get(target, 0) + 1
        ids.append(target if seen[target] == 1 else f"{target}#{seen[target]}")
    return ids


class GatewaySteps:
    """Splits, XOR decisions, joins and the confirmations joins wait for."""

    engine: Engine
    process: Process
    answers: dict[str, dict[str, Any]]
    _xor: dict[str, dict[str, bool]]

    if TYPE_CHECKING:  # the rest of the driver: engine.runtime._Runtime and engine.scope_steps.ScopeSteps
        @property
        def instance(self) -> Instance: ...  # held weakly (see _Runtime.__init__)
        def context_of(self, task: Any) -> LayeredContext: ...
        def find_waiting_task(self, task_id: str) -> Any: ...
        def _evaluate(self, task: Any, expression: str, external: Mapping[str, Any] | None = None) -> Any: ...
        def _end_event_paths(self, workflow: Any) -> list[str]: ...
        def _merge_events(self, name: str) -> None: ...
        def _merge_side(self, gw: str, name: str, what: str = "boundary path") -> str: ...
        def close_dead_joins(self) -> None: ...

    def split(self, task: Any) -> None:
        spec = task.task_spec
        gw = spec.bpmn_id
        cfg = self.process.config(gw)
        taken = [c for c in task.children if c.has_state(TaskState.DEFINITE_MASK)]
        parent_name = spiff.context_name_of(task)
        parent = self.instance.contexts[parent_name]
        if isinstance(spec, ExclusiveGateway):
            self._xor.pop(str(task.id), None)
            for child in taken:  # one child: the taken flow
                start = spiff.branch_start_id(child)
                self._split_in_place(parent, gw, start, _inject_of(cfg, start))
            return
        if taken:
            self._fork(task, parent_name, parent, gw, cfg, taken)

    def no_branch_taken(self, task: Any) -> ActivityError:
        """The error of a gateway that finds no outgoing flow to take: no condition holds and it
        has no default flow. Names the conditions, the values they read, and what to add."""
        spec = task.task_spec
        gw = spiff.bpmn_id_of(task)
        conditions: list[str] = []
        sentences = False
        for condition, name in spec.cond_task_specs:
            if condition is not None:
                target = task.workflow.spec.get_task_spec_from_name(name)
                text = str(condition.args[0]).strip()
                spoken = is_flow_sentence(text)
                sentences = sentences or spoken
                why = " (a sentence: only the model decides it, and none did)" if spoken else ""
                conditions.append(f"to {spiff.flow_target_id(target)!r}: {text}{why}")
        ctx = self.context_of(task)
        read = []
        # a sentence reads no context key, however much of it parses as a (CJK) name
        expressions = (str(c.args[0]) for c, _ in spec.cond_task_specs
                       if c is not None and not is_flow_sentence(str(c.args[0]).strip()))
        for name in sorted(spiff.names_in(expressions)):
            read.append(f"{name}={short(thaw(ctx.resolve(name)))}" if name in ctx else f"no {name!r}")
        kind = "inclusive" if isinstance(spec, InclusiveGateway) else "exclusive"
        return ActivityError(
            f"{kind} gateway {gw!r}: no condition of its outgoing flows holds ({'; '.join(conditions)}) and it has "
            f"no default flow; the context has {', '.join(read) or 'nothing these conditions read'}: add a default "
            "flow (default=\"FLOW_ID\" on the gateway) or a condition for this case"
            + ("; run with a model (--model) for the sentences" if sentences else ""), task_id=gw)

    def decide_exclusive(self, task: Any) -> dict[str, bool] | None:
        """Decide an XOR gateway whose config gives natural-language conditions: the verdict of
        each outgoing flow's condition text, for SpiffWorkflow's flow-by-flow evaluation.
        None when the config gives no sentence (SpiffWorkflow evaluates the expressions).

        Who decides (DESIGN: "evaluated by the model with the expression as fallback"):

        1. the model, which reads every branch's sentence (a flow with no sentence: its
           expression) and the context, and names one branch. A valid answer naming one of
           the gateway's branches is followed. The context reaches it wrapped as data, never
           as instructions. When it names another branch than the expressions would take,
           ``condition_disagreement`` goes on the tape (both branches, the model's
           rationale) so a person can review the sentence against its expression.
        2. the BPMN condition expressions, in SpiffWorkflow's order of the flows, when no
           model is configured or it gave no valid answer: the first flow whose expression
           holds is taken. A sentence has no expression: offline its flow is not taken.
           They are evaluated after the model was asked: one that fails on this instance's
           data stops the instance only when it has to decide (behind a valid answer the
           failure is the decision note's ``expression_error``).
        3. the default flow; without one, SpiffWorkflow's "no conditions satisfied" error.

        Offline (no model) the expressions decide and nothing imports litellm. A model
        that fails (unreachable, or malformed twice) is recorded as
        ``condition_model_failed`` and the expressions decide. Every decision is recorded
        as ``condition_decision``; a replay reads it from the tape, never asking again.
        """
        spec = task.task_spec
        gw = spec.bpmn_id
        cfg = self.process.config(gw)
        sentences = {b.id: b.condition for b in (cfg.branches if cfg is not None else [])
                     if b.condition and is_natural_language(b.condition)}
        flows: list[tuple[str, str | None]] = []  # (branch id, condition text; None: the default flow)
        for condition, name in spec.cond_task_specs:
            target = task.workflow.spec.get_task_spec_from_name(name)
            flows.append((spiff.flow_target_id(target), None if condition is None else condition.args[0]))
        spoken = {b for b, text in flows if text is not None and is_natural_language(text)}
        # A sentence written as the flow's own conditionExpression is that branch's condition
        # too (the config's sentence, when it gives one, wins).
        for b, text in flows:
            if b in spoken and is_flow_sentence(text):
                sentences.setdefault(b, str(text).strip())
        if not sentences:
            return None
        ctx = self.context_of(task)
        default = next((b for b, text in flows if text is None), None)

        answer = None
        chooser = self.engine.chooser_for(self.process, gw)
        if chooser is not None:
            options = tuple(BranchOption(b, sentences.get(b) or text, default=text is None) for b, text in flows)
            with self._noting_calls(chooser, ctx, gw, "condition"):
                # the question shows the context's data keys, secrets hidden (the gateway's redact config)
                shown = condition_context(ctx, redact=self.process.redact_for(gw))
                answer, failures = ask_branch(chooser, BranchQuestion(gw, options, shown))
            for note in failures:
                ctx.record("condition_model_failed", actor=gw, data={"gateway": gw, "error": note[:2000]})
        valid = answer is not None and answer.branch in {b for b, _ in flows}

        # The expressions are the fallback, evaluated after the model was asked: one that cannot be
        # evaluated on this instance's data (a key it reads is missing) stops the instance only when
        # it has to decide; behind a valid answer its failure is noted and the model's branch taken.
        expression_error: str | None = None
        try:
            by_expression = next((b for b, text in flows if text is not None and b not in spoken
                                  and self._evaluate(task, text)), None)
        except ActivityError as err:  # the error the instance stops with when the expressions must decide
            if not valid:
                raise
            by_expression, expression_error = None, str(err)[:2000]

        chosen: str | None
        if valid:
            assert answer is not None
            chosen, by = answer.branch, "model"
        elif by_expression is not None:
            chosen, by = by_expression, "expression"
        else:
            chosen, by = default, "default"
        model = None if answer is None else {"branch": answer.branch, "rationale": answer.rationale}
        ctx.record("condition_decision", actor=gw, data={
            "gateway": gw, "branch": chosen, "decided_by": by, "expression_branch": by_expression or default,
            "model": model, "model_configured": chooser is not None, "conditions": sentences,
            **({"expression_error": expression_error} if expression_error is not None else {})})
        expected = by_expression or default
        # A flow whose only condition is a sentence is the model's alone: taking it over the
        # default contradicts no expression (nor does any branch where the expressions failed).
        if (answer is not None and expression_error is None and answer.branch != expected
                and (by_expression is not None or answer.branch not in spoken)):
            ctx.record("condition_disagreement", actor=gw, data={
                "gateway": gw, "followed": chosen, "followed_by": by, "model_branch": answer.branch,
                "model_rationale": answer.rationale,
                "expression_branch": expected,
                "conditions": {b: sentences.get(b) for b in (expected, answer.branch) if b is not None}})
        verdicts: dict[str, bool] = {}
        for branch, text in flows:
            if text is not None:
                verdicts[text] = verdicts.get(text, False) or branch == chosen
        self._xor[str(task.id)] = verdicts
        return verdicts

    def _split_in_place(self, ctx: LayeredContext, gw: str, branch_id: str, inject: Mapping[str, Any]) -> None:
        """XOR: only one branch goes on, so the context goes on with it. A contextInject the
        write rule refuses stops the instance, as at a parallel split."""
        try:
            check_inject(ctx, gw, branch_id, inject, actor=gw)
        except ContextWriteDenied as err:  # on the tape already
            raise _gateway_denied(gw, err) from None
        snap = ctx.snapshot(label=f"split:{gw}", actor=gw)
        ctx.record("split", actor=gw, data={"gateway": gw, "type": "exclusive", "branches": [branch_id],
                                             "snapshot_id": snap.id, "inject": dict(inject)})
        values = {**inject, "_branch_id": branch_id, "_snapshot_id": snap.id}
        _inject(ctx, values, actor=gw, data={"gateway": gw, "branch_id": branch_id})

    def _fork(self, task: Any, parent_name: str, parent: LayeredContext, gw: str,
              cfg: ActivityExtensionConfig | None, taken: list[Any], at: Snapshot | None = None) -> None:
        inst = self.instance
        ids = _unique_branch_ids([spiff.branch_start_id(c) for c in taken])
        try:
            branches = ContextSplitter().split(parent, gw, ids, cfg, actor=gw, gateway_type=_gateway_type(task.task_spec),
                                               at=at)
        except ContextWriteDenied as err:  # a contextInject the layer rules refuse (on the tape already)
            raise _gateway_denied(gw, err) from None
        split_id = f"{gw}@{task.id}"
        for child, b in zip(taken, branches):
            name = b.context.name
            inst.contexts[name] = b.context
            inst.branches[name] = {
                "parent": parent_name, "branch_id": b.branch_id, "gateway": gw, "split": split_id,
                "snapshot_id": b.snapshot_id, "injected": thaw(dict(b.injected)), "status": "open", "join": None}
            child.internal_data[spiff.CTX_KEY] = name
            child.internal_data[spiff.BRANCH_KEY] = b.branch_id

    def join(self, task: Any) -> bool:
        """Merge the arrived branch contexts; False when the join waits for a person.

        The implicit join a (sub-)process ends in (``spiff.is_end_join``) fires once every
        other task of its workflow is finished: a branch of a split in that workflow that
        did not arrive never will (an interrupting event cancelled it), so it is closed as
        ``cancelled`` and its siblings merge without it."""
        gw = spiff.bpmn_id_of(task)
        branches = self.instance.branches
        # SpiffWorkflow keeps the instances of this join from an earlier pass of a loop (the
        # ones its firing cancelled); their branches were merged (or closed) back then
        arrived = [name for name in (spiff.context_name_of(t) for t in spiff.arrived_branch_tasks(task))
                   if name not in branches or branches[name]["status"] not in ("joined", "cancelled")]
        current = list(dict.fromkeys(self._merge_side(gw, n) if n in branches and branches[n]["status"] == "side"
                                     else n for n in arrived))
        if spiff.is_end_join(task.task_spec):
            # the paths a timer started here (``event_path``) have ended, each repetition's of a cycle
            # too (SpiffWorkflow cancelled the end it waited at): they come back with ``_merge_events``
            self._end_event_paths(task.workflow)
            current = list(dict.fromkeys(str(branches[n]["parent"]) if n in branches and branches[n].get("event_path")
                                         and branches[n]["status"] == "event_done" else n for n in current))
            # a branch whose path went on into a split of its own and ended only in that split's
            # branches (each at an end event, no join) arrives through them: it is no branch
            # that never came, and they merge into it first
            self._cancel_branches(task, keep=[a for n in current for a in self._lineage(n)])
        while True:
            open_groups: dict[str, list[str]] = {}
            for name in current:
                info = branches.get(name)
                if info is not None and info["status"] == "open":
                    open_groups.setdefault(info["split"], []).append(name)
            # A split's branches merge once all of its open branches are here; a nested
            # split's branches (deeper) merge before their parent's. Only a split of this join's
            # own workflow: the end of a sub-process that a branch runs through is no join of
            # that branch's split, even when the branch is the only one the split sent
            ready = [members for split, members in open_groups.items()
                     if set(members) >= {n for n, i in branches.items() if i["split"] == split and i["status"] == "open"}
                     and self._in_workflow(members[0], task.workflow) and self._closes_here(task, members)]
            if not ready:
                part = self._part_of_split(task, open_groups)
                if part is None:
                    break
                group = self._merge_part(task, gw, part, arrival=arrived)
                if group is None:
                    return False
                current = list(dict.fromkeys(group if n in part else n for n in current))
                continue
            members = max(ready, key=lambda m: self._depth(m[0]))
            parent_name = branches[members[0]]["parent"]
            if not self._merge_group(task, gw, parent_name, members, arrival=arrived):
                return False
            current = list(dict.fromkeys(parent_name if n in members else n for n in current))
        if len(current) != 1:
            raise MergeConflictError(self._unmatched_join(gw, current), gateway_id=gw)
        task.internal_data[spiff.CTX_KEY] = current[0]
        self._merge_events(current[0])
        return True

    def _part_of_split(self, task: Any, open_groups: Mapping[str, list[str]]) -> list[str] | None:
        """Two or more branches of one split that met at this join while their siblings never
        can (no path leads from where a sibling starts to this join): the join closes that part
        of the split, as SpiffWorkflow's does. A sibling that may still come stays an error."""
        for split, members in open_groups.items():
            if len(members) < 2 or not self._in_workflow(members[0], task.workflow):
                continue
            others = [i for n, i in self.instance.branches.items()
                      if i["split"] == split and i["status"] == "open" and n not in members]
            if others and not any(self._may_reach(task, i["branch_id"], i["gateway"]) for i in others):
                return members
        return None

    def _closes_here(self, task: Any, members: list[str]) -> bool:
        """Whether this join is where ``members`` (all the open branches of their split) meet.
        One branch alone of a split that did not take all its flows (an inclusive split that
        took one) meets nothing at a join none of the flows it did not take can reach: the
        join of a block nested in that branch. It goes on to its split's own join, whose
        settings (reducers, strategy) are the ones that apply there."""
        if len(members) > 1:
            return True
        info = self.instance.branches[members[0]]
        taken = {i["branch_id"] for i in self.instance.branches.values() if i["split"] == info["split"]}
        splits = [s for s in task.workflow.spec.task_specs.values() if getattr(s, "bpmn_id", None) == info["gateway"]]
        untaken = [o.bpmn_id for s in splits for o in s.outputs
                   if getattr(o, "bpmn_id", None) and o.bpmn_id not in taken]
        return not untaken or any(self._may_reach(task, t, info["gateway"]) for t in untaken)

    @staticmethod
    def _may_reach(task: Any, start_id: str, split_id: str) -> bool:
        """Whether the flow from the element ``start_id`` of ``task``'s workflow can reach
        ``task``'s element without passing the split ``split_id`` again (a loop back through the
        split brings new branches). True when the element is not found: assume it can."""
        specs = task.workflow.spec.task_specs.values()
        todo = [s for s in specs if getattr(s, "bpmn_id", None) == start_id]
        if not todo:
            return True
        seen: set[str] = set()
        while todo:
            spec = todo.pop()
            if spec is task.task_spec:
                return True
            if spec.name not in seen and getattr(spec, "bpmn_id", None) != split_id:
                seen.add(spec.name)
                todo.extend(spec.outputs)
        return False

    def _merge_part(self, task: Any, gw: str, members: list[str], *, arrival: list[str]) -> str | None:
        """Merge ``members``, part of a split's branches, into one new branch of that split,
        forked from the split's snapshot and named by this join: it goes on in their place and
        merges with the other branches where they meet (at the latest where the scope ends).
        None while the merge waits for a person."""
        inst = self.instance
        info = inst.branches[members[0]]
        name = f"{info['parent']}/{gw}@{task.id}"  # one per firing of the join
        if name not in inst.contexts:  # kept while the merge waits for answers
            parent = inst.contexts[info["parent"]]
            inst.contexts[name] = LayeredContext.fork(parent.get_snapshot(info["snapshot_id"]), name=name,
                                                      branch_id=gw, actor=gw, encoding=parent.encoding,
                                                      clock=parent.clock)
        if not self._merge_group(task, gw, name, members, arrival=arrival):
            return None
        inst.branches[name] = {
            "parent": info["parent"], "branch_id": gw, "gateway": info["gateway"], "split": info["split"],
            "snapshot_id": info["snapshot_id"], "injected": {}, "status": "open", "join": None}
        return name

    def _unmatched_join(self, gw: str, current: list[str]) -> str:
        """Why a join cannot merge what arrived: some branches of one split are missing (they reach
        the join by another flow, later), or the branches come from different splits."""
        branches = self.instance.branches
        splits = {branches[n]["split"] for n in current if n in branches and branches[n]["status"] == "open"}
        if len(splits) == 1 and all(n in branches for n in current):
            [split] = splits
            siblings = [i for i in branches.values() if i["split"] == split]
            missing = [i["branch_id"] for i in siblings if i["status"] == "open" and
                       not any(branches[n] is i for n in current)]
            here = ", ".join(repr(branches[n]["branch_id"]) for n in current)
            return (f"join {gw!r} fired with {len(current)} of the {len(siblings)} branches of split "
                    f"{siblings[0]['gateway']!r} ({here}); {', '.join(map(repr, missing))} had not arrived (a path "
                    "that merges branches of one split, e.g. in an exclusive gateway, brings them to the join one "
                    "at a time): layerflow merges every branch of a split at one join, so give the join one "
                    f"incoming flow per branch of {siblings[0]['gateway']!r}")

        def described(name: str) -> str:
            info = branches.get(name)
            if info is not None:
                return f"branch {info['branch_id']!r} of split {info['gateway']!r}"
            return "the process outside any split" if name == MAIN else f"the context {name!r}"

        return (f"join {gw!r} received what no one split sent together: {'; '.join(map(described, current))} "
                "(a path that goes back into the branches of a split from outside it, e.g. a loop through an "
                "exclusive gateway, brings them here apart); layerflow merges the branches of one split at a time: "
                "close each split with its own join, and let a loop go back before the split")

    def terminate(self, task: Any) -> None:
        """A terminate (or error) end event in a branch: the branch that reached it merges into
        its parent (and on up, to the context the terminated workflow started in; for an error
        an event sub-process of a scope around catches, to the context of that scope); the
        branches it cancels are closed as ``cancelled``, their changes dropped, as the
        terminate drops their tokens."""
        name = spiff.context_name_of(task)
        branches = self.instance.branches
        gw = spiff.bpmn_id_of(task)
        # an error (an escalation) that an event sub-process of a scope around caught: the branches of
        # the workflows up to that scope merge too (``spiff.CAUGHT_UP_KEY``)
        workflows = [task.workflow]
        for _ in range(int(task.internal_data.pop(spiff.CAUGHT_UP_KEY, 0))):
            if workflows[-1].parent_workflow is not None:
                workflows.append(workflows[-1].parent_workflow)
        while name in branches and branches[name]["status"] == "open" \
                and any(self._in_workflow(name, w) for w in workflows):
            info = branches[name]
            self._cancel_branches(task, keep=[name], split=info["split"])
            if not self._merge_group(task, gw, info["parent"], [name], arrival=[name]):
                raise MergeConflictError(f"terminate end event {gw!r}: branch {info['branch_id']!r} could not be "
                                         "merged into its parent context", gateway_id=gw)
            name = info["parent"]
        task.internal_data[spiff.CTX_KEY] = name

    def _lineage(self, name: str) -> list[str]:
        """``name`` and the branches it was split off from, innermost first."""
        found = [name]
        while found[-1] in self.instance.branches:
            found.append(str(self.instance.branches[found[-1]]["parent"]))
        return found

    def _cancel_branches(self, task: Any, *, keep: list[str], split: str | None = None) -> None:
        """Close the open branches of ``split`` (default: of every split in ``task``'s
        workflow) that are not in ``keep``."""
        for name, info in self.instance.branches.items():
            if info["status"] != "open" or name in keep:
                continue
            if (info["split"] == split) if split is not None else self._in_workflow(name, task.workflow):
                by = spiff.bpmn_id_of(task)
                info["status"] = "cancelled"
                info["join"] = by
                self.instance.contexts[name].record("cancelled", actor=by, data={"by": by})

    def _in_workflow(self, name: str, workflow: Any) -> bool:
        """Whether branch ``name`` was split off by a gateway of ``workflow`` (not of a
        sub-process in it, nor of the process around it)."""
        split_task_id = self.instance.branches[name]["split"].rsplit("@", 1)[1]
        return uuid.UUID(split_task_id) in workflow.tasks

    @contextmanager
    def _noting_calls(self, client: Any, ctx: LayeredContext, element_id: str, purpose: str) -> Iterator[None]:
        """While a model client (the arbiter, a condition chooser) works for ``element_id``,
        every attempt, its request, reply and error, is noted as ``llm_call`` on ``ctx``'s tape,
        as an LLM activity's are: a garbage answer is on the tape, not only its consequence."""
        if client is None or not hasattr(client, "on_attempt") or not hasattr(client, "endpoint"):
            yield
            return
        from .llm import call_recorder
        from .model_limits import ModelLimits, ModelLimitsError

        try:
            limits = ModelLimits.of(ctx)
        except ModelLimitsError:
            limits = ModelLimits()  # unusable limits fail the instance's model steps, naming them
        before = client.on_attempt
        client.on_attempt = call_recorder(ctx, task_id=element_id, endpoint=client.endpoint,
                                          attempts=int(client.attempts), actor=element_id,
                                          agent=f"{client.endpoint.model}#{purpose}", purpose=purpose)
        # SYSTEM's model_limits bound the arbiter's and a condition's requests as they bound an activity's
        within = client.within(limits) if hasattr(client, "within") else nullcontext()
        try:
            with within:
                yield
        finally:
            client.on_attempt = before

    def _depth(self, name: str) -> int:
        d = 0
        while name in self.instance.branches:
            name = self.instance.branches[name]["parent"]
            d += 1
        return d

    def _context_of_snapshot(self, snapshot_id: str) -> LayeredContext | None:
        """The instance's context that took ``snapshot_id`` (``snap:<context>:<seq>``)."""
        name = snapshot_id[len("snap:"):].rpartition(":")[0] if snapshot_id.startswith("snap:") else ""
        return self.instance.contexts.get(name)

    def _merge_group(self, task: Any, gw: str, parent_name: str, members: list[str], *, arrival: list[str]) -> bool:
        inst = self.instance
        parent = inst.contexts[parent_name]
        infos = {m: inst.branches[m] for m in members}
        # the split's context; ``parent_name`` is another one when part of the split merges (_merge_part)
        base = inst.contexts[infos[members[0]]["parent"]].get_snapshot(infos[members[0]]["snapshot_id"])
        # branch order: the split's order of outgoing flows
        ordered = sorted(members, key=list(inst.branches).index)
        contexts = {infos[m]["branch_id"]: inst.contexts[m] for m in ordered}
        injected = {infos[m]["branch_id"]: infos[m]["injected"] for m in ordered}
        order = [infos[m]["branch_id"] for m in dict.fromkeys(a for a in arrival if a in infos)]
        # what a person was shown, for the answers given: the chain does not run again for them
        # (this firing's only: a join that fires in two places at once, as a called process's join
        # does when two branches call it, asks each under an id of its own, see _add_confirmations)
        if any(not c.get("answered") for c in self._firing(gw, parent_name)):
            # a question of an earlier pass that an interrupting event cancelled since (a boundary
            # timer on the join's sub-process whose path loops back into it: a retry) is closed
            # before this pass asks, as it would be once the run settles: it is none of this pass's
            self.close_dead_joins()
        mine = [c for c in self._firing(gw, parent_name)
                if c.get("answered") and not c.get("resolved") and not c.get("cancelled")]
        asked = {_request_id(c): {**c, "id": _request_id(c), "timed_out": bool(c.get("answered_by_timeout"))}
                 for c in mine}
        # the answers are saved with their confirmations: a join that asked several questions
        # runs again once all are answered, maybe after a save and a load (`resume --answer`
        # one at a time), when the answers given before are no longer in self.answers
        answers = {_request_id(c): c["answer"] for c in mine}
        answers.update({_request_id(c): self.answers[c["id"]]["value"] for c in mine if c["id"] in self.answers})
        own = self.process.config(gw)
        if own is None and spiff.is_end_join(task.task_spec) and spiff.is_collaboration(task.workflow.spec):
            own = self.process.config(str(task.workflow.spec.name))  # a collaboration's settings are its end join's
        config = _join_config(own, self.process.config(infos[members[0]]["gateway"]))
        if "redact" not in config.model_fields_set and self.process.redact is not None:
            config = config.model_copy(update={"redact": self.process.redact})  # process: {redact: ...}
        arbiter = self.engine.arbiter_for(self.process, config.llm)
        try:
            with self._noting_calls(arbiter, parent, gw, "conflict_resolution"):
                result = join_contexts(base, contexts, config=config, gateway_id=gw,
                                       arrival_order=order, answers=answers, arbiter=arbiter,
                                       human_available=True, injected=injected, asked=asked,
                                       base_folded=folded_before(base, self._context_of_snapshot),
                                       decided=self._model_decided(gw) if mine else None,
                                       clock=self.instance.clock)
        except MergeConflictError as err:
            records = getattr(err, "conflicts", None) or []
            parent.record("conflict_failed", actor=gw, data={"gateway_id": gw, "message": str(err)[:2000]})
            self._set_conflicts(gw, [_failed_conflict_record(gw, c) for c in records], resolved=False,
                               context=parent_name)
            raise
        if parent_name != infos[members[0]]["parent"]:  # into a fork of the split's snapshot, not the split's context
            result = replace(result, snapshot_id=parent.snapshot(label=f"join:{gw}", actor=gw).id)
        apply_join(parent, result, actor=gw)
        records = result.conflict_records()
        self._set_conflicts(gw, records, resolved=result.complete, context=parent_name, refire=bool(mine))
        if not result.complete:
            self._add_confirmations(task, gw, result.pending, context=parent_name,
                                    values={r["key"]: r["values"] for r in records})
            return False
        self._close_confirmations(gw, parent_name)
        for m in members:
            inst.branches[m]["status"] = "joined"
            inst.branches[m]["join"] = gw
            inst.contexts[m].record("joined", actor=gw, data={"gateway_id": gw, "into": parent_name})
        return True

    def _model_decided(self, gw: str) -> dict[str, dict[str, Any]]:
        """What the model settled when join ``gw`` ran before and waited for people (the latest report
        of each key; the reports do not say which firing made them, and the same question keeps the
        same answer): kept when the join runs again once they answered (``resolve_conflicts``)."""
        return {c["key"]: c for c in self.instance.conflicts
                if c.get("gateway_id") == gw and (c.get("resolution") or {}).get("resolver") == "model"}

    def _set_conflicts(self, gw: str, records: list[dict[str, Any]], *, resolved: bool, context: str,
                       refire: bool = False) -> None:
        """The ``conflicts`` list shows each join's conflicts once. A join that waited for a person
        runs again once answered (``refire``) and reports all its conflicts again: each replaces
        its report of the pass before, the pending one (now answered) and the ones the policy or
        the strategy settled then (settled the same way again), which would otherwise be listed
        twice. A join that fires in several places at once (a called process's join called from
        two branches, a join inside a parallel multi-instance body) asks each firing its own
        questions: a pending conflict another firing still asks about stays listed, even when its
        key and values are this firing's too. Each report names the context its firing merges into,
        so this firing replaces only its own; a report saved before reports named it is told by
        counting: one per open question elsewhere on the same key and values (each join
        confirmation keeps its conflict's ``values``)."""
        inst = self.instance
        was_pending = [c for c in inst.conflicts if c.get("gateway_id") == gw and c.get("resolution") is None
                       and not c.get("cancelled") and c.get("context", context) == context]
        elsewhere = [c for c in inst.confirmations
                     if c.get("task_id") == gw and c.get("context") != context and not c.get("answered")]
        for record in records:
            same = [c for c in was_pending if c.get("key") == record.get("key")
                    and json_equal(c.get("values"), record.get("values"))]
            named = [c for c in same if "context" in c]
            # another firing's open question on this key is about the same conflict only when it
            # asks about the same values (a confirmation saved without its values: by key alone)
            asked_elsewhere = 0 if named else sum(
                1 for c in elsewhere if c.get("key") == record.get("key")
                and ("values" not in c or json_equal(c["values"], record.get("values"))))
            if len(same) > asked_elsewhere:
                was_pending.remove((named or same)[0])
                _remove_item(inst.conflicts, (named or same)[0])
            elif refire and record.get("resolution") is not None:
                # the latest report of this key is the pass before's (a model asked again may even
                # have settled it otherwise this time): replaced, not kept beside the new one
                before = [c for c in inst.conflicts if c.get("gateway_id") == gw and c.get("key") == record.get("key")
                          and c.get("resolution") is not None and json_equal(c.get("values"), record.get("values"))
                          and c.get("context", context) == context]
                if before:
                    _remove_item(inst.conflicts, before[-1])
        for c in was_pending:  # this firing's (the usual case: every pending conflict of the gateway)
            if "context" in c or not elsewhere:
                _remove_item(inst.conflicts, c)
        # each names the context the join merges into: of several firings at once, whose it is
        inst.conflicts.extend({**record, "context": context} for record in records)

    def _firing(self, gw: str, context: str) -> list[dict[str, Any]]:
        """The confirmations of one firing of join ``gw``: the ones it asked merging into ``context``
        (two firings at once merge into different contexts; one after the other, in a loop, the
        earlier one's are resolved)."""
        return [c for c in self.instance.confirmations
                if c.get("task_id") == gw and c.get("context", context) == context]

    def _add_confirmations(self, task: Any, gw: str, pending: list[Any], *, context: str,
                           values: Mapping[str, Any]) -> None:
        """Ask ``pending`` for this firing of join ``gw``; each question keeps the ``values`` (branch
        id -> value) of the conflict it asks about, which tells it from another firing's question on
        the same key."""
        inst = self.instance
        known = {_request_id(c) for c in self._firing(gw, context) if not c.get("answered")}
        now = self.instance.clock()
        for req in pending:
            if req.id in known:
                continue
            entry = {**req.to_dict(), **({"values": values[req.key]} if req.key in values else {}),
                     "answer": None, "timed_out": False, "answered": False,
                     "task_id": gw, "task": str(task.id), "context": context,
                     "created": now, "deadline": now + float(req.timeout)}
            # the same question open for another firing of this join (GATEWAY/KEY answers both)
            taken = {c["id"] for c in inst.confirmations if not c.get("answered")}
            if req.id in taken:
                entry["id"] = next(f"{req.id}#{n}" for n in itertools.count(2) if f"{req.id}#{n}" not in taken)
                entry["request_id"] = req.id
            inst.confirmations.append(entry)

    def _close_confirmations(self, gw: str, context: str) -> None:
        for c in self._firing(gw, context):
            if c.get("answered") and "resolved" not in c:
                c["resolved"] = True
                self.answers.pop(c["id"], None)

    def check_answer(self, confirmation_id: str, value: Any) -> dict[str, Any]:
        """The open confirmation, if ``value`` is one of its options (value, label or its JSON text)."""
        inst = self.instance
        entry = next((c for c in inst.confirmations if c["id"] == confirmation_id and not c.get("answered")), None)
        if entry is None:
            open_ids = [c["id"] for c in inst.confirmations if not c.get("answered")]
            raise ActivityError(f"instance {inst.id} has no open confirmation {confirmation_id!r}; open: "
                                f"{', '.join(open_ids) or 'none'}")
        from .governance import OptionNotOffered  # governance imports this module

        try:
            freeze(value)
        except ValueError as err:  # NaN, Infinity, a lone surrogate: the person's mistake, not the process's
            raise OptionNotOffered(f"answer {short(value)} for confirmation {confirmation_id!r} is not a JSON value: "
                                f"{err}; answer with one of the offered option values",
                                instance_id=inst.id, task_id=entry.get("task_id")) from None
        options = entry.get("options") or []
        ok = (not options or value == "escalate" or typed_option(options, value) is not None
              or any(json_equal(value, o.get("value")) or value == o.get("label")
                     or (isinstance(value, str) and value == json.dumps(o.get("value"), ensure_ascii=False))
                     for o in options))
        if not ok and entry.get("type") == CONFLICT_CONFIRMATION and entry.get("gateway_id"):
            config = self.process.config(str(entry["gateway_id"]))
            why = None if config is None else unfit_option(HumanRequest.from_dict(entry), value, config)
            if why is not None:
                raise OptionNotOffered(why, instance_id=inst.id, task_id=entry.get("task_id"))
        if not ok:
            offered = ", ".join(json.dumps(o.get("value"), ensure_ascii=False) for o in options)
            raise OptionNotOffered(f"answer {value!r} for confirmation {confirmation_id!r} is not one of the "
                                   f"offered option values: {offered}", instance_id=inst.id,
                                   task_id=entry.get("task_id"))
        return entry

    def describe(self, item: Mapping[str, Any]) -> dict[str, Any]:
        """What a person is asked: the confirmation (message, options, default) or the user task."""
        if item["kind"] == "confirmation":
            # the open one: a loop back through a join asks again under the same id, with new options
            entry = next((c for c in self.instance.confirmations if c["id"] == item["id"] and not c.get("answered")),
                         next((c for c in self.instance.confirmations if c["id"] == item["id"]), {}))
            return {**entry, **item}
        out = dict(item)
        if item["kind"] == "user_task":
            task = self.find_waiting_task(item["id"])
            out["documentation"] = getattr(task.task_spec, "documentation", None)
        return out

    def answer(self, confirmation_id: str, value: Any, *, resolver: str = "human", timed_out: bool = False,
               actor: str = "person", reason: str | None = None, unattended: bool = False,
               by: str | None = None) -> None:
        """Record a person's answer; once a join has all its answers it runs again. ``unattended``: no
        person gave it, ``actor`` took what was proposed (``runtime.Unattended``; the join's resolution
        then says in its reason whose proposal ``actor`` took). ``by``: the person who answered, when
        they were named (a REST request's ``user``, the console's signed-in person); the join's
        resolution names them.

        The decision goes on the tape when it is made (a join with several confirmations
        runs again, and records its resolutions, only once all are answered); an answer a
        timeout gave is on the tape as ``confirmation_timed_out`` already."""
        inst = self.instance
        entry = self.check_answer(confirmation_id, value)
        value = option_value(entry.get("options") or [], value)
        if not timed_out:
            ctx = inst.contexts.get(entry.get("context") or MAIN, inst.main)
            ctx.record("human_decision", actor=actor, data={
                "confirmation_id": confirmation_id, "key": entry.get("key"), "value": value, "reason": reason,
                **({"resolver": resolver} if resolver != "human" else {}),
                **({"unattended": True} if unattended else {})})
        if resolver != "human":
            entry["resolver"] = resolver  # the join's resolution names who decided
        if unattended:
            entry["unattended"] = True
            entry["answered_by"] = actor
        if by and not timed_out and not unattended:
            entry["by"] = by
        entry["answer"] = value
        entry["answered"] = True
        entry["answered_at"] = self.instance.clock()  # a second answer is told when (AnsweredAlready)
        entry["timed_out"] = timed_out or bool(entry.get("timed_out"))  # an escalated one stays marked
        self.answers[confirmation_id] = {"value": value, "resolver": resolver}
        task_uuid = entry.get("task")
        if task_uuid and not any(c.get("task") == task_uuid and not c.get("answered") for c in inst.confirmations):
            task = inst.workflow.get_task_from_id(uuid.UUID(task_uuid))
            if task is not None and task.state == TaskState.STARTED:
                task.run()


    def _open(self, confirmation_id: str) -> dict[str, Any] | None:
        return next((c for c in self.instance.confirmations if c["id"] == confirmation_id and not c.get("answered")),
                    None)

    def overdue(self, confirmation_id: str) -> bool:
        """Past its deadline and not yet timed out (an escalated one waits for a person, no longer for a clock)."""
        entry = self._open(confirmation_id)
        if entry is None or entry.get("escalated"):
            return False
        deadline = _deadline(entry)
        return deadline is not None and self.instance.clock() >= deadline

    def time_out(self, confirmation_id: str) -> bool:
        """Apply a confirmation's timeout rule; True when that answered it.

        ``onTimeout: default`` with a default that is one of the options: the default is
        the answer (the join runs again; its resolution says it was the timeout's).
        Otherwise (``onTimeout: escalate``, or no usable default) the confirmation is marked
        ``escalated`` and stays open: a loan officer expects an unanswered dual approval
        to land on a supervisor's desk, not to be decided by the clock nor to fail the
        instance (which would lose the question). Either way ``timed_out`` is set and a
        ``confirmation_timed_out`` event goes on the tape of the join's context.
        """
        entry = self._open(confirmation_id)
        if entry is None or entry.get("escalated"):
            return False
        now = self.instance.clock()
        ctx = self.instance.contexts.get(entry.get("context") or MAIN, self.instance.main)
        data = {"confirmation_id": confirmation_id, "deadline": _deadline(entry), "timeout": entry.get("timeout"),
                "at": now}
        entry["timed_out"] = True
        entry["timed_out_at"] = now  # a late answer is told when (AnsweredByTimeout)
        default = entry.get("default")
        why = None
        if entry.get("on_timeout", "default") != "default":
            why = "onTimeout is escalate"
        elif default is None:
            # none configured for this key (humanConfirm.defaults, else default), or it is not of this
            # conflict's type (policy.default_for, policy.default_fits)
            why = "no default applies to it"
        else:
            try:
                self.check_answer(confirmation_id, default)
            except ActivityError as err:
                why = f"the default is not one of the options ({err})"
        if why is None:
            ctx.record("confirmation_timed_out", actor="engine", data={**data, "action": "default", "value": default})
            entry["answered_by_timeout"] = True
            self.answer(confirmation_id, default, timed_out=True)
            return True
        entry["escalated"] = True
        entry["escalated_at"] = now
        for item in self.instance.waiting_for:
            if item.get("kind") == "confirmation" and item.get("id") == confirmation_id:
                item["escalated"] = True
                item.pop("due", None)  # it waits for a person now, no longer for a clock
        ctx.record("confirmation_timed_out", actor="engine", data={**data, "action": "escalated", "reason": why})
        return False


def _request_id(confirmation: Mapping[str, Any]) -> str:
    """The id the join asked under (``GATEWAY_ID/KEY``), whatever id the confirmation got."""
    return str(confirmation.get("request_id") or confirmation["id"])


def _remove_item(items: list[dict[str, Any]], item: dict[str, Any]) -> None:
    """Remove ``item`` itself (equal reports of two firings are different items)."""
    for i, c in enumerate(items):
        if c is item:
            del items[i]
            return
