"""Compression after an activity when a model is configured (DESIGN.md "Compression").

``compress_after_activity`` is the engine's hook for a run with a model (``--model``
or the activity's ``llm.model``); without one the engine calls
``context_layers.compression.after_activity`` and nothing here (nor litellm) is
imported. Detection, targets and the cliff are the rule-driven compressor's; the
model does two things:

* **summaries** (``summarize`` rules, compaction summaries) come from
  ``LiteLLMSummarizer``. The request is the activity's normal request
  (``engine.llm.activity_request``: the same bytes an LLM activity of this task would
  send now) with the summary instruction appended at the end, so a provider's prompt
  cache serves the shared prefix. The answer is asked for in ``maxTokens`` (in the
  instruction and as the API's ``max_tokens``) and cut at a token boundary to fit
  (tiktoken) when the model overshoots: the budget is a hard limit, not a wish.
* **the plan**, when the activity's config says ``compressionPlanner: model``: the
  model is shown the compression decision prompt and answers a JSON plan, validated
  and run by the same compressor (``compression_plan.execute_plan``). A plan that names
  a protected key is rejected (``compression_plan_rejected`` on the tape).

Any failure falls back to the rules, and says so on the tape: a rejected plan or a
failed model call (``compression_fallback``), a summary the model could not give
(``compression_model_failed``; that summary and the rest of this compression are
extractive). After one failed call the model is not asked again within the same
compression: a server that is down would otherwise cost every summary its retries.
Every model call is an ``llm_call`` note (request, response, usage), like an LLM
activity's: summaries as the activity's model agent (they share its prefix), plans
as ``<model>#compression_plan`` (their prompt is their own).

The activity's ``redact`` config holds here too: the prefix is the activity's redacted request
and the text to summarize has its secrets hidden (``redact_lines``: the values of secret-named
keys and fields, the secrets written inside any text), so a
model's summary never holds a secret the model was not shown. A ``summarize`` rule's entry under a
key named like a secret is summarized offline: its text is the value alone, no name to hide it by.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from context_layers.attention import AttentionScore, Scope
from context_layers.compression import HOOK_KEEP_RECENT, CompressResult, RuleDrivenCompressor, after_activity
from context_layers.compression_plan import CompressionPlanRejected, execute_plan
from context_layers.config import ActivityExtensionConfig, LLMConfig
from context_layers.context import LayeredContext
from context_layers.errors import ModelError
from context_layers.hooks import RedactSetting, redact_for_model, redact_lines, secret_key
from context_layers.summarize import ExtractiveSummarizer

from .llm import Completion, LiteLLMPlanner, LiteLLMSummarizer, RetryPolicy, activity_request, call_recorder
from .model_limits import ModelLimits, ModelLimitsError

__all__ = ["ModelCompressor", "compress_after_activity", "model_summaries"]

PLAN_AGENT_SUFFIX = "#compression_plan"


def _limits(ctx: LayeredContext) -> ModelLimits:
    """SYSTEM's ``model_limits`` bound the summary and plan requests as they bound the activity's;
    unusable ones are the activity's call to name (it fails on them), not the compression's."""
    try:
        return ModelLimits.of(ctx)
    except ModelLimitsError:
        return ModelLimits()


def _preserved_facts(ctx: LayeredContext, redact: RedactSetting) -> dict[str, Any]:
    """The preserved keys the context holds, with their values, that a model summary is checked against
    (``misstated_keys``): those a model may be shown (no secret: its correction would tell the value)."""
    facts: dict[str, Any] = {}
    for key in sorted(ctx.preserved):
        value = ctx.get(key, _ABSENT)
        if value is not _ABSENT and not secret_key(key, redact) and redact_for_model(value, redact) == value:
            facts[key] = value
    return facts


_ABSENT = object()


class ModelCompressor(RuleDrivenCompressor):
    """A ``RuleDrivenCompressor`` whose summaries and (optionally) plan come from a model.

    Built per compression of one context (it caches that context's request prefix and
    remembers a failed model for the rest of the compression).
    """

    def __init__(self, ctx: LayeredContext, *, task_id: str, model: str, llm_config: LLMConfig | None = None,
                 redact: RedactSetting = True, completion: Completion | None = None, retry: RetryPolicy | None = None,
                 sleep: Callable[[float], None] | None = None, **kwargs: Any) -> None:
        self.task_id = task_id
        self.llm_config = llm_config or LLMConfig()
        self.redact = redact
        self.failure: ModelError | None = None
        self._ctx = ctx
        self._prefix: list[dict[str, Any]] | None = None
        cfg = self.llm_config
        client: dict[str, Any] = {"api_base": cfg.api_base, "timeout": cfg.timeout, "max_retries": cfg.max_retries,
                                  "retry": retry, "completion": completion, "limits": _limits(ctx)}
        if sleep is not None:
            client["sleep"] = sleep
        self.model_summarizer = LiteLLMSummarizer(model, **client)
        self.model_summarizer.facts = _preserved_facts(ctx, redact)
        self.model_summarizer.on_attempt = call_recorder(
            ctx, task_id=task_id, endpoint=self.model_summarizer.endpoint, attempts=self.model_summarizer.attempts,
            actor=task_id, purpose="summary")
        self.planner = LiteLLMPlanner(model, **client)
        self.planner.on_attempt = call_recorder(
            ctx, task_id=task_id, endpoint=self.planner.endpoint, attempts=self.planner.attempts, actor=task_id,
            agent=self.planner.endpoint.model + PLAN_AGENT_SUFFIX, purpose="compression_plan")
        # a summarize rule sends an entry's value alone, under no name: a secret key's value would go
        # to the model as plain text (the rendered request hides it whole, by its key)
        kwargs.setdefault("offline_keys", lambda key: secret_key(key, redact))
        super().__init__(_FallbackSummarizer(self, ctx.encoding), prefix=self.request_prefix, **kwargs)

    def request_prefix(self, ctx: LayeredContext) -> Sequence[Mapping[str, str]]:
        """The activity's normal request on ``ctx`` as it is now. Compression changes HISTORY
        in one event after every summary is made, so one render serves them all."""
        if ctx is not self._ctx:
            return activity_request(ctx, self.task_id, self.llm_config, redact=self.redact)
        if self._prefix is None:
            self._prefix = activity_request(ctx, self.task_id, self.llm_config, redact=self.redact)
        return self._prefix

    def model_failed(self, err: ModelError, *, purpose: str, actor: str) -> None:
        self.failure = err
        self._ctx.record("compression_model_failed", actor=actor, data={
            "task_id": self.task_id, "purpose": purpose, "model": self.model_summarizer.endpoint.model,
            "error": f"{type(err).__name__}: {err}"[:2000], "fallback": "extractive" if purpose == "summary" else "rules"})

    def _run(self, ctx: LayeredContext, config: ActivityExtensionConfig, *, actor: str,
             triggers: Sequence[str] | None, target_tokens: int | None, directive: Any,
             source: str = "rules", attention: AttentionScore | None = None,
             scope: Scope | None = None) -> CompressResult:
        # after_activity detects and calls _run; execute_plan calls it back with the plan's
        # directive. Only an undirected run is the planner's to decide.
        if directive is None and config.context_strategy.compression_planner == "model":
            planned, why = self._planned(ctx, config, actor=actor, triggers=triggers, attention=attention)
            if planned is not None:
                return planned
            result = super()._run(ctx, config, actor=actor, triggers=triggers, target_tokens=target_tokens,
                                  directive=None, source=source, attention=attention, scope=scope)
            return dataclasses.replace(result, notes=[*result.notes, f"planner: {why}; the rules ran instead"])
        return super()._run(ctx, config, actor=actor, triggers=triggers, target_tokens=target_tokens,
                            directive=directive, source=source, attention=attention, scope=scope)

    def _planned(self, ctx: LayeredContext, config: ActivityExtensionConfig, *, actor: str,
                 triggers: Sequence[str] | None, attention: AttentionScore | None) -> tuple[CompressResult | None, str]:
        try:
            plan = self.planner.plan(ctx, config, attention=attention, redact=self.redact)
        except ModelError as err:
            self.failure = err
            why = f"the model gave no plan ({type(err).__name__}: {str(err)[:300]})"
            ctx.record("compression_fallback", actor=actor, data={
                "task_id": self.task_id, "reason": "model_failed", "error": f"{type(err).__name__}: {err}"[:2000],
                "fallback": "rules"})
            return None, why
        try:
            return execute_plan(ctx, plan, config, compressor=self, actor=actor, triggers=triggers), "plan"
        except CompressionPlanRejected as err:  # check_plan recorded compression_plan_rejected
            ctx.record("compression_fallback", actor=actor, data={
                "task_id": self.task_id, "reason": "plan_rejected", "keys": err.keys, "fallback": "rules"})
            return None, f"the plan was rejected ({str(err)[:300]})"


class _FallbackSummarizer:
    """The model's summary until the model fails once; extractive from then on."""

    def __init__(self, owner: ModelCompressor, encoding: str) -> None:
        self.owner = owner
        self.offline = ExtractiveSummarizer(encoding=encoding)

    def summarize(self, text: str, max_tokens: int, *,
                  prefix_messages: Sequence[Mapping[str, str]] | None = None) -> str:
        if self.owner.failure is None:
            try:
                return self.owner.model_summarizer.summarize(redact_lines(text, self.owner.redact), max_tokens,
                                                             prefix_messages=prefix_messages)
            except ModelError as err:
                self.owner.model_failed(err, purpose="summary", actor=self.owner.task_id)
        return self.offline.summarize(text, max_tokens)


def compress_after_activity(ctx: LayeredContext, config: ActivityExtensionConfig | None, *, task_id: str, model: str,
                            redact: RedactSetting | None = None, completion: Completion | None = None, retry: RetryPolicy | None = None,
                            sleep: Callable[[float], None] | None = None) -> CompressResult | None:
    """``after_activity`` with the model's summaries (and plan): see the module doc.
    ``None`` when nothing fired or the compression changed nothing; nothing is built
    (let alone imported) when the activity asks for no compression."""
    if config is None or not config.compression_configured:
        return None
    compressor = ModelCompressor(ctx, task_id=task_id, model=model, llm_config=config.llm,
                                 redact=config.redact if redact is None else redact,
                                 completion=completion, retry=retry, sleep=sleep, keep_recent=HOOK_KEEP_RECENT)
    return after_activity(ctx, config, actor=task_id, compressor=compressor)


def model_summaries(ctx: LayeredContext, *, task_id: str, model: str, llm_config: LLMConfig | None = None,
                    redact: RedactSetting = True) -> RuleDrivenCompressor:
    """The compressor of a ``context_compress`` that a model step calls with its tools: the rules it
    names run as they are (no plan is asked for: the step's model chose them), their summaries are the
    model's, on the step's own request (the prefix its next turn shares), extractive only when the
    model fails (``compression_model_failed``), as after the activity."""
    owner = ModelCompressor(ctx, task_id=task_id, model=model, llm_config=llm_config, redact=redact)
    return RuleDrivenCompressor(owner.summarizer, prefix=owner.request_prefix, keep_recent=HOOK_KEEP_RECENT,
                                offline_keys=owner.offline_keys)
