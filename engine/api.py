"""The REST API: the governance service over HTTP (FastAPI; ``layerflow serve`` runs it).

Every endpoint that changes state or returns instance data needs
``Authorization: Bearer <token>`` (the token given to ``create_app``, else
``$LAYERFLOW_API_TOKEN``; with neither, every such request is refused). Only
``/api/health`` and the OpenAPI docs (``/docs``, ``/openapi.json``) are open.

Processes are started by id from the server's catalog directory, never from BPMN in
a request (BPMN scripts are Python run in-process).

Errors: ``{"error": {"kind": ..., "message": ..., ...}}`` with the status code of
``STATUS_BY_KIND`` -- the one place that maps the error tree's kinds to HTTP.
"""

from __future__ import annotations

import difflib
import hmac
import json
import logging
import os
import re
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Annotated, Any, ClassVar, Literal, get_args

from fastapi import Body, Depends, FastAPI, Header, Path as PathParam, Query, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from fastapi.routing import APIRoute
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import Match

from context_layers.errors import ConfigError, LayerflowError, VersionConflict
from context_layers.stores import InstanceNotFound

from .governance import (
    AnswerArgs,
    BadRequest,
    BranchEvaluateArgs,
    CancelArgs,
    Catalog,
    CompressArgs,
    ConfigArgs,
    CorrelateArgs,
    GovernanceService,
    InjectArgs,
    InstanceId,
    InspectArgs,
    MAX_LABEL_CHARS,
    InspectFilter,
    ResolveArgs,
    RollbackArgs,
    SendEventArgs,
    SnapshotArgs,
    StartAnswers,
    ResumeArgs,
    StartArgs,
    UserTaskArgs,
    _snake,
    mark_dead_letters,
)
from .runtime import Engine, Status
from .tools import TOOL_MODELS, dispatch_tool, tool_schemas
from .worker import DEFAULT_STREAM, dead_letter_ids, has_queue, queue_client

__all__ = ["CONDITIONAL_ROUTES", "DEFAULT_MAX_BODY_BYTES", "KIND_MEANING", "MAX_BODY_ENV", "ROUTE_ERRORS",
           "STATUS_BY_KIND", "TOKEN_ENV", "Unauthorized", "answer_responses", "create_app", "dead_letter_reader",
           "route_responses", "status_for"]

TOKEN_ENV = "LAYERFLOW_API_TOKEN"
#: A request body larger than this is refused (413) before it is read on: an inject of megabytes
#: is saved, then loaded with every read of the instance. ``layerflow serve --max-body-bytes`` or
#: the environment variable raise it.
MAX_BODY_ENV = "LAYERFLOW_MAX_BODY_BYTES"
DEFAULT_MAX_BODY_BYTES = 1024 * 1024
log = logging.getLogger("layerflow.api")
ID_PATTERN = r"^[\w.:@-]+$"
PathId = Annotated[str, PathParam(pattern=ID_PATTERN, max_length=200)]
QueryId = Annotated[str | None, Query(pattern=ID_PATTERN, max_length=200)]

#: The one mapping from error kinds to HTTP status codes (unknown kinds: 500).
STATUS_BY_KIND: dict[str, int] = {
    "bad_request": 400,
    "invalid_value": 400,
    "invalid_answer": 400,
    "unauthorized": 401,
    "permission_denied": 403,
    "not_found": 404,
    "method_not_allowed": 405,
    "payload_too_large": 413,
    "precondition_failed": 412,
    "version_conflict": 409,
    "invalid_state": 409,
    "already_answered": 409,
    "already_exists": 409,
    "tape_sequence": 409,
    "merge_conflict": 409,
    "validation_error": 422,
    "invalid_config": 422,
    "invalid_process": 422,
    "invalid_record": 422,
    "model_error": 502,
    "store_unavailable": 503,
    "store_error": 500,  # a store's failure no narrower kind names (a damaged record is invalid_record)
}


def status_for(kind: str) -> int:
    return STATUS_BY_KIND.get(kind, 500)


class Unauthorized(LayerflowError):
    kind = "unauthorized"


# ----------------------------------------------------------------------------- bodies

def _camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(word.title() for word in rest)


def _other_names(schema: dict[str, Any], model: type[BaseModel]) -> None:
    """Put in a request body's OpenAPI schema the other names the server takes its fields by
    (README: "field names snake_case or camelCase"; ``_Args._camel_case`` and the bodies' own
    ``other_names``): each an optional property of the field's shape; a required field is required
    by any one of its names. Two names of one field together are refused by the server (422, naming
    both), not by the schema: a ``not`` of every such pair made schemathesis's coverage phase take
    minutes per body to build its cases."""
    extra = getattr(model, "openapi_rules", None)
    rules: list[dict[str, Any]] = extra(schema) if extra else []  # first: it may make a field optional
    props: dict[str, Any] = schema.setdefault("properties", {})
    required: list[str] = schema.get("required", [])
    others: dict[str, tuple[str, ...]] = {name: (_camel(name),) for name in props if "_" in name.strip("_")}
    for name, more in getattr(model, "other_names", {}).items():
        others[name] = tuple(dict.fromkeys((*others.get(name, ()), *more)))
    for name, aliases in others.items():
        for alias in aliases:
            props.setdefault(alias, {**props.get(name, {}), "title": alias, "description": f"the same as `{name}`"})
        names = [name, *aliases]
        if name in required:
            required.remove(name)
            rules.append({"anyOf": [{"required": [n]} for n in names]})
    if not required:
        schema.pop("required", None)
    if rules:
        schema["allOf"] = [*schema.get("allOf", []), *rules]


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, json_schema_extra=_other_names)


def _who(description: str) -> Any:
    """The ``user`` field of a request: a person's name or id, on the tape as the actor of every event the
    request makes, so bounded as a label is."""
    return Field(default=None, max_length=MAX_LABEL_CHARS, description=description)


class _Instance(_Body):
    instance_id: InstanceId | None = Field(default=None, description="the instance (required: here or as ?instance_id=)")


class _Change(_Instance):
    expected_version: int | None = Field(default=None, ge=1, description="the version you read; stale -> 409")
    user: str | None = _who("who asks (recorded on the tape as the actor)")


class InspectRequest(InspectArgs, _Instance):
    pass


class CompressRequest(CompressArgs, _Change):
    pass


class InjectRequest(InjectArgs, _Change):
    # one key: {"key": K, "value": V} stands for {"values": {K: V}} (InjectArgs._one_key)
    @staticmethod
    def openapi_rules(schema: dict[str, Any]) -> list[dict[str, Any]]:
        props = schema["properties"]
        schema["required"].remove("values")
        props["key"] = {"type": "string", "minLength": 1, "title": "key",
                        "description": "one key to write (with `value`), instead of `values`"}
        props["value"] = {"title": "value", "description": "the JSON value of `key`"}
        return [{"anyOf": [{"required": ["values"]}, {"required": ["key", "value"]}]}]


class ResolveRequest(ResolveArgs, _Change):
    # the names a pending confirmation shows (ResolveArgs._confirmation_names)
    other_names: ClassVar[dict[str, tuple[str, ...]]] = {"conflict_key": ("key",), "resolution": ("value", "answer")}

    @staticmethod
    def openapi_rules(schema: dict[str, Any]) -> list[dict[str, Any]]:
        return [{"anyOf": [{"required": [n]} for n in ("confirmation_id", "confirmationId", "conflict_key",
                                                           "conflictKey", "key")]}]


class RollbackRequest(RollbackArgs, _Change):
    pass


class ConfigRequest(ConfigArgs, _Change):
    # the seed's ActivityExtensionConfig names its activity inside (`config.activityId`), and may be
    # the body itself: then its fields stand beside instance_id (ConfigArgs._seed_shape)
    @staticmethod
    def openapi_rules(schema: dict[str, Any]) -> list[dict[str, Any]]:
        schema["additionalProperties"] = True  # the config's own fields, when it is the body
        schema["required"] = [n for n in schema["required"] if n not in ("activity_id", "config")]
        names = sorted({*schema["properties"], *map(_camel, schema["properties"])})
        named_inside = {"required": ["config"], "properties": {"config": {"anyOf": [
            {"required": ["activityId"]}, {"required": ["activity_id"]}]}}}
        return [{"anyOf": [{"required": ["activity_id"]}, {"required": ["activityId"]}, named_inside]},
                {"if": {"required": ["config"]}, "then": {"propertyNames": {"enum": names}}}]


class SnapshotRequest(SnapshotArgs, _Change):
    pass


class BranchEvaluateRequest(BranchEvaluateArgs, _Instance):
    pass


class AnswerRequest(AnswerArgs, _Body):
    # `answer`, the field's name in a confirmation and in --answers, and `resolution`, resolve's name
    # for it (AnswerArgs.value's aliases)
    other_names: ClassVar[dict[str, tuple[str, ...]]] = {"value": ("answer", "resolution")}


class StartRequest(StartArgs, _Body):  # _Body: its camelCase names in the schema (_Args._camel_case)
    user: str | None = _who("who starts it (recorded on the tape as the actor)")


class SendEventRequest(SendEventArgs, _Body):  # _Body: its camelCase names in the schema (_Args._camel_case)
    expected_version: int | None = Field(default=None, ge=1, description="the version you read; stale -> 409")
    user: str | None = _who("who sends it (recorded on the tape as the actor)")


class CorrelateRequest(CorrelateArgs, _Body):  # _Body: its camelCase names in the schema (_Args._camel_case)
    user: str | None = _who("who sends it (recorded on the tape as the actor)")


class UserTaskRequest(UserTaskArgs, _Body):  # _Body: its camelCase names in the schema (_Args._camel_case)
    expected_version: int | None = Field(default=None, ge=1, description="the version you read; stale -> 409")
    user: str | None = _who("who completes it (recorded on the tape as the actor)")


class CancelRequest(CancelArgs, _Body):  # _Body: its camelCase names in the schema (_Args._camel_case)
    expected_version: int | None = Field(default=None, ge=1, description="the version you read; stale -> 409")
    user: str | None = _who("who cancels (recorded on the tape as the actor)")


class ResumeRequest(ResumeArgs, _Body):  # _Body: its camelCase names in the schema (_Args._camel_case)
    expected_version: int | None = Field(default=None, ge=1, description="the version you read; stale -> 409")
    user: str | None = _who("who answers (the tape's actor; a join's resolution names them)")


class _Open(BaseModel):  # a reply's part: the fields DESIGN.md names; more may come (added, never renamed)
    model_config = ConfigDict(extra="allow")


class RunError(_Open):
    kind: str
    message: str
    task_id: str | None


class Resolution(_Open):
    value: Any
    resolver: Literal["policy", "model", "human", "strategy"]
    reason: str


class Conflict(_Open):
    gateway_id: str
    layer: str = Field(examples=["L4"])
    key: str
    base_value: Any
    values: dict[str, Any] = Field(description="branch id -> its value")
    resolution: Resolution | None
    context: str | None = Field(default=None, examples=["main"], description=(
        "the context the join merges into: `main` for the process's own flow, else the branch or line "
        "(of a multi-instance) context the join fires in; equal conflicts of two lines are told apart "
        "by it (absent from a conflict recorded before conflicts named it)"))


class Compression(_Open):
    activity_id: str
    triggers: list[str]
    tokens_before: int
    tokens_after: int
    snapshot_id: str


class Confirmation(_Open):
    id: str
    type: str
    message: str
    options: list[Any]
    answer: Any
    timed_out: bool
    context: str | None = Field(default=None, examples=["main"], description=(
        "the context the question asks for: a join's, the one it merges into (its conflict's "
        "`context`); a model's, the one the activity runs in"))


class WaitingItem(_Open):
    # DESIGN's user_task | confirmation, extended (never renamed) with timer and event
    kind: Literal["user_task", "confirmation", "timer", "event"] = Field(description=(
        "`user_task`, `confirmation`, `timer` (with its `due` time) or `event` (a message, a signal or a "
        "condition: `event_kind` `message`, `signal` or `conditional`)"))
    id: str = Field(description="what to answer: a user task's or event's task id, a confirmation's id")
    task_id: str = Field(description="the BPMN id of the element that waits")
    context: str | None = Field(default=None, examples=["main"], description=(
        "the context it waits in (a user task's, a confirmation's, a timer's or an event's), `main` for the "
        "process's own flow, "
        "else the branch or line (of a multi-instance) context, which tells apart items of one `task_id`"))
    due: str | None = Field(default=None, description=(
        "a timer's (and a confirmation's with a timeout): when it fires, ISO 8601 UTC; none when not known"))
    event: str | None = Field(default=None, description="an event's: the name of the message or signal to send")
    instance: int | None = Field(default=None, description=(
        "a user task's, timer's or event's inside a multi-instance activity: which instance waits, from 1"))
    input: dict[str, Any] | None = Field(default=None, description="with `instance`: that instance's input item")


class Layers(_Open):
    L0: dict[str, Any]
    L1: dict[str, Any]
    L2: dict[str, Any]
    L3: dict[str, Any]
    L4: dict[str, Any]
    L5: dict[str, Any]


class Tokens(_Open):
    L0: int
    L1: int
    L2: int
    L3: int
    L4: int
    L5: int
    total: int


class InstanceDocument(_Open):
    """An instance as `layerflow run --json` prints it (DESIGN.md "Interfaces"), plus its version
    (``expected_version`` of a change). A deleted key is absent from its layer."""
    instance_id: str
    process_id: str
    status: Status
    error: RunError | None
    layers: Layers
    tokens: Tokens
    conflicts: list[Conflict]
    compressions: list[Compression]
    confirmations: list[Confirmation]
    waiting_for: list[WaitingItem]
    tape_length: int
    version: int


HELD_BY = Field(description="who runs the instance right now (the worker or process holding its lease), "
                           "else null", examples=["worker-7", None])


class InstanceView(InstanceDocument):
    """GET /api/instances/{id}: the instance's document, as `layerflow inspect --json` begins it."""
    held_by: str | None = HELD_BY


class InstanceSummary(_Open):
    """One row of GET /api/instances, as `layerflow list --json` gives it."""
    instance_id: str = Field(description="the instance, as every document that names one calls it")
    id: str = Field(description="the same id, as the store names it (kept: added, never renamed)")
    process_id: str
    status: Status
    version: int
    updated: float | None
    held_by: str | None = HELD_BY
    dead_letter: str | None = Field(
        default=None, description="only on an unfinished instance whose delivery a worker dead-lettered: the dead "
        "letter's id (`layerflow worker dead` says why; no worker runs it until `layerflow worker requeue ID`)")
    definition_version: str | None = Field(
        default=None, description="the definition the instance runs, the one it started with: its document's "
        "`definition.version` (null: an instance from before versions were kept)")


class ConsoleSummary(_Open):
    """One row of the console's GET /api/instance-summaries: the instance at a glance."""
    instance_id: str
    id: str = Field(description="the same id, as the store names it")
    process_id: str | None
    status: Status
    version: int | None = Field(description="the instance's version (what `expected_version` / `If-Match` ask for)")
    started: str | None = Field(description="ISO 8601, UTC")
    updated: str | None = Field(description="ISO 8601, UTC")
    definition_version: str | None = Field(description="the definition it runs: its document's `definition.version`")
    dead_letter: str | None = Field(default=None, description=(
        "only on an unfinished instance whose delivery a worker dead-lettered: the dead letter's id"))
    waiting_for: list[WaitingItem]
    tokens_total: int | None = Field(description="tokens of its main context (null: its record cannot be loaded)")
    open_conflicts: int
    error: RunError | None = Field(description="its error; for one whose record cannot be loaded, the damage")


class RollbackDocument(InstanceDocument):
    """The instance's document with ``layers`` and ``tokens`` of the context rolled back, as they
    are after it, plus the rollback's own fields, as `layerflow rollback --json` prints it."""
    context: str
    snapshot_id: str
    event_seq: int
    restored_layers: list[str] = Field(description="the layers put back to the snapshot", examples=[["L3"]])
    tokens_before: Tokens
    tokens_after: Tokens


class InjectResult(_Open):
    """What an ``inject`` wrote, where, and its note's place on that context's tape."""
    instance_id: str
    version: int = Field(description="the instance's version after the change")
    context: str = Field(examples=["main"], description="the context written to (a branch's in full)")
    written: dict[str, str] = Field(examples=[{"memo": "L4"}], description=(
        "key -> the layer it went to (`L4`; a key HISTORY holds is promoted there: `L3`)"))
    tape_seq: int = Field(description="the sequence number of the inject's note on that context's tape")


class SnapshotResult(_Open):
    """The snapshot taken: its id (what ``rollback`` takes) and the keys of each layer it holds."""
    instance_id: str
    version: int
    context: str
    snapshot_id: str
    seq: int = Field(description="the tape position it captures")
    label: str | None
    layers: dict[str, list[str]] = Field(description="layer (`L0`..`L5`) -> the keys it holds")


class TapeEvent(_Open):
    """One event of a tape, as `layerflow tape --json` prints it (a write adds ``changes`` and, of one
    key, ``layer``, ``key`` and ``value``; a note its ``data``)."""
    context: str = Field(examples=["main"])
    seq: int = Field(description="its place on the tape of its context, counted from 1")
    kind: str = Field(examples=["write"])
    time: float = Field(description="epoch seconds, of the engine's clock")
    actor: str
    activity: str | None
    branch: str | None


class TapeDocument(_Open):
    """The events the filters select, by time; a filter that matches nothing on the tape adds a
    ``note`` and what there is (``kinds``, ``activities``, ``keys`` or ``branches``)."""
    instance_id: str
    version: int
    count: int
    events: list[TapeEvent]
    total: int = Field(description="how many events the filters select, on every page")
    next_offset: int | None = Field(description="the `offset` of the next page; null on the last one")
    note: str | None = None
    kinds: list[str] | None = None
    activities: list[str] | None = None
    keys: list[str] | None = None
    branches: list[str] | None = None


class InspectResult(_Open):
    """Per inspected layer its metrics (``layers``; each also at the top level, as the seed's
    ``context_inspect`` returns it: ``L3``, ``L4``...), the context's tokens, attention, compression
    status, pending conflicts and branches, plus the seed's ContextGovernanceDTO fields
    (``layer_infos``, ``attention_score``, ``knowledge_scores``, ``merged_conflicts``, ``branch_infos``)."""
    instance_id: str
    version: int
    status: Status
    context: str = Field(examples=["main"])
    layers: dict[str, dict[str, Any]] = Field(description=(
        "inspected layer -> the metrics asked for (`token_count`, `key_count`, `keys`, `attention_score`, "
        "`last_modified`, `size_bytes`, `top_keys`)"))
    tokens: Tokens
    attention: dict[str, Any]
    compress_status: dict[str, Any] = Field(description="`would_trigger`, `explain`, `thresholds`, `compressions`")
    conflicts: list[Conflict] = Field(description="the pending ones (of the joins merging into `context` if named)")
    branches: list[dict[str, Any]] = Field(description="each branch context: `context`, `branch_id`, `gateway`, "
                                                       "`status`")
    active_config: dict[str, Any] | None
    preserved: list[str]


class CompressResult(_Open):
    """A compression's (``action`` `compress`: ``changed``, ``ratio``, ``folded``, ``dropped``...), its
    evaluation's (`evaluate`: ``preserved_intact``, ``density_gain``...) or its undoing's (`decompress`)."""
    instance_id: str
    version: int
    action: Literal["compress", "evaluate", "decompress"]
    context: str = Field(examples=["main"])
    snapshot_id: str | None = Field(description="the snapshot the compression took (what `decompress` restores)")
    tokens_before: int
    tokens_after: int


class ConfigResult(_Open):
    """The activity's config after the change, complete (defaults too), and before it."""
    instance_id: str
    version: int
    activity_id: str
    config_version: int = Field(description="how many runtime changes this activity's config has had")
    change: dict[str, Any] = Field(description="the fields the request set")
    config: dict[str, Any]
    previous: dict[str, Any]


class BranchEvaluateResult(_Open):
    """Whether the branch's context holds the required keys, and in which layer."""
    instance_id: str
    version: int
    branch_id: str = Field(examples=["main"])
    context: str
    status: str = Field(description="the branch's status (of the instance for `main`)")
    ok: bool = Field(description="every required key is present")
    present: dict[str, str] = Field(examples=[{"risk_level": "L3"}], description="key -> the layer it is in")
    missing: list[str]


class ReplayKey(_Open):
    key: str
    value: Any
    tokens: int
    preserved: bool
    written_by: dict[str, Any] | None = Field(description="the tape event that wrote it (activity, actor, seq, ...)")


class ReplayLayer(_Open):
    name: str = Field(examples=["HISTORY"])
    tokens: int
    keys: list[ReplayKey]


class ReplayDocument(_Open):
    """A context rebuilt from its tape alone up to ``until``, as `layerflow replay` prints it."""
    instance_id: str
    version: int
    context: str = Field(examples=["main"])
    branch_id: str | None
    until: int = Field(description="the tape position rebuilt to: the one asked for, at most the tape's end")
    until_requested: int | None = Field(default=None, description="the `until` asked for (none: the whole tape); "
                                        "past the tape's end it is more than `until`")
    tape_last_seq: int
    tape_end: int | None = Field(default=None, description="`tape_last_seq` under `layerflow replay --json`'s name")
    event: TapeEvent | None = Field(description="the event at `until` (none on an empty tape)")
    tokens: Tokens
    layers: dict[str, ReplayLayer] = Field(description="layer (`L0`..`L5`) -> its keys")


ETAG_HEADER = {"ETag": {"description": "the instance's version, quoted (`\"3\"`): what a change's `If-Match` asks "
                                       "for", "schema": {"type": "string"}}}


PAGE_HEADERS = {
    "X-Total-Count": {"description": "how many instances the filters select in all", "schema": {"type": "integer"}},
    "Link": {"description": 'the next page (`</api/instances?...&offset=N>; rel="next"`), while there is one',
             "schema": {"type": "string"}},
}


def _success(route: str, model: type[BaseModel], description: str) -> dict[str, Any]:
    """A route's success answer for /openapi.json: ``model``, and the ``ETag`` of the routes that send one."""
    etag = {"headers": ETAG_HEADER} if route in (*CONDITIONAL_ROUTES, "document", "start") else {}
    return {"model": model, "description": description, **etag}


def answer_responses(route: str, model: type[BaseModel], description: str) -> dict[int | str, dict[str, Any]]:
    """``route_responses`` plus its success, ``model``."""
    return {200: _success(route, model, description), **route_responses(route)}


def document_responses(route: str, status: int = 200) -> dict[int | str, dict[str, Any]]:
    """``route_responses`` plus its success: the instance's document (``InstanceDocument``)."""
    return {status: _success(route, InstanceDocument, "the instance's document, as it is now"),
            **route_responses(route)}


class ErrorDetail(BaseModel):
    model_config = ConfigDict(extra="allow")
    kind: str
    message: str


class ErrorBody(BaseModel):
    error: ErrorDetail


#: What each error kind means to a client (the descriptions of /openapi.json's error answers).
KIND_MEANING: dict[str, str] = {
    "bad_request": "a request that cannot be carried out as asked (the message says why and what to do)",
    "invalid_value": "a value no JSON document can carry (a lone surrogate, NaN)",
    "invalid_answer": "an answer that is none of the offered options, or does not fit the task's form",
    "unauthorized": "no or wrong bearer token",
    "permission_denied": "a layer rule denied the write (a SYSTEM key, a PROCESS key already set)",
    "not_found": "an unknown instance, context, branch, snapshot, element, confirmation, process or tool",
    "version_conflict": "stale expected_version: load the instance again and repeat",
    "precondition_failed": "stale If-Match (the ETag, the instance's version, you read): load the instance again "
                           "and repeat",
    "invalid_state": "the instance's state does not allow it (completed, cancelled, not waiting for it, "
                     "branches open, run by another request right now)",
    "already_answered": "the confirmation was answered already (by whom and when: in the message)",
    "payload_too_large": f"a request body larger than the server's limit (default {DEFAULT_MAX_BODY_BYTES} "
                         f"bytes; `layerflow serve --max-body-bytes` or {MAX_BODY_ENV} raise it)",
    "validation_error": "an invalid body, path or query parameter (each problem in `problems`)",
    "invalid_config": "an invalid activity config (or a catalog config file that does not validate)",
    "invalid_process": "a catalog BPMN file that does not validate (or cannot be drawn)",
    "invalid_record": "a stored record this server cannot read",
    "store_unavailable": "the store is unavailable (redis down, sqlite locked too long); retry once it answers",
}

_LOADED = ("validation_error", "not_found", "invalid_record", "store_unavailable")  # an instance read
_CHANGED = (*_LOADED, "version_conflict", "invalid_state")  # ... and changed under its lease, at its version
_WRITTEN = (*_CHANGED, "permission_denied", "invalid_value")  # ... with values the client gives
_ANSWERED = (*_CHANGED, "bad_request", "invalid_answer", "already_answered")  # ... answering a confirmation

#: The one table of what each route (by its endpoint's name) can answer besides its success: the
#: kinds its handler and what it calls raise (their codes: ``STATUS_BY_KIND``). Every ``/api/``
#: route also answers 401 ``unauthorized`` (the token), 413 ``payload_too_large`` (the body's
#: size, checked before anything else) and 500 ``internal_error`` (a bug).
#: /openapi.json lists each route's codes from here, and the error handlers log an answer whose
#: code its route does not list (``_documented``), so the two cannot drift apart unseen. No route
#: answers 502 ``model_error``: a model that fails inside an activity is the instance's error
#: (status ``error``, ``error.kind`` ``model_error``), as in ``run --json``; the governance routes
#: call no model (``compress`` summarizes offline).
ROUTE_ERRORS: dict[str, tuple[str, ...]] = {
    "inspect": _LOADED,
    "compress": (*_CHANGED, "bad_request"),
    "inject": _WRITTEN,
    "resolve": _ANSWERED,
    "rollback": (*_CHANGED, "bad_request"),  # a label several snapshots carry (AmbiguousSnapshot)
    "config": (*_CHANGED, "bad_request", "invalid_config"),
    "snapshot": _CHANGED,
    "branch_evaluate": _LOADED,
    "tools": ("validation_error",),  # a query parameter it does not take (_known_query)
    "call_tool": _ANSWERED,  # the tools' errors: context_branch resolves, context_compress changes
    "processes": ("validation_error",),
    "process": ("validation_error", "not_found", "invalid_process", "invalid_config"),
    "list_instances": ("validation_error", "store_unavailable"),
    "start": ("validation_error", "not_found", "invalid_process", "invalid_config", "bad_request", "invalid_value",
              "invalid_answer", "permission_denied", "store_unavailable"),
    "document": _LOADED,
    "send_event": _WRITTEN,
    # none takes the message: 404 naming what waits; several: 409 naming them; a catalog process it starts
    "correlate": (*_WRITTEN, "bad_request", "invalid_process", "invalid_config"),
    "complete_user_task": (*_CHANGED, "permission_denied", "invalid_answer"),
    "resume": (*_ANSWERED, "permission_denied"),
    "cancel": _CHANGED,
    "tape": _LOADED,
    "confirmations": _LOADED,
    "answer": _ANSWERED,
    # engine.console's
    "instance_summaries": ("validation_error", "store_unavailable"),
    "instance_diagram": (*_LOADED, "invalid_process"),
    "process_diagram": ("validation_error", "not_found", "invalid_process"),
    "replay": _LOADED,
}


#: The routes that take the version a change expects as ``If-Match`` too (the ``ETag`` their answer
#: gives): a stale one is 412 ``precondition_failed``, a malformed one 400 ``bad_request``.
CONDITIONAL_ROUTES = ("compress", "inject", "resolve", "rollback", "config", "snapshot", "send_event",
                      "complete_user_task", "resume", "cancel", "answer")
for _route in CONDITIONAL_ROUTES:
    ROUTE_ERRORS[_route] = tuple(dict.fromkeys((*ROUTE_ERRORS[_route], "precondition_failed", "bad_request")))
del _route


def route_responses(route: str) -> dict[int | str, dict[str, Any]]:
    """The error answers of ``route`` for its OpenAPI entry (``responses=``), from ``ROUTE_ERRORS``:
    each code with the one error body and the kinds it carries there."""
    by_code: dict[int, list[str]] = {}
    for kind in ("unauthorized", "payload_too_large", *ROUTE_ERRORS[route]):
        by_code.setdefault(status_for(kind), []).append(kind)
    by_code[500] = ["internal_error"]
    meaning = {**KIND_MEANING, "internal_error": "an unexpected error (the server's log has the details)"}
    return {code: {"model": ErrorBody, "description": "; ".join(f"`{k}`: {meaning[k]}" for k in kinds)}
            for code, kinds in sorted(by_code.items())}


# ----------------------------------------------------------------------------- the app

def _error(kind: str, message: str, status: int | None = None, **extra: Any) -> JSONResponse:
    headers = {"WWW-Authenticate": "Bearer"} if kind == "unauthorized" else None
    return JSONResponse({"error": {"kind": kind, "message": message, **extra}},
                        status_code=status or status_for(kind), headers=headers)


class _BodyLimit:
    """ASGI middleware: a request whose body is larger than ``limit`` bytes is answered 413 and
    never reaches a route (nothing is written). Its declared length is checked first; a body
    sent without one (chunked) is read up to the limit, then handed on as it came."""

    def __init__(self, app: Any, limit: int) -> None:
        self.app, self.limit = app, limit

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = dict(scope["headers"]).get(b"content-length", b"")
        if declared.isdigit() and int(declared) > self.limit:
            return await self._refuse(int(declared), scope, receive, send)
        received, size = [], 0
        while True:
            message = await receive()
            received.append(message)
            if message["type"] != "http.request":
                break
            size += len(message.get("body", b""))
            if size > self.limit:
                return await self._refuse(None, scope, receive, send)
            if not message.get("more_body"):
                break

        async def replay() -> Any:
            return received.pop(0) if received else await receive()
        await self.app(scope, replay, send)

    async def _refuse(self, size: int | None, scope: Any, receive: Any, send: Any) -> None:
        sent = f"{size} bytes" if size is not None else f"more than {self.limit} bytes"
        response = _error("payload_too_large", (
            f"the request body ({sent}) is larger than this server's limit of {self.limit} bytes; send less "
            f"(a large document belongs in the knowledge folder, not in a context), or raise the limit: "
            f"`layerflow serve --max-body-bytes N` or {MAX_BODY_ENV}=N"),
            limit=self.limit, setting=f"--max-body-bytes / {MAX_BODY_ENV}")
        await response(scope, receive, send)


def max_body_bytes_from_env() -> int:
    """``LAYERFLOW_MAX_BODY_BYTES`` if set, else ``DEFAULT_MAX_BODY_BYTES``."""
    raw = os.environ.get(MAX_BODY_ENV, "").strip()
    if not raw:
        return DEFAULT_MAX_BODY_BYTES
    if not raw.isdigit() or int(raw) < 1:
        raise ConfigError(f"{MAX_BODY_ENV}={raw!r} is no positive number of bytes; set it to one (the default is "
                          f"{DEFAULT_MAX_BODY_BYTES}) or unset it")
    return int(raw)


def dead_letter_reader(store_url: str | None, queue: str | None = None,
                       stream: str = DEFAULT_STREAM) -> Callable[[], dict[str, str]]:
    """What the listings read to name an instance's dead letter (``worker.dead_letter_ids`` of ``stream``
    on the queue ``worker.queue_client`` finds: ``queue``, a Redis store's, $LAYERFLOW_QUEUE); with none,
    nothing. A bad ``queue`` URL fails here, as the server starts; a queue that does not answer later
    costs the listing its dead letters (logged), never the listing."""
    if not has_queue(store_url, queue):
        return dict
    client = queue_client(store_url, queue)

    def read() -> dict[str, str]:
        try:
            return dead_letter_ids(client, stream)
        except LayerflowError as err:
            log.warning("dead letters of stream %r not read, instance rows name none: %s", stream, err)
            return {}
    return read


def create_app(store: str | Engine | GovernanceService | None = None, catalog_dir: str | Path | None = None,
               token: str | None = None, *, model: str | None = None,
               max_body_bytes: int | None = None, queue: str | None = None,
               stream: str = DEFAULT_STREAM) -> FastAPI:
    """The FastAPI app. ``store``: a store URL (default ``memory://``), an ``Engine`` or a
    ``GovernanceService``; ``catalog_dir``: where the startable processes are; ``max_body_bytes``:
    the largest request body accepted (default: ``LAYERFLOW_MAX_BODY_BYTES``, else 1 MiB);
    ``queue`` / ``stream``: the workers' Redis stream whose dead letters the instance rows name
    (``dead_letter``; default: the store's Redis, else $LAYERFLOW_QUEUE, else none)."""
    limit = max_body_bytes if max_body_bytes is not None else max_body_bytes_from_env()
    if limit < 1:
        raise ConfigError(f"max_body_bytes={limit} accepts no body at all; give a positive number of bytes")
    if isinstance(store, GovernanceService):
        service = store
    else:
        engine = store if isinstance(store, Engine) else Engine(store or "memory://", model=model)
        service = GovernanceService(engine, Catalog(catalog_dir))
    secret = token if token is not None else os.environ.get(TOKEN_ENV) or None
    dead_letters = dead_letter_reader(getattr(service.engine.store, "url", None), queue, stream)

    app = FastAPI(title="layerflow", version="0.1.0",
                  description="Context governance for BPMN processes with a layered LLM context.",
                  dependencies=[Depends(_known_query)])
    app.state.service = service
    app.state.dead_letters = dead_letters

    def openapi() -> dict[str, Any]:
        # the bodies' nested models take camelCase names too (_Args._camel_case): say so here only,
        # not in the tools' schemas, which share these models
        if app.openapi_schema is None:
            schemas = FastAPI.openapi(app).get("components", {}).get("schemas", {})
            for model in (InspectFilter, StartAnswers):
                if model.__name__ in schemas:
                    _other_names(schemas[model.__name__], model)
        return app.openapi_schema or {}

    app.openapi = openapi  # type: ignore[method-assign]
    bearer = HTTPBearer(auto_error=False, description="the server's API token (LAYERFLOW_API_TOKEN)")

    def authorize(credentials: HTTPAuthorizationCredentials | None) -> None:
        if secret is None:
            raise Unauthorized(f"this server has no API token configured; start it with --token or {TOKEN_ENV}")
        if credentials is None or credentials.scheme.lower() != "bearer":
            raise Unauthorized("send the API token as `Authorization: Bearer <token>`")
        if not hmac.compare_digest(credentials.credentials.encode("utf-8", "surrogatepass"),
                                   secret.encode("utf-8")):
            raise Unauthorized("the bearer token is not this server's API token; send the one the server was "
                               f"started with (`layerflow serve --token`, or {TOKEN_ENV}) as "
                               "`Authorization: Bearer <token>`")

    # Checked before the body is read, so a request without a token gets 401, never a
    # validation error that would tell it about the body.
    @app.middleware("http")
    async def require_token(request: Request, call_next: Any) -> Any:
        path = request.url.path
        if path.startswith("/api/") and path != "/api/health":
            try:
                authorize(await bearer(request))
            except LayerflowError as err:
                return _error(err.kind, str(err))  # 401: every /api/ route lists it
        return await call_next(request)

    def svc(credentials: HTTPAuthorizationCredentials | None = Depends(bearer)) -> GovernanceService:
        authorize(credentials)  # the middleware already did; this documents it in OpenAPI
        return service

    @app.exception_handler(LayerflowError)
    async def _layerflow_error(request: Request, err: LayerflowError) -> JSONResponse:
        body = err.to_dict()
        message = body.pop("message")
        if isinstance(err, InstanceNotFound):  # the store's hint names a Python call; a client lists by GET
            message = _not_in_store(err.instance_id)
        kind = body.pop("kind")
        if isinstance(err, VersionConflict) and request.headers.get("if-match", "").strip() not in ("", "*"):
            # the version came as a precondition (RFC 9110): its failure is 412, not a body's conflict
            kind, message = "precondition_failed", f"If-Match: {message}"
        return _documented(request, _error(kind, message, **body))

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, err: RequestValidationError) -> JSONResponse:
        route = request.scope.get("route")
        body_field = getattr(route, "body_field", None)
        body_model = body_field.field_info.annotation if body_field is not None else None
        problems = [_problem(e, body_model, request.path_params) for e in err.errors()]
        if any(tuple(e.get("loc", ())) == ("body",) and isinstance(e.get("input"), bytes) for e in err.errors()):
            # FastAPI reads a body as JSON only when it is sent as JSON (curl's -d sends a form type):
            # the bytes it kept are no object, and "should be a valid dictionary" would not say why
            sent = request.headers.get("content-type")
            problems = [{"field": "body", "message": f"the body was sent with "
                         f"{f'Content-Type: {sent}' if sent else 'no Content-Type'}, so it was not read as "
                         "JSON; send one JSON object with the header `Content-Type: application/json`"}]
        elif whole := [e for e in err.errors()
                       if tuple(e.get("loc", ())) == ("body",) and e.get("type") in _NO_OBJECT]:
            problems = [_no_object(whole[0], body_model)]
        text = "; ".join(f"{p['field']}: {p['message']}" for p in problems[:10])
        return _documented(request, _error("validation_error", f"invalid request: {text}", problems=problems))

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, err: StarletteHTTPException) -> JSONResponse:
        kind = {404: "not_found", 405: "method_not_allowed", 401: "unauthorized"}.get(err.status_code, "http_error")
        message, asked = str(err.detail), f"{request.method} {request.url.path}"
        allowed = (err.headers or {}).get("Allow")
        if err.status_code == 405:  # every route of the path, not the first one's methods only
            allowed = _methods_of(app, request) or allowed
            message = (f"{asked} is not an endpoint: {request.url.path} takes {allowed or 'other methods'}; "
                       "/docs lists the endpoints")
        elif err.status_code == 404 and message == "Not Found":  # the router's, not an endpoint's own
            message = f"{asked} is not an endpoint; /docs lists the endpoints (/openapi.json for programs)"
        elif err.status_code == 400 and message == "There was an error parsing the body" and err.__cause__:
            # JSON the parser reads but Python cannot hold: an invalid body, as one that does not parse
            return await _invalid(request, RequestValidationError([{
                "loc": ("body",), "type": "json_unreadable", "msg": _unreadable(err.__cause__)}]))
        response = _documented(request, _error(kind, message, err.status_code))
        if allowed:
            response.headers["Allow"] = allowed  # RFC 9110: a 405 names the methods the path takes
        return response

    @app.exception_handler(UnicodeError)
    async def _bad_text(request: Request, err: UnicodeError) -> JSONResponse:
        return _documented(request, _error("bad_request", "the request carries text that is not valid Unicode "
                                                     "(an unpaired surrogate?)"))

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, err: Exception) -> JSONResponse:
        return _error("internal_error", f"{type(err).__name__}: the server failed; see its log", 500)

    # ----- open ------------------------------------------------------------------------

    @app.get("/api/health", tags=["server"])
    def health() -> dict[str, str]:
        """Readiness: answers once the server is up (no instance data, no token)."""
        return {"status": "ok"}

    # ----- governance ---------------------------------------------------------------

    @app.post("/api/context-governance/inspect", tags=["context-governance"], response_model=None,
              responses=answer_responses("inspect", InspectResult, "the context, layer by layer"))
    # every field is optional: `POST .../inspect?instance_id=ID` with no body is a whole request (README)
    def inspect(body: Annotated[InspectRequest, Body(default_factory=InspectRequest)], instance_id: QueryId = None,
                s: GovernanceService = Depends(svc)) -> dict[str, Any]:
        """Per layer: tokens, keys, attention scores, last modified, size, top keys."""
        return s.inspect(_instance_of(body, instance_id), InspectArgs.model_validate(_args(body, InspectArgs)),
                         dto=True)

    @app.post("/api/context-governance/compress", tags=["context-governance"], response_model=None,
              responses=answer_responses("compress", CompressResult, "the compression, its evaluation or its undoing"))
    def compress(body: CompressRequest, response: Response, instance_id: QueryId = None,
                 if_match: IfMatch = None,
                 s: GovernanceService = Depends(svc)) -> dict[str, Any]:
        """Compress HISTORY (a snapshot first), evaluate a compression, or undo it."""
        version = _expected(body.expected_version, if_match)
        args = CompressArgs.model_validate(_args(body, CompressArgs))
        return _etag(response, s.compress(_instance_of(body, instance_id), args, expected_version=version,
                                          actor=body.user or "api"))

    @app.post("/api/context-governance/inject", tags=["context-governance"], response_model=None,
              responses=answer_responses("inject", InjectResult, "what was written, and where"))
    def inject(body: InjectRequest, response: Response, instance_id: QueryId = None,
               if_match: IfMatch = None,
               s: GovernanceService = Depends(svc)) -> dict[str, Any]:
        """Write values into a layer; the layer rules apply (a SYSTEM key: 403)."""
        version = _expected(body.expected_version, if_match)
        args = InjectArgs.model_validate(_args(body, InjectArgs))
        return _etag(response, s.inject(_instance_of(body, instance_id), args, expected_version=version,
                                        actor=body.user or "api"))

    @app.post("/api/context-governance/resolve", tags=["context-governance"], response_model=None,
              responses=document_responses("resolve"))
    def resolve(body: ResolveRequest, response: Response, instance_id: QueryId = None,
                if_match: IfMatch = None,
                s: GovernanceService = Depends(svc)) -> dict[str, Any]:
        """Settle a pending conflict / confirmation with a value and a reason; the instance runs on."""
        version = _expected(body.expected_version, if_match)
        args = ResolveArgs.model_validate(_args(body, ResolveArgs))
        return _etag(response, s.resolve(_instance_of(body, instance_id), args, expected_version=version,
                                         actor=body.user or "api", by=body.user))

    @app.post("/api/context-governance/rollback", tags=["context-governance"], response_model=None,
              responses={200: _success("rollback", RollbackDocument, "the instance's document, the context rolled "
                                                                       "back as it is now"),
                         **route_responses("rollback")})
    def rollback(body: RollbackRequest, response: Response, instance_id: QueryId = None,
                 if_match: IfMatch = None,
                 s: GovernanceService = Depends(svc)) -> dict[str, Any]:
        """Restore a context's layers to a snapshot (an event on the tape; nothing is deleted)."""
        version = _expected(body.expected_version, if_match)
        args = RollbackArgs.model_validate(_args(body, RollbackArgs))
        return _etag(response, s.rollback(_instance_of(body, instance_id), args, expected_version=version,
                                          actor=body.user or "api"))

    @app.post("/api/context-governance/config", tags=["context-governance"], response_model=None,
              responses=answer_responses("config", ConfigResult, "the config now and before"))
    def config(body: ConfigRequest, response: Response, instance_id: QueryId = None,
               if_match: IfMatch = None,
               s: GovernanceService = Depends(svc)) -> dict[str, Any]:
        """Change an activity's config for this instance (validated, versioned; no handlers or scripts)."""
        version = _expected(body.expected_version, if_match)
        args = ConfigArgs.model_validate(_args(body, ConfigArgs))
        return _etag(response, s.config(_instance_of(body, instance_id), args, expected_version=version,
                                        actor=body.user or "api"))

    @app.post("/api/context-governance/snapshot", tags=["context-governance"], response_model=None,
              responses=answer_responses("snapshot", SnapshotResult, "the snapshot taken"))
    def snapshot(body: Annotated[SnapshotRequest, Body(default_factory=SnapshotRequest)], response: Response,
                 instance_id: QueryId = None, if_match: IfMatch = None,
                 s: GovernanceService = Depends(svc)) -> dict[str, Any]:
        """Take a snapshot of a context (all six layers)."""
        version = _expected(body.expected_version, if_match)
        args = SnapshotArgs.model_validate(_args(body, SnapshotArgs))
        return _etag(response, s.snapshot(_instance_of(body, instance_id), args, expected_version=version,
                                          actor=body.user or "api"))

    @app.post("/api/context-governance/branch-evaluate", tags=["context-governance"],
              response_model=None,
              responses=answer_responses("branch_evaluate", BranchEvaluateResult, "the keys present and missing"))
    def branch_evaluate(body: BranchEvaluateRequest, instance_id: QueryId = None,
                        s: GovernanceService = Depends(svc)) -> dict[str, Any]:
        """Whether a branch's context holds the required keys (and in which layer)."""
        return s.branch_evaluate(_instance_of(body, instance_id), BranchEvaluateArgs.model_validate(_args(body, BranchEvaluateArgs)))

    # ----- the model tools (DESIGN: served by the same governance service) -------------

    @app.get("/api/context-governance/tools", tags=["model-tools"], responses=route_responses("tools"))
    @app.get("/api/tools", tags=["model-tools"], responses=route_responses("tools"), include_in_schema=False)
    def tools(s: GovernanceService = Depends(svc)) -> list[dict[str, Any]]:
        """context_inspect, context_compress, context_branch and human_confirm as OpenAI
        function-calling schemas (``tools=`` entries)."""
        return tool_schemas()

    @app.post("/api/context-governance/tools/{name}", tags=["model-tools"], responses=route_responses("call_tool"))
    @app.post("/api/tools/{name}", tags=["model-tools"],
              responses=route_responses("call_tool"), include_in_schema=False)
    def call_tool(request: Request, name: str,
                  body: Annotated[dict[str, Any], Body(examples=[{"instance_id": "ID", "arguments": {
                      "layers": ["L3", "L4"], "metrics": ["token_count", "attention_score"]}}])],
                  instance_id: QueryId = None, s: GovernanceService = Depends(svc)) -> dict[str, Any]:
        """Run one tool call on an instance, as a model's call is run: ``{"instance_id": ...,
        "arguments": {...}}`` (``arguments`` may be the JSON text a model sends), or the
        arguments themselves beside ``instance_id``. A bad argument: 422; an unknown tool: 404."""
        if name not in TOOL_MODELS:
            return _documented(request, _error(  # type: ignore[return-value]
                "not_found", f"unknown tool {name!r}; tools: {', '.join(TOOL_MODELS)}"))
        rest = {k: v for k, v in body.items() if k not in ("instance_id", "instanceId", "user", "arguments")}
        if "arguments" in body and rest:
            raise BadRequest(f"give the tool's arguments in `arguments` or beside instance_id, not both "
                             f"(also given: {', '.join(sorted(rest))})")
        given = body.get("instance_id", body.get("instanceId"))
        try:
            shell = _Instance.model_validate({"instance_id": given} if given is not None else {})
        except ValidationError as err:  # the body is free-form here: its id is checked as the bodies' are
            raise RequestValidationError([{**e, "loc": ("body", *e["loc"])} for e in err.errors()]) from None
        iid = _instance_of(shell, instance_id)
        user = body.get("user")
        result = dispatch_tool(s, iid, name, body["arguments"] if "arguments" in body else rest,
                               actor=user if isinstance(user, str) and user else "model")
        error = result.get("error") if isinstance(result, dict) and set(result) == {"error"} else None
        if isinstance(error, dict):
            detail = {k: v for k, v in error.items() if k not in ("kind", "message")}
            message = str(error.get("message"))
            if message == str(InstanceNotFound(iid)):  # the store's hint names a Python call, as below
                message = _not_in_store(iid)
            return _documented(request, _error(str(error.get("kind")), message, **detail))  # type: ignore[return-value]
        return result

    # ----- instances ----------------------------------------------------------------

    @app.get("/api/processes", tags=["instances"], responses=route_responses("processes"))
    def processes(s: GovernanceService = Depends(svc)) -> list[dict[str, Any]]:
        """The processes of the catalog (what POST /api/instances can start)."""
        return s.processes()

    @app.get("/api/processes/{process_id}", tags=["instances"], responses=route_responses("process"))
    def process(process_id: str, s: GovernanceService = Depends(svc)) -> dict[str, Any]:
        """One catalog process and what starting it asks for: ``start_form`` (the form on its none
        start event, which POST /api/instances checks the data against: 400 field by field) or null."""
        return s.process(process_id)

    @app.get("/api/instances", tags=["instances"], response_model=None,
             responses={200: {"model": list[InstanceSummary], "description": "the instances, newest first",
                              "headers": PAGE_HEADERS},
                        **route_responses("list_instances")})
    def list_instances(status: Status | None = Query(default=None, description="only this status"),
                       process_id: str | None = Query(default=None, description="only the instances of this process"),
                       limit: int | None = Query(default=None, ge=1, description="at most this many"),
                       offset: int = Query(default=0, ge=0, description="skip this many of those selected first"),
                       *, request: Request, response: Response, s: GovernanceService = Depends(svc)
                       ) -> list[dict[str, Any]]:
        """Instance summaries, newest first, each naming who holds its lease right now (``held_by``), the
        definition it runs (``definition_version``) and, for one whose delivery a worker dead-lettered, that
        dead letter (``dead_letter``: no worker runs it until it is requeued); ``limit`` and ``offset`` page
        through them: ``X-Total-Count`` says how many the filters select, and ``Link`` (``rel="next"``) where
        the next page starts while there is one (newest first: instances started meanwhile push the older
        ones on by as many)."""
        rows, total = s.instance_page(status, holders=True, process_id=process_id, limit=limit, offset=offset)
        mark_dead_letters(rows, dead_letters() if rows else {})
        response.headers["X-Total-Count"] = str(total)
        if offset + len(rows) < total:
            after = request.url.include_query_params(offset=offset + len(rows))
            response.headers["Link"] = f'<{after.path}?{after.query}>; rel="next"'
        return rows

    @app.post("/api/instances", status_code=201, tags=["instances"], response_model=None,
              responses=document_responses("start", 201))
    def start(body: StartRequest, response: Response, s: GovernanceService = Depends(svc)) -> dict[str, Any]:
        """Start a catalog process by id and run it until it completes, waits or fails; the answer's
        ``Location`` is the new instance's document."""
        doc = s.start(StartArgs.model_validate(_args(body, StartArgs)), actor=body.user or "api", by=body.user)
        response.headers["Location"] = f"/api/instances/{doc['instance_id']}"
        return _etag(response, doc)

    @app.get("/api/instances/{instance_id}", tags=["instances"], response_model=None,
             responses=answer_responses("document", InstanceView, "the instance's document, as it is now"))
    def document(instance_id: PathId, response: Response, s: GovernanceService = Depends(svc)) -> dict[str, Any]:
        """The instance as `layerflow run --json` prints it, plus its version and who holds its
        lease right now (``held_by``); its ``ETag`` is that version, which a change's ``If-Match``
        (or ``expected_version``) asks for."""
        return _etag(response, s.document(instance_id))

    @app.post("/api/instances/{instance_id}/events", tags=["instances"], response_model=None,
              responses=document_responses("send_event"))
    def send_event(instance_id: PathId, body: SendEventRequest, response: Response, if_match: IfMatch = None,
                   s: GovernanceService = Depends(svc)) -> dict[str, Any]:
        """Send a BPMN message (or broadcast a signal) with a payload to what waits for it; the
        instance runs on. Nothing waits for it: 409, naming what the instance waits for."""
        version = _expected(body.expected_version, if_match)
        args = SendEventArgs.model_validate(_args(body, SendEventArgs))
        return _etag(response, s.send_event(instance_id, args, expected_version=version, actor=body.user or "api"))

    @app.post("/api/messages", tags=["instances"], response_model=None,
              responses=document_responses("correlate"))
    def correlate(body: CorrelateRequest, response: Response, s: GovernanceService = Depends(svc)) -> dict[str, Any]:
        """Send a BPMN message to the one waiting instance it is meant for, found by correlation, not by
        id: its catch waits for ``name``, takes the payload's correlation properties, and its context
        holds every ``match`` value; the instance runs on. None does: a catalog process (``process_id``,
        else any) whose message start event is ``name`` is started and gets it (``"started": true``);
        else 404, naming what waits for the message with which values. Several: 409, naming them."""
        args = CorrelateArgs.model_validate(_args(body, CorrelateArgs))
        return _etag(response, s.correlate(args, actor=body.user or "api"))

    @app.post("/api/instances/{instance_id}/user-tasks/{task_id}", tags=["instances"], response_model=None,
              responses=document_responses("complete_user_task"))
    def complete_user_task(instance_id: PathId, task_id: str, body: UserTaskRequest,
                           response: Response, if_match: IfMatch = None,
                           s: GovernanceService = Depends(svc)) -> dict[str, Any]:
        """Complete a user task the instance waits for (``task_id``: the ``id`` of its
        ``waiting_for`` item, or its BPMN id) with the person's ``data``; the instance runs on.
        Several instances of a multi-instance task waiting under the BPMN id: it completes the
        first ``waiting_for`` lists; ``completed_user_task`` names the one completed (``id``,
        ``task_id``, ``instance``, ``input``). A task of the process it does not wait for (yet, or
        any more): 409; an id that is no user task of the instance at all: 404; both name what the
        instance waits for."""
        version = _expected(body.expected_version, if_match)
        args = UserTaskArgs.model_validate(_args(body, UserTaskArgs))
        return _etag(response, s.complete_user_task(instance_id, task_id, args, expected_version=version,
                                                    actor=body.user or "api"))

    @app.post("/api/instances/{instance_id}/resume", tags=["instances"], response_model=None,
              responses=document_responses("resume"))
    def resume(instance_id: PathId, body: ResumeRequest, response: Response, if_match: IfMatch = None,
               s: GovernanceService = Depends(svc)) -> dict[str, Any]:
        """Run an instance on, as `layerflow resume ID`: with ``answers`` (the `--answers` shape)
        for what it waits for, after a timer came due, or to retry the failed activity of an
        instance in ``error`` once its cause is fixed. All or nothing: an answer refused (400,
        403) leaves the instance as it was, with nothing of the other answers applied. A completed
        instance comes back as it is (200), its answers unused, as `layerflow resume` exits 0."""
        version = _expected(body.expected_version, if_match)
        args = ResumeArgs.model_validate(_args(body, ResumeArgs))
        return _etag(response, s.resume(instance_id, args, expected_version=version, by=body.user))

    @app.post("/api/instances/{instance_id}/cancel", tags=["instances"], response_model=None,
              responses=document_responses("cancel"))
    def cancel(instance_id: PathId, body: CancelRequest, response: Response, if_match: IfMatch = None,
               s: GovernanceService = Depends(svc)) -> dict[str, Any]:
        """Stop an unfinished instance for good: its open tasks are cancelled, its pending
        confirmations closed, and nothing of it runs again; who and why are on its tape.
        A completed or cancelled instance: 409."""
        version = _expected(body.expected_version, if_match)
        args = CancelArgs.model_validate(_args(body, CancelArgs))
        return _etag(response, s.cancel(instance_id, args, expected_version=version, actor=body.user or "api"))

    @app.get("/api/instances/{instance_id}/tape", tags=["instances"], response_model=None,
             responses=answer_responses("tape", TapeDocument, "the selected events"))
    def tape(instance_id: PathId, context: str | None = None, kind: str | None = None, activity: str | None = None,
             branch: str | None = None, key: str | None = None, since: int | None = Query(default=None, ge=0),
             limit: int | None = Query(default=None, ge=1),
             offset: int = Query(default=0, ge=0, description=(
                 "skip this many of the selected events: page with `limit` and the answer's `next_offset` (`since` "
                 "counts one context's tape, so it cannot page through several)")),
             s: GovernanceService = Depends(svc)) -> dict[str, Any]:
        """Tape events of every context (or one), by time; filters as `layerflow tape`."""
        return s.tape(instance_id, context=context, kind=kind, activity=activity, branch=branch, key=key,
                      since=since, limit=limit, offset=offset)

    @app.get("/api/confirmations", tags=["confirmations"], responses=route_responses("confirmations"))
    def confirmations(instance_id: QueryId = None, s: GovernanceService = Depends(svc)) -> list[dict[str, Any]]:
        """Open confirmations (people's decisions pending), of every instance or of one."""
        return s.confirmations(instance_id)

    @app.post("/api/confirmations/{confirmation_id:path}", tags=["confirmations"], response_model=None,
              responses=document_responses("answer"))
    def answer(confirmation_id: str, body: AnswerRequest, response: Response, if_match: IfMatch = None,
               s: GovernanceService = Depends(svc)) -> dict[str, Any]:
        """Answer a confirmation with one of its option values; the instance runs on."""
        version = _expected(body.expected_version, if_match)
        return _etag(response, s.answer(confirmation_id, body.model_copy(update={"expected_version": version}),
                                        actor=body.user or "api"))

    # The web console (engine/console.py): its page at / and its documented read endpoints.
    from .console import mount_console

    mount_console(app)
    # added last, so outermost: a body too large is refused before the token or a route reads it
    app.add_middleware(_BodyLimit, limit=limit)
    return app


def _if_match(if_match: Annotated[str | None, Header(description=(
        'the instance\'s version you read, as its `ETag` gave it (`"3"`): a change to a newer one is 412 and changes '
        'nothing; `*`: any version (as `expected_version` in the body, which it must not contradict)'))] = None
               ) -> int | None:
    """The version an ``If-Match`` header asks for (None: absent, or ``*``); malformed: 400 naming the form."""
    if if_match is None or if_match.strip() == "*":
        return None
    found = re.fullmatch(r'\s*"([1-9][0-9]{0,17})"\s*', if_match)
    if found is None:
        raise BadRequest(f"If-Match: {if_match[:100]!r} is not one entity tag of this API: send the instance's "
                         '`ETag` as it came (one quoted version, e.g. "3"; not a weak W/"3", not a list), or `*`')
    return int(found.group(1))


IfMatch = Annotated[int | None, Depends(_if_match)]


def _expected(body_version: int | None, if_match: int | None) -> int | None:
    """The version a change expects: the body's ``expected_version`` or the ``If-Match`` header's, not both
    at odds."""
    if body_version is not None and if_match is not None and body_version != if_match:
        raise BadRequest(f"expected_version {body_version} and If-Match \"{if_match}\" ask for different versions; "
                         "send one of them (or both the same)")
    return body_version if body_version is not None else if_match


def _etag(response: Response, doc: dict[str, Any]) -> dict[str, Any]:
    """``doc`` (an instance's document or a change's answer), its version as the answer's ``ETag``."""
    version = doc.get("version")
    if isinstance(version, int) and not isinstance(version, bool):
        response.headers["ETag"] = f'"{version}"'
    return doc


def _unreadable(cause: BaseException) -> str:
    """What of a body JSON parses that Python cannot hold, and what to send instead."""
    if isinstance(cause, RecursionError):
        found = "its values are nested too deeply"
    elif isinstance(cause, ValueError) and "digits" in str(cause):
        found = f"it holds an integer of too many digits ({cause})"
    else:
        found = f"{type(cause).__name__}: {cause}"
    return f"the body cannot be read: {found}; send one JSON object of plain values"


def _methods_of(app: FastAPI, request: Request) -> str:
    """The methods the routes of ``request``'s path take (for a 405's Allow)."""
    methods: set[str] = set()
    for route in app.router.routes:
        if isinstance(route, APIRoute) and route.matches(request.scope)[0] != Match.NONE:
            methods |= route.methods or set()
    return ", ".join(sorted(methods))


def _documented(request: Request, response: JSONResponse) -> JSONResponse:
    """``response``, an error answer of ``request``'s route; logged when the route's /openapi.json
    entry does not list its code (``ROUTE_ERRORS``): the table and the code have drifted apart."""
    route = request.scope.get("route")
    name = getattr(route, "name", None)
    code = response.status_code
    # a method the route does not take: the path's 405, no operation's (the route matched the path only)
    listed = ROUTE_ERRORS.get(str(name)) if request.method in getattr(route, "methods", ()) else None
    if listed is not None and code not in (401, 500, *map(status_for, listed)):
        kind = _kind_of(response)
        log.warning("%s %s answered %d (%s), which /openapi.json does not list for it: add %r to "
                    "ROUTE_ERRORS[%r] in engine/api.py, or answer a listed kind", request.method,
                    request.url.path, code, kind, kind, name)
    return response


def _query_names(route: APIRoute) -> list[str]:
    """The query parameters ``route`` takes (its own and its dependencies'), by the names a client sends."""
    names, todo = [], [route.dependant]
    while todo:
        dependant = todo.pop()
        names += [p.alias for p in dependant.query_params]
        todo += dependant.dependencies
    return list(dict.fromkeys(names))


def _known_query(request: Request) -> None:
    """Refuse a query parameter the route does not take (``?stauts=waiting``, ``?process=``): dropped,
    it would answer as if no filter were asked for, as a body field the route has no place for is
    refused (``_problem``). So is one given twice with different values (``?status=waiting&status=error``):
    each takes one value, and the last one would be taken without a word."""
    route = request.scope.get("route")
    if not isinstance(route, APIRoute) or not request.url.path.startswith("/api/"):
        return
    taken = _query_names(route)
    names = list(dict.fromkeys(request.query_params))
    problems: list[dict[str, Any]] = [
        {"loc": ("query", name), "type": "extra_forbidden", "input": None, "msg": "Extra inputs are not permitted",
         "ctx": {"taken": taken}} for name in names if name not in taken]
    for name in names:
        values = list(dict.fromkeys(request.query_params.getlist(name)))
        if name in taken and len(values) > 1:
            problems.append({"loc": ("query", name), "type": "value_error", "input": values,
                             "msg": f"given {len(values)} times ({', '.join(map(repr, values))}); it takes one value: "
                                    "send one request per value"})
    if problems:
        raise RequestValidationError(problems)


def _kind_of(response: JSONResponse) -> str:
    return str(json.loads(bytes(response.body))["error"]["kind"])


def _not_in_store(instance_id: str) -> str:
    return f"instance {instance_id!r} is not in this server's store; GET /api/instances lists the instances it holds"


def _problem(error: Any, body_model: Any = None, path_params: Mapping[str, Any] | None = None) -> dict[str, str]:
    """One validation problem: the field it is in, and what is wrong (a field the body has no place
    for: the one meant, when its name is close to one)."""
    loc = tuple(error.get("loc", ()))
    if loc == ("query", "until") and error.get("type") in ("greater_than_equal", "int_parsing"):
        # replay's position on the tape: pydantic's "greater than or equal to 0" says neither what it
        # is nor where to find one (as `layerflow replay --until` says)
        iid = (path_params or {}).get("instance_id") or "ID"
        return {"field": "query.until",
                "message": f"until {error.get('input')!r}: a tape sequence number counts from 1 (0: before the "
                           f"first event); GET /api/instances/{iid}/tape lists them (each event's `seq`)"}
    if error.get("type") == "extra_forbidden" and loc[:1] == ("query",):  # _known_query's
        taken = list((error.get("ctx") or {}).get("taken") or [])
        close = difflib.get_close_matches(str(loc[-1]), taken, n=1, cutoff=0.6)
        meant = f"did you mean {close[0]!r}? " if close else ""
        takes = f"the query parameters it takes: {', '.join(taken)}" if taken else "it takes no query parameters"
        return {"field": f"query.{loc[-1]}", "message": f"no query parameter {loc[-1]!r} here; {meant}{takes}"}
    if error.get("type") == "extra_forbidden" and loc[:1] == ("body",) and len(loc) > 1:
        fields = _fields_at(body_model, loc[1:-1])
        name = str(loc[-1])
        field = ".".join(str(p) for p in loc)
        if fields is not None and _snake(name) in fields and _snake(name) != name:
            return {"field": field, "message": f"{name} names the same field as `{_snake(name)}`, given as "
                                               f"`{_snake(name)}` too; give it once"}
        if fields:
            close = difflib.get_close_matches(name, fields, n=1, cutoff=0.6)
            meant = f"did you mean {close[0]!r}? " if close else ""
            return {"field": field, "message": f"no field {name!r} here; {meant}the fields: {', '.join(fields)}"}
    if error.get("type") == "json_invalid":  # loc: ("body", offset); the parser's finding is in ctx
        found = (error.get("ctx") or {}).get("error") or "it does not parse"
        where = f" at position {loc[1]}" if len(loc) > 1 else ""
        return {"field": "body", "message": f"the body is not valid JSON: {found}{where}; send one JSON object "
                                            "(double-quoted names and strings, no trailing commas)"}
    if error.get("type") == "string_pattern_mismatch" and (error.get("ctx") or {}).get("pattern") == ID_PATTERN:
        # pydantic's "should match pattern" names a regex, not the value or what an id is
        return {"field": ".".join(str(p) for p in loc),
                "message": f"{error.get('input')!r} is no id: an id has letters, digits and _ . : @ - only "
                           "(GET /api/instances lists the instances' ids)"}
    return {"field": ".".join(str(p) for p in loc), "message": error.get("msg", "")}


_NO_OBJECT = {"missing", "model_attributes_type", "dict_type", "model_type"}  # the body as a whole
_JSON_KINDS = ((bool, "JSON true or false"), (list, "a JSON array"), (str, "a JSON string"),
               ((int, float), "a JSON number"), (type(None), "JSON null"))


def _no_object(error: Any, body_model: Any) -> dict[str, str]:
    """The body as a whole is missing or no JSON object: what was sent, and what to send instead
    (pydantic's "should be a valid dictionary or object to extract fields from" says neither)."""
    if error.get("type") == "missing":
        sent = "no body was sent"
    else:
        found = error.get("input")
        sent = "the body is " + next((name for kinds, name in _JSON_KINDS if isinstance(found, kinds)), "no object")
    needed = ["instance_id"] if isinstance(body_model, type) and issubclass(body_model, _Instance) else []
    if isinstance(body_model, type) and issubclass(body_model, BaseModel):
        needed += [name for name, info in body_model.model_fields.items() if info.is_required()]
    with_fields = f" with {', '.join(needed)}" if needed else ""
    return {"field": "body", "message": f"{sent}; send one JSON object{with_fields} and the header "
                                        "`Content-Type: application/json` (every field: /docs)"}


def _fields_at(model: Any, path: tuple[Any, ...]) -> list[str] | None:
    """The field names (and the other names a body takes them by) of the body model at ``path``
    (field names and list indexes); None where the path leaves the models."""
    def unwrap(t: Any) -> Any:  # X | None, list[X] -> X
        while not (isinstance(t, type) and issubclass(t, BaseModel)) and get_args(t):
            t = next((a for a in reversed(get_args(t)) if a is not type(None)), None)
        return t

    for step in path:
        model = unwrap(model)
        if isinstance(step, int):
            continue
        info = model.model_fields.get(step) if isinstance(model, type) and issubclass(model, BaseModel) else None
        if info is None:
            return None
        model = info.annotation
    model = unwrap(model)
    if not (isinstance(model, type) and issubclass(model, BaseModel)):
        return None
    others = [n for names in getattr(model, "other_names", {}).values() for n in names]
    return [*model.model_fields, *others]


def _instance_of(body: _Instance, query: str | None) -> str:
    """The instance a governance request is for: ``instance_id`` of the body, else of the query."""
    if body.instance_id is not None and query is not None and body.instance_id != query:
        raise RequestValidationError([{"loc": ("query", "instance_id"), "type": "value_error",
                                       "msg": f"names {query!r} but the body's instance_id is {body.instance_id!r}; "
                                              "give the instance once"}])
    found = body.instance_id or query
    if found is None:
        raise RequestValidationError([{"loc": ("body", "instance_id"), "type": "missing",
                                       "msg": "Field required: give the instance as instance_id in the body "
                                              "(or ?instance_id= in the query)"}])
    return found


def _args(body: BaseModel, model: type[BaseModel]) -> dict[str, Any]:
    """The fields of ``body`` that ``model`` has (the request minus instance_id / version / user)."""
    return {name: getattr(body, name) for name in model.model_fields if name in body.model_fields_set}
