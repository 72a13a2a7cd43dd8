"""The compression decision prompt, the plan the model answers, and its execution.

``build_compression_prompt`` shows the model the layer token and key counts, the
attention scores, the keys it must preserve, the context the current activity
requires, the finished activities and the largest other HISTORY entries, and asks for
a JSON plan::

    {"summarize": [activity ids], "keep_points": [str], "drop": [keys], "max_tokens": int}

``parse_compression_plan`` validates the answer (``CompressionPlan``, pydantic);
``execute_plan`` runs it with the same compressor as the rule-driven path: rules
first, then the named activities fold into the compaction record (their protected
keys stay, verbatim), the keep points open its summary, and ``drop`` keys are removed.
A plan that would drop or summarize a protected key (preserved, or required by the
current activity) is rejected as a whole: ``CompressionPlanRejected`` is raised and a
``compression_plan_rejected`` event is recorded. Activity ids and keys the plan names
but HISTORY does not hold are ignored and reported. Offline (no model) the engine runs
the rule-driven path instead; this module never calls a model.
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Mapping, Sequence
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError
from pydantic.alias_generators import to_camel

from .attention import COMPACTED, AttentionScore, is_activity_record, segment_history
from .canonical import freeze
from .compression import CompressResult, RuleDrivenCompressor, _Directive
from .config import ActivityExtensionConfig, as_config
from .context import LayeredContext
from .errors import ContextWriteDenied, ModelError
from .hooks import RedactSetting, note_redacted, redact_for_model
from .layers import Layer

__all__ = [
    "CompressionPlan",
    "CompressionPlanRejected",
    "build_compression_prompt",
    "check_plan",
    "execute_plan",
    "parse_compression_plan",
]

PROMPT_SYSTEM = (
    "You are the context compression decision engine of a business-process workflow. "
    "The context of the current activity has grown too large or too diluted. Decide which "
    "finished activities can be replaced by a summary, which points that summary must keep, "
    "and which HISTORY keys can be removed entirely. Never name a preserved or required key "
    "in \"summarize\" or \"drop\": a plan that does is rejected. Answer with one JSON object "
    "and nothing else: {\"summarize\": [activity ids], \"keep_points\": [short strings], "
    "\"drop\": [keys], \"max_tokens\": integer (the summary's budget)}."
)


class CompressionPlan(BaseModel):
    """The model's compression plan (camelCase or snake_case fields)."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid", frozen=True)

    summarize: list[str] = Field(default_factory=list)
    keep_points: list[str] = Field(default_factory=list)
    drop: list[str] = Field(default_factory=list)
    max_tokens: int | None = Field(default=None, gt=0)


class CompressionPlanRejected(ContextWriteDenied):
    """A plan named protected keys; ``reasons`` maps each to why it is protected."""

    def __init__(self, reasons: Mapping[str, str]) -> None:
        self.reasons = dict(reasons)
        keys = sorted(self.reasons)
        detail = "; ".join(f"{k!r} is {self.reasons[k]}" for k in keys)
        super().__init__(keys[0], Layer.HISTORY, Layer.HISTORY,
                         f"the compression plan would drop or summarize protected keys ({detail}); "
                         "ask for a plan without them, or compress with the rules (RuleDrivenCompressor)")
        self.keys = keys

    def to_dict(self) -> dict[str, Any]:
        return {**super().to_dict(), "keys": self.keys, "reasons": self.reasons}


_FENCE = re.compile(r"```(?:json)?\s*(.*?)```", re.DOTALL)


def parse_compression_plan(answer: str | Mapping[str, Any]) -> CompressionPlan:
    """A ``CompressionPlan`` from the model's answer (a JSON object, possibly inside a
    code fence or surrounded by prose); ``ModelError`` naming the bad fields otherwise."""
    data: Any = answer
    if isinstance(answer, str):
        text = answer.strip()
        fenced = _FENCE.search(text)
        if fenced:
            text = fenced.group(1).strip()
        start, end = text.find("{"), text.rfind("}")
        if start < 0 or end < start:
            raise ModelError(f"the compression plan is not a JSON object: {answer[:200]!r}")
        try:
            data = json.loads(text[start:end + 1])
        except json.JSONDecodeError as exc:
            raise ModelError(f"the compression plan is not valid JSON ({exc.msg} at {exc.pos}): {answer[:200]!r}") from None
    try:
        freeze(data)  # what the context can hold: no lone surrogates, NaN or Infinity in the points
    except (ValueError, TypeError) as err:
        raise ModelError(f"invalid compression plan: {err}") from None
    try:
        return CompressionPlan.model_validate(data)
    except ValidationError as err:
        problems = "; ".join(f"{'.'.join(str(p) for p in e['loc']) or '(plan)'}: {e['msg']}" for e in err.errors())
        raise ModelError(f"invalid compression plan: {problems}") from None


def _protected(ctx: LayeredContext, config: ActivityExtensionConfig) -> dict[str, str]:
    reasons = {k: "preserved" for k in [*ctx.preserved, *config.effective_preserve_keys]}
    for k in config.context_strategy.required_context:
        reasons.setdefault(k, "required by the current activity")
    for k in ctx.layer(Layer.HISTORY):
        if k.startswith("_"):
            reasons.setdefault(k, "engine bookkeeping")
    return reasons


def build_compression_prompt(ctx: LayeredContext, config: ActivityExtensionConfig | Mapping[str, Any] | None = None, *,
                             attention: AttentionScore | None = None, required_context: Sequence[str] | None = None,
                             max_listed: int = 30, redact: RedactSetting = True) -> list[dict[str, str]]:
    """The messages asking the model for a compression plan (pure: same input, same text).

    Values written by users or models (activity summaries, keys) appear only inside
    JSON strings, so none can pose as part of the prompt's structure. The activity
    summaries are the only values it shows: they pass ``redact_for_model(redact)`` (the
    activity's ``redact`` config), as the activity's own request shows them.
    """
    config = as_config(config)
    score = attention or AttentionScore.compute(ctx, config)
    required = list(required_context if required_context is not None else config.context_strategy.required_context)
    protected = _protected(ctx, config)
    history = ctx.layer(Layer.HISTORY)
    items = [(k, history[k]) for k in history]
    seg = segment_history(items)
    owned: dict[str, int] = {}
    for k, _ in items:
        owner = seg.owner[k]
        if owner is not None and owner != COMPACTED:
            owned[owner] = owned.get(owner, 0) + ctx.key_tokens(Layer.HISTORY, k)
    activities = []
    for rec in seg.records[-max_listed:]:
        v = history[rec]
        activities.append({"id": v.get("activity", rec), "status": v.get("status"),
                           "tokens": owned.get(rec, 0), "summary": v.get("summary")})
    others = sorted(((k, ctx.key_tokens(Layer.HISTORY, k)) for k, v in items
                     if not is_activity_record(k, v) and k not in protected), key=lambda kv: (-kv[1], kv[0]))
    largest = [{"key": k, "kind": _kind(history[k]), "tokens": n} for k, n in others[:max_listed]]
    threshold = config.effective_token_threshold
    ratio = config.context_strategy.compress_target_ratio
    lines = [
        "Current context state:",
        f"- HISTORY (L3): {ctx.tokens(Layer.HISTORY)} tokens, {len(history)} keys",
        f"- WORKING (L4): {ctx.tokens(Layer.WORKING)} tokens, {len(ctx.layer(Layer.WORKING))} keys",
        f"- token threshold: {threshold if threshold else 'none'}; "
        f"target after compression: {int(ratio * threshold) if threshold else 'as small as the plan allows'}",
        "- attention scores: " + ", ".join(f"{k}={v:.2f}" for k, v in score.to_dict().items()),
        "",
        f"Keys that must be preserved: {dumps(sorted(k for k, r in protected.items() if r == 'preserved'))}",
        f"Context the current activity requires: {dumps(required)}",
        f"Finished activities, oldest first: {dumps(redact_for_model(activities, redact))}",
        f"Largest other HISTORY entries: {dumps(largest)}",
        "",
        "Decide:",
        "1. Which finished activities can be compressed into a summary? (\"summarize\": their ids)",
        "2. Which key points must that summary keep? (\"keep_points\")",
        "3. Which keys can be removed entirely? (\"drop\")",
        "Answer with the JSON compression plan only.",
    ]
    text = "\n".join(lines)
    return [{"role": "system", "content": note_redacted(PROMPT_SYSTEM, text)}, {"role": "user", "content": text}]


def dumps(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False)


def _kind(value: Any) -> str:
    return value["kind"] if isinstance(value, dict) and isinstance(value.get("kind"), str) else "data"


def check_plan(ctx: LayeredContext, plan: CompressionPlan | Mapping[str, Any] | str,
               config: ActivityExtensionConfig | Mapping[str, Any] | None = None, *,
               actor: str = "compressor") -> tuple[_Directive, list[str]]:
    """The plan as the compressor's directive, and what it named that HISTORY lacks.

    Raises ``CompressionPlanRejected`` (after recording ``compression_plan_rejected``)
    when it names a protected key.
    """
    config = as_config(config)
    if not isinstance(plan, CompressionPlan):  # its JSON, or the model's answer as text
        plan = parse_compression_plan(plan)
    protected = _protected(ctx, config)
    bad = {k: protected[k] for k in [*plan.drop, *plan.summarize] if k in protected}
    if bad:
        ctx.record("compression_plan_rejected", actor=actor,
                   data={"plan": plan.model_dump(), "keys": sorted(bad), "reasons": bad})
        raise CompressionPlanRejected(bad)
    history = ctx.layer(Layer.HISTORY)
    records: dict[str, list[str]] = {}
    for k in history:
        v = history[k]
        if is_activity_record(k, v):
            for name in (k, k.split(":", 1)[1], v.get("activity")):
                if isinstance(name, str):
                    records.setdefault(name, []).append(k)
    chosen: list[str] = []
    ignored: list[str] = []
    for name in plan.summarize:
        if name in records:
            chosen.extend(r for r in records[name] if r not in chosen)
        else:
            ignored.append(f"summarize {name!r}: no finished activity of that id in HISTORY")
    drop = [k for k in plan.drop if k in history]
    ignored += [f"drop {k!r}: not in HISTORY" for k in plan.drop if k not in history]
    directive = _Directive(records=tuple(chosen), drop=tuple(drop), keep_points=tuple(plan.keep_points),
                           max_tokens=plan.max_tokens)
    return directive, ignored


def execute_plan(ctx: LayeredContext, plan: CompressionPlan | Mapping[str, Any] | str,
                 config: ActivityExtensionConfig | Mapping[str, Any] | None = None, *,
                 compressor: RuleDrivenCompressor | None = None, actor: str = "compressor",
                 triggers: Sequence[str] | None = None) -> CompressResult:
    """Run a checked plan with ``compressor`` (a ``RuleDrivenCompressor()`` by default)."""
    config = as_config(config)
    directive, ignored = check_plan(ctx, plan, config, actor=actor)
    compressor = compressor or RuleDrivenCompressor()
    result = compressor._run(ctx, config, actor=actor, triggers=list(triggers) if triggers is not None else ["plan"],
                             target_tokens=None, directive=directive, source="plan")
    if ignored:
        ctx.record("compression_plan_ignored", actor=actor, data={"ignored": ignored})
        result = dataclasses.replace(result, notes=[*result.notes, *ignored])
    return result
