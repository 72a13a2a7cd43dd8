"""The governance service: one set of operations on stored instances, two faces.

The REST API (``engine.api``) serves it to people and programs, the function-calling
tools (``engine.tools``) to the model. Both validate their input with the pydantic
models below, so the API's OpenAPI schema and the tools' JSON schemas are the same
models.

Operations (DESIGN.md "Interfaces", the seed's context_inspect / context_compress /
context_branch / human_confirm):

* reads: ``inspect`` (per layer: tokens, keys, attention, last modified, bytes, top
  keys), ``branch_evaluate``, ``document``, ``tape``, ``list_instances``,
  ``confirmations``, ``processes``;
* changes: ``start`` (a process of the catalog, never uploaded BPMN), ``compress``
  (compress / evaluate / decompress), ``inject`` (through the layer rules),
  ``resolve`` / ``answer`` (a pending confirmation, with a reason), ``rollback``,
  ``config`` (validated, versioned, never a script or handler), ``snapshot``,
  ``request_confirmation`` (the model's human_confirm), ``send_event`` (a BPMN message or
  signal with a payload, for what waits for it).

Concurrency: every change loads the instance, checks ``expected_version`` when the
caller sent one, and saves with the version it loaded; the store refuses a stale save
(``VersionConflict``), so an update is never lost: it is applied on the latest state
or refused. Changes to one instance through one service are serialised by a
per-instance lock, so callers of one server who send no version do not refuse each other,
and every change holds the instance's lease in the store (``engine.leases``) while it runs,
as workers and ``layerflow resume`` do: an instance a worker runs right now is waited for
(``LEASE_WAIT``), then refused (``InstanceStateError``), never run twice at once.

Errors are the ``LayerflowError`` tree; this module adds::

    LayerflowError
    ├── BadRequest          kind="bad_request"     well-formed, but cannot be applied as asked
    │   └── InvalidAnswer   kind="invalid_answer"  not one of a confirmation's options, or not JSON
    │       └── FormAnswerInvalid                  a user task's answer that does not fit its form
    │           └── StartDataInvalid               start data that does not fit the start event's form
    └── InstanceStateError  kind="invalid_state"   the instance's status does not allow it,
                                                   or another process runs it right now

A second answer to a confirmation raises the stores' ``ConfirmationAnswered``
(kind ``already_answered``), naming the answer that stands.
"""

from __future__ import annotations

import ast
import difflib
import fnmatch
import json
import re
import os
import socket
import string
import threading
import uuid
import weakref
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path
from typing import Annotated, Any, Literal
from xml.etree import ElementTree

from SpiffWorkflow.util.task import TaskState
from pydantic import (AfterValidator, AliasChoices, BaseModel, ConfigDict, Field, ValidationError, ValidationInfo,
                      field_validator, model_validator)

from context_layers import DELETED, Layer, LayeredContext, canonical_json, thaw
from context_layers.canonical import freeze, json_equal, text_problem
from context_layers.attention import AttentionScore, CompressTriggerDetector, Scope, ScopeEntry
from context_layers.compression import HOOK_KEEP_RECENT, RuleDrivenCompressor, decompress, evaluate
from context_layers.config import (MAX_CONFIRM_TIMEOUT, ActivityExtensionConfig, _unclosed_bracket, CompressRule, config_from_dict,
                                   doubled_option, format_validation_error)
from context_layers.errors import (
    ActivityError,
    ConfigError,
    ContextKeyError,
    ContextWriteDenied,
    ProcessError,
    LayerflowError,
    VersionConflict,
)
from context_layers.stores import ConfirmationAnswered, InstanceNotFound, StoreError, StoreUnavailable
from context_layers.tape import Event, EventKind, kind_names, matches_kind

from gateways.policy import ESCALATE, ESCALATION_IS_FINAL

from . import configfile, events, forms, spiff
from .gateway_steps import ENGINE_KEY_RULE, _deadline, is_engine_key, short_json
from .leases import held_by, holding
from .process import Process, definition_version, file_digest, load_process
from .runtime import (Engine, Instance, check_answer_keys, confirmation_item, refuse_if_cancelled,
                      has_user_task, why_not_waiting)
from .store import record_head

__all__ = [
    "AnswerArgs",
    "BadRequest",
    "BranchArgs",
    "BranchEvaluateArgs",
    "CancelArgs",
    "Catalog",
    "CompressArgs",
    "ConfigArgs",
    "ConfirmOption",
    "CorrelateArgs",
    "GovernanceService",
    "HumanConfirmArgs",
    "InjectArgs",
    "InspectArgs",
    "InspectFilter",
    "InstanceId",
    "InstanceStateError",
    "FormAnswerInvalid",
    "StartDataInvalid",
    "InvalidAnswer",
    "ResolveArgs",
    "ResumeArgs",
    "RollbackArgs",
    "SendEventArgs",
    "SnapshotArgs",
    "StartArgs",
    "UserTaskArgs",
]

MAIN = "main"
#: Seconds a change waits for the lease of an instance that a worker or the CLI runs right now
#: (a run is usually short) before it is refused with ``InstanceStateError``.
LEASE_WAIT = 5.0
METRICS = ("token_count", "key_count", "attention_score", "last_modified", "size_bytes", "top_keys", "keys")
# Keys a runtime config change may not carry: code runs in-process (DESIGN.md "Interfaces").
FORBIDDEN_CONFIG_KEYS = frozenset({"handler", "script", "scripts", "prescript", "postscript", "code", "exec",
                                   "eval", "import", "module", "function", "callable"})


class BadRequest(LayerflowError):
    kind = "bad_request"


def _ran(instance: Instance) -> dict[str, Any]:
    """The reply to a request that ran an instance on: its document, its version, and
    ``notices``, what the run did not do that the request asked for (an answer it did not use,
    and why), as ``layerflow`` prints them on stderr; empty when there is nothing to say."""
    return {**instance.to_document(), "version": instance.version, "notices": list(instance.notices)}


class InvalidAnswer(BadRequest):
    kind = "invalid_answer"

    def __init__(self, message: str, *, instance_id: str | None = None, task_id: str | None = None) -> None:
        super().__init__(message)
        self.instance_id = instance_id  # the instance that still waits for a valid answer
        self.task_id = task_id  # the BPMN id of what was answered, when known

    def to_dict(self) -> dict[str, Any]:
        out = super().to_dict()
        if self.instance_id is not None:
            out["instance_id"] = self.instance_id
        if self.task_id is not None:
            out["task_id"] = self.task_id
        return out


class OptionNotOffered(InvalidAnswer, ActivityError):
    """An answer that is none of an open confirmation's options (or no JSON value): bad input,
    ``invalid_answer``, as README names it. Still an ``ActivityError``, which
    ``Engine.answer_confirmation`` raised for it before."""



class FormAnswerInvalid(InvalidAnswer):
    """A person's answer to a user task does not fit the form its modeler declared (a required
    field missing, a value of the wrong type, not offered, out of range, against the JSON Schema):
    bad input (kind ``invalid_answer``), refused before anything of it was written, the refusal
    on the tape, the task still waiting. ``task_id``: the user task's BPMN id; ``problems``:
    ``[(field, what is wrong)]``; ``fields``: what the form asks for."""

    WAITS = "; the task still waits for a corrected answer"  # said of a task that waits (``runtime._not_created``)

    def __init__(self, task_id: str, problems: list[tuple[str, str]], form: Mapping[str, Any], *,
                 instance_id: str | None = None) -> None:
        self.problems = list(problems)
        self.fields = [dict(f) for f in form.get("fields") or []]
        self.source = form.get("source")
        listed = "; ".join(f"field {f!r} {p}" for f, p in problems)
        asked = forms.describe_fields(self.fields)
        super().__init__(f"the answer to user task {task_id!r} does not fit its form ({self.source}): {listed}"
                         + (f"; the form asks for: {asked}" if asked else "")
                         + self.WAITS,
                         instance_id=instance_id, task_id=task_id)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = super().to_dict()
        out["problems"] = [{"field": f, "problem": p} for f, p in self.problems]
        return out


class StartDataInvalid(FormAnswerInvalid):
    """The data an instance is started with does not fit the form on the process's none start event
    (Camunda 7 formData, a formProperty, a Camunda 8 form): refused as a user task's answer is, with
    the same ``problems``, before any instance exists. ``task_id``: the start event's BPMN id; ``pool``:
    in a collaboration, the process of the pool whose start event holds the form."""

    def __init__(self, event_id: str, problems: list[tuple[str, str]], form: Mapping[str, Any], *,
                 process_id: str, file: str | None, pool: str | None = None) -> None:
        self.problems = list(problems)
        self.fields = [dict(f) for f in form.get("fields") or []]
        self.source = form.get("source")
        self.process_id, self.pool = process_id, pool
        listed = "; ".join(f"field {f!r} {p}" for f, p in problems)
        asked = forms.describe_fields(self.fields)
        where = f" in {file}" if file else ""
        owner = f"process {process_id!r}" + (f" (its pool {pool!r})" if pool else "")
        InvalidAnswer.__init__(self, f"the start data of {owner} does not fit the form of its start "
                               f"event {event_id!r}{where} ({self.source}): {listed}"
                               + (f"; the form asks for: {asked}" if asked else "")
                               + "; no instance was created: correct the data and start again", task_id=event_id)


class StartInputsMissing(StartDataInvalid):
    """The process run (in a collaboration, a pool that starts with the instance) declares data inputs
    in a ``bpmn:ioSpecification`` of its own that the start data does not give (nor the config's
    ``system:``): SpiffWorkflow would run until a step reads one and fails with a NameError that says
    nothing of the declaration. Refused as start data that does not fit a start form is (kind
    ``invalid_answer``, ``problems``), before any instance exists. ``task_id``: the process's id."""

    def __init__(self, missing: list[str], declared: list[str], *, process_id: str, file: str | None,
                 pool: str | None = None) -> None:
        self.problems = [(name, "is missing") for name in missing]
        self.fields = [{"id": name, "type": "any", "required": True} for name in declared]
        self.source = "bpmn:ioSpecification"
        self.process_id, self.pool = process_id, pool
        where = f" in {file}" if file else ""
        owner = f"process {process_id!r}" + (f" (its pool {pool!r})" if pool else "")
        InvalidAnswer.__init__(self, f"the start data of {owner} lacks the data input"
                               f"{'s' if len(missing) > 1 else ''} {', '.join(map(repr, missing))} that its "
                               f"bpmn:ioSpecification{where} declares (it declares "
                               f"{', '.join(map(repr, declared))}); give {'them' if len(missing) > 1 else 'it'} "
                               "in the start data (--data FILE, or the data of POST /api/instances), or delete "
                               "the bpmn:dataInput from the ioSpecification if the process does not need it; no "
                               "instance was created", task_id=process_id)


class InstanceStateError(LayerflowError):
    kind = "invalid_state"


def _decided(instance: Instance, entry: Mapping[str, Any]) -> Event | None:
    """The tape event that settled confirmation ``entry``: the last ``human_decision`` (or
    ``confirmation_timed_out``) naming it on the tape of the context that asked it."""
    ctx = instance.contexts.get(entry.get("context") or "main", instance.main)
    found = [e for e in ctx.tape if e.data.get("note") in ("human_decision", "confirmation_timed_out")
             and e.data.get("confirmation_id") == entry["id"]]
    return found[-1] if found else None


def _what_to_do(instance: Instance, key: str | None, answer: Any = None) -> str:
    """What a user whose answer came second can do instead, for the instance's status (and for an
    escalation that stands: the join failed, and no value written into a context settles it)."""
    rollback = (f"go back to a snapshot taken before the join (`layerflow snapshot {instance.id} --list`, then "
                f"`layerflow rollback {instance.id} SNAPSHOT_ID`, or POST /api/context-governance/rollback)")
    if instance.status == "cancelled":
        return (f"Instance {instance.id} is cancelled: nothing of it changes any more (no inject, no rollback); "
                "start a new instance to decide otherwise")
    if instance.status == "completed":
        # a completed instance takes no inject and runs nothing again, but its contexts can still be
        # rolled back: the audit record then shows the decision undone, the process stays finished
        return (f"Instance {instance.id} is completed: nothing runs again and inject is refused, but you can "
                f"still {rollback}, which puts its context back, not its process; to run the steps after the "
                "join with another value, start a new instance")
    if answer == ESCALATE and instance.status == "error":
        # no rollback either: the join merges its branches again, whatever the context it merges into holds
        return f"{ESCALATION_IS_FINAL} (`layerflow resume {instance.id}`)"
    if key is None:
        return f"To decide otherwise, {rollback}"
    return (f"To decide otherwise, write the value into the context (`layerflow resume {instance.id} --set "
            f"{key}=VALUE`, or POST /api/context-governance/inject), or {rollback}")


class _SecondAnswer(ConfirmationAnswered):
    """What the two kinds of second answer say alike: ``instance_id``, ``confirmation_id``,
    ``gateway_id``, ``key``, ``answer`` (the value that stands), ``answered_by`` (who gave it: a
    person's name, the actor, or ``timeout``), ``answered_at`` (epoch seconds, as the confirmation holds
    it and as ``created`` and ``deadline`` are) with ``answered_at_iso`` (that moment in ISO 8601 UTC, as
    ``due`` gives a deadline), ``tape_seq`` (the event
    that recorded it on the tape of ``context``: ``event``, from ``_decided``), ``given`` (the refused
    answer); the message ends with where to read the decision and what to do instead."""

    def __init__(self, instance: Instance, entry: Mapping[str, Any], given: Any, what: str, *,
                 answered_by: str | None, answered_at: Any, event: Any) -> None:
        self.instance_id, self.confirmation_id = instance.id, str(entry["id"])
        self.gateway_id, self.key = entry.get("gateway_id") or entry.get("task_id"), entry.get("key")
        self.answer, self.given = entry.get("answer"), given
        self.answered_by = answered_by or (event.actor if event is not None else None)
        at = answered_at if answered_at is not None else event.time if event is not None else None
        self.answered_at = float(at) if at is not None else None
        self.answered_at_iso = _moment(self.answered_at)
        self.context = entry.get("context") or "main"
        self.tape_seq = event.seq if event is not None else None
        on = "" if self.context == "main" else f" --context {self.context}"
        kind = event.data.get("note") if event is not None else "human_decision"
        at = f" (#{self.tape_seq})" if self.tape_seq is not None else ""
        read = (f"The decision is on the tape{at}: `layerflow tape {instance.id}{on} --kind {kind}` (REST: GET "
                f"/api/instances/{instance.id}/tape?kind={kind}" + ("" if on == "" else f"&context={self.context}") +
                ").")
        super().__init__(f"{what}; an answer is final. {read} {_what_to_do(instance, self.key, self.answer)}")

    def to_dict(self) -> dict[str, Any]:
        out = super().to_dict()
        out.update(instance_id=self.instance_id, confirmation_id=self.confirmation_id, gateway_id=self.gateway_id,
                   key=self.key, answer=self.answer, answered_by=self.answered_by, answered_at=self.answered_at,
                   answered_at_iso=self.answered_at_iso, context=self.context, tape_seq=self.tape_seq, given=self.given)
        return out


class AnsweredAlready(_SecondAnswer):
    """A second answer to a confirmation that a person (or a model, or an unattended run) answered
    already, and no round of which is open (kind ``already_answered``: REST 409, CLI exit 2), nothing
    of it applied; the fields of ``_SecondAnswer`` say who answered it, when, with what."""

    def __init__(self, instance: Instance, entry: Mapping[str, Any], given: Any) -> None:
        who = entry.get("by") or entry.get("answered_by")
        event = _decided(instance, entry)
        shown = who or (event.actor if event is not None else None) or "a person"
        at = entry.get("answered_at", event.time if event is not None else None)
        join = f" (join {entry.get('gateway_id')!r}, key {entry.get('key')!r})" if entry.get("gateway_id") else ""
        super().__init__(
            instance, entry, given,
            f"confirmation {entry['id']!r} of instance {instance.id}{join} was already answered "
            f"{short_json(entry.get('answer'))} by {shown}" + (f" at {_moment(at)}" if at is not None else "") +
            f"; the answer {short_json(given)} was not applied",
            answered_by=who, answered_at=at, event=event)


class AnsweredByTimeout(_SecondAnswer):
    """An answer to a join's confirmation that its ``humanConfirm`` timeout settled already (with
    its default): a second answer, like one to a confirmation a person answered (kind
    ``already_answered``, REST 409, CLI exit 2), nothing of it applied. The fields of
    ``_SecondAnswer`` (``answered_by``: ``timeout``), and ``timed_out_at`` (epoch seconds, as the
    confirmation holds it) with ``timed_out_at_iso``, as ``answered_at``, say what happened; the
    message says what the user can do instead."""

    def __init__(self, instance: Instance, entry: Mapping[str, Any], given: Any) -> None:
        at = entry.get("timed_out_at") or entry.get("deadline")
        self.timed_out_at = float(at) if at is not None else None
        self.timed_out_at_iso = _moment(self.timed_out_at)
        super().__init__(
            instance, entry, given,
            f"confirmation {entry['id']!r} of instance {instance.id} (join "
            f"{entry.get('gateway_id') or entry.get('task_id')!r}, key {entry.get('key')!r}) was settled by its "
            f"timeout at {self.timed_out_at_iso} with the default {short_json(entry.get('answer'))} (no answer came within "
            f"its {entry.get('timeout')} s); the answer {short_json(given)} came after that and was not applied",
            answered_by="timeout", answered_at=at, event=_decided(instance, entry))

    def to_dict(self) -> dict[str, Any]:
        return {**super().to_dict(), "timed_out_at": self.timed_out_at, "timed_out_at_iso": self.timed_out_at_iso}


# ============================================================================ request models

def _layer_name(value: str) -> str:
    return str(Layer.parse(value))


LayerName = Annotated[str, AfterValidator(_layer_name),
                      Field(description="L0..L5, or SYSTEM, PROCESS, KNOWLEDGE, HISTORY, WORKING, EPHEMERAL",
                            examples=["L3"])]
InstanceId = Annotated[str, Field(min_length=1, max_length=200, pattern=r"^[\w.:@-]+$",
                                   description="an instance id (letters, digits, _ . : @ -)")]
ContextName = Annotated[str | None, Field(default=None, description="a context name or branch id (default: the main context)")]


def _snake(name: str) -> str:
    return re.sub(r"(?<=[a-z0-9])([A-Z])", lambda m: "_" + m.group(1).lower(), name)


class _Args(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    @model_validator(mode="before")
    @classmethod
    def _camel_case(cls, data: Any) -> Any:
        # the seed's configs are camelCase (preserveKeys, maxTokens): a camelCase name of a
        # field is taken for it; given both ways, the camelCase one is left (an extra: 422)
        if not isinstance(data, dict) or not any(isinstance(k, str) and k != k.lower() for k in data):
            return data
        out = dict(data)
        for key in data:
            if isinstance(key, str) and key != key.lower():
                name = _snake(key)
                if name != key and name in cls.model_fields and name not in out:
                    out[name] = out.pop(key)
        return out

    @model_validator(mode="after")
    def _text_only(self) -> "_Args":
        # a lone surrogate is a valid JSON escape but no text: no answer, tape or log could carry it
        for name, value in self:
            for item in value if isinstance(value, list) else [value]:
                problem = text_problem(item) if isinstance(item, str) else None
                if problem:
                    raise ValueError(f"{name} {problem}")
        return self


class InspectFilter(_Args):
    key_prefix: str | None = Field(default=None, description="glob (`risk_*`) or plain prefix (`risk_`) of the keys to look at")
    modified_after: datetime | None = Field(default=None, description="ISO 8601 time; only keys changed later (naive = UTC)")

    @field_validator("key_prefix")
    @classmethod
    def _check_glob(cls, pattern: str | None) -> str | None:
        # as a compress rule's pattern: fnmatch reads an unclosed "[" as a literal, so "risk_[ab"
        # matched no key, and a model read that the context holds none
        if pattern is not None and _unclosed_bracket(pattern):
            raise ValueError(f"glob {pattern!r} opens a character class with '[' and never closes it: close it "
                             "with ']', or write '[[]' for a literal '['")
        return pattern


class InspectArgs(_Args):
    """context_inspect: per-layer statistics of an instance's context."""

    layers: list[LayerName] = Field(default_factory=lambda: [str(x) for x in Layer], description="layers to report")
    metrics: list[Literal["token_count", "key_count", "attention_score", "last_modified", "size_bytes",
                          "top_keys", "keys"]] | None = Field(default=None, description="metrics to report (default: all)")
    filter: InspectFilter | None = Field(default=None, description="which keys to look at (key_prefix, "
                                                                     "modified_after)")
    context: ContextName = None
    activity_id: str | None = Field(default=None, description="score against this activity's config (preserveKeys, thresholds)")
    top: int = Field(default=5, ge=0, le=100, description="how many keys `top_keys` lists")


class CompressArgs(_Args):
    """context_compress: compress HISTORY, evaluate a compression, or undo it."""

    action: Literal["compress", "evaluate", "decompress"]
    target_layers: list[LayerName] = Field(default_factory=lambda: ["L3"], description="only L3 HISTORY is compressed")
    preserve_keys: list[Annotated[str, Field(min_length=1)]] = Field(
        default_factory=list, description="keys no compression may drop or alter (kept preserved afterwards)")
    compress_rules: list[CompressRule] = Field(default_factory=list, description="extra rules for this compression")
    max_tokens: int | None = Field(default=None, gt=0, description="compress HISTORY+WORKING down to at most this many tokens")
    before_snapshot_id: str | None = Field(default=None, description="evaluate: the snapshot taken before the compression "
                                              "(compared with the context as that compression left it)")
    snapshot_id: str | None = Field(default=None, description="decompress: the snapshot to put HISTORY back to")
    context: ContextName = None
    activity_id: str | None = Field(default=None, description="start from this activity's config")




def refuse_engine_key(ctx: LayeredContext, layer: str, key: str) -> None:
    """An inject may write data, never the engine's own entries: a join's ``_mergedConflicts``
    (the conflict score and the audit of every resolution read it), a branch's ``_branch_id`` /
    ``_snapshot_id``, any ``_``-prefixed bookkeeping, and the ``activity:`` / ``compaction:``
    records of HISTORY. Written to WORKING they were auto-promoted into HISTORY (or moved there at
    the activity's end), replacing or forging what the engine recorded."""
    if is_engine_key(key):
        requested = Layer.parse(layer)
        held = ctx.locate(key)
        effective = held if held is not None and held < requested else requested
        raise ContextWriteDenied(key, requested, effective,
                                 f"{ENGINE_KEY_RULE}; inject a data key (resolve a conflict with "
                                 "POST /api/context-governance/resolve)")


class InjectArgs(_Args):
    """Write values into a layer of a waiting or running instance (the layer rules apply)."""

    values: dict[str, Any] = Field(min_length=1, description="key -> JSON value")
    layer: LayerName = "L4"
    context: ContextName = None
    reason: str | None = None

    @model_validator(mode="before")
    @classmethod
    def _one_key(cls, data: Any) -> Any:
        # {"key": K, "value": V} is {"values": {K: V}}
        if isinstance(data, dict) and "values" not in data and ("key" in data or "value" in data):
            out = dict(data)
            if "key" not in out or "value" not in out:
                raise ValueError("inject one key with both `key` and `value`, or several with `values: {key: value}`"
                                 f"; `{'value' if 'key' in out else 'key'}` is missing")
            key = out.pop("key")
            if not isinstance(key, str) or not key:
                raise ValueError("`key` must be a non-empty string (the context key to write)")
            out["values"] = {key: out.pop("value")}
            return out
        return data


# what a person is shown (a confirmation's message, its options), why a conflict was settled and what a
# snapshot is called are text a model or a person writes: bounded, so a runaway or hostile call cannot put
# megabytes into the instance's record, its tape and every confirmation list (a tool call's whole arguments
# are bounded too: engine.tools)
MAX_LABEL_CHARS = 500
MAX_MESSAGE_CHARS = 10_000
MAX_OPTIONS = 100


class ResolveArgs(_Args):
    """Settle a pending conflict or confirmation with a value and a reason."""

    confirmation_id: str | None = Field(default=None, description="e.g. `review_join/approval_status`")
    conflict_key: str | None = Field(default=None, description="the context key in conflict (when only one is open)")
    resolution: Any = Field(description="the chosen value: one of the offered option values")
    reason: str = Field(min_length=1, max_length=MAX_MESSAGE_CHARS,
                        description="why this value: on the tape and in `_mergedConflicts` with the resolution")

    @model_validator(mode="before")
    @classmethod
    def _confirmation_names(cls, data: Any) -> Any:
        # a pending confirmation shows its `key` and its options' `value`s, and is answered elsewhere
        # with `value` (or `answer`): those names are taken here too, each for one field only
        if not isinstance(data, dict):
            return data
        out = dict(data)
        for field_name, aliases in (("conflict_key", ("key", "conflictKey")), ("resolution", ("value", "answer"))):
            given = [a for a in (field_name, *aliases) if a in out]
            if len(given) > 1:
                raise ValueError(f"{' and '.join(given)} name the same field ({field_name}); give one")
            if given and given[0] != field_name:
                out[field_name] = out.pop(given[0])
        return out

    @model_validator(mode="after")
    def _one_target(self) -> "ResolveArgs":
        if not self.confirmation_id and not self.conflict_key:
            raise ValueError("name the confirmation_id or the conflict_key to resolve")
        return self


class RollbackArgs(_Args):
    """Restore KNOWLEDGE..EPHEMERAL (or the given layers) of a context to a snapshot."""

    snapshot_id: str = Field(min_length=1)
    layers: list[LayerName] | None = Field(default=None, description="default: every layer (SYSTEM and PROCESS never roll back)")
    context: ContextName = None
    reason: str | None = None

    @field_validator("layers")
    @classmethod
    def _no_fixed_layer(cls, layers: list[str] | None) -> list[str] | None:
        # named explicitly, SYSTEM or PROCESS would be skipped without a word: refused instead (a field
        # validator, so the refusal names the field `layers`, not the body as a whole)
        fixed = [name for name in layers or [] if Layer.parse(name) < Layer.KNOWLEDGE]
        if fixed:
            raise ValueError(f"layers {', '.join(fixed)}: SYSTEM and PROCESS never roll back (SYSTEM is frozen, "
                             "PROCESS only grows); name layers among L2..L5, or none for all of them")
        return layers


class ConfigArgs(_Args):
    """Change an activity's config for this instance at run time."""

    activity_id: str = Field(min_length=1)
    config: dict[str, Any] = Field(description="ActivityExtensionConfig fields (camelCase or snake_case); no handler or script")
    mode: Literal["merge", "replace"] = "merge"
    reason: str | None = None

    @model_validator(mode="before")
    @classmethod
    def _seed_shape(cls, data: Any) -> Any:
        # the seed's ActivityExtensionConfig names its activity inside ({"activityId": ...,
        # "contextStrategy": ...}); it may come as `config` or as the body itself
        if not isinstance(data, dict):
            return data
        out = dict(data)
        if "activityId" in out and "activity_id" not in out:
            out["activity_id"] = out.pop("activityId")
        if "config" not in out:
            extra = {k: v for k, v in out.items() if k not in cls.model_fields and _snake(k) not in cls.model_fields}
            if extra:
                out = {k: v for k, v in out.items() if k not in extra}
                out["config"] = extra
        config = out.get("config")
        if isinstance(config, dict):
            inner = [k for k in ("activityId", "activity_id") if k in config]
            if inner:
                for k in inner:
                    named = config[k]
                    if "activity_id" not in out:
                        out["activity_id"] = named
                    elif out["activity_id"] != named:
                        raise ValueError(f"activity_id {out['activity_id']!r} and the config's {k} {named!r} differ;"
                                         " name the activity once")
                out["config"] = {k: v for k, v in config.items() if k not in inner}
        return out


class SnapshotArgs(_Args):
    label: str | None = Field(default=None, max_length=MAX_LABEL_CHARS)
    layers: list[LayerName] | None = Field(default=None, description="layers to describe in the answer (a snapshot holds all six)")
    context: ContextName = None


class BranchEvaluateArgs(_Args):
    branch_id: str | None = Field(default=None, description="the branch id (BPMN id of its first element); default: main")
    required_keys: list[str] = Field(min_length=1)


class BranchArgs(_Args):
    """context_branch: evaluate a branch, resolve a conflict, or take a snapshot."""

    action: Literal["evaluate", "resolve_conflict", "snapshot"] = Field(
        description="evaluate: are required_keys readable in a branch; resolve_conflict: settle a join's open "
                    "question (conflict_key or confirmation_id, resolution, reason); snapshot: take a snapshot")
    branch_id: str | None = Field(default=None, description="evaluate: the branch id (BPMN id of its first element); "
                                                            "default: the main context")
    required_keys: list[str] = Field(default_factory=list, description="evaluate (needed): the keys the branch "
                                                                       "must be able to read")
    conflict_key: str | None = Field(default=None, description="resolve_conflict: the conflicting key "
                                                               "(or GATEWAY_ID/KEY)")
    confirmation_id: str | None = Field(default=None, description="resolve_conflict: the pending confirmation's id")
    resolution: Any = Field(default=None, description="resolve_conflict (needed): the chosen value, one of the "
                                                      "offered option values")
    reason: str | None = Field(default=None, max_length=MAX_MESSAGE_CHARS,
                               description="resolve_conflict (needed): why this value")
    layers: list[LayerName] | None = Field(default=None, description="snapshot: layers to describe in the answer")
    label: str | None = Field(default=None, max_length=MAX_LABEL_CHARS, description="snapshot: a label for the snapshot")

    @model_validator(mode="after")
    def _fields_of_action(self) -> "BranchArgs":
        if self.action == "evaluate" and not self.required_keys:
            raise ValueError("action evaluate needs required_keys")
        if self.action == "resolve_conflict":
            if not (self.conflict_key or self.confirmation_id):
                raise ValueError("action resolve_conflict needs conflict_key (or confirmation_id)")
            if not self.reason:
                raise ValueError("action resolve_conflict needs a reason")
            if "resolution" not in self.model_fields_set:
                raise ValueError("action resolve_conflict needs resolution (the chosen value)")
        return self


class ConfirmOption(_Args):
    label: str = Field(min_length=1, max_length=MAX_LABEL_CHARS)
    value: Any = None


class HumanConfirmArgs(_Args):
    """human_confirm: ask a person to choose among options."""

    type: str = Field(default="confirmation", min_length=1, max_length=MAX_LABEL_CHARS,
                      description="e.g. conflict_resolution, compression_review")
    message: str = Field(min_length=1, max_length=MAX_MESSAGE_CHARS)
    options: list[ConfirmOption] = Field(min_length=1, max_length=MAX_OPTIONS)
    timeout: float | None = Field(default=None, gt=0, le=MAX_CONFIRM_TIMEOUT,
                                  description="seconds until the default is taken")
    default: Any = Field(default=None, description="the value taken when the timeout passes: one of the options' "
                                                   "values (or labels)")

    @field_validator("options")
    @classmethod
    def _options_differ(cls, options: list[ConfirmOption]) -> list[ConfirmOption]:
        doubled = doubled_option([o.value for o in options])
        if doubled:
            raise ValueError(doubled)
        return options

    @field_validator("default")
    @classmethod
    def _default_is_an_option(cls, default: Any, info: ValidationInfo) -> Any:
        # a default no option offers could never be taken: the timeout would only escalate it
        if "options" not in info.data:
            return default  # the options failed their own check, which names the problem
        options = info.data["options"]
        if default is not None and options and not any(json_equal(default, o.value) or default == o.label
                                                       for o in options):
            offered = ", ".join(json.dumps(o.value, ensure_ascii=False) for o in options)
            raise ValueError(f"{json.dumps(default, ensure_ascii=False)} is none of the options' values ({offered}); "
                             "make it one of them")
        if default is not None and not any(json_equal(default, o.value) for o in options):
            return next(o.value for o in options if default == o.label)  # a label stands for its option's value
        return default


class AnswerArgs(_Args):
    """A person's answer to a pending confirmation (``value``; ``answer``, the field's name in the
    confirmation and in ``--answers``, is taken too, and so is ``resolution``, resolve's name for it,
    as resolve takes ``value``)."""

    value: Any = Field(validation_alias=AliasChoices("value", "answer", "resolution"))
    reason: str | None = None
    user: str | None = Field(default=None, max_length=MAX_LABEL_CHARS, description="who answers (the tape's actor)")
    instance_id: InstanceId | None = Field(default=None, description="needed when several instances have this confirmation id")
    expected_version: int | None = Field(default=None, ge=1)


class SendEventArgs(_Args):
    """A BPMN message (or signal) for what waits for it in an instance, with a payload."""

    name: str = Field(min_length=1, max_length=500, description="the message's (signal's) name, as the BPMN names it")
    kind: Literal["message", "signal"] = "message"
    payload: Any = Field(default=None, description="a JSON object: its keys go to WORKING of the context that catches "
                                                   "the event (the whole payload as one key, when the BPMN names a "
                                                   "messageVariable)")


class CorrelateArgs(_Args):
    """A BPMN message for the one waiting instance it is meant for, found by its correlation (not by id);
    none: an instance of a catalog process that starts on it is started."""

    name: str = Field(min_length=1, max_length=500, description="the message's name, as the BPMN names it")
    payload: Any = Field(default=None, description="a JSON object: its keys go to WORKING of the context that catches "
                                                   "the message (the whole payload as one key, when the BPMN names a "
                                                   "messageVariable)")
    match: dict[str, Any] = Field(default_factory=dict, description="context keys and the values the instance must "
                                                                    "hold in the context that waits (Zeebe's "
                                                                    "correlation key, Camunda's business key)")
    process_id: str | None = Field(default=None, min_length=1, description="the catalog process to start when no "
                                                                           "waiting instance takes the message (default: "
                                                                           "any catalog process that starts on it)")


class UserTaskArgs(_Args):
    """Complete a user (or manual) task the instance waits for, with what the person entered."""

    data: dict[str, Any] = Field(default_factory=dict, description="the person's input: its keys go to WORKING of "
                                                                    "the task's context, through the layer rules")


class StartAnswers(_Args):
    user_tasks: dict[str, dict[str, Any]] = Field(default_factory=dict)
    confirmations: dict[str, Any] = Field(default_factory=dict)


class ResumeArgs(_Args):
    """Run a waiting instance on (a timer that came due), with answers for what it waits for,
    as ``layerflow resume ID --answers``; an instance in ``error`` retries its failed activity."""

    answers: StartAnswers | None = None


class CancelArgs(_Args):
    """Stop an unfinished instance for good (nothing of it runs again); the reason goes on its tape."""

    reason: str = Field(min_length=1, max_length=2000, description="why: recorded on the tape with who cancelled")


class StartArgs(_Args):
    """Start a process registered in the server's catalog (by process id, never BPMN)."""

    process_id: str = Field(min_length=1)
    data: dict[str, Any] = Field(default_factory=dict, description="initial data (PROCESS unless the config says otherwise)")
    answers: StartAnswers | None = None
    run: bool = True


# ============================================================================ catalog

_BPMN_NS = "{http://www.omg.org/spec/BPMN/20100524/MODEL}"


class Catalog:
    """The processes a server may start: every executable process of the ``*.bpmn``
    files in one directory (with their config files beside them), by process id, and every
    collaboration of two or more executable pools there, by its id (its pools run together)."""

    def __init__(self, directory: str | Path | None) -> None:
        self.directory = Path(directory).resolve() if directory is not None else None
        self._lock = threading.Lock()
        self._cache: dict[str, tuple[tuple[tuple[str, str | None], ...], Process]] = {}

    def entries(self) -> dict[str, dict[str, Any]]:
        """process id -> {"id", "name", "file"} (the first file wins when two define one id)."""
        return self._scan()[0]

    def problems(self) -> list[str]:
        """What of the directory the catalog leaves out, and why (a server says so as it starts):
        files that do not parse, and a process id a later file defines again."""
        return self._scan()[1]

    def _scan(self) -> tuple[dict[str, dict[str, Any]], list[str]]:
        out: dict[str, dict[str, Any]] = {}
        problems: list[str] = []
        if self.directory is None or not self.directory.is_dir():
            return out, problems
        for path in sorted(self.directory.glob("*.bpmn")):
            try:
                root = ElementTree.parse(path).getroot()
            except (ElementTree.ParseError, OSError) as err:
                # `layerflow validate` says more; the catalog lists what can run
                problems.append(f"{path.name}: left out of the catalog, it cannot be read as XML ({err}); "
                                f"`layerflow validate {path}` says what to fix")
                continue
            processes = [p for p in root.iter(f"{_BPMN_NS}process") if p.get("isExecutable", "true").lower() != "false"]
            executable = {p.get("id") for p in processes}
            # a collaboration of two or more executable pools runs them together (engine.collaboration)
            collabs = [c for c in root.iter(f"{_BPMN_NS}collaboration")
                       if sum(1 for p in c.iter(f"{_BPMN_NS}participant") if p.get("processRef") in executable) >= 2]
            for kind, node in [*(("process", p) for p in processes), *(("collaboration", c) for c in collabs)]:
                eid = node.get("id")
                if not eid:
                    continue
                if eid in out:
                    problems.append(f"{path.name}: {kind} {eid!r} is left out of the catalog: "
                                    f"{out[eid]['file']} defines that id first; rename one of them")
                    continue
                out[eid] = {"id": eid, "name": node.get("name"), "file": path.name}
        return out, problems

    def _files_of(self, file: str) -> list[Path]:
        """``file``, then the catalog's files of the processes its call activities call (and so on),
        as ``layerflow run main.bpmn called.bpmn`` is given them."""
        assert self.directory is not None
        entries, files = self.entries(), [file]
        for name in files:  # grows as called files are found
            root = ElementTree.parse(self.directory / name).getroot()
            for call in root.iter(f"{_BPMN_NS}callActivity"):
                called = entries.get(call.get("calledElement") or "")
                if called is not None and called["file"] not in files:
                    files.append(called["file"])
        return [self.directory / name for name in files]

    def load(self, process_id: str) -> Process:
        entry = self.entries().get(process_id)
        if entry is None or self.directory is None:
            known = ", ".join(sorted(self.entries())) or "none"
            where = self.directory or "(no catalog directory)"
            raise ContextKeyError(f"process {process_id!r} is not in the catalog {where}; registered: {known}")
        paths = self._files_of(entry["file"])
        stamp = self._stamp(paths)
        with self._lock:
            hit = self._cache.get(process_id)
            if hit is not None and hit[0] == stamp:
                return hit[1]
        process = load_process(paths, process_id)
        with self._lock:
            self._cache[process_id] = (stamp, process)
        return process

    def _stamp(self, paths: list[Path]) -> tuple[tuple[str, str | None], ...]:
        """What a new start's process is loaded from, as it stands: the BPMN files, the config file
        beside each and the folder's DMN files (a config-only edit is a new version for new starts,
        as a BPMN edit is)."""
        assert self.directory is not None
        files = [*paths, *(c for p in paths for c in configfile.configs_beside(p)), *sorted(self.directory.glob("*.dmn"))]
        return tuple((str(f), file_digest(f)) for f in files)


# ============================================================================ the service

class _Gate:
    __slots__ = ("lock", "__weakref__")

    def __init__(self) -> None:
        self.lock = threading.Lock()


def snapshot_list(instance: Instance, ctx: LayeredContext | None = None) -> list[dict[str, Any]]:
    """The snapshots of an instance (or of one context), newest first, each once, as ``layerflow
    snapshot ID --list`` lists them: a snapshot an activity's begin took is labelled ``before TASK``."""
    found: dict[str, dict[str, Any]] = {}
    for c in [ctx] if ctx is not None else list(instance.contexts.values()):
        for sid, snap in c.snapshots.items():
            owner = instance.contexts.get(snap.context)
            event = _event_at(owner.tape, snap.seq) if owner is not None else None
            label = snap.label
            if label is None and event is not None and event.kind == "begin":
                label = f"before {(event.data or {}).get('task_id') or event.activity}"
            found.setdefault(sid, {"snapshot_id": sid, "context": snap.context, "seq": snap.seq, "label": label,
                                   "time": event.time if event is not None else None})
    return sorted(found.values(), key=lambda s: (s["time"] or 0.0, s["seq"]), reverse=True)


def _event_at(tape: Any, seq: int) -> Event | None:
    if 0 < seq <= len(tape) and tape[seq - 1].seq == seq:  # seqs count from 1 without gaps
        return tape[seq - 1]  # type: ignore[no-any-return]
    return next((e for e in tape if e.seq == seq), None)


def recent_snapshots(snapshots: list[dict[str, Any]], n: int = 5) -> str:
    shown = ", ".join(f"{s['snapshot_id']}" + (f" ({s['label']})" if s["label"] else "") for s in snapshots[:n])
    return shown or "none"


def snapshot_id_of(instance: Instance, given: str, ctx: LayeredContext | None = None) -> str:
    """The id of the snapshot ``given`` names in ``instance`` (in ``ctx`` only, when given): its id, else
    the label ``snapshot ID --list`` shows beside it (an operator's ``--label``, ``before TASK``,
    ``split:GATEWAY``) when one snapshot alone has it. ``SnapshotNotFound`` when none does,
    ``AmbiguousSnapshot`` when several snapshots have that label."""
    if any(given in c.snapshots for c in ([ctx] if ctx is not None else instance.contexts.values())):
        return given
    labelled = [s for s in snapshot_list(instance, ctx) if s["label"] == given]
    if len(labelled) > 1:
        raise AmbiguousSnapshot(instance, given, labelled)
    if not labelled:
        raise SnapshotNotFound(instance, given, ctx)
    return str(labelled[0]["snapshot_id"])


class AmbiguousSnapshot(BadRequest):
    """A rollback to a label that several snapshots carry (``split:GATEWAY`` of a loop, an operator's
    label given twice): which one is meant is not guessed; the message lists their ids, newest first."""

    def __init__(self, instance: Instance, label: str, labelled: list[dict[str, Any]]) -> None:
        self.instance_id, self.label = instance.id, label
        self.snapshot_ids = [str(s["snapshot_id"]) for s in labelled]
        shown = ", ".join(f"{s['snapshot_id']!r} ({s['context']} #{s['seq']})" for s in labelled)
        super().__init__(f"snapshot label {label!r} names {len(labelled)} snapshots of instance {instance.id}: "
                         f"{shown} (newest first); nothing was rolled back. Give the id of the one you mean: "
                         f"`layerflow rollback {instance.id} {labelled[0]['snapshot_id']}` (REST: "
                         f'"snapshot_id": "{labelled[0]["snapshot_id"]}")')

    def to_dict(self) -> dict[str, Any]:
        return {**super().to_dict(), "instance_id": self.instance_id, "label": self.label,
                "snapshot_ids": self.snapshot_ids}


class SnapshotNotFound(ContextKeyError):
    """A rollback to a snapshot no context of the instance (or the context named) took, by id or label:
    the same message and fields from the CLI and REST, with the instance's most recent snapshots to
    choose from."""

    def __init__(self, instance: Instance, snapshot_id: str, ctx: LayeredContext | None = None) -> None:
        known = snapshot_list(instance, ctx)
        where = f" context {ctx.name!r} of" if ctx is not None else ""
        self.instance_id, self.snapshot_id, self.recent = instance.id, snapshot_id, known[:5]
        super().__init__(
            f"no snapshot with the id or label {snapshot_id!r} in{where} instance {instance.id}; recent snapshots: "
            f"{recent_snapshots(known)}; "
            f"`layerflow snapshot {instance.id} --list` shows them all (REST: "
            f"GET /api/instances/{instance.id}/tape?kind=snapshot those of splits, compressions and operators, "
            "`?kind=begin` the one each activity took as it began)")

    def to_dict(self) -> dict[str, Any]:
        return {**super().to_dict(), "instance_id": self.instance_id, "snapshot_id": self.snapshot_id,
                "recent_snapshots": self.recent}


def instance_rows(store: Any, status: str | None = None, *, holders: bool = False,
                  process_id: str | None = None, limit: int | None = None, offset: int = 0) -> list[dict[str, Any]]:
    """The store's instances, newest first (of one ``status`` and one ``process_id``, when given), each
    with ``instance_id`` as ``run --json`` names it beside the store's ``id``: GET /api/instances and
    ``layerflow list --json`` alike; ``limit`` of them from the ``offset``-th on. ``holders``: each with
    ``held_by`` (a lease lookup per row) and ``definition_version`` (the definition it runs, as its
    document's ``definition.version``: a record read per row, no tape), so only for a listing someone reads."""
    return instance_page(store, status, holders=holders, process_id=process_id, limit=limit, offset=offset)[0]


def instance_page(store: Any, status: str | None = None, *, holders: bool = False, process_id: str | None = None,
                  limit: int | None = None, offset: int = 0) -> tuple[list[dict[str, Any]], int]:
    """``instance_rows``, and how many instances the filters select in all (the page's ``total``)."""
    selected = [{"instance_id": r["id"], **r} for r in store.list()
                if (status is None or r.get("status") == status)
                and (process_id is None or r.get("process_id") == process_id)]
    rows = selected[offset:] if limit is None else selected[offset:offset + limit]
    if holders:
        for r in rows:
            r["held_by"] = held_by(store, r["id"], r["status"])
            r["definition_version"] = _definition_version(store, r)
    return rows, len(selected)


def mark_dead_letters(rows: Iterable[dict[str, Any]], letters: Mapping[str, str]) -> None:
    """Add ``dead_letter`` (the id of its dead letter, ``letters``: ``worker.dead_letter_ids``) to the rows
    of unfinished instances that have one: no worker runs them until it is requeued. Only on those rows,
    so the others are as they were."""
    for r in rows:
        if r["status"] in ("running", "waiting") and r["id"] in letters:
            r["dead_letter"] = letters[r["id"]]


# (store, instance id, process id) -> its definition version: an instance keeps the definition it started with
_DEFINITIONS: dict[tuple[str, str, str], str | None] = {}
_DEFINITIONS_KEPT = 4096


def _definition_version(store: Any, row: Mapping[str, Any]) -> str | None:
    """The ``definition.version`` of the instance of ``row``, from its record without tapes (None: one
    from before versions were kept, or deleted meanwhile)."""
    key = (str(getattr(store, "url", "")), str(row["id"]), str(row.get("process_id")))
    if key in _DEFINITIONS:
        return _DEFINITIONS[key]
    try:
        process = record_head(store, row["id"]).get("process")
    except StoreUnavailable:
        raise
    except (InstanceNotFound, StoreError):  # a damaged record is listed (`inspect` names the damage), not fatal here
        return None
    digests = process.get("digests") if isinstance(process, Mapping) else None
    found = definition_version(digests) if isinstance(digests, Mapping) else None
    if len(_DEFINITIONS) >= _DEFINITIONS_KEPT:
        _DEFINITIONS.clear()
    _DEFINITIONS[key] = found
    return found


def fixed_key_hint(instance_id: str, err: ContextWriteDenied) -> str:
    """What to do instead of correcting a PROCESS key (the start data): the fix-and-retry an operator
    tries first after a step failed on a wrong value of it (REST ``inject``, ``resume --set``); empty
    for a refusal in another layer."""
    if Layer.parse(err.effective) != Layer.PROCESS:
        return ""
    return (f". PROCESS keys (the start data) are fixed for the life of instance {instance_id}: to run with "
            f"another {err.key!r}, cancel it (`layerflow cancel {instance_id} --reason ...`, REST POST "
            f"/api/instances/{instance_id}/cancel) and start a new instance with the corrected data; a key "
            f"that must stay correctable is started in WORKING (the config's `data_layers: {{{err.key}: WORKING}}`)")


class GovernanceService:
    """The governance operations on the instances of ``engine.store``."""

    def __init__(self, engine: Engine, catalog: Catalog | str | Path | None = None, *,
                 compressor: RuleDrivenCompressor | None = None, lease_wait: float = LEASE_WAIT) -> None:
        self.engine = engine
        self.catalog = catalog if isinstance(catalog, Catalog) else Catalog(catalog)
        self.compressor = compressor or RuleDrivenCompressor(keep_recent=HOOK_KEEP_RECENT)
        self.lease_wait = lease_wait
        self._gates: weakref.WeakValueDictionary[str, _Gate] = weakref.WeakValueDictionary()
        self._gates_lock = threading.Lock()
        # instance id -> (version, its open confirmations): a listing reads only what changed
        self._open: dict[str, tuple[int, list[dict[str, Any]]]] = {}
        self._open_lock = threading.Lock()

    # ----- plumbing ------------------------------------------------------------------

    @contextmanager
    def _lock(self, instance_id: str) -> Iterator[None]:
        """One lock per instance id while someone holds it (a long run blocks no other instance),
        and the instance's lease in the store (``engine.leases``), so that no worker and no
        ``layerflow resume`` runs it meanwhile. Held by another for longer than ``lease_wait``
        seconds: ``InstanceStateError``, nothing loaded or changed."""
        with self._gates_lock:
            gate = self._gates.get(instance_id)
            if gate is None:
                gate = self._gates[instance_id] = _Gate()
        # a request of this server that runs the instance holds the gate: wait for it no longer
        # than for another process's lease (a long activity must not hang every other request)
        if not gate.lock.acquire(timeout=self.lease_wait):
            raise InstanceStateError(
                f"instance {instance_id} is being run by another request of this server right now (for longer "
                f"than {self.lease_wait:g} s); nothing was changed. Repeat the request once the instance is at rest "
                f"(GET /api/instances/{instance_id})")
        try:
            owner = f"api-{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"
            with holding(self.engine.store, instance_id, owner, wait=self.lease_wait) as holder:
                if holder is not None:
                    raise InstanceStateError(
                        f"instance {instance_id} is being run by {holder} right now (it holds the instance's lease, "
                        f"and kept it for {self.lease_wait:g} s); nothing was changed. Repeat the request once the "
                        f"instance is at rest (GET /api/instances/{instance_id})")
                yield
        finally:
            gate.lock.release()

    def load(self, instance_id: str) -> Instance:
        return self.engine.load(instance_id)

    def _save(self, instance: Instance, *, refusal: bool = False) -> None:
        self.engine.save(instance, refusal=refusal)

    @staticmethod
    def _check_version(instance: Instance, expected: int | None) -> None:
        # a version that only refused requests followed (their notes on the tape) is current still:
        # the client's own refused request must not make its corrected retry stale
        since = instance.refusals_since
        if expected is not None and expected != instance.version \
                and not (since is not None and since <= expected <= instance.version):
            raise VersionConflict(f"instance {instance.id!r} is at version {instance.version}, the request expected "
                                  f"version {expected}; load it again (GET /api/instances/{instance.id}) and repeat "
                                  "the change against what you see")

    def _change(self, instance_id: str, expected: int | None, op: str, actor: str,
                fn: Callable[[Instance], dict[str, Any]]) -> dict[str, Any]:
        """Load, check the version, apply ``fn``, save with the loaded version (only when the
        tape grew). A denied write is recorded on the tape of a fresh copy and raised."""
        with self._lock(instance_id):
            instance = self.load(instance_id)
            self._check_version(instance, expected)
            refuse_if_cancelled(instance, f"take {op}")
            before = instance.tape_length()
            try:
                result = fn(instance)
            except ContextWriteDenied as err:
                self._record_denial(instance_id, op, actor, err)
                raise
            if instance.tape_length() != before:
                self._save(instance)
        return {"instance_id": instance.id, "version": instance.version, **result}

    def _record_denial(self, instance_id: str, op: str, actor: str, err: ContextWriteDenied) -> None:
        try:
            fresh = self.load(instance_id)
            ctx = fresh.contexts.get(getattr(err, "context", None) or MAIN, fresh.main)
            ctx.record("governance_denied", actor=actor, data={"op": op, **err.to_dict()})
            self._save(fresh, refusal=True)
        except VersionConflict:
            pass  # someone saved meanwhile; the refusal itself still stands

    @staticmethod
    def branch_contexts(instance: Instance, name: str) -> list[str]:
        """The contexts branch id ``name`` ran in, oldest first (one per pass of a loop through its split)."""
        return [n for n, info in instance.branches.items() if info.get("branch_id") == name and n in instance.contexts]

    @staticmethod
    def context_of(instance: Instance, name: str | None) -> LayeredContext:
        """A context by name, or by branch id (its open one, else its latest). A branch id that
        several open contexts run at once (the instances of a multi-instance body, a called
        process's branch called from two places) names none of them: refused, naming each."""
        if name is None or name == MAIN:
            return instance.main
        if name in instance.contexts:
            return instance.contexts[name]
        matches = GovernanceService.branch_contexts(instance, name)
        if matches:
            open_ = [n for n in matches if instance.branches[n].get("status") in ("open", "scope")]  # live ones
            if len(open_) > 1:
                raise ContextKeyError(
                    f"instance {instance.id} runs branch {name!r} in {len(open_)} contexts at once: "
                    f"{', '.join(open_)}; name the one you mean in full")
            return instance.contexts[(open_ or matches)[-1]]
        element = ""
        if name in instance.process.element_ids():  # no typo: a sub-process or a task, which opens no context
            branches = sorted({str(i["branch_id"]) for i in instance.branches.values() if i.get("branch_id")})
            element = (f"; {name!r} is an element of process {instance.process.id!r} with no context of its own: "
                       f"its steps run in the context of the flow it is on (main, or the parallel branch it is in, "
                       f"named by the branch's first element once its split ran: {', '.join(branches) or 'none yet'})")
        raise ContextKeyError(f"instance {instance.id} has no context or branch {name!r}{element}; contexts: "
                              f"{', '.join(instance.contexts)}")

    @staticmethod
    def _writable(instance: Instance, ctx: LayeredContext, op: str,
                  keys: Iterable[str] = ()) -> LayeredContext:
        """A context whose split branches are still open must stay as the split left it (the
        join merges the branches against that snapshot): refuse to change it. A branch (or
        scope) context already merged, or cancelled, is read by nothing any more: a change
        there would look applied and reach nothing; refuse it too. So is a change of ``keys``
        that the branch's join asks a person about (``_refuse_asked``)."""
        GovernanceService._refuse_asked(instance, ctx, op, keys)
        GovernanceService._refuse_finished(instance, ctx, op)
        open_ = sorted(i.get("branch_id") or n for n, i in instance.branches.items()
                       if i.get("parent") == ctx.name and i.get("status") == "open")
        if open_:
            raise InstanceStateError(f"{op}: context {ctx.name!r} of instance {instance.id} has open branches "
                                     f"({', '.join(open_)}) that will be merged into it at their join; change a "
                                     "branch context instead (`context`: a branch id) or wait for the join")
        return ctx

    @staticmethod
    def _refuse_finished(instance: Instance, ctx: LayeredContext, op: str, why: str = "",
                         instead: str = "Change the context the process goes on in instead") -> None:
        """A branch (or scope) context already merged, or cancelled, is read by nothing any more:
        ``op`` there would look applied and reach nothing; refused, naming the context to use."""
        info = instance.branches.get(ctx.name)
        if info is None or info.get("status") not in ("joined", "cancelled"):
            return
        parent = info.get("parent") or MAIN
        done = (f"already merged into {parent!r}" + (f" at {info['join']!r}" if info.get("join") else "")
                if info["status"] == "joined" else "cancelled")
        raise InstanceStateError(f"{op}: context {ctx.name!r} of instance {instance.id} (branch "
                                 f"{info.get('branch_id') or ctx.name!r}) is {done}; nothing reads it any more{why}. "
                                 f"{instead} (`context`: {parent!r})")

    @staticmethod
    def _asked(instance: Instance, ctx: LayeredContext) -> list[dict[str, Any]]:
        """The open questions of the join that the branch ``ctx`` waits at (none when it is no
        open branch): each a confirmation naming a ``key``."""
        info = instance.branches.get(ctx.name)
        if info is None or info.get("status") != "open":
            return []
        return [c for c in instance.confirmations if not c.get("answered") and c.get("gateway_id") is not None
                and c.get("context") == info.get("parent") and c.get("key") is not None]

    @staticmethod
    def _refuse_asked(instance: Instance, ctx: LayeredContext, op: str, keys: Iterable[str]) -> None:
        """A branch that waits at its join, where a person is asked about one of ``keys``: the
        question offers the values the branches held when the join ran, and the answer settles
        that conflict when the join runs again; a value changed under it would be merged with an
        answer given to another question (or none left to answer). Settle the question instead."""
        wanted = set(keys)
        for c in GovernanceService._asked(instance, ctx):
            if c["key"] not in wanted:
                continue
            offered = ", ".join(json.dumps(o.get("value")) for o in c.get("options", []) if isinstance(o, dict))
            raise InstanceStateError(
                f"{op}: {c['key']!r} in context {ctx.name!r} (branch "
                f"{instance.branches[ctx.name].get('branch_id')!r}) is what join {c['gateway_id']!r} asks a person "
                f"about (confirmation {c['id']!r}, offering {offered}); a change there would leave that question "
                f"stale. Settle it with the answer (`layerflow resume {instance.id} --answer {c['id']}=VALUE`, "
                f"POST /api/confirmations/{c['id']} or /api/context-governance/resolve), then change the key "
                "after the join")

    @staticmethod
    def _config_of(instance: Instance, activity_id: str | None) -> ActivityExtensionConfig | None:
        if activity_id is None:
            return None
        if activity_id not in instance.process.element_ids():
            raise ContextKeyError(f"process {instance.process_id!r} has no element {activity_id!r}; elements: "
                                  f"{', '.join(instance.process.element_ids())}")
        return instance.process.config(activity_id)

    # ----- reads ---------------------------------------------------------------------

    def processes(self) -> list[dict[str, Any]]:
        return list(self.catalog.entries().values())

    def process(self, process_id: str) -> dict[str, Any]:
        """One catalog entry, with what starting it asks for: ``start_form`` is the form on its none
        start event (``event_id``, ``fields``, ``source``; the start data is checked against it) or
        None. Options a field takes from a SYSTEM key are listed as the start would offer them."""
        entry = self.catalog.entries().get(process_id)
        process = self.catalog.load(process_id)  # unknown id: 404 naming the registered ones
        found = spiff.start_form(process.spec, process.subprocess_specs)
        start_form = None
        if found is not None:
            event_id, form = found
            form = forms.with_options(form, {k: process.system[k] for k in forms.option_keys(form) if k in process.system})
            start_form = {"event_id": event_id, **forms.public_form(form)}
        return {**(entry or {"id": process_id}), "start_form": start_form}

    def list_instances(self, status: str | None = None, *, holders: bool = False,
                       process_id: str | None = None, limit: int | None = None, offset: int = 0) -> list[dict[str, Any]]:
        """Summaries, newest first (``instance_rows``); ``holders``: each with ``held_by`` (a lease
        lookup per row, so only for a listing someone reads)."""
        return self.instance_page(status, holders=holders, process_id=process_id, limit=limit, offset=offset)[0]

    def instance_page(self, status: str | None = None, *, holders: bool = False, process_id: str | None = None,
                      limit: int | None = None, offset: int = 0) -> tuple[list[dict[str, Any]], int]:
        """``list_instances``, and how many the filters select in all."""
        return instance_page(self.engine.store, status, holders=holders, process_id=process_id, limit=limit,
                             offset=offset)

    def document(self, instance_id: str) -> dict[str, Any]:
        """The instance's `run --json` document, plus its version and who holds its lease."""
        instance = self.load(instance_id)
        return {**instance.to_document(), "version": instance.version,
                "held_by": held_by(self.engine.store, instance.id, instance.status)}

    def tape(self, instance_id: str, *, context: str | None = None, kind: str | None = None,
             activity: str | None = None, branch: str | None = None, key: str | None = None,
             since: int | None = None, limit: int | None = None, offset: int = 0) -> dict[str, Any]:
        """The events the filters select, ``limit`` of them from the ``offset``-th on, with how many
        they select in all (``total``) and where the next page starts (``next_offset``, None at the end)."""
        instance = self.load(instance_id)
        names = [self.context_of(instance, context).name] if context else list(instance.contexts)
        selected = tape_rows(instance, names, kind=kind, activity=activity, branch=branch, key=key, since=since,
                             limit=None)
        rows = selected[offset:][:limit]
        end = offset + len(rows)
        doc = {"instance_id": instance.id, "version": instance.version, "count": len(rows),
               "events": [event_document(name, e) for name, e in rows],
               "total": len(selected), "next_offset": end if end < len(selected) else None}
        if selected and not rows:
            doc["note"] = f"offset {offset} is past the end: the filters select {len(selected)} events (offsets 0..{len(selected) - 1})"
        elif not rows:  # a typo in a filter, or filters that exclude each other: say which, as `layerflow tape` does
            doc["note"], listed = tape_miss(instance, names, kind=kind, activity=activity, branch=branch, key=key,
                                            since=since)
            doc.update(listed)
        return doc

    def inspect(self, instance_id: str, args: InspectArgs, *, dto: bool = False,
                for_model: bool = False) -> dict[str, Any]:
        """Per-layer statistics. ``dto``: add the seed's ContextGovernanceDTO fields
        (``layer_infos`` of all six layers, ``attention_score``, ``knowledge_scores``,
        ``merged_conflicts``, ``branch_infos``) -- for the REST API, not for a model's tokens.
        ``for_model``: the result a model is sent (``context_inspect``): beside the seed's
        ``last_modified`` time, a key's last change as the tape ``seq`` of the event that made it
        (``last_modified_seq``), which orders changes the same way in every run.
        ``conflicts`` are the pending ones (not a cancelled one, which nobody will settle): with
        ``args.context`` named, those of the joins merging into that context (a conflict saved
        before conflicts named theirs is shown in every context); with none, the whole instance's."""
        instance = self.load(instance_id)
        ctx = self.context_of(instance, args.context)
        cfg = self._config_of(instance, args.activity_id)
        metrics = set(args.metrics or METRICS)
        flt = args.filter or InspectFilter()
        after = _epoch(flt.modified_after) if flt.modified_after is not None else None
        modified = _modified_times(ctx)
        seqs = _modified_seqs(ctx) if for_model else None
        preserved = set(ctx.preserved) | set(cfg.effective_preserve_keys if cfg else ())
        layers: dict[str, Any] = {}
        for name in dict.fromkeys(args.layers):
            layer = Layer.parse(name)
            view = ctx.layer(layer)
            keys = [k for k in view if _key_matches(k, flt.key_prefix)
                    and (after is None or modified(layer, k) > after)]
            tokens = {k: ctx.key_tokens(layer, k) for k in keys}
            info: dict[str, Any] = {}
            if "token_count" in metrics:
                info["token_count"] = sum(tokens.values())
            if "key_count" in metrics:
                info["key_count"] = len(keys)
            if "attention_score" in metrics:
                info["attention_score"] = _layer_attention(ctx, layer, keys, tokens, preserved).to_dict()
            if "last_modified" in metrics:
                info["last_modified"] = _iso(max((modified(layer, k) for k in keys), default=None))
                if seqs is not None:
                    info["last_modified_seq"] = int(max((seqs(layer, k) for k in keys), default=0)) or None
            if "size_bytes" in metrics:
                info["size_bytes"] = len(canonical_json({k: thaw(view[k]) for k in keys}).encode("utf-8"))
            if "top_keys" in metrics:
                ranked = sorted(keys, key=lambda k: (-tokens[k], k))[: args.top]
                info["top_keys"] = [{"key": k, "tokens": tokens[k], "last_modified": _iso(modified(layer, k)),
                                     **({"last_modified_seq": int(seqs(layer, k)) or None} if seqs else {}),
                                     "preserved": k in preserved} for k in ranked]
            if "keys" in metrics or "key_count" in metrics:  # the seed lists the keys it counts
                info["keys"] = keys
            layers[str(layer)] = info
        decision = CompressTriggerDetector().detect(ctx, cfg)
        report = {
            # each inspected layer also at the top level, as the seed's context_inspect returns
            # it ({"L3": {"token_count": ...}, "L4": {...}}); "layers" holds the same
            **layers,
            "instance_id": instance.id, "version": instance.version, "status": instance.status,
            "context": ctx.name, "layers": layers, "tokens": ctx.token_report(),
            "attention": AttentionScore.compute(ctx, cfg).to_dict(),
            "compress_status": {"would_trigger": decision.triggers, "explain": decision.explain(),
                                "thresholds": decision.thresholds,
                                "compressions": [c for c in instance.compression_records()
                                                 if c.get("context", MAIN) == ctx.name]},
            "conflicts": [c for c in instance.conflicts
                          if c.get("resolution") is None and not c.get("cancelled")
                          and (args.context is None or c.get("context", ctx.name) == ctx.name)],
            "branches": [{"context": n, "branch_id": i.get("branch_id"), "gateway": i.get("gateway"),
                          "status": i.get("status")} for n, i in instance.branches.items()],
            "active_config": cfg.dump() if cfg is not None else None,
            "preserved": sorted(preserved),
        }
        if dto:
            report.update(_dto_fields(ctx, modified, report))
        return report

    def branch_evaluate(self, instance_id: str, args: BranchEvaluateArgs) -> dict[str, Any]:
        instance = self.load(instance_id)
        if args.branch_id is not None and args.branch_id != MAIN:
            known = {i.get("branch_id") for i in instance.branches.values()} | set(instance.branches)
            if args.branch_id not in known:
                raise ContextKeyError(f"instance {instance.id} has no branch {args.branch_id!r}; branches: "
                                      f"{', '.join(sorted(str(k) for k in known)) or 'none'}")
        ctx = self.context_of(instance, args.branch_id)
        present = {k: str(ctx.locate(k)) for k in args.required_keys if ctx.locate(k) is not None}
        missing = [k for k in args.required_keys if k not in present]
        info = instance.branches.get(ctx.name, {})
        # with no branch_id the default context was evaluated (a model step's tools: its own branch's); the
        # answer names the branch it evaluated, not "main"
        branch = args.branch_id or info.get("branch_id") or MAIN
        return {"instance_id": instance.id, "version": instance.version, "branch_id": branch,
                "context": ctx.name, "status": info.get("status", instance.status), "ok": not missing,
                "present": present, "missing": missing}

    def confirmations(self, instance_id: str | None = None) -> list[dict[str, Any]]:
        """Open confirmations (a person's answer pending), of one instance or of all.

        Listing all reads the record head (no tape, no workflow rebuilt) of each unfinished
        instance whose version changed since the last listing; the rest is remembered
        (any change to an instance bumps its version)."""
        if instance_id is not None:
            inst = self.load(instance_id)
            return _open_of(inst.id, inst.version, inst.confirmations)
        rows = [r for r in self.list_instances() if r.get("status") not in ("completed", "cancelled")]
        out = []
        for row in rows:
            iid, version = row["id"], row.get("version")
            with self._open_lock:
                known = self._open.get(iid)
            if known is None or known[0] != version:
                try:
                    head = record_head(self.engine.store, iid)
                except ContextKeyError:
                    continue  # deleted meanwhile
                known = (head["version"], _open_of(iid, head["version"], head.get("engine", {}).get("confirmations", [])))
                with self._open_lock:
                    self._open[iid] = known
            out.extend(known[1])
        with self._open_lock:  # forget instances that finished or were deleted
            for gone in self._open.keys() - {r["id"] for r in rows}:
                del self._open[gone]
        return out

    # ----- changes -------------------------------------------------------------------

    def start(self, args: StartArgs, *, actor: str = "api", by: str | None = None) -> dict[str, Any]:
        """Start a catalog process and run it; ``by``: the person who gives its answers, if named."""
        process = self.catalog.load(args.process_id)
        answers = args.answers.model_dump() if args.answers is not None else None
        check_answer_keys(process, answers)  # before anything is started, as Engine.run does
        # held from before the instance exists, as every other change holds it: a request, worker
        # or `layerflow resume` that finds the new id (GET /api/instances) waits for this run
        instance_id = uuid.uuid4().hex[:12]
        # with answers, created once the run has taken them: one its task's form refuses leaves nothing
        # behind, and a client that retries the start makes no duplicate (``Engine.starting``)
        with self._lock(instance_id), self.engine.starting(process, args.data, instance_id=instance_id,
                                                            answers=answers if args.run else None) as instance:
            instance.main.record("started", actor=actor, data={"process_id": process.id, "via": "governance"})
            if args.run:
                instance = self.engine.run(instance, answers=answers, by=by)
            else:
                self._save(instance)
        return _ran(instance)

    def inject(self, instance_id: str, args: InjectArgs, *, expected_version: int | None = None,
               actor: str = "operator") -> dict[str, Any]:
        def apply(instance: Instance) -> dict[str, Any]:
            if instance.status == "completed":
                raise InstanceStateError(f"instance {instance.id} is completed; inject writes into a waiting, "
                                         "running or failed instance")
            ctx = self.context_of(instance, args.context)
            written = {}
            try:
                for key in args.values:
                    refuse_engine_key(ctx, args.layer, key)
                # the layer rules first: a SYSTEM key is denied, always; in key order, as a JSON object has
                # none (the same values make the same HISTORY and the same bytes for the next model)
                for key, value in sorted(args.values.items()):
                    written[key] = str(ctx.write(args.layer, key, value, actor=actor))
            except ContextWriteDenied as err:
                err.context = ctx.name  # the refusal goes on the tape of the context it was meant for
                err.args = (str(err) + fixed_key_hint(instance.id, err),)
                raise
            self._writable(instance, ctx, "inject", args.values)
            ctx.record("governance", actor=actor, data={"op": "inject", "keys": list(args.values),
                                                        "layer": args.layer, "reason": args.reason})
            return {"context": ctx.name, "written": written, "tape_seq": ctx.tape[-1].seq}
        return self._change(instance_id, expected_version, "inject", actor, apply)

    def compress(self, instance_id: str, args: CompressArgs, *, expected_version: int | None = None,
                 actor: str = "operator") -> dict[str, Any]:
        def apply(instance: Instance) -> dict[str, Any]:
            ctx = self.context_of(instance, args.context)
            cfg = self._compress_config(instance, args)
            if args.action == "evaluate":
                sid = args.before_snapshot_id or args.snapshot_id or self._last_compression(instance, ctx)
                report = evaluate(ctx, sid, cfg, recent_activities=self.compressor.recent_activities)
                return {"action": "evaluate", "context": ctx.name, **report.to_dict(),
                        "density_gain": report.density_gain}
            self._writable(instance, ctx, f"compress ({args.action})")
            if args.action == "decompress":
                sid = args.snapshot_id or args.before_snapshot_id or self._last_compression(instance, ctx, merged=True)
                done = decompress(ctx, sid, actor=actor, source=self._merged_owner(instance, ctx, sid))
                return {"action": "decompress", "context": ctx.name, **done.to_dict()}
            extra = sorted(set(args.target_layers) - {"L3"})
            if extra:
                raise BadRequest(f"compression works on L3 HISTORY only (WORKING belongs to the open activity, the "
                                 f"other layers are not compressed); drop {', '.join(extra)} from target_layers")
            if args.preserve_keys:
                ctx.mark_preserved(args.preserve_keys, actor=actor)
            triggers = [*CompressTriggerDetector().detect(ctx, cfg).triggers, "manual"]
            result = self.compressor.compress(ctx, cfg, actor=actor, triggers=triggers, target_tokens=args.max_tokens)
            record = {**result.to_dict(), "activity_id": args.activity_id or "governance", "context": ctx.name,
                      "actor": actor}
            if result.changed:
                instance.compressions.append(record)
            return {"action": "compress", "changed": result.changed, **record}
        return self._change(instance_id, expected_version, f"compress:{args.action}", actor, apply)

    @staticmethod
    def _last_compression(instance: Instance, ctx: LayeredContext, *, merged: bool = False) -> str:
        """The latest compression of ``ctx`` (``merged``: or of a branch merged into it since)."""
        undone = []
        for c in reversed(instance.compression_records()):
            name = c.get("context", MAIN)
            if not c.get("snapshot_id") or not (name == ctx.name or merged and _merged_into(instance, name, ctx.name)):
                continue
            if c.get("undone"):
                # put back (its activity failed, a decompress, a rollback): nothing of it to evaluate or undo
                undone.append(f"{c['snapshot_id']} (undone by {c['undone'].get('by')} at event {c['undone'].get('seq')})")
                continue
            return str(c["snapshot_id"])
        why = f"; its compressions were undone: {', '.join(reversed(undone))}" if undone else ""
        raise BadRequest(f"context {ctx.name!r} of instance {instance.id} has no compression to refer to{why}; "
                         "pass before_snapshot_id / snapshot_id")

    def _compress_config(self, instance: Instance, args: CompressArgs) -> ActivityExtensionConfig:
        base = self._config_of(instance, args.activity_id) or ActivityExtensionConfig()
        if not args.preserve_keys and not args.compress_rules:
            return base
        data = base.model_dump(exclude_unset=True)
        data["preserve_keys"] = list(dict.fromkeys([*base.preserve_keys, *args.preserve_keys]))
        data["compress_rules"] = [*base.compress_rules, *args.compress_rules]
        return ActivityExtensionConfig.model_validate(data)

    def rollback(self, instance_id: str, args: RollbackArgs, *, expected_version: int | None = None,
                 actor: str = "operator") -> dict[str, Any]:
        def apply(instance: Instance) -> dict[str, Any]:
            named = self.context_of(instance, args.context) if args.context is not None else None
            sid = snapshot_id_of(instance, args.snapshot_id, named)  # its id, or a label only it has
            owner = self._snapshot_owner(instance, sid, args.context)
            info = instance.branches.get(owner.name)
            if args.context is None and info is not None and info.get("status") == "joined":
                parent = info.get("parent") or MAIN
                raise InstanceStateError(
                    f"rollback: snapshot {sid!r} was taken in context {owner.name!r} of instance "
                    f"{instance.id} (branch {info.get('branch_id') or owner.name!r}), already merged into {parent!r} at "
                    f"{info.get('join')!r}: nothing reads that context any more, and {parent!r} never was in that "
                    f"state. Roll {parent!r} back to a snapshot of its own: the split's, {info.get('snapshot_id')!r}, "
                    "is from before the branch began (`layerflow snapshot ID --list` lists them)")
            ctx = self._writable(instance, owner, "rollback")
            before = ctx.token_report()
            had = {c["key"]: ctx.get(c["key"], _ABSENT) for c in self._asked(instance, ctx)}
            activity = self._open_activity_at(instance, ctx, sid, actor)
            event = ctx.restore(sid, layers=args.layers, actor=actor, reason=args.reason)
            self._refuse_asked(instance, ctx, "rollback", [k for k, v in had.items()
                                                           if not _same(v, ctx.get(k, _ABSENT))])
            ctx.record("governance", actor=actor, data={"op": "rollback", "snapshot_id": sid,
                                                        "reason": args.reason, **activity})
            # the instance's document (``rollback --json`` gives the same), its ``layers`` and
            # ``tokens`` those of the context rolled back, as they are now
            after = ctx.token_report()
            return {**instance.to_document(), "layers": ctx.as_dict(), "tokens": after, "context": ctx.name,
                    "snapshot_id": sid, "event_seq": event.seq,
                    "restored_layers": [str(Layer(x)) for x in event.data["layers"]],
                    "tokens_before": before, "tokens_after": after, **activity}
        return self._change(instance_id, expected_version, "rollback", actor, apply)

    @staticmethod
    def _merged_owner(instance: Instance, ctx: LayeredContext, snapshot_id: str) -> LayeredContext | None:
        """The branch context that took ``snapshot_id`` and was merged into ``ctx`` at its join (a
        compression a parallel branch made: its changes are ``ctx``'s history now); None otherwise."""
        if snapshot_id in ctx.snapshots:
            return None
        return next((other for name, other in instance.contexts.items()
                     if snapshot_id in other.snapshots and _merged_into(instance, name, ctx.name)), None)

    @staticmethod
    def _open_activity_at(instance: Instance, ctx: LayeredContext, snapshot_id: str, actor: str) -> dict[str, str]:
        """What a rollback does to the activity ``ctx`` has open (a model activity waiting for, or
        failed after, a person's answer): a snapshot taken inside it keeps it open, its conversation
        going on (``activity_open``); one taken before it began ends it first, as a failure does (an
        ``abort`` naming the rollback; its conversation dropped), so ``resume`` runs it again from the
        context rolled back (``activity_ended``), and a later ``cancel`` cannot put back, from the
        activity's begin snapshot, what the rollback took away. While the model's question waits for
        an answer that second case is refused: its conversation would be dropped under the question."""
        open_ = ctx.current_activity
        if open_ is None:
            return {}
        began = [e for e in ctx.tape.filter(kind="begin") if e.activity == open_][-1]
        if ctx.get_snapshot(snapshot_id).seq > began.seq:
            return {"activity_open": open_}
        if _open_multi_instance(instance, ctx, open_):
            # its instances are SpiffWorkflow's, running one by one (people answer them): ended here, the
            # activity would not run again, and the next instance would find it closed
            raise InstanceStateError(
                f"rollback: multi-instance activity {open_!r} of instance {instance.id} is open in context "
                f"{ctx.name!r}, its instances running one by one; snapshot {snapshot_id!r} was taken before it "
                f"began ({began.data.get('snapshot_id')!r} is the one its begin took), and its instances that ran "
                "cannot be taken back. Roll back to a snapshot taken while it runs (`layerflow snapshot "
                f"{instance.id}` takes one now), or once it has completed")
        held = [(k, v) for k, v in instance.suspended.items()
                if v.get("task_id") == open_ and (v.get("context") or MAIN) == ctx.name]
        waited = [c["id"] for _, v in held for c in instance.confirmations
                  if c["id"] in v.get("confirmations", ()) and not c.get("answered")]
        if waited:
            raise InstanceStateError(
                f"rollback: activity {open_!r} of instance {instance.id} is open, waiting for the answer to "
                f"{', '.join(map(repr, waited))} that its model asked; snapshot {snapshot_id!r} was taken before it "
                "began, so the rollback would end the activity under that question. Answer it first (the activity "
                f"then goes on), or `layerflow cancel {instance.id} --reason TEXT`")
        ctx.abort_activity(open_, actor=actor, reason=(
            f"rollback to snapshot {snapshot_id!r}, taken before activity {open_!r} began: the activity ends here "
            "(its conversation with the model is dropped) and runs again from the context rolled back on resume"))
        for key, _ in held:
            del instance.suspended[key]
        return {"activity_ended": open_}

    def _snapshot_owner(self, instance: Instance, snapshot_id: str, context: str | None) -> LayeredContext:
        if context is not None:
            ctx = self.context_of(instance, context)
            if snapshot_id not in ctx.snapshots:
                raise SnapshotNotFound(instance, snapshot_id, ctx)
            return ctx
        for ctx in instance.contexts.values():
            if snapshot_id in ctx.snapshots:
                return ctx
        raise SnapshotNotFound(instance, snapshot_id)

    def snapshot(self, instance_id: str, args: SnapshotArgs, *, expected_version: int | None = None,
                 actor: str = "operator") -> dict[str, Any]:
        def apply(instance: Instance) -> dict[str, Any]:
            ctx = self.context_of(instance, args.context)
            self._refuse_finished(instance, ctx, "snapshot", why=", and a rollback to a snapshot of it is refused "
                                  "for that reason", instead="Snapshot the context it went into instead: it holds the "
                                  "branch's work since then")
            snap = ctx.snapshot(label=args.label, actor=actor)
            shown = args.layers or [str(x) for x in Layer]
            return {"context": ctx.name, "snapshot_id": snap.id, "seq": snap.seq, "label": snap.label,
                    "layers": {name: sorted(snap.layer(name)) for name in dict.fromkeys(shown)}}
        return self._change(instance_id, expected_version, "snapshot", actor, apply)

    def config(self, instance_id: str, args: ConfigArgs, *, expected_version: int | None = None,
               actor: str = "operator") -> dict[str, Any]:
        try:
            freeze(args.config)  # a value no JSON document can carry (NaN parses) would be saved as null
        except (TypeError, ValueError) as err:
            raise BadRequest(f"runtime config for {args.activity_id!r}: {err}") from None
        change = runtime_config(args.config, element_id=args.activity_id)

        def apply(instance: Instance) -> dict[str, Any]:
            if instance.status == "completed":
                raise InstanceStateError(f"instance {instance.id} is completed; its config no longer matters")
            current = self._config_of(instance, args.activity_id)
            _check_identity(change, current, args.activity_id)
            try:
                if args.mode == "merge" and current is not None:
                    new = current.merged_with(change)
                else:
                    data = change.model_dump(exclude_unset=True)
                    if current is not None and current.handler:
                        data["handler"] = current.handler  # the handler is the server's, never the request's
                    if current is not None and current.type and "type" not in data:
                        data["type"] = current.type  # what the BPMN draws, as the file says it
                    new = ActivityExtensionConfig.model_validate(data)
            except ValidationError as err:  # each part is valid, the merge is not (e.g. a strategy without its fields)
                problems = format_validation_error(err, source="runtime config", element_id=args.activity_id)
                raise ConfigError(f"runtime config for {args.activity_id!r}: merged with the current config it is "
                                  "invalid: " + "; ".join(f"{p['field']}: {p['message']}" for p in problems),
                                  problems=problems) from None
            _check_element_ids(new, instance, args.activity_id)
            main = instance.main
            version = 1 + sum(1 for e in main.tape.filter(kind="config_change")
                              if e.data.get("activity_id") == args.activity_id)
            # complete, defaults too: a reader sees what each field was before and is now
            previous = (current or ActivityExtensionConfig()).dump_full()
            instance.process.configs = {**instance.process.configs, args.activity_id: new}
            main.record("config_change", actor=actor, data={
                "activity_id": args.activity_id, "config_version": version, "mode": args.mode,
                "change": change.dump(), "config": new.dump_full(), "previous": previous, "reason": args.reason})
            return {"activity_id": args.activity_id, "config_version": version, "change": change.dump(),
                    "config": new.dump_full(), "previous": previous}
        return self._change(instance_id, expected_version, "config", actor, apply)

    def resolve(self, instance_id: str, args: ResolveArgs, *, expected_version: int | None = None,
                actor: str = "operator", resolver: str = "human", by: str | None = None) -> dict[str, Any]:
        """Settle a pending confirmation; ``resolver``: who decided (``"model"`` when a model's
        ``context_branch`` tool call does), as the conflict's resolution names it; ``by``: the person,
        when named (a REST request's ``user``)."""
        return self._answer(instance_id, args.confirmation_id, args.conflict_key, args.resolution, args.reason,
                            actor, expected_version, resolver=resolver, by=by)

    def answer(self, confirmation_id: str, args: AnswerArgs, *, actor: str = "operator") -> dict[str, Any]:
        instance_id = args.instance_id
        if instance_id is None:
            owners = sorted({c["instance_id"] for c in self.confirmations() if c["id"] == confirmation_id})
            if not owners:
                owners = self._answered_in(confirmation_id)
                if len(owners) == 1:  # answered already (by a person or its timeout): say so, as with instance_id
                    _open_confirmation(self.load(owners[0]), confirmation_id, None, args.value)
                if owners:
                    raise ConfirmationAnswered(
                        f"confirmation {confirmation_id!r} is answered already in instances {', '.join(owners)} and "
                        "open in none; an answer is final (send instance_id to see who answered it and when)")
                closed = self._answered_in(confirmation_id, cancelled=True)
                if len(closed) == 1:  # cancelled with its instance or its join: say so, as with instance_id
                    _open_confirmation(self.load(closed[0]), confirmation_id, None, args.value)
                raise ContextKeyError(f"no instance has an open confirmation {confirmation_id!r}; "
                                      "GET /api/confirmations lists the open ones")
            if len(owners) > 1:
                raise BadRequest(f"confirmation {confirmation_id!r} is open in several instances "
                                 f"({', '.join(owners)}); send instance_id")
            instance_id = owners[0]
        return self._answer(instance_id, confirmation_id, None, args.value, args.reason, args.user or actor,
                            args.expected_version, by=args.user)

    def _answered_in(self, confirmation_id: str, *, cancelled: bool = False) -> list[str]:
        """The instances (finished ones too) where confirmation ``confirmation_id`` was answered, by a
        person or by its timeout (``cancelled``: closed unanswered instead, with its instance or its
        join): an answer by id alone comes late, not to an unknown confirmation. Reads every record
        head; only a refused answer gets here."""
        found = []
        for row in self.list_instances():
            try:
                head = record_head(self.engine.store, row["id"])
            except ContextKeyError:
                continue  # deleted meanwhile
            if any(c["id"] == confirmation_id and c.get("answered") and bool(c.get("cancelled")) == cancelled
                   for c in head.get("engine", {}).get("confirmations", [])):
                found.append(row["id"])
        return sorted(found)

    def _answer(self, instance_id: str, confirmation_id: str | None, conflict_key: str | None, value: Any,
                reason: str | None, actor: str, expected: int | None, *, resolver: str = "human",
                by: str | None = None) -> dict[str, Any]:
        with self._lock(instance_id):
            instance = self.load(instance_id)
            # a decision already taken is what a late answer must hear about, whatever version its
            # client read before it was taken (that version is stale by then, as a matter of course)
            entry = _open_confirmation(instance, confirmation_id, conflict_key, value)
            self._check_version(instance, expected)
            entry["reason"] = reason
            entry["answered_by"] = actor
            try:  # the engine puts the decision on the tape
                instance = self.engine.answer_confirmation(instance, entry["id"], value, actor=actor, reason=reason,
                                                           resolver=resolver, by=by)
            except ActivityError as err:  # raised before anything changed: not one of the options
                raise InvalidAnswer(str(err)) from None
        return {"confirmation_id": entry["id"], **_ran(instance)}

    def _run_on(self, instance_id: str, expected: int | None, step: Callable[[Instance], Instance]) -> dict[str, Any]:
        """Load the instance under its lock, check the version, let ``step`` (an ``Engine``
        call, which saves) run it on; the document it ends with, and its version."""
        with self._lock(instance_id):
            instance = self.load(instance_id)
            self._check_version(instance, expected)
            instance = step(instance)
        return _ran(instance)

    def send_event(self, instance_id: str, args: SendEventArgs, *, expected_version: int | None = None,
                   actor: str = "operator") -> dict[str, Any]:
        """Deliver a message or signal (``Engine.send_event``), then run the instance on. A refused
        payload key is on the tape of the catching context already (the engine saved it)."""
        return self._run_on(instance_id, expected_version, lambda instance: self.engine.send_event(
            instance, args.name, args.payload, kind=args.kind, actor=actor))

    def correlate(self, args: CorrelateArgs, *, actor: str = "operator") -> dict[str, Any]:
        """``Engine.correlate`` with the catalog: the message goes to the one waiting instance whose
        catch takes it and whose context holds ``match``, under its lease; none: a catalog process
        (``process_id``, else any) that starts on the message is started and gets it. The reply is
        the instance's document, plus ``started``."""
        from .correlate import find

        def processes() -> Iterator[Process]:  # loaded only when no instance takes the message
            if args.process_id:
                yield self.catalog.load(args.process_id)  # unknown: 404; broken: 422
                return
            for pid in self.catalog.entries():
                try:
                    yield self.catalog.load(pid)
                except (ProcessError, ConfigError):
                    continue  # a broken file of the catalog starts nothing (`layerflow serve` named it)

        target = find(self.engine, args.name, args.payload, match=args.match, process=processes())
        if isinstance(target, Instance):
            doc = self._run_on(target.id, None, lambda instance: self.engine.send_event(
                instance, args.name, args.payload, actor=actor))
            return {**doc, "started": False}
        instance_id = uuid.uuid4().hex[:12]
        with self._lock(instance_id):
            instance = self.engine.start_for_message(target, args.name, args.payload, actor=actor,
                                                     instance_id=instance_id)
        return {**_ran(instance), "started": True}

    def complete_user_task(self, instance_id: str, task_id: str, args: UserTaskArgs, *,
                           expected_version: int | None = None, actor: str = "operator") -> dict[str, Any]:
        """Complete a user task the instance waits for (``task_id``: the ``id`` of its
        ``waiting_for`` item, or its BPMN id: of several instances of a multi-instance task, the
        first ``waiting_for`` lists), then run the instance on; ``completed_user_task`` names the
        one completed. A task it does not wait for: ``InstanceStateError`` naming what it waits
        for, nothing changed."""
        completed: list[dict[str, Any] | None] = []

        def step(instance: Instance) -> Instance:
            waiting = [w for w in instance.waiting_for if w.get("kind") == "user_task"]
            if instance.status != "waiting" or not any(task_id in (w.get("id"), w.get("task_id")) for w in waiting):
                # none waits: name what does (a confirmation, a message), as the engine's refusal does
                shown = (", ".join(f"{w['task_id']} ({w['id']})" for w in waiting)
                         or f"no user task ({events.describe_waiting(instance.waiting_for)})")
                if not has_user_task(instance, task_id) and task_id not in instance.process.element_ids():
                    # not the instance's at all (a typo): a wrong address; an element of its process that is no
                    # user task (a script task's id) stays a state the instance is in, as before
                    raise ContextKeyError(f"instance {instance_id} ({instance.status}) has no user task "
                                          f"{task_id!r}{why_not_waiting(instance, task_id)}; it waits for {shown}")
                raise InstanceStateError(f"instance {instance_id} ({instance.status}) does not wait for user task "
                                         f"{task_id!r}{why_not_waiting(instance, task_id)}; it waits for {shown}")
            instance = self.engine.complete_user_task(instance, task_id, args.data, actor=actor)
            completed.append(instance.completed_user_task)
            return instance
        # which one a BPMN id completed (the first of several waiting instances): an added field
        return {**self._run_on(instance_id, expected_version, step), "completed_user_task": completed[0]}

    def resume(self, instance_id: str, args: ResumeArgs, *, expected_version: int | None = None,
               by: str | None = None) -> dict[str, Any]:
        """``Engine.resume`` with the answers given (``layerflow resume ID --answers``): what is
        answered runs on, the rest still waits. A completed instance comes back as it is, its
        answers unused, as ``layerflow resume`` answers it (exit 0): a client that retries a resume
        whose reply it lost, or that answers what someone else answered meanwhile, is not in
        conflict with the outcome it asked for."""
        answers = args.answers.model_dump() if args.answers else None
        return self._run_on(instance_id, expected_version,
                            lambda instance: self.engine.resume(instance, answers=answers, by=by))

    def cancel(self, instance_id: str, args: CancelArgs, *, expected_version: int | None = None,
               actor: str = "operator") -> dict[str, Any]:
        """``Engine.cancel``: stop an unfinished instance for good, with the reason on its tape."""
        return self._run_on(instance_id, expected_version,
                            lambda instance: self.engine.cancel(instance, reason=args.reason, actor=actor))

    def request_confirmation(self, instance_id: str, args: HumanConfirmArgs, *, actor: str = "model",
                             answer: Any = None, answered: bool = False) -> dict[str, Any]:
        """The model's ``human_confirm``: a pending confirmation that a person answers later
        (``POST /api/confirmations/{id}``); or, with ``answered``, one a person answered at once."""
        def apply(instance: Instance) -> dict[str, Any]:
            # a timeout runs from now: a run or resume after the deadline takes the default (as for a
            # join's confirmation); without ``created`` / ``deadline`` it never came
            now = instance.clock()
            extra = {"created": now, **({"deadline": now + args.timeout} if args.timeout is not None else {})}
            return self._add_confirmation(instance, instance.main, args, actor=actor, answer=answer, answered=answered,
                                          extra=extra)
        return self._change(instance_id, None, "human_confirm", actor, apply)

    @staticmethod
    def _add_confirmation(instance: Instance, ctx: LayeredContext, args: HumanConfirmArgs, *, actor: str,
                          answer: Any = None, answered: bool = False,
                          extra: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """The body of ``request_confirmation`` on a loaded (or running) instance; noted on
        ``ctx``'s tape. ``extra``: more fields of the confirmation entry (the engine's
        ``task``, ``context``, ``created``, ``deadline`` for one an activity waits for)."""
        if instance.status == "completed":
            raise InstanceStateError(f"instance {instance.id} is completed; nobody is waiting for an answer")
        n = 1 + sum(1 for c in instance.confirmations if str(c.get("id", "")).startswith("model:"))
        cid = f"model:{n}"
        entry = {"id": cid, "type": args.type, "message": args.message,
                 "options": [o.model_dump() for o in args.options], "timeout": args.timeout,
                 "default": args.default, "answer": answer if answered else None, "timed_out": False,
                 "answered": answered, "task_id": ctx.current_activity or "model", "task": None,
                 "requested_by": actor, "context": ctx.name, **(extra or {})}
        instance.confirmations.append(entry)
        ctx.record("confirmation_requested", actor=actor, data={
            "confirmation_id": cid, "type": args.type, "message": args.message[:2000],
            "options": entry["options"]})
        if answered:
            ctx.record("human_decision", actor="person", data={"confirmation_id": cid, "value": answer})
        else:
            instance.waiting_for = [*instance.waiting_for, confirmation_item(entry)]
            if instance.status == "running":
                instance.status = "waiting"
        return {"confirmation_id": cid, "status": "answered" if answered else "pending",
                "answer": answer if answered else None}

    def record_note(self, instance_id: str, note: str, data: Mapping[str, Any], *, actor: str) -> dict[str, Any]:
        """An audit note on the main tape (e.g. what the model's tool calls were)."""
        def apply(instance: Instance) -> dict[str, Any]:
            event = instance.main.record(note, actor=actor, data=dict(data))
            return {"tape_seq": event.seq}
        return self._change(instance_id, None, note, actor, apply)


# ============================================================================ helpers

def moved_keys(e: Event) -> list[str]:
    """The keys a ``complete`` event moved from WORKING into HISTORY."""
    if e.kind != EventKind.COMPLETE:
        return []
    gone = {key for layer, key, value in e.changes if layer == Layer.WORKING and value is DELETED}
    return [key for layer, key, value in e.changes if layer == Layer.HISTORY and value is not DELETED and key in gone]


def event_document(context_name: str, event: Any) -> dict[str, Any]:
    """A tape event as the CLI and the REST API show it: every event names its context, seq,
    kind, time, actor, activity and branch (null when it has none; the stored form leaves
    them out). A write or delete of one key also names it flat, beside ``changes``
    (``[[layer, key, value]]``): ``layer`` as ``"L4"``, ``key`` and ``value``; a refused write
    (``denied``) its ``key`` and the ``layer`` it asked for."""
    doc: dict[str, Any] = {"context": context_name, "activity": None, "branch": None, **event.to_dict()}
    changes = doc.get("changes") or []
    if doc.get("kind") in ("write", "delete") and len(changes) == 1 and len(changes[0]) == 3:
        layer, key, value = changes[0]
        flat = {"layer": f"L{layer}" if isinstance(layer, int) else str(layer), "key": key, "value": value}
        doc.update({k: v for k, v in flat.items() if k not in doc})
    elif doc.get("kind") == "denied" and isinstance((doc.get("data") or {}).get("key"), str):
        # a refused write names its key (and the layer it asked for) flat too, as a write does
        data = doc["data"]
        requested = data.get("requested")
        flat = {"key": data["key"], "layer": f"L{requested}" if isinstance(requested, int) else requested}
        doc.update({k: v for k, v in flat.items() if k not in doc and v is not None})
    return doc


def runtime_config(data: Any, *, element_id: str) -> ActivityExtensionConfig:
    """Validate a runtime config change: the config schema, and nothing that runs code
    (no ``handler`` or script field, conditions only in the safe expression subset, no
    attribute access in knowledge query templates, no model endpoint)."""
    source = "runtime config"
    if not isinstance(data, dict):
        raise ConfigError(f"{source} for {element_id!r} must be an object")
    problems = [{"file": source, "id": element_id, "field": k, "message": "runtime config changes cannot carry "
                 "handlers or scripts; register them on the server, in the process config"}
                for k in data if str(k).replace("_", "").lower() in FORBIDDEN_CONFIG_KEYS]
    if problems:
        raise ConfigError(f"{source} for {element_id!r}: field(s) {', '.join(p['field'] for p in problems)} "
                          "cannot be changed at run time: no handlers or scripts", problems=problems)
    cfg = config_from_dict(data, source=source, element_id=element_id)
    found: list[tuple[str, str]] = []
    if cfg.llm is not None and cfg.llm.api_base is not None:
        found.append(("llm.apiBase", "the model endpoint is the server's to set (process config or "
                                     "LAYERFLOW_MODEL_API_BASE), not a runtime change"))
    rules = cfg.conflict_policy.rules if cfg.conflict_policy is not None else []
    for i, rule in enumerate(rules):
        problem = _unsafe_expression(rule.when, natural_language_ok=False)
        if problem:
            found.append((f"conflictPolicy.rules.{i}.when", problem))
    for i, branch in enumerate(cfg.branches):
        problem = _unsafe_expression(branch.condition, natural_language_ok=True) if branch.condition else None
        if problem:
            found.append((f"branches.{i}.condition", problem))
    if cfg.knowledge_config is not None and cfg.knowledge_config.query:
        try:
            fields = [f for _, f, _, _ in string.Formatter().parse(cfg.knowledge_config.query) if f]
        except ValueError as err:
            found.append(("knowledgeConfig.query", f"not a template: {err}"))
        else:
            if any("." in f or "[" in f for f in fields):
                found.append(("knowledgeConfig.query", "template fields name context keys only ({key}); "
                                                       "attribute or index access is not allowed"))
    if found:
        listed = [{"file": source, "id": element_id, "field": f, "message": m} for f, m in found]
        raise ConfigError(f"{source} for {element_id!r}:\n  " + "\n  ".join(f"field {f}: {m}" for f, m in found),
                          problems=listed)
    return cfg


def _check_identity(change: ActivityExtensionConfig, current: ActivityExtensionConfig | None,
                    element_id: str) -> None:
    """A runtime change says nothing else of what the element is: ``type`` (the seed's ``XOR_SPLIT``, a
    task type) describes what the BPMN draws, and the BPMN decides how the element runs, so another
    ``type`` would change nothing but the config's word for it; ``activityId`` / ``gatewayId`` name the
    element the change is for. Each is taken when it repeats what the element's config says (a config
    sent back as it was read), and refused otherwise, naming the element and the field."""
    found = []
    if "type" in change.model_fields_set and change.type != (current.type if current is not None else None):
        own = current.type if current is not None else None
        found.append(("type", f"{change.type!r} cannot be set at run time: the BPMN decides what {element_id!r} "
                              f"is and how it runs, and a runtime config cannot change that (its config's type is "
                              f"{own!r}); leave type out" + (f" or send {own!r}" if own is not None else "")
                              + ", or change the BPMN and start a new instance"))
    for name, attr in (("activityId", "activity_id"), ("gatewayId", "gateway_id")):
        value = getattr(change, attr)
        if attr in change.model_fields_set and value is not None and value != element_id:
            found.append((name, f"{value!r} is not the element this change is for ({element_id!r}); send the "
                                f"change for {value!r} as its own request, or leave {name} out"))
    if found:
        listed = [{"file": "runtime config", "id": element_id, "field": f, "message": m} for f, m in found]
        raise ConfigError(f"runtime config for {element_id!r}:\n  " + "\n  ".join(
            f"field {p['field']}: {p['message']}" for p in listed), problems=listed)


def _check_element_ids(cfg: ActivityExtensionConfig, instance: Instance, element_id: str) -> None:
    """The ids a runtime config names (``branchPriority``, ``branches``) are elements of the
    instance's process, as ``layerflow validate`` checks for the file: a branchPriority that names
    none of the join's branches stopped the instance at the join."""
    known = set(instance.process.element_ids())
    found = [(f"branchPriority.{i}", b) for i, b in enumerate(cfg.branch_priority) if b not in known]
    found += [(f"branches.{i}.id", b.id) for i, b in enumerate(cfg.branches) if b.id not in known]
    if found:
        listed = [{"file": "runtime config", "id": element_id, "field": f,
                   "message": f"{b!r} is no element of process {instance.process_id!r}; name the BPMN ids of the "
                              "branches' first elements"} for f, b in found]
        raise ConfigError(f"runtime config for {element_id!r}:\n  " + "\n  ".join(
            f"field {p['field']}: {p['message']}" for p in listed), problems=listed)


def _unsafe_expression(expression: str, *, natural_language_ok: bool) -> str | None:
    from gateways.expressions import ExpressionError, UnsafeExpressionError, check_expression

    try:
        check_expression(expression)
    except UnsafeExpressionError as err:
        return str(err)
    except ExpressionError as err:
        if natural_language_ok:
            try:
                ast.parse(expression.strip(), mode="eval")
            except SyntaxError:
                return None  # a designer's sentence, for the model; nothing runs it
        return str(err)
    return None


def activity_events(ctx: LayeredContext, activity: str, branch: str | None, key: str | None) -> list[Any]:
    """The events of an activity, and of a gateway by its BPMN id: its snapshot and split too
    (``layerflow tape --activity`` and ``GET /api/instances/{id}/tape?activity=`` alike)."""
    found = {e.seq for e in ctx.tape.filter(activity=activity, branch=branch, key=key)}
    rest = ctx.tape.filter(branch=branch, key=key)
    # a person's decision on a join's conflict names the gateway in its confirmation id, GATEWAY/KEY;
    # a person's answer to a user task (and its refusal) is noted before the task begins, naming it
    # in task_id
    mine = [e for e in rest if e.activity is None
            and (activity in ((e.data or {}).get("gateway"), (e.data or {}).get("gateway_id"),
                              (e.data or {}).get("task_id"))
                 or str((e.data or {}).get("confirmation_id") or "").startswith(f"{activity}/"))]
    splits = {(e.data or {}).get("snapshot_id") for e in mine}
    found |= {e.seq for e in mine}
    found |= {e.seq for e in rest if e.kind == "snapshot" and (e.data or {}).get("snapshot_id") in splits}
    return [e for e in rest if e.seq in found]


def no_key_or_branch(contexts: Iterable[LayeredContext], key: str | None,
                     branch: str | None) -> tuple[str, dict[str, list[str]]]:
    """What a tape filter by ``key`` or ``branch`` that found nothing says (``layerflow tape`` on
    stderr, the REST tape's ``note``): the value the tape has none of, and those it has, by name
    (``branches`` or ``keys``; the note names the nearest keys, as they may be hundreds)."""
    events = [e for ctx in contexts for e in ctx.tape]
    branches = sorted({str(e.branch) for e in events if e.branch})
    keys = sorted({str(c[1]) for e in events for c in e.changes} | {str(e.data["key"]) for e in events
                                                                    if e.data and isinstance(e.data.get("key"), str)})
    if branch and branch not in branches:
        return (f"no event of branch {branch!r} here (a branch its split did not take has none); "
                f"branches on this tape: {', '.join(branches) or 'none'}", {"branches": branches})
    if key and key not in keys:
        near = difflib.get_close_matches(key, keys, n=3)
        hint = f"did you mean {' or '.join(map(repr, near))}?" if near else f"{len(keys)} keys are changed on it"
        return f"no event of key {key!r} on this tape; {hint}", {"keys": keys}
    return (f"no event of key {key!r} in branch {branch!r}" if key and branch else "no event matches"), {}


def tape_rows(instance: Instance, names: Iterable[str], *, kind: str | None, activity: str | None,
              branch: str | None, key: str | None, since: int | None,
              limit: int | None, offset: int = 0) -> list[tuple[str, Event]]:
    """The events of the contexts ``names`` that pass every filter, by time, at most ``limit`` from the
    ``offset``-th on: (context name, event) pairs, as ``layerflow tape`` and REST's tape list them.
    ``offset`` pages through a listing of several contexts, where ``since`` (one context's numbering)
    cannot: the order is the tapes' own, so a page's place stays put as the tapes grow."""
    wanted = kind_names(kind)
    rows: list[tuple[float, str, Event]] = []
    for name in names:
        ctx = instance.contexts[name]
        found = (ctx.tape.filter(branch=branch, key=key) if activity is None
                 else activity_events(ctx, activity, branch, key))
        rows.extend((e.time, name, e) for e in found
                    if (since is None or e.seq >= since) and (wanted is None or matches_kind(e, wanted)))
    rows.sort(key=lambda r: (r[0], r[2].seq))
    return [(name, e) for _, name, e in rows[offset:][:limit]]


def tape_miss(instance: Instance, names: Iterable[str], *, kind: str | None, activity: str | None,
              branch: str | None, key: str | None, since: int | None) -> tuple[str, dict[str, list[str]]]:
    """What a tape listing of the contexts ``names`` that found nothing says (``layerflow tape`` on
    stderr, the REST tape's ``note``), with what the tapes have by name: a filter that finds nothing
    on them alone (a typo: the kinds, activities, keys or branches there), else the filters that find
    nothing together, and where each tape ends when ``since`` is one of them."""
    names = list(names)
    contexts = [instance.contexts[n] for n in names]
    wanted = kind_names(kind)
    if wanted is not None and not any(matches_kind(e, wanted) for ctx in contexts for e in ctx.tape):
        seen = sorted({str(k) for ctx in contexts for e in ctx.tape for k in (e.kind, (e.data or {}).get("note")) if k})
        near = difflib.get_close_matches(str(kind), seen, n=3)
        hint = f"did you mean {' or '.join(map(repr, near))}? " if near else ""
        return (f"no event of kind {kind!r} here; {hint}kinds and notes on this tape: {', '.join(seen)}",
                {"kinds": seen})
    if activity is not None:
        missing = no_activity(instance, names, activity)
        if missing is not None:
            return missing[0], {"activities": missing[1]}
    if key is not None or branch is not None:
        note, listed = no_key_or_branch(contexts, key, branch)
        if listed:
            return note, listed
    filters = [f"{what} {value!r}" for what, value in (("kind", kind), ("activity", activity), ("key", key),
                                                       ("branch", branch)) if value is not None]
    if since is not None:
        filters.append(f"from #{since} on")
    ends = ""
    if since is not None:  # each context numbers its own tape from 1
        shown = [f"{n} ends at #{ctx.tape[-1].seq if len(ctx.tape) else 0}" for n, ctx in zip(names, contexts)]
        ends = f" (the tape of {', '.join(shown[:5])}{', ...' if len(shown) > 5 else ''})"
    if len(filters) == 1:
        return f"no event matches {filters[0]}{ends}", {}
    each = "" if since is not None else "; the tape has events of each filter on its own: drop or change one"
    return f"no event matches {', '.join(filters[:-1])} and {filters[-1]} together{ends}{each}", {}


def activity_ids(contexts: Iterable[LayeredContext], elements: Iterable[str]) -> list[str]:
    """The ids ``activity_events`` finds events of in ``contexts``, sorted: the activities and gateways
    the events name, and the actor of an event that names no activity when it is one of ``elements``
    (the process's BPMN ids: an activity's closing events are its own; ``engine``, ``person``, ``api``
    or ``input`` are who acted, no activity to look for)."""
    known = set(elements)
    ids: set[str] = set()
    for ctx in contexts:
        for e in ctx.tape:
            if e.activity:
                ids.add(str(e.activity))
                continue
            data = e.data or {}
            ids.update(str(i) for i in (data.get("gateway"), data.get("gateway_id"), data.get("task_id")) if i)
            if e.actor and str(e.actor) in known:
                ids.add(str(e.actor))
            confirmation = str(data.get("confirmation_id") or "")
            if "/" in confirmation:
                ids.add(confirmation.split("/", 1)[0])
    return sorted(ids)


def no_activity(instance: Instance, names: Iterable[str], activity: str) -> tuple[str, list[str]] | None:
    """What a tape filter by ``activity`` that found nothing says (``layerflow tape`` on stderr, the
    REST tape's ``note``) when no event on the tapes of contexts ``names`` is of it: the nearest ids
    and all of them; None when the id is there (it has no event matching the other filters)."""
    process = instance.process
    ids = activity_ids((instance.contexts[n] for n in names), process.element_ids())
    if activity in ids:
        return None
    inner = process.subprocess_specs.get(activity)
    if inner is not None:  # its tasks have the events (a sub-process takes no context step of its own)
        inside = [ts.bpmn_id for ts in spiff.iter_user_specs(inner)]
        with_events = [i for i in inside if i in ids]
        return (f"no event of activity {activity!r} here: {activity!r} is a sub-process of process {process.id!r} (or "
                f"a process it calls), whose events are those of the elements inside it ({', '.join(inside)}): give "
                f"one of them to --activity; of them, events on this tape: {', '.join(with_events) or 'none'}"), ids
    if activity in process.element_ids():  # no typo: the element was not reached, or takes no context step
        return (f"no event of activity {activity!r} here: {activity!r} is an element of process {process.id!r} with no "
                f"event on this tape (not reached, or no step of its own); activities and gateways on this tape: "
                f"{', '.join(ids) or 'none'}"), ids
    near = difflib.get_close_matches(activity, ids, n=3)
    hint = f"did you mean {' or '.join(map(repr, near))}? " if near else ""
    return (f"no event of activity {activity!r} here; {hint}activities and gateways on this tape: "
            f"{', '.join(ids) or 'none'}"), ids


_ABSENT = object()


def _merged_into(instance: Instance, name: str, target: str) -> bool:
    """Whether the context ``name`` is a branch joined into ``target`` (directly, or through the
    branches it was joined into in turn)."""
    seen = set()
    info = instance.branches.get(name)
    while info is not None and info.get("status") == "joined" and name not in seen:
        seen.add(name)
        name = info.get("parent") or MAIN
        if name == target:
            return True
        info = instance.branches.get(name)
    return False


def _same(a: Any, b: Any) -> bool:
    """Two reads of one key (``_ABSENT`` when the context does not hold it) give the same value."""
    if a is _ABSENT or b is _ABSENT:
        return a is b
    return json_equal(a, b)


def _open_of(instance_id: str, version: int, confirmations: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The open ones, each with its instance and version and, while its timeout runs (``deadline``,
    epoch seconds by the engine's clock), ``due``: that moment in ISO 8601 UTC, as ``waiting_for`` gives it."""
    return [{**c, "instance_id": instance_id, "version": version, **_due_of(c)}
            for c in confirmations if not c.get("answered")]


def _due_of(confirmation: Mapping[str, Any]) -> dict[str, str]:
    deadline = _deadline(confirmation)
    if deadline is None or confirmation.get("escalated") or "due" in confirmation:
        return {}  # escalated: it waits for a person now, no longer for a clock
    return {"due": str(_moment(deadline))}


def _moment(seconds: float | None) -> str | None:
    """A confirmation's time (epoch seconds, by the engine's clock) as ISO 8601 UTC text, written
    as ``due`` and ``waiting_for`` write theirs."""
    return None if seconds is None else datetime.fromtimestamp(float(seconds), timezone.utc).isoformat()


def _open_confirmation(instance: Instance, confirmation_id: str | None, conflict_key: str | None,
                       given: Any = None) -> dict[str, Any]:
    pending = [c for c in instance.confirmations if not c.get("answered")]
    if confirmation_id:
        found = [c for c in pending if c["id"] == confirmation_id]
    else:
        found = [c for c in pending if c.get("key") == conflict_key or c["id"] == conflict_key]
    if len(found) == 1:
        if confirmation_id and conflict_key and conflict_key not in (found[0].get("key"), found[0]["id"]):
            # two names of two questions: answering one would drop what the client said of the other
            raise BadRequest(f"confirmation {confirmation_id!r} asks about key {found[0].get('key')!r}, not "
                             f"{conflict_key!r}; send the confirmation_id alone, or with its own conflict_key")
        return found[0]
    wanted = confirmation_id or conflict_key
    if not found:
        done = [c for c in instance.confirmations
                if c.get("answered") and not c.get("cancelled") and wanted in (c["id"], c.get("key"))]
        if done:  # a second answer (two people at once, a retry): the first stands
            last = done[-1]
            if last.get("answered_by_timeout"):
                raise AnsweredByTimeout(instance, last, given)
            raise AnsweredAlready(instance, last, given)
        _refuse_if_closed(instance, wanted)
        raise ContextKeyError(f"instance {instance.id} has no open confirmation or conflict {wanted!r}; open: "
                              f"{', '.join(c['id'] for c in pending) or 'none'}")
    # several joins, or one join that fired in several places at once (a multi-instance body)
    raise BadRequest(f"conflict key {wanted!r} is open in several confirmations ({', '.join(c['id'] for c in found)}); "
                     "send confirmation_id, one of those")


def _refuse_if_closed(instance: Instance, wanted: str | None) -> None:
    """``InstanceStateError`` (409) for an answer to a confirmation nobody reads any more: its
    instance was cancelled (who cancelled it and why), or its join was (an interrupting event, a
    terminate end event).
    A late answer is told what happened to the question, not that there never was one."""
    closed = [c for c in instance.confirmations if c.get("cancelled") and wanted in (c["id"], c.get("key"))]
    if not closed:
        return
    refuse_if_cancelled(instance, f"take an answer to confirmation {closed[-1]['id']!r}")
    if closed[-1].get("closed_by") == "completion":
        raise InstanceStateError(f"confirmation {closed[-1]['id']!r} of instance {instance.id} was closed unanswered "
                                 "when the instance completed (no step waited for it); nothing reads an answer to "
                                 "it any more, and a completed instance is not changed")
    raise InstanceStateError(f"confirmation {closed[-1]['id']!r} of instance {instance.id} was cancelled with its "
                             f"join {closed[-1].get('task_id')!r} (an interrupting event or a terminate end event "
                             "ended it); nothing reads an answer to it. `layerflow inspect` shows what the instance "
                             "waits for now")


def _key_matches(key: str, pattern: str | None) -> bool:
    if not pattern:
        return True
    if any(ch in pattern for ch in "*?["):
        return fnmatch.fnmatchcase(key, pattern)
    return key.startswith(pattern)


def _modified_times(ctx: LayeredContext) -> Callable[[Layer, str], float]:
    """When each key's current value was set in this context: the time of the last tape event
    that wrote it, or of a later fork / restore / abort that reset its layer."""
    return _modified_by(ctx, lambda e: float(e.time))


def _modified_seqs(ctx: LayeredContext) -> Callable[[Layer, str], float]:
    """``_modified_times`` by the events' tape ``seq``: what a model is shown, which no clock changes."""
    return _modified_by(ctx, lambda e: e.seq)


def _modified_by(ctx: LayeredContext, mark: Callable[[Any], float]) -> Callable[[Layer, str], float]:
    marks: dict[tuple[int, str], float] = {}
    reset = [0.0] * len(Layer)
    for e in ctx.tape:
        if e.kind == EventKind.FORK:
            reset = [mark(e)] * len(Layer)
        elif e.kind == EventKind.RESTORE:
            for i in e.data.get("layers", ()):
                reset[int(i)] = mark(e)
        elif e.kind == EventKind.ABORT and e.data.get("snapshot_id"):
            for i in range(1, len(Layer)):
                reset[i] = mark(e)
        for layer, key, value in e.changes:
            if value is DELETED:
                marks.pop((layer, key), None)
            else:
                marks[(layer, key)] = mark(e)
    return lambda layer, key: max(marks.get((int(layer), key), 0.0), reset[int(layer)])


def _layer_attention(ctx: LayeredContext, layer: Layer, keys: Iterable[str], tokens: Mapping[str, int],
                     preserved: Iterable[str]) -> AttentionScore:
    view = ctx.layer(layer)
    entries = tuple(ScopeEntry(layer, k, view[k], tokens[k]) for k in keys)
    merged = ctx.get("_mergedConflicts")
    if layer == Layer.HISTORY:
        scope = Scope(history=entries, preserved=frozenset(preserved), merged_conflicts=merged)
    else:
        scope = Scope(history=(), working=entries, preserved=frozenset(preserved), merged_conflicts=merged)
    return AttentionScore.of_scope(scope)


def _epoch(moment: datetime) -> float:
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=timezone.utc)
    return moment.timestamp()


def _dto_fields(ctx: LayeredContext, modified: Callable[[Layer, str], float], report: Mapping[str, Any]
                ) -> dict[str, Any]:
    """The seed's ContextGovernanceDTO names: LayerInfo of every layer (unfiltered), and
    the confidence of each KNOWLEDGE entry."""
    infos = []
    for layer in Layer:
        view = ctx.layer(layer)
        tokens = {k: ctx.key_tokens(layer, k) for k in view}
        infos.append({"layer_id": str(layer), "token_count": sum(tokens.values()), "key_count": len(tokens),
                      "size_bytes": len(canonical_json({k: thaw(v) for k, v in view.items()}).encode("utf-8")),
                      "last_modified": _iso(max((modified(layer, k) for k in tokens), default=None)),
                      "top_keys": sorted(tokens, key=lambda k: (-tokens[k], k))[:5]})
    scores = []
    for key, value in ctx.layer(Layer.KNOWLEDGE).items():
        item = thaw(value)
        confidence = item.get("confidence") if isinstance(item, dict) else None
        if isinstance(confidence, (int, float)) and not isinstance(confidence, bool):
            scores.append({"key": key, "confidence": confidence, "source": item.get("source") or key,
                           "collection": item.get("collection")})
    return {"layer_infos": infos, "attention_score": report["attention"], "knowledge_scores": scores,
            "merged_conflicts": report["conflicts"], "branch_infos": report["branches"]}


def _iso(t: float | None) -> str | None:
    if not t:
        return None
    return datetime.fromtimestamp(t, tz=timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _open_multi_instance(instance: Instance, ctx: LayeredContext, bpmn_id: str) -> bool:
    """Whether ``bpmn_id`` is a multi-instance task whose activity is open in ``ctx`` (its instances
    run in the task's own context one after another: ``Runtime.begin_multi``)."""
    workflows = [instance.workflow, *instance.workflow.subprocesses.values()]
    return any(task.internal_data.get(spiff.MULTI_KEY) and spiff.bpmn_id_of(task) == bpmn_id
               and not task.has_state(TaskState.FINISHED_MASK) and spiff.context_name_of(task) == ctx.name
               for wf in workflows for task in wf.tasks.values())
