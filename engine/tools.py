"""The governance operations as model tools (OpenAI function calling).

``context_inspect``, ``context_compress``, ``context_branch`` and ``human_confirm``
(the seed's tools) are JSON schemas generated from the same pydantic models as the
REST API's bodies (``engine.governance``), and ``dispatch_tool`` runs them on the same
``GovernanceService``: a model and a person governing an instance go through the same
checks (layer rules, versions, config validation).

``run_tool_loop`` drives the seed's sequence with a model through litellm: the model
inspects, decides, compresses, evaluates and asks a person (``human_confirm``) when it
needs to; each tool call is answered with its result until the model answers in text,
a person's answer is pending, or ``max_steps`` is reached. The calls are noted on the
instance's tape (``model_tools``).

Inside a process, an LLM activity whose config says ``llm.tools: true`` gets the same
four tools (``engine.llm.run_llm_tool_activity``), dispatched to ``LiveGovernance``:
the same operations on the *running* instance (its activity's context and config by
default), with nothing loaded from or saved to the store in between. A
``human_confirm`` there makes the instance wait with the activity still open; the
person's answer (``--answer model:N=VALUE``, ``POST /api/confirmations/model:N``, an
answers file) is given to the model as that tool call's result and the activity goes
on from where it stopped.

A tool error (a bad argument, a denied write, a stale version) is not raised: it goes
back to the model as ``{"error": {"kind", "message"}}`` so that it can correct itself.
"""

from __future__ import annotations

import copy
import json
import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel, ValidationError

from context_layers.canonical import freeze, json_equal
from context_layers.context import LayeredContext
from context_layers.errors import ContextKeyError, LayerflowError, ModelError
from context_layers.hooks import RedactSetting, redact_for_model

from .governance import (
    BranchArgs,
    BranchEvaluateArgs,
    CompressArgs,
    GovernanceService,
    HumanConfirmArgs,
    InspectArgs,
    InstanceStateError,
    ResolveArgs,
    SnapshotArgs,
)
from .gateway_steps import option_value
from .llm import MAX_TOOL_ARGUMENT_CHARS, kept_call
from .runtime import Engine, Instance

__all__ = ["TOOL_MODELS", "LiveGovernance", "ToolLoopResult", "dispatch_tool", "run_tool_loop", "tool_schemas"]

TOOL_MODELS: dict[str, type[BaseModel]] = {
    "context_inspect": InspectArgs,
    "context_compress": CompressArgs,
    "context_branch": BranchArgs,
    "human_confirm": HumanConfirmArgs,
}

DESCRIPTIONS = {
    "context_inspect": "Inspect the layered context of the current process instance: per layer (L0 SYSTEM .. "
                       "L5 EPHEMERAL) the token count, key count, attention scores (density, redundancy, decay, "
                       "conflict, toolEfficiency; each 0..1), last modified time and the tape seq of that change "
                       "(last_modified_seq), size in bytes and the largest keys; plus which compression triggers would fire.",
    "context_compress": "Compress L3 HISTORY (action=compress: a snapshot is taken first; preserve_keys are never "
                        "dropped or altered), evaluate a compression against the snapshot taken before it "
                        "(action=evaluate: tokens and attention before and right after it, whether preserved keys are intact), "
                        "or undo it (action=decompress).",
    "context_branch": "Branches of a gateway: action=evaluate checks that a branch context holds required_keys; "
                      "action=resolve_conflict settles a pending merge conflict with a resolution value and a "
                      "reason; action=snapshot takes a snapshot of the context.",
    "human_confirm": "Ask a person to choose among options (e.g. to approve a compression that changed a "
                     "preserved key, or to settle a conflict you cannot). The answer may come later.",
}

Ask = Callable[[dict[str, Any]], Any]


def _inline(schema: dict[str, Any]) -> dict[str, Any]:
    """The schema with ``$ref``s to ``$defs`` inlined and titles dropped (what function
    calling APIs take best)."""
    defs = schema.get("$defs", {})

    def walk(node: Any) -> Any:
        if isinstance(node, dict):
            ref = node.get("$ref")
            if isinstance(ref, str) and ref.startswith("#/$defs/"):
                target = copy.deepcopy(defs[ref.split("/")[-1]])
                rest = {k: v for k, v in node.items() if k != "$ref"}
                return walk({**target, **rest})
            return {k: walk(v) for k, v in node.items() if k not in ("$defs", "title")}
        if isinstance(node, list):
            return [walk(v) for v in node]
        return node

    inlined: dict[str, Any] = walk(schema)
    return inlined


def tool_schemas(names: Sequence[str] | None = None) -> list[dict[str, Any]]:
    """The tools as OpenAI ``tools=`` entries."""
    out = []
    for name in names or TOOL_MODELS:
        model = TOOL_MODELS[name]
        out.append({"type": "function", "function": {
            "name": name, "description": DESCRIPTIONS[name], "parameters": _inline(model.model_json_schema())}})
    return out


def _error(kind: str, message: str, **extra: Any) -> dict[str, Any]:
    return {"error": {"kind": kind, "message": message, **extra}}


def dispatch_tool(service: GovernanceService, instance_id: str, name: str, arguments: str | Mapping[str, Any] | None,
                  *, actor: str = "model", ask: Ask | None = None) -> dict[str, Any]:
    """Run one tool call on ``instance_id``; the result, or ``{"error": {...}}``."""
    model = TOOL_MODELS.get(name)
    if model is None:
        return _error("bad_request", f"unknown tool {name!r}; tools: {', '.join(TOOL_MODELS)}")
    size = len(arguments) if isinstance(arguments, str) else None
    if size is not None and size > MAX_TOOL_ARGUMENT_CHARS:
        # refused unread: a runaway model's megabytes reach no parser, record or tape (the note keeps a head)
        return _error("validation_error", f"arguments of {name} are {size} characters, over the {MAX_TOOL_ARGUMENT_CHARS} "
                      "a tool call takes; send the values the tool needs, not whole documents")
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments) if arguments.strip() else {}
        except json.JSONDecodeError as err:
            return _error("validation_error", f"arguments of {name} are not JSON: {err.msg} at {err.pos}")
    if arguments is not None and not isinstance(arguments, Mapping):
        return _error("validation_error", f"arguments of {name} must be a JSON object")
    try:
        # Python's JSON reader takes NaN and Infinity, which no context, tape or record can keep:
        # an option valued NaN failed the instance's save, not the call
        freeze(dict(arguments or {}))
    except (TypeError, ValueError) as err:
        return _error("validation_error", f"arguments of {name} are not plain JSON: {err}; send finite numbers "
                      "and Unicode text only")
    try:
        args = model.model_validate(dict(arguments or {}))
        return _run(service, instance_id, name, args, actor=actor, ask=ask)
    except ValidationError as err:
        problems = [{"field": ".".join(str(p) for p in e["loc"]) or "(arguments)", "message": e["msg"]}
                    for e in err.errors()]
        return _error("validation_error", f"invalid arguments for {name}: "
                      + "; ".join(f"{p['field']}: {p['message']}" for p in problems), problems=problems)
    except LayerflowError as err:
        return {"error": err.to_dict()}


def _run(service: GovernanceService, instance_id: str, name: str, args: Any, *, actor: str,
         ask: Ask | None) -> dict[str, Any]:
    if isinstance(args, InspectArgs):
        return service.inspect(instance_id, args, for_model=True)  # read by a model: the tape seq of changes too
    if isinstance(args, CompressArgs):
        return service.compress(instance_id, args, actor=actor)
    if isinstance(args, BranchArgs):
        if args.action == "evaluate":
            return service.branch_evaluate(instance_id, BranchEvaluateArgs(branch_id=args.branch_id,
                                                                           required_keys=args.required_keys))
        if args.action == "snapshot":
            return service.snapshot(instance_id, SnapshotArgs(label=args.label, layers=args.layers), actor=actor)
        done = service.resolve(instance_id, ResolveArgs(confirmation_id=args.confirmation_id,
                                                        conflict_key=args.conflict_key, resolution=args.resolution,
                                                        reason=args.reason or ""), actor=actor, resolver="model")
        return {k: done[k] for k in ("instance_id", "version", "confirmation_id", "status", "conflicts", "error")}
    assert isinstance(args, HumanConfirmArgs)
    return _human_confirm(service, instance_id, args, actor=actor, ask=ask)


def _human_confirm(service: GovernanceService, instance_id: str, args: HumanConfirmArgs, *, actor: str,
                   ask: Ask | None) -> dict[str, Any]:
    if ask is not None:
        request = {"kind": "confirmation", "instance_id": instance_id, **args.model_dump()}
        answer = ask(request)
        if answer is not None:
            if not any(json_equal(answer, o.value) or answer == o.label for o in args.options):
                offered = ", ".join(json.dumps(o.value, ensure_ascii=False) for o in args.options)
                return _error("invalid_answer", f"the answer {answer!r} is not one of the options: {offered}")
            answer = option_value([o.model_dump() for o in args.options], answer)  # a label: its option's value
            return service.request_confirmation(instance_id, args, actor=actor, answer=answer, answered=True)
    return service.request_confirmation(instance_id, args, actor=actor)


# ----------------------------------------------------------------------------- a running instance

class LiveGovernance(GovernanceService):
    """The governance operations on a running instance, for the tools of one LLM activity.

    The operation bodies are ``GovernanceService``'s (same checks, same tape events); only
    where the instance comes from differs: the live ``Instance`` the engine is running,
    not a copy loaded from the store and saved back (the engine saves the instance after
    the activity, as after any other). Defaults are the activity's: its context (a branch
    context in a parallel branch) and its config (``preserveKeys``, thresholds, rules). A
    ``human_confirm`` becomes a confirmation the engine waits for, bound to the
    activity's task (``task``, ``context``, and a ``deadline`` when a timeout is given).
    ``context_branch`` with ``resolve_conflict`` is refused (the model is told why):
    settling a confirmation runs the process on, which cannot happen from inside one of
    its own running tasks.
    """

    def __init__(self, engine: Engine, instance: Instance, ctx: LayeredContext, *, activity_id: str,
                 task: str | None = None, model: str | None = None, redact: RedactSetting = True) -> None:
        super().__init__(engine)
        self.instance = instance
        self.ctx = ctx
        self.activity_id = activity_id
        self.task = task
        self.model = model
        self.redact = redact

    def load(self, instance_id: str) -> Instance:
        if instance_id != self.instance.id:
            raise ContextKeyError(f"an activity's tools govern its own instance {self.instance.id!r}, "
                                  f"not {instance_id!r}")
        return self.instance

    def _save(self, instance: Instance, *, refusal: bool = False) -> None:
        pass  # the engine saves the running instance after the activity

    @contextmanager
    def _lock(self, instance_id: str) -> Iterator[None]:
        yield  # the instance is the live one: whoever runs it holds its lease already

    def context_of(self, instance: Instance, name: str | None) -> LayeredContext:  # type: ignore[override]
        if name is None:
            return self.ctx
        return GovernanceService.context_of(instance, name)

    def inspect(self, instance_id: str, args: InspectArgs, *, dto: bool = False,
                for_model: bool = False) -> dict[str, Any]:
        return super().inspect(instance_id, _for_activity(args, self.activity_id), dto=dto, for_model=for_model)

    def compress(self, instance_id: str, args: CompressArgs, *, expected_version: int | None = None,
                 actor: str = "operator") -> dict[str, Any]:
        args = _for_activity(args, self.activity_id)
        if self.model is None or args.action != "compress" or self.context_of(self.instance, args.context) is not self.ctx:
            return super().compress(instance_id, args, expected_version=expected_version, actor=actor)
        # the step's model writes the summaries of the compression it asked for, as it does after the step
        from .model_compression import model_summaries

        cfg = self._config_of(self.instance, self.activity_id)
        rules = self.compressor
        self.compressor = model_summaries(self.ctx, task_id=self.activity_id, model=self.model,
                                          llm_config=cfg.llm if cfg is not None else None, redact=self.redact)
        try:
            return super().compress(instance_id, args, expected_version=expected_version, actor=actor)
        finally:
            self.compressor = rules

    def resolve(self, instance_id: str, args: ResolveArgs, *, expected_version: int | None = None,
                actor: str = "operator", resolver: str = "human", by: str | None = None) -> dict[str, Any]:
        # Settling a confirmation runs its join (or resumes its activity) at once: inside a
        # running activity that would run the process from within one of its own tasks.
        raise InstanceStateError(
            f"activity {self.activity_id!r} cannot settle confirmation "
            f"{args.confirmation_id or args.conflict_key!r} while it runs; a person answers it "
            "(GET /api/confirmations, `layerflow resume --answer`), or govern the instance from outside "
            "the process (engine.tools.run_tool_loop)")

    def request_confirmation(self, instance_id: str, args: HumanConfirmArgs, *, actor: str = "model",
                             answer: Any = None, answered: bool = False) -> dict[str, Any]:
        def apply(instance: Instance) -> dict[str, Any]:
            now = instance.clock()
            extra: dict[str, Any] = {"task": self.task, "context": self.ctx.name, "created": now}
            if args.timeout is not None:
                extra["deadline"] = now + args.timeout
            return self._add_confirmation(instance, self.ctx, args, actor=actor, answer=answer, answered=answered,
                                          extra=extra)
        return self._change(instance_id, None, "human_confirm", actor, apply)


def _for_activity(args: Any, activity_id: str) -> Any:
    return args if args.activity_id is not None else args.model_copy(update={"activity_id": activity_id})


# ----------------------------------------------------------------------------- the loop

@dataclass
class ToolLoopResult:
    """``status``: ``done`` (the model answered in text), ``waiting`` (a person's answer is
    pending), ``max_steps``."""

    status: str
    final: str | None
    steps: int
    calls: list[dict[str, Any]] = field(default_factory=list)
    messages: list[dict[str, Any]] = field(default_factory=list)


SYSTEM_PROMPT = (
    "You govern the context of a running business-process instance. Its context has six layers: L0 SYSTEM, "
    "L1 PROCESS, L2 KNOWLEDGE, L3 HISTORY, L4 WORKING, L5 EPHEMERAL. Keep it small enough for the model "
    "without losing what the process depends on. Inspect first (context_inspect); compress L3 HISTORY only "
    "when a measure calls for it (density below its threshold, redundancy above, too many tokens), keeping "
    "the keys the process depends on in preserve_keys; then evaluate the compression; if a preserved key "
    "changed or you are unsure, ask a person with human_confirm (or undo with action=decompress). End with "
    "a one-paragraph summary of what you did and why.")


def _attr(obj: Any, name: str) -> Any:
    return obj.get(name) if isinstance(obj, Mapping) else getattr(obj, name, None)


def run_tool_loop(service: GovernanceService, instance_id: str, model: str, *, task: str | None = None,
                  messages: Sequence[Mapping[str, Any]] | None = None, max_steps: int = 8,
                  api_base: str | None = None, api_key: str | None = None, timeout: float = 30.0,
                  completion: Callable[..., Any] | None = None, ask: Ask | None = None,
                  actor: str = "model", tools: Sequence[str] | None = None,
                  redact: RedactSetting = True) -> ToolLoopResult:
    """Let ``model`` govern ``instance_id`` with the tools (litellm ``completion(tools=...)``).
    The tools' results reach the model through ``redact_for_model(result, redact)`` (an open
    conflict's values, say); ``calls`` keeps them as the tools gave them."""
    from .llm import ENV_API_BASE, ENV_API_KEY, load_litellm, mask_secret

    call = completion or load_litellm().completion
    api_base = api_base or os.environ.get(ENV_API_BASE) or None
    api_key = api_key or os.environ.get(ENV_API_KEY) or None
    schemas = tool_schemas(tools)
    history: list[dict[str, Any]] = [dict(m) for m in messages] if messages else [
        {"role": "system", "content": SYSTEM_PROMPT},
        {"role": "user", "content": task or f"Govern the context of instance {instance_id}."}]
    calls: list[dict[str, Any]] = []
    status, final, steps = "max_steps", None, 0
    for steps in range(1, max_steps + 1):
        try:
            response = call(model=model, messages=history, tools=schemas, tool_choice="auto", api_base=api_base,
                            api_key=api_key, timeout=timeout)
        except Exception as err:  # noqa: BLE001 - litellm raises many types; one error for the caller
            raise ModelError(f"model {model!r} at {api_base or 'the provider default'} failed during the "
                             f"governance tool loop of instance {instance_id}: {type(err).__name__}: "
                             f"{mask_secret(str(err), api_key)}") from err
        message = _attr(_attr(response, "choices")[0], "message")
        tool_calls = list(_attr(message, "tool_calls") or [])
        content = _attr(message, "content")
        if not tool_calls:
            status, final = "done", content
            history.append({"role": "assistant", "content": content})
            break
        history.append({"role": "assistant", "content": content, "tool_calls": [kept_call(
            {"id": _attr(tc, "id"), "type": "function",
             "function": {"name": _attr(_attr(tc, "function"), "name"),
                          "arguments": _attr(_attr(tc, "function"), "arguments") or "{}"}}) for tc in tool_calls]})
        waiting = False
        for tc in tool_calls:
            fn = _attr(tc, "function")
            name, arguments = _attr(fn, "name"), _attr(fn, "arguments") or "{}"
            result = dispatch_tool(service, instance_id, name, arguments, actor=actor, ask=ask)
            calls.append({"id": _attr(tc, "id"), "name": name, "arguments": arguments, "result": result})
            history.append({"role": "tool", "tool_call_id": _attr(tc, "id"),
                            "content": json.dumps(redact_for_model(result, redact), ensure_ascii=False,
                                                  default=str)})
            waiting = waiting or (name == "human_confirm" and result.get("status") == "pending")
        if waiting:
            status = "waiting"
            break
    service.record_note(instance_id, "model_tools", {
        "model": model, "status": status, "steps": steps, "final": (final or "")[:2000],
        "calls": [{"name": c["name"], "arguments": c["arguments"][:2000],
                   "error": (c["result"].get("error") or {}).get("kind")} for c in calls]}, actor=actor)
    return ToolLoopResult(status=status, final=final, steps=steps, calls=calls, messages=history)
