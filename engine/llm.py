"""Model calls through litellm: LLM activities, the summarizer and the conflict arbiter.

This is the only module that imports litellm, and only inside the functions that call
a model (the import takes seconds and 200 MB). ``LITELLM_LOCAL_MODEL_COST_MAP`` is set
first, unless the user set it, so litellm uses the cost map in its wheel instead of
downloading one.

An LLM activity (``run_llm_activity``):

1. renders the activity's view (``context_layers.render``: stable head, late-bound
   task) and sends it to ``litellm.completion``;
2. retries transient failures (timeouts, connection errors, HTTP 408/409/429/5xx)
   with capped exponential backoff, or after the server's ``Retry-After`` when that is
   longer (one over ``MAX_RETRY_AFTER`` fails the call at once: resume later), and a reply
   that is not the required JSON with a corrective message appended at the end (so the
   cached prefix still holds; a reply cut at ``max_tokens`` is asked for shorter, and its
   failure says to raise ``llm.maxTokens``); a model given no API key is not retried;
3. checks the permission of every key of the answer before writing any, so a denied
   key (a model trying to write SYSTEM, or the engine's own ``_mergedConflicts`` or records)
   fails the activity with ``ContextWriteDenied`` (recorded on the tape) and nothing of the
   answer is written;
4. records every attempt on the tape as an ``llm_call`` note: the request (hash,
   tokens, tokens shared with the previous request of the same agent, and the text as
   a delta against that request, so a run's requests can be rebuilt from the tape
   without storing each one whole), the response, token usage and cost (``None`` when the provider
   reported no usage), and the error (with the ``Retry-After`` the server asked for; an API key it
   quoted masked).

What a model is sent is redacted (the element's ``redact`` config, default on:
``context_layers.hooks.model_hooks``): the activity's request is rendered through the
redaction hooks and its tools' results pass ``redact_for_model``, so passwords, API keys
and tokens in the context stay out of the request while the context and the tape keep
them (the ``llm_call`` notes hold what was sent, redacted).

Persistent failure raises ``ModelCallFailed`` (a ``ModelError``) naming the model, the
API base, the attempts and the last error; the context is left as it was (the engine
also aborts the activity).

An LLM activity with ``llm.tools: true`` (``run_llm_tool_activity``) sends the same
first request with the governance tools offered, runs the model's tool calls through
the engine's ``dispatch`` until the model gives its answer (checked and written as
above), and can stop to wait for a person's ``human_confirm`` answer, to be resumed
from the returned state. ``activity_request`` is the one place that builds an
activity's request: the model-driven compressor (``engine.model_compression``) sends
it as the prefix of its summary requests. ``LiteLLMSummarizer``, ``LiteLLMPlanner``
(compression plans) and ``LiteLLMArbiter`` note their calls when given an
``on_attempt`` recorder (``call_recorder``).
"""

from __future__ import annotations

import hashlib
import heapq
import itertools
import json
import os
import re
import sys
import copy
import time
from collections import OrderedDict
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, TypeVar

from context_layers.canonical import canonical_json, text_problem
from context_layers.config import ActivityExtensionConfig, LLMConfig
from context_layers.context import LayeredContext, View
from context_layers.errors import ContextWriteDenied, LayerflowError, ModelError
from context_layers.hooks import RedactSetting, model_hooks, redact_for_model
from context_layers.layers import Layer
from context_layers.prefix import common_prefix_tokens, request_text
from context_layers.render import RenderOptions, render
from context_layers.tokens import DEFAULT_ENCODING, count_text

from .answer import AnswerError, answer_contract, parse_answer, validate_schema
from .gateway_steps import ENGINE_KEY_RULE, is_engine_key
from .model_limits import MODEL_LIMITS_KEY, ModelLimits, ModelLimitsError

if TYPE_CHECKING:
    from gateways.arbiter import ArbiterAnswerError, ArbitrationAnswer, ArbitrationRequest
    from gateways.conditions import BranchAnswerError

__all__ = [
    "ENV_API_BASE",
    "ENV_API_KEY",
    "ENV_RETRY_BASE",
    "LiteLLMArbiter",
    "LiteLLMPlanner",
    "LiteLLMSummarizer",
    "MAX_TOOL_ARGUMENT_CHARS",
    "MAX_TOOL_TURNS",
    "MODEL_LIMITS_KEY",
    "ModelCallFailed",
    "ModelLimits",
    "RetryPolicy",
    "ToolOutcome",
    "activity_request",
    "call_recorder",
    "declared_values",
    "load_litellm",
    "model_configured",
    "prompt_report",
    "prompt_stability",
    "request_messages",
    "run_llm_activity",
    "run_llm_tool_activity",
]

ENV_API_BASE = "LAYERFLOW_MODEL_API_BASE"
ENV_API_KEY = "LAYERFLOW_MODEL_API_KEY"
ENV_RETRY_BASE = "LAYERFLOW_RETRY_BASE_DELAY"
LLM_CALL = "llm_call"
TRANSIENT_STATUS = frozenset({408, 409, 425, 429, 500, 502, 503, 504, 529})
# the longest ``Retry-After`` a step waits out (one lease ttl: the heartbeat keeps the instance held);
# a server asking for longer fails the step at once, to be resumed once it takes requests again
MAX_RETRY_AFTER = 60.0

Messages = list[dict[str, Any]]
Completion = Callable[..., Any]
OnAttempt = Callable[[int, Messages, "Reply | None", "BaseException | None"], None]


def load_litellm() -> Any:
    """Import litellm offline-safe and quiet; an ImportError names the package to install."""
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    try:
        import litellm
    except ImportError as err:
        raise ModelError("model calls need litellm, which is not installed; run `pip install litellm==1.110.2` "
                         "(a layerflow dependency) or run without a model to use the offline handlers") from err
    litellm.suppress_debug_info = True
    return litellm


# ----- configuration ---------------------------------------------------------------------

def model_configured(llm_config: LLMConfig | ActivityExtensionConfig | None, model_override: str | None = None) -> bool:
    """Whether an activity with this config calls a model (else its offline handler runs)."""
    if isinstance(llm_config, ActivityExtensionConfig):
        llm_config = llm_config.llm
    if llm_config is None:
        return False
    return bool(model_override or llm_config.model)


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """Capped exponential backoff: ``min(cap, base * factor ** (n - 1))`` after the n-th failure.

    No jitter: runs are reproducible. ``LAYERFLOW_RETRY_BASE_DELAY`` overrides ``base``
    (tests set it small).
    """

    base: float = 0.5
    factor: float = 2.0
    cap: float = 8.0

    def delay(self, failures: int) -> float:
        return min(self.cap, self.base * self.factor ** max(0, failures - 1))

    @classmethod
    def from_env(cls) -> "RetryPolicy":
        raw = os.environ.get(ENV_RETRY_BASE)
        if not raw:
            return cls()
        try:
            base = float(raw)
        except ValueError:
            raise LayerflowError(f"{ENV_RETRY_BASE}={raw!r} is not a number of seconds") from None
        return cls(base=base, cap=max(base, min(8.0, base * 16)))


@dataclass(frozen=True, slots=True)
class Endpoint:
    model: str
    api_base: str | None
    api_key: str | None
    timeout: float
    temperature: float | None = None
    max_tokens: int | None = None
    limits: ModelLimits = ModelLimits()

    @classmethod
    def of(cls, model: str, llm_config: LLMConfig | None = None, *, api_base: str | None = None,
           api_key: str | None = None, timeout: float | None = None,
           limits: ModelLimits | None = None) -> "Endpoint":
        cfg = llm_config or LLMConfig()
        return cls(model=model,
                   api_base=api_base or cfg.api_base or os.environ.get(ENV_API_BASE) or None,
                   api_key=api_key or os.environ.get(ENV_API_KEY) or None,
                   timeout=timeout if timeout is not None else cfg.timeout,
                   temperature=cfg.temperature, max_tokens=cfg.max_tokens, limits=limits or ModelLimits())

    @property
    def where(self) -> str:
        return self.api_base or "the provider's default endpoint"

    def masked(self, text: str) -> str:
        """``text`` without the API key: a provider or proxy may quote the key it refused in its error,
        which would reach the instance's error, the tape and the logs."""
        return mask_secret(text, self.api_key)


def mask_secret(text: str, secret: str | None) -> str:
    """``text`` with ``secret`` (an API key) replaced by ``***``."""
    return text.replace(secret, "***") if secret and len(secret) >= 8 else text


class CutOffAnswer(AnswerError):
    """A reply the provider cut at the answer's token limit (``finish_reason: "length"``) that is not
    an acceptable answer: the corrective turn asks for a shorter one, the failure for a higher limit."""

    def __init__(self, err: AnswerError, limit: int | None) -> None:
        self.limit = limit
        super().__init__([_cut_off(limit, "; ".join(err.problems))], text=err.text)


class FilteredAnswer(AnswerError):
    """A reply the provider's content filter withheld (``finish_reason: "content_filter"``): no stronger
    model or tighter schema helps; what the step sends is what the provider refused."""

    def __init__(self, err: AnswerError) -> None:
        super().__init__([f'the provider\'s content filter withheld the reply (finish_reason "content_filter"; '
                          f'{"; ".join(err.problems)})'], text=err.text)


def _cut_off(limit: int | None, problem: str) -> str:
    """What a reply cut at the answer's token limit is told as: where it was cut, and what was wrong."""
    where = f"at max_tokens ({limit} tokens)" if limit else "at the model's answer token limit"
    return f"the reply was cut off {where} before it was complete ({problem})"


class ModelCallFailed(ModelError):
    """A model call failed for good: every attempt failed, or the failure was not transient."""

    def __init__(self, message: str, *, task_id: str | None, model: str, api_base: str | None, attempts: int,
                 cause: BaseException | None) -> None:
        self.task_id = task_id
        self.model = model
        self.api_base = api_base
        self.attempts = attempts
        self.cause = cause
        # the model could not be reached (a transport failure, ``is_transient``, once the retries are
        # spent): a join then asks it no more for its other conflicts (``gateways.policy``)
        self.unreachable = cause is not None and is_transient(cause)
        super().__init__(message)

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "message": str(self), "task_id": self.task_id, "model": self.model,
                "api_base": self.api_base, "attempts": self.attempts}


# ----- one call ----------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class Reply:
    content: str | None
    finish_reason: str | None
    response_id: str | None
    usage: dict[str, Any] | None
    cost: float | None
    latency_ms: int
    tool_calls: tuple[dict[str, Any], ...] = ()
    # why ``content`` as received could not be text (a lone surrogate, sent as a JSON
    # escape); ``content`` then has U+FFFD in its place, so the tape can keep the reply
    problem: str | None = None

    def response_record(self) -> dict[str, Any]:
        """The reply as an ``llm_call`` note keeps it."""
        out: dict[str, Any] = {"content": self.content, "finish_reason": self.finish_reason, "id": self.response_id}
        if self.tool_calls:
            out["tool_calls"] = [kept_call(c) for c in self.tool_calls]
        return out


# the longest arguments text a tool call may send; a longer one is refused unread (``engine.tools``)
MAX_TOOL_ARGUMENT_CHARS = 64_000


def kept_call(call: Mapping[str, Any]) -> dict[str, Any]:
    """A tool call as the conversation sent back and the tape keep it: arguments over
    ``MAX_TOOL_ARGUMENT_CHARS`` (refused unread) are replaced by a JSON note of their size, so a
    runaway call's megabytes are neither sent again with every later turn nor kept twice on the tape
    (its ``tool_call`` note keeps their head)."""
    arguments = call["function"]["arguments"]
    if len(arguments) <= MAX_TOOL_ARGUMENT_CHARS:
        return dict(call)
    note = json.dumps({"refused": f"{len(arguments)} characters of arguments, over the {MAX_TOOL_ARGUMENT_CHARS} "
                                  "a tool call takes"})
    return {**call, "function": {**call["function"], "arguments": note}}


def _field(obj: Any, name: str) -> Any:
    return obj.get(name) if isinstance(obj, Mapping) else getattr(obj, name, None)


def _plain(obj: Any) -> Any:
    if obj is None or isinstance(obj, (str, int, float, bool)):
        return obj
    if isinstance(obj, Mapping):
        return {str(k): _plain(v) for k, v in obj.items() if v is not None}
    if isinstance(obj, (list, tuple)):
        return [_plain(v) for v in obj]
    for dump in ("model_dump", "dict"):
        if callable(getattr(obj, dump, None)):
            try:
                return _plain(getattr(obj, dump)())
            except Exception:  # noqa: BLE001 - fall through to str
                break
    return str(obj)


def _cost(response: Any) -> float | None:
    # Only when litellm is loaded anyway (a fake completion must not pull it in), and only
    # offline: the cost map is the one in the wheel; unknown models have no price.
    litellm = sys.modules.get("litellm")
    if litellm is None:
        return None
    try:
        cost = litellm.completion_cost(completion_response=response)
    except Exception:  # noqa: BLE001 - unmapped models, fakes: no cost, never a failure
        return None
    return float(cost) if isinstance(cost, (int, float)) and cost == cost else None


def _tool_calls(message: Any) -> tuple[dict[str, Any], ...]:
    """The reply's tool calls as plain OpenAI dicts (litellm gives objects)."""
    out: list[dict[str, Any]] = []
    seen: set[str] = set()
    for call in _field(message, "tool_calls") or ():
        fn = _field(call, "function")
        arguments = _field(fn, "arguments")
        cid = str(_field(call, "id") or f"call_{len(out)}")
        if cid in seen:
            # a provider that gives two calls of one reply the same id: each result must go back to its
            # own call (two questions to a person would each get the other's answer)
            cid = next(f"{cid}_{n}" for n in range(2, len(out) + 3) if f"{cid}_{n}" not in seen)
        seen.add(cid)
        out.append({"id": cid, "type": "function",
                    "function": {"name": str(_field(fn, "name") or ""),
                                 "arguments": arguments if isinstance(arguments, str) else json.dumps(arguments or {})}})
    return tuple(out)


def _reported_usage(usage: Any) -> dict[str, Any] | None:
    """The token usage the provider reported; None when it reported none. litellm fills a reply
    without ``usage`` with zeros (and prices it at 0.0), but no request is billed 0 prompt tokens:
    the tape says "not reported" rather than a usage and a cost that never were."""
    if not isinstance(usage, dict):
        return None
    counts = [usage.get(k) for k in ("prompt_tokens", "completion_tokens", "total_tokens")]
    return None if not any(isinstance(c, (int, float)) and c > 0 for c in counts) else usage


_SURROGATES = re.compile("[\ud800-\udfff]")


def _complete(completion: Completion, endpoint: Endpoint, messages: Sequence[Mapping[str, Any]],
              max_tokens: int | None = None, tools: Sequence[Mapping[str, Any]] | None = None) -> Reply:
    kwargs: dict[str, Any] = {"model": endpoint.model, "messages": [dict(m) for m in messages],
                              "timeout": endpoint.timeout, "num_retries": 0, "max_retries": 0}
    if tools:
        kwargs["tools"] = [dict(t) for t in tools]
        kwargs["tool_choice"] = "auto"
    if endpoint.api_base:
        kwargs["api_base"] = endpoint.api_base
    if endpoint.api_key:
        kwargs["api_key"] = endpoint.api_key
    if endpoint.temperature is not None:
        kwargs["temperature"] = endpoint.temperature
    answer_tokens = endpoint.limits.answer_tokens(max_tokens or endpoint.max_tokens)
    if answer_tokens:
        kwargs["max_tokens"] = answer_tokens
    start = time.perf_counter()
    response = completion(**kwargs)
    latency = int((time.perf_counter() - start) * 1000)
    choices = _field(response, "choices") or []
    message = _field(choices[0], "message") if choices else None
    content = _field(message, "content") if message is not None else None
    usage = _reported_usage(_plain(_field(response, "usage")))
    text = content if isinstance(content, str) else None
    problem = text_problem(text) if text is not None else None
    if text is not None and problem is not None:
        text = _SURROGATES.sub("\ufffd", text)
    return Reply(content=text, problem=problem,
                 finish_reason=_field(choices[0], "finish_reason") if choices else None,
                 response_id=_field(response, "id"), usage=usage,
                 cost=_cost(response) if usage is not None else None, latency_ms=latency,
                 tool_calls=_tool_calls(message) if message is not None else ())


# the openai client's refusal to send a request without a key, which litellm reports as an HTTP 500
_NO_API_KEY = ("Missing credentials", "api_key client option must be set")


def _no_api_key(exc: BaseException | None) -> bool:
    return exc is not None and any(text in str(exc) for text in _NO_API_KEY)


def is_transient(exc: BaseException) -> bool:
    """Worth retrying: timeouts, connection errors, 408/409/425/429/5xx (litellm's and the stdlib's);
    not a request the client refused to send for want of an API key (no retry brings one)."""
    if _no_api_key(exc):
        return False
    status = getattr(exc, "status_code", None)
    if isinstance(status, int):
        return status in TRANSIENT_STATUS or status >= 500
    if isinstance(exc, (TimeoutError, ConnectionError)):
        return True
    name = type(exc).__name__
    return any(word in name for word in ("Timeout", "Connection", "ServiceUnavailable", "RateLimit", "InternalServer"))


def _retry_after_seconds(exc: BaseException) -> float | None:
    """Seconds the server asked to wait before the next request (``retry-after-ms``, ``Retry-After`` in
    seconds or as an HTTP date), from the response litellm keeps on its error; None when it names none."""
    headers: Any = _field(getattr(exc, "response", None), "headers") or getattr(exc, "litellm_response_headers", None)
    items = getattr(headers, "items", None)  # httpx.Headers or a plain mapping
    if not callable(items):
        return None
    lowered = {str(k).lower(): str(v) for k, v in items()}
    try:
        if "retry-after-ms" in lowered:
            return max(0.0, float(lowered["retry-after-ms"]) / 1000)
        raw = lowered.get("retry-after")
        if raw is None:
            return None
        try:
            return max(0.0, float(raw))
        except ValueError:
            from email.utils import parsedate_to_datetime

            return max(0.0, parsedate_to_datetime(raw).timestamp() - time.time())
    except (TypeError, ValueError, OverflowError):
        return None  # a header that says nothing usable: the backoff decides


def _error_dict(exc: BaseException, endpoint: Endpoint) -> dict[str, Any]:
    text = endpoint.masked(str(exc))
    out = {"type": type(exc).__name__, "message": text if len(text) <= 500 else text[:500] + "...",
           "status_code": getattr(exc, "status_code", None), "transient": is_transient(exc)}
    wait = _retry_after_seconds(exc)
    if wait is not None:  # the server's word on when to come back: why the next attempt came when it did
        out["retry_after"] = wait
    return out


def _describe(exc: BaseException | None, endpoint: Endpoint) -> str:
    if exc is None:
        return "no error recorded"
    text = " ".join(endpoint.masked(str(exc)).split())
    return f"{type(exc).__name__}: {text[:300]}"


def _undecodable(exc: BaseException | None) -> bool:
    """Whether the failure was a reply body that does not parse as JSON (litellm keeps the
    ``JSONDecodeError`` in the chain of the errors it raises)."""
    seen = 0
    while exc is not None and seen < 8:
        if isinstance(exc, json.JSONDecodeError):
            return True
        exc, seen = exc.__cause__ or exc.__context__, seen + 1
    return False


def _hint(exc: BaseException | None, *, activity: bool = True, text_answer: str | None = None) -> str:
    status = getattr(exc, "status_code", None)
    if _no_api_key(exc):
        return (f"no API key was given for the model: set {ENV_API_KEY} (any non-empty value for a local "
                "server that takes none), then resume")
    if isinstance(exc, CutOffAnswer):
        limit = f"its {exc.limit} tokens" if exc.limit else "the model's own limit (no max_tokens was sent)"
        return (f"the model's answer was cut off at {limit}: raise llm.maxTokens (and SYSTEM's "
                "model_limits.max_output_tokens, which caps it), or ask for a shorter answer in llm.instructions")
    if isinstance(exc, FilteredAnswer):
        return ("check what the step sends (llm.instructions and the context it reads: `layerflow inspect ID "
                "--prompts`) against the provider's content policy, then resume")
    if isinstance(exc, AnswerError):
        if text_answer:
            return f"the model never gave {text_answer}; raise llm.maxRetries or use a stronger model"
        return "the model never gave the required JSON answer; tighten llm.instructions / outputSchema or use a stronger model"
    if status in (401, 403):
        return f"check the API key ({ENV_API_KEY})"
    if _undecodable(exc):
        return (f"the model server answered with a body that is not JSON (a web page, a cut-off reply): check that "
                f"{ENV_API_BASE} is the OpenAI-compatible endpoint (usually ending in /v1), then resume")
    if status == 404:
        return "check the model name and the API base"
    if exc is not None and isinstance(status, int) and 400 <= status < 500 and not is_transient(exc):
        # a refusal is not retried: more retries or a longer timeout would only repeat it
        return (f"the model server refused the request (HTTP {status}): check the model's llm settings "
                "(maxTokens, temperature) and whether the request fits its context, then resume")
    hint = f"check that the model server is reachable ({ENV_API_BASE}) or raise llm.maxRetries / llm.timeout"
    # only an activity has an offline handler; a gateway's condition, a join's conflict or a summary
    # falls back as its caller says (model_fallbacks)
    return hint + ("; without --model the activity's offline handler runs instead" if activity else "")


class _Caller:
    """Retrying completion calls against one endpoint; ``check`` turns a reply into a result
    or raises ``AnswerError`` for a corrective retry."""

    def __init__(self, endpoint: Endpoint, *, completion: Completion | None, max_retries: int,
                 retry: RetryPolicy | None, sleep: Callable[[float], None],
                 context: LayeredContext | None = None) -> None:
        self.endpoint = endpoint
        self.context = context  # the activity's: a request over model_limits names its largest keys
        self.completion = completion
        self.attempts = max_retries + 1
        self.retry = retry or RetryPolicy.from_env()
        self.sleep = sleep

    def _completion(self) -> Completion:
        if self.completion is None:
            self.completion = load_litellm().completion
        return self.completion

    def run(self, messages: Messages, check: Callable[[str | None], Any], *, task_id: str | None = None,
            on_attempt: OnAttempt | None = None, max_tokens: int | None = None,
            text_answer: str | None = None) -> Any:
        return self.run_reply(messages, lambda reply: check(reply.content), task_id=task_id, on_attempt=on_attempt,
                              max_tokens=max_tokens, text_answer=text_answer)[0]

    def run_reply(self, messages: Messages, check: Callable[[Reply], Any], *, task_id: str | None = None,
                  on_attempt: OnAttempt | None = None, max_tokens: int | None = None,
                  tools: Sequence[Mapping[str, Any]] | None = None,
                  text_answer: str | None = None) -> tuple[Any, Messages]:
        """``check(reply)``'s result and the conversation as last sent (with any corrective turns).

        ``text_answer`` names what a plain-text answer is (``"the summary text"``): its corrective
        turn and its failure ask for that, not for the JSON object the activities answer with."""
        convo = list(messages)
        last: BaseException | None = None
        failures = 0
        for attempt in range(1, self.attempts + 1):
            self._check_size(convo, tools, max_tokens, task_id, attempt - 1)
            reply: Reply | None = None
            try:
                reply = _complete(self._completion(), self.endpoint, convo, max_tokens, tools)
                if reply.problem is not None:
                    raise AnswerError([f"the reply {reply.problem}; answer in plain Unicode text"],
                                      text=reply.content or "")
                result = check(reply)
            except AnswerError as err:
                if reply is not None and reply.finish_reason == "length":
                    err = CutOffAnswer(err, self.endpoint.limits.answer_tokens(max_tokens or self.endpoint.max_tokens))
                elif reply is not None and reply.finish_reason == "content_filter":
                    err = FilteredAnswer(err)
                last = err
                if on_attempt:
                    on_attempt(attempt, convo, reply, err)
                convo = convo + [{"role": "assistant", "content": (reply.content or "") if reply else ""},
                                 {"role": "user", "content": _correction(err, text_answer)}]
                continue
            except ModelError:
                raise
            except Exception as err:  # noqa: BLE001 - mapped to ModelCallFailed below
                last = err
                if on_attempt:
                    on_attempt(attempt, convo, reply, err)
                if not is_transient(err):
                    raise self._failed(task_id, attempt, err, text_answer) from err
                failures += 1
                wait = _retry_after_seconds(err)
                if wait is not None and wait > MAX_RETRY_AFTER:
                    raise self._failed(task_id, attempt, err, text_answer, retry_after=wait) from err
                if attempt < self.attempts:
                    self.sleep(max(self.retry.delay(failures), wait or 0.0))
                continue
            if on_attempt:
                on_attempt(attempt, convo, reply, None)
            return result, convo
        raise self._failed(task_id, self.attempts, last, text_answer) from last

    def _check_size(self, convo: Messages, tools: Sequence[Mapping[str, Any]] | None, max_tokens: int | None,
                    task_id: str | None, attempts: int) -> None:
        """Refuse, before it is sent, a request that does not fit SYSTEM's ``model_limits`` (a
        corrective turn or a tool's result can make a request grow past it too)."""
        limits = self.endpoint.limits
        asked = max_tokens or self.endpoint.max_tokens
        budget = limits.request_budget(asked)
        if budget is None:
            return
        tokens = _request_tokens(convo, tools)
        if tokens <= budget:
            return
        what = f"the request of activity {task_id!r}" if task_id else "the model request"
        largest = _largest_keys(self.context) if self.context is not None else ""
        raise ModelCallFailed(
            f"{what} was not sent: it is {tokens} tokens, over the {budget} the model takes ({limits.describe(asked)})"
            f"{f'; its largest keys: {largest}' if largest else ''}; compress the context before this step (its compressTokenThreshold and compressRules, or "
            "context_compress), leave out what it need not see, or raise model_limits.max_context_tokens",
            task_id=task_id, model=self.endpoint.model, api_base=self.endpoint.api_base, attempts=attempts, cause=None)

    def _failed(self, task_id: str | None, attempts: int, err: BaseException | None,
                text_answer: str | None = None, retry_after: float | None = None) -> ModelCallFailed:
        what = f"model call for activity {task_id!r}" if task_id else "model call"
        hint = _hint(err, activity=bool(task_id), text_answer=text_answer)
        if retry_after is not None:
            hint = (f"the model server asked to wait {retry_after:.0f} s before the next request (Retry-After), "
                    f"longer than the {MAX_RETRY_AFTER:.0f} s a step waits; resume once it takes requests again")
        return ModelCallFailed(
            f"{what} failed after {attempts} attempt(s) (model {self.endpoint.model!r} at {self.endpoint.where}): "
            f"{_describe(err, self.endpoint)}; {hint}",
            task_id=task_id, model=self.endpoint.model, api_base=self.endpoint.api_base, attempts=attempts, cause=err)


def _largest_keys(ctx: LayeredContext, count: int = 3) -> str:
    """The ``count`` keys of ``ctx`` that take the most tokens, with their layer: in a context of
    thousands of keys, what to compress or leave out."""
    sizes = [(ctx.key_tokens(layer, key), layer, key) for layer in Layer for key in ctx.layer(layer)]
    top = heapq.nlargest(count, sizes, key=lambda s: s[0])
    return ", ".join(f"{layer} {key if len(key) <= 80 else key[:80] + '…'!r} {n} tokens" for n, layer, key in top)


def _correction(err: AnswerError, text_answer: str | None = None) -> str:
    again = (f"Reply again with {text_answer} only, and nothing else." if text_answer else
             "Reply again with exactly one JSON object that fixes this, and nothing else.")
    if isinstance(err, CutOffAnswer):
        again += " Keep it shorter, so that all of it fits."
    return "Your previous reply was not accepted: " + "; ".join(err.problems) + ". " + again


# ----- requests on the tape -------------------------------------------------------------------

_TEXT_CACHE: "OrderedDict[str, str]" = OrderedDict()  # sha256 -> request JSON text


def _remember(sha: str, text: str) -> None:
    _TEXT_CACHE[sha] = text
    _TEXT_CACHE.move_to_end(sha)
    while len(_TEXT_CACHE) > 64:
        _TEXT_CACHE.popitem(last=False)


def _request_json(tape: Sequence[Any], seq: int, index: dict[int, Any] | None = None) -> str:
    """The JSON text of the messages an ``llm_call`` event sent (rebuilt from the delta chain)."""
    index = index if index is not None else {e.seq: e for e in tape}
    chain = []
    current: int | None = seq
    while current is not None:
        event = index.get(current)
        if event is None or (event.data or {}).get("note") != LLM_CALL:
            raise LayerflowError(f"tape event {current} is not an llm_call; cannot rebuild request {seq}")
        req = event.data["request"]
        cached = _TEXT_CACHE.get(req["sha256"])
        if cached is not None:
            text = cached
            break
        chain.append(req)
        current = req.get("base_seq")
    else:
        text = ""
    for req in reversed(chain):
        text = text[: req["keep"]] + req["tail"]
        _remember(req["sha256"], text)
    return text


def request_messages(tape: Sequence[Any], seq: int) -> Messages:
    """The exact messages the ``llm_call`` event ``seq`` sent, rebuilt from the tape."""
    return list(json.loads(_request_json(tape, seq)))


def prompt_report(tape: Sequence[Any]) -> list[dict[str, Any]]:
    """One row per recorded model request (``llm_call`` events), for ``inspect --prompts``:
    seq, task, agent, attempt, status, tokens, prefix_tokens and share (the part that
    prefixes the agent's previous request; ``None`` for an agent's first request)."""
    rows = []
    for e in tape:
        data = e.data or {}
        if data.get("note") != LLM_CALL or "request" not in data:
            continue
        req = data["request"]
        first = req.get("base_seq") is None
        rows.append({"seq": e.seq, "task_id": data.get("task_id"), "agent": data.get("agent"),
                     "attempt": data.get("attempt"), "status": data.get("status"), "tokens": req["tokens"],
                     "prefix_tokens": req["prefix_tokens"],
                     "share": None if first else (req["prefix_tokens"] / req["tokens"] if req["tokens"] else 1.0)})
    return rows


def prompt_stability(tape: Sequence[Any]) -> float | None:
    """Mean prefix share of the recorded requests (an agent's first excluded); None if none compare."""
    shares = [r["share"] for r in prompt_report(tape) if r["share"] is not None]
    return sum(shares) / len(shares) if shares else None


def _previous_request(ctx: LayeredContext, agent: str) -> tuple[int, str] | None:
    for event in reversed(ctx.tape):
        data = event.data or {}
        if data.get("note") == LLM_CALL and data.get("agent") == agent and "request" in data:
            return event.seq, _request_json(ctx.tape, event.seq)
    return None


def _common_chars(a: str, b: str) -> int:
    n = min(len(a), len(b))
    lo, hi = 0, n  # binary search on slices: C speed instead of a Python loop per character
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if a[:mid] == b[:mid]:
            lo = mid
        else:
            hi = mid - 1
    return lo


def _token_text(messages: Sequence[Mapping[str, Any]]) -> str:
    """``request_text`` with each message's tool calls after its content (they are sent, so they count)."""
    flat = []
    for m in messages:
        calls = m.get("tool_calls")
        if calls:
            content = m.get("content")
            m = {**m, "content": (content if isinstance(content, str) else "") + canonical_json(calls)}
        flat.append(m)
    return request_text(flat)


def _request_tokens(messages: Messages, tools: Sequence[Mapping[str, Any]] | None = None,
                   encoding: str | None = None) -> int:
    """The tokens of a request: its messages and the tool schemas sent beside them. One count for
    the size check (``model_limits``) and the ``llm_call`` note (``inspect --prompts``)."""
    text = _token_text(messages) + (canonical_json(list(tools)) if tools else "")
    return count_text(text, encoding or DEFAULT_ENCODING)


def _request_record(ctx: LayeredContext, agent: str, messages: Messages,
                    tools: Sequence[Mapping[str, Any]] = ()) -> dict[str, Any]:
    text = canonical_json(messages)
    sha = hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()
    tokens = _request_tokens(messages, tools, ctx.encoding)
    prev = _previous_request(ctx, agent)
    if prev is None:
        record = {"sha256": sha, "tokens": tokens, "prefix_tokens": 0, "base_seq": None, "keep": 0, "tail": text}
    else:
        base_seq, base_text = prev
        keep = _common_chars(base_text, text)
        prefix = common_prefix_tokens(_token_text(json.loads(base_text)), _token_text(messages), ctx.encoding)
        record = {"sha256": sha, "tokens": tokens, "prefix_tokens": prefix, "base_seq": base_seq,
                  "keep": keep, "tail": text[keep:]}
    _remember(sha, text)
    return record


# ----- LLM activities ---------------------------------------------------------------------------

def _write_answer(ctx: LayeredContext, answer: Mapping[str, Any], actor: str) -> None:
    # all or nothing: a denied key (recorded on the tape like a script's) writes nothing; in key order,
    # as the answer is a JSON object, which has none (the next request is the same bytes either way)
    answer = dict(sorted(answer.items()))
    for key in answer:
        effective, reason = ctx.check_write(Layer.WORKING, key)
        if reason is None and is_engine_key(key):
            # a model's answer is data, as a person's is: a model talked into `"_mergedConflicts": []`
            # by the text it reads would erase a join's conflict log (a handler's `_` keys stay its own)
            why = f"{ENGINE_KEY_RULE}; a model's answer carries data keys only"
            ctx.record("model_answer_refused", actor=actor, data={"key": key, "reason": why})
            raise ContextWriteDenied(key, Layer.WORKING, effective, why)
    ctx.write_many(Layer.WORKING, answer, actor=actor)


TOOLS_NOTE = ("You may call the context governance tools (context_inspect, context_compress, context_branch, "
              "human_confirm) before you answer; when you are done, answer as required below.")


def activity_request(ctx: LayeredContext | View, task_id: str, llm_config: LLMConfig | None = None, *,
                     options: RenderOptions | None = None, memory: Sequence[Any] = (),
                     tools: bool | None = None, redact: RedactSetting = True) -> Messages:
    """The messages an LLM activity sends: ``render`` of the view with the activity's
    instructions, answer contract and render format (pure: same context, same bytes).
    ``tools`` (default: ``llm.tools``): the request offers the governance tools, and says so.
    ``redact`` (the activity's ``redact`` config): the view's hooks are followed by
    ``model_hooks(redact)``, and recalled memory passes ``redact_for_model``.

    A model summary of this activity's context starts with exactly these messages, so a
    provider's prompt cache serves the shared part (``engine.model_compression``)."""
    cfg = llm_config or LLMConfig()
    offered = cfg.tools if tools is None else tools
    parts = (TOOLS_NOTE if offered else "", cfg.instructions.strip(), answer_contract(cfg.output_schema, cfg.output_keys))
    opts = replace(options or RenderOptions(knowledge_scope="activity"), format=cfg.render_format,
                   instructions="\n\n".join(p for p in parts if p), task_id=task_id)
    # within SYSTEM's model_limits: late-bound KNOWLEDGE and memory are shed first (never a
    # preserved key); what still does not fit is refused before it is sent (``_Caller``)
    try:
        budget = ModelLimits.of(ctx).request_budget(cfg.max_tokens)
    except ModelLimitsError:
        budget = None  # the call names them (``_limits_of``) before anything is sent
    if budget is not None and (opts.budget is None or budget < opts.budget):
        opts = replace(opts, budget=budget)
    if memory:
        opts = replace(opts, memory=tuple(redact_for_model(m, redact) for m in memory))
    hidden = model_hooks(redact)
    if isinstance(ctx, LayeredContext):
        source = ctx.view(hooks=hidden)
    else:
        source = copy.copy(ctx)  # the caller's view keeps its own hooks; the copy adds redaction last
        source.hooks = (*ctx.hooks, *hidden)
    return [dict(m) for m in render(source, opts)]


def call_recorder(ctx: LayeredContext, *, task_id: str | None, endpoint: Endpoint, attempts: int, actor: str,
                  agent: str | None = None, purpose: str | None = None,
                  tools: Sequence[str] = (), schemas: Sequence[Mapping[str, Any]] = ()) -> OnAttempt:
    """The ``on_attempt`` callback that notes every attempt on ``ctx``'s tape as ``llm_call``.

    ``agent`` (default: the model) groups requests for the prefix delta and
    ``prompt_report``: requests of one agent are expected to share their prefix.
    ``purpose`` says what a call outside an activity's own request was for (``summary``,
    ``compression_plan``). ``schemas``: the tool schemas sent beside the messages (named in ``tools``),
    counted in the request's ``tokens`` as the size check counts them."""
    agent = agent or endpoint.model

    def record(attempt: int, sent: Messages, reply: Reply | None, err: BaseException | None) -> None:
        status = "ok" if err is None else ("invalid_answer" if isinstance(err, AnswerError) else "error")
        data: dict[str, Any] = {
            "task_id": task_id, "agent": agent, "model": endpoint.model, "api_base": endpoint.api_base,
            "attempt": attempt, "max_attempts": attempts, "status": status,
            "request": _request_record(ctx, agent, sent, schemas),
            "response": None if reply is None else reply.response_record(),
            "usage": reply.usage if reply else None, "cost": reply.cost if reply else None,
            "latency_ms": reply.latency_ms if reply else None,
            "error": None if err is None else (
                {"type": "AnswerError", "message": str(err)[:500], "problems": err.problems[:20]}
                if isinstance(err, AnswerError) else _error_dict(err, endpoint)),
        }
        if purpose is not None:
            data["purpose"] = purpose
        if tools:
            data["tools"] = list(tools)
        ctx.record(LLM_CALL, actor=actor, data=data)

    return record


def _activity_call(ctx: Any, task_id: Any, llm_config: LLMConfig | ActivityExtensionConfig | None,
                   chosen: str | None) -> tuple[LayeredContext, str, LLMConfig, str, RedactSetting]:
    """The engine's handler style (``activity_context, activity_config``) or the plain one,
    resolved to (context, task id, LLM config, model, the activity's ``redact``: on for an
    ``LLMConfig`` alone)."""
    if not isinstance(ctx, LayeredContext) and isinstance(getattr(ctx, "context", None), LayeredContext):
        if llm_config is None and not isinstance(task_id, str):
            llm_config, task_id = task_id, None
        task_id = task_id or ctx.task_id
        ctx = ctx.context
    redact: RedactSetting = True
    if isinstance(llm_config, ActivityExtensionConfig):
        redact = llm_config.redact
        llm_config = llm_config.llm
    if not isinstance(task_id, str) or not task_id:
        raise LayerflowError(f"run_llm_activity needs the task id of the activity, got {task_id!r}")
    cfg = llm_config or LLMConfig()
    chosen = chosen or cfg.model
    if not chosen:
        raise ModelCallFailed(f"activity {task_id!r} is a model call but no model is configured; set llm.model in "
                              "its config or pass --model (or give it an offline handler)",
                              task_id=task_id, model="", api_base=None, attempts=0, cause=None)
    return ctx, task_id, cfg, chosen, redact


def _limits_of(ctx: LayeredContext | View, task_id: str) -> ModelLimits:
    """SYSTEM's limits for an activity's calls; unusable ones fail the activity as a model call would."""
    try:
        return ModelLimits.of(ctx)
    except ModelLimitsError as err:
        raise ModelCallFailed(f"activity {task_id!r}: {err}", task_id=task_id, model="", api_base=None,
                              attempts=0, cause=None) from None


def run_llm_activity(ctx: Any, task_id: Any = None, llm_config: LLMConfig | ActivityExtensionConfig | None = None, *,
                     model_override: str | None = None, model: str | None = None, completion: Completion | None = None,
                     view: View | None = None, options: RenderOptions | None = None, memory: Sequence[Any] = (),
                     retry: RetryPolicy | None = None, sleep: Callable[[float], None] = time.sleep,
                     actor: str | None = None, redact: RedactSetting | None = None) -> dict[str, Any]:
    """Run one model-call activity; returns the answer (already written to WORKING).

    ``ctx`` is the activity's ``LayeredContext`` (the activity is open). Also accepted, for
    the engine's handler path: ``run_llm_activity(activity_context, activity_config, model=...)``.
    ``view`` (default: the whole context) and ``options`` shape what the model sees;
    ``completion`` replaces ``litellm.completion`` (same keyword arguments).
    ``redact`` (default: the activity config's ``redact``, on): see ``activity_request``.
    """
    # an instance of a multi-instance activity (the engine's ActivityContext) keeps its items in a
    # scope of its own: its output item goes there, never to the WORKING its sibling instances see
    scope: dict[str, Any] | None = getattr(ctx, "scope", None)
    scoped: frozenset[str] = frozenset(getattr(ctx, "scoped", ()) or ())
    ctx, task_id, cfg, chosen, configured = _activity_call(ctx, task_id, llm_config, model_override or model)
    endpoint = Endpoint.of(chosen, cfg, limits=_limits_of(ctx, task_id))
    messages = activity_request(view if view is not None else ctx, task_id, cfg, options=options, memory=memory,
                                tools=False, redact=configured if redact is None else redact)
    who = actor or task_id
    caller = _Caller(endpoint, completion=completion, max_retries=cfg.max_retries, retry=retry, sleep=sleep,
                     context=ctx if isinstance(ctx, LayeredContext) else None)
    record = call_recorder(ctx, task_id=task_id, endpoint=endpoint, attempts=caller.attempts, actor=who)
    answer = caller.run(messages, lambda text: parse_answer(text, schema=cfg.output_schema, keys=cfg.output_keys),
                        task_id=task_id, on_attempt=record)
    _write_answer(ctx, {k: v for k, v in answer.items() if k not in scoped}, who)
    if scope is not None:
        scope.update((k, v) for k, v in answer.items() if k in scoped)
    return dict(answer)


# ----- LLM activities with tools -----------------------------------------------------------------

MAX_TOOL_TURNS = 12

Dispatch = Callable[[str, str], dict[str, Any]]


@dataclass(frozen=True)
class ToolOutcome:
    """How a tool-using activity ended this time: its ``answer`` (written to WORKING), or
    ``waiting`` for the answers of these confirmation ids, with the ``state`` to resume from."""

    answer: dict[str, Any] | None
    waiting: tuple[str, ...] = ()
    state: dict[str, Any] | None = None


def _result_text(result: Mapping[str, Any]) -> str:
    return json.dumps(result, ensure_ascii=False, sort_keys=True, default=str)


def _looping(history: Messages) -> str:
    """What a model stuck in a loop repeated: its last turns were all the same calls (``""`` otherwise)."""
    turns = [[(c["function"]["name"], c["function"]["arguments"]) for c in m["tool_calls"]]
             for m in history if m.get("role") == "assistant" and m.get("tool_calls")]
    if len(turns) < 2 or any(t != turns[-1] for t in turns[-3:]):
        return ""
    repeated = sum(1 for _ in itertools.takewhile(lambda t: t == turns[-1], reversed(turns)))
    calls = ", ".join(f"{name} {arguments[:200]}" for name, arguments in turns[-1])
    return f"; its last {repeated} turns repeated the same call ({calls})"


def run_llm_tool_activity(ctx: LayeredContext, task_id: str, llm_config: LLMConfig | None, *, model: str,
                          dispatch: Dispatch, schemas: Sequence[Mapping[str, Any]],
                          state: Mapping[str, Any] | None = None, answers: Mapping[str, Any] | None = None,
                          completion: Completion | None = None, retry: RetryPolicy | None = None,
                          sleep: Callable[[float], None] = time.sleep, actor: str | None = None,
                          max_turns: int = MAX_TOOL_TURNS, scoped: Collection[str] = (),
                          redact: RedactSetting = True) -> ToolOutcome:
    """An LLM activity that may call tools before it answers (``llm.tools: true``).

    The first request is the activity's normal one (``activity_request``) with the tool
    schemas; each turn's tool calls go to ``dispatch(name, arguments_json)`` in order and
    their results back to the model as ``tool`` messages, until the model answers in text,
    which must be the activity's JSON answer (corrected like ``run_llm_activity``'s). Each
    request is noted as ``llm_call`` and each tool call as ``tool_call`` on the tape.

    A ``human_confirm`` whose result is ``pending`` ends the turn with ``waiting``: the
    engine keeps the activity open and calls again with ``state`` and ``answers``
    (confirmation id -> ``{"answer", "timed_out"}``) once a person answered; the model then
    sees the answer as that tool call's result and goes on.

    ``scoped``: names of a multi-instance activity's instance (its items); the answer's keys
    among them are not written to WORKING (the caller keeps them in the instance's scope).

    ``redact`` (the activity's config): the request is ``activity_request``'s, and what a tool
    returns reaches the model through ``redact_for_model`` (``context_inspect`` shows values);
    the ``tool_call`` notes on the tape keep the results as the tools gave them.
    """
    cfg = llm_config or LLMConfig()
    endpoint = Endpoint.of(model, cfg, limits=_limits_of(ctx, task_id))
    who = actor or task_id
    names = [str(t.get("function", {}).get("name")) for t in schemas]
    caller = _Caller(endpoint, completion=completion, max_retries=cfg.max_retries, retry=retry, sleep=sleep,
                     context=ctx)
    record = call_recorder(ctx, task_id=task_id, endpoint=endpoint, attempts=caller.attempts, actor=who, tools=names,
                           schemas=schemas)
    if state is None:
        # the tool schemas are sent beside the messages: the request leaves room for them
        budget = endpoint.limits.request_budget(cfg.max_tokens)
        room = None if budget is None else max(1, budget - count_text(canonical_json(list(schemas))))
        history: Messages = activity_request(ctx, task_id, cfg, tools=True, redact=redact,
                                             options=RenderOptions(knowledge_scope="activity", budget=room))
        turns = 0
    else:
        history = [dict(m) for m in state["messages"]]
        turns = int(state["turns"])
        pending: Mapping[str, str] = state["pending"]
        given = {cid: dict((answers or {}).get(cid) or {}) for cid in pending.values()}
        # the pending calls are the last turn's: a provider may reuse a call id from turn to turn
        # (``call_0`` each time when it gives none), and an earlier turn's result must stay as it was
        last_turn = max((i for i, m in enumerate(history) if m.get("role") == "assistant"), default=-1)
        for m in history[last_turn + 1:]:
            cid = pending.get(m.get("tool_call_id", "")) if m.get("role") == "tool" else None
            if cid is not None:
                # `--yes` took the default with nobody looking: the model is not to read it as a person's word
                unattended = {"unattended": True} if given[cid].get("unattended") else {}
                m["content"] = _result_text(redact_for_model({"confirmation_id": cid, "status": "answered",
                                                              "answer": given[cid].get("answer"),
                                                              "timed_out": bool(given[cid].get("timed_out")),
                                                              **unattended}, redact))
        ctx.record("tool_loop_resumed", actor=who, data={"task_id": task_id, "answers": given})

    def check(reply: Reply) -> Any:
        if reply.tool_calls:
            return reply
        return parse_answer(reply.content, schema=cfg.output_schema, keys=cfg.output_keys)

    while True:
        if turns >= max_turns:
            raise ModelCallFailed(
                f"activity {task_id!r}: the model {endpoint.model!r} called tools in {turns} turns without giving "
                f"its answer (a step's model takes at most {max_turns} turns of tool calls){_looping(history)}; "
                "tighten llm.instructions or turn llm.tools off", task_id=task_id, model=endpoint.model,
                api_base=endpoint.api_base, attempts=turns, cause=None)
        turns += 1
        result, history = caller.run_reply(history, check, task_id=task_id, on_attempt=record, tools=schemas)
        if not isinstance(result, Reply):
            _write_answer(ctx, {k: v for k, v in result.items() if k not in scoped}, who)
            return ToolOutcome(answer=dict(result))
        turn: dict[str, Any] = {"role": "assistant", "tool_calls": [kept_call(c) for c in result.tool_calls]}
        if result.content is not None:  # no content key at all otherwise: litellm leaves a None out
            turn["content"] = result.content
        history = [*history, turn]
        waiting: dict[str, str] = {}
        for call in result.tool_calls:
            name, arguments = call["function"]["name"], call["function"]["arguments"]
            outcome = dispatch(name, arguments)
            error = outcome.get("error") if isinstance(outcome.get("error"), Mapping) else None
            text = _result_text(outcome)
            ctx.record("tool_call", actor=who, data={
                "task_id": task_id, "turn": turns, "call_id": call["id"], "tool": name, "arguments": arguments[:4000],
                "result": text if len(text) <= 4000 else text[:4000] + "...",
                "error": None if error is None else error.get("kind")})
            history.append({"role": "tool", "tool_call_id": call["id"],
                            "content": _result_text(redact_for_model(outcome, redact))})
            if name == "human_confirm" and error is None and outcome.get("status") == "pending":
                waiting[call["id"]] = str(outcome["confirmation_id"])
        if waiting:
            ctx.record("tool_loop_waiting", actor=who, data={"task_id": task_id, "turn": turns,
                                                             "confirmations": list(waiting.values())})
            return ToolOutcome(answer=None, waiting=tuple(waiting.values()),
                               state={"messages": history, "pending": waiting, "turns": turns})


# ----- summarizer and arbiter ---------------------------------------------------------------------

_T = TypeVar("_T")


class _Client:
    """``on_attempt`` (e.g. ``call_recorder``) is told of every attempt, so the calls can go on a tape."""

    def __init__(self, model: str, *, api_base: str | None = None, api_key: str | None = None, timeout: float = 30,
                 max_retries: int = 2, retry: RetryPolicy | None = None, completion: Completion | None = None,
                 sleep: Callable[[float], None] = time.sleep, on_attempt: OnAttempt | None = None,
                 limits: ModelLimits | None = None, llm_config: LLMConfig | None = None) -> None:
        self.endpoint = Endpoint.of(model, llm_config, api_base=api_base, api_key=api_key, timeout=timeout,
                                    limits=limits)
        self._caller = _Caller(self.endpoint, completion=completion, max_retries=max_retries, retry=retry, sleep=sleep)
        self.on_attempt = on_attempt

    @contextmanager
    def within(self, limits: ModelLimits) -> Iterator[None]:
        """The calls made inside go within ``limits`` (SYSTEM's ``model_limits`` of the instance the
        client works for: its ``max_tokens`` at most ``max_output_tokens``, a request that does not fit
        refused before it is sent), as an activity's calls do."""
        before = self.endpoint
        self.endpoint = self._caller.endpoint = replace(before, limits=limits)
        try:
            yield
        finally:
            self.endpoint = self._caller.endpoint = before

    @property
    def attempts(self) -> int:
        return self._caller.attempts

    def _parsed(self, messages: Messages, parse: Callable[[str], _T],
                error: "type[ArbiterAnswerError] | type[BranchAnswerError]", *,
                what: str) -> _T:
        """``parse`` of the model's reply to ``messages`` (a join's arbiter, an XOR's chooser: their
        callers retry a malformed one once). A reply the provider cut at the token limit
        (``finish_reason: "length"``) that ``parse`` refuses raises ``error`` naming the cut and the
        limit to raise, as an activity's cut-off reply is named (``CutOffAnswer``), not only as
        malformed. ``what``: whose ``llm.maxTokens`` that is (``"the join's"``)."""
        reply, _ = self._caller.run_reply(messages, lambda r: r, on_attempt=self.on_attempt)
        try:
            return parse(reply.content or "")
        except error as err:
            if reply.finish_reason != "length":
                raise
            limit = self.endpoint.limits.answer_tokens(self.endpoint.max_tokens)
            raise error(f"{_cut_off(limit, err.problem)}: raise {what} llm.maxTokens (and SYSTEM's model_limits.max_output_tokens, which caps it)",
                        text=reply.content or "") from None

    @classmethod
    def from_config(cls, llm_config: LLMConfig | None = None, model_override: str | None = None,
                    **kwargs: Any) -> Any:
        cfg = llm_config or LLMConfig()
        chosen = model_override or cfg.model
        if not chosen:
            raise ModelError("no model is configured; pass a model name (--model) or set llm.model")
        return cls(chosen, api_base=cfg.api_base, timeout=cfg.timeout, max_retries=cfg.max_retries, llm_config=cfg,
                   **kwargs)


class LiteLLMSummarizer(_Client):
    """``context_layers.summarize.Summarizer`` through litellm, for the compressor.

    The request is ``build_summary_request(prefix_messages, text, max_tokens)``: the
    activity's normal request (``prefix_messages``, e.g. ``render.stable_prefix``)
    unchanged, then the instruction and the text, so the provider's cached prefix is
    reused. The answer is cut to ``max_tokens``; failures raise ``ModelError`` (the
    compressor then falls back to its offline summary).
    """

    system = "You write faithful, compact summaries of business-process records."
    # preserved keys and their values (``ModelCompressor`` sets them): a summary that gives one of them
    # another value (``claim_ref: CLM-999``) is asked for again, told which, and fails when the model insists
    facts: Mapping[str, Any] = {}

    def summarize(self, text: str, max_tokens: int, *, prefix_messages: Sequence[Mapping[str, str]] | None = None) -> str:
        from context_layers.summarize import build_summary_request, fit_summary, misstated_keys

        messages = build_summary_request(prefix_messages, text, max_tokens)
        if not prefix_messages:
            messages = [{"role": "system", "content": self.system}, *messages]

        def check(content: str | None) -> str:
            if not content or not content.strip():
                raise AnswerError(["the summary is empty"], text=content or "")
            summary = fit_summary(content, max_tokens)
            wrong = misstated_keys(summary, self.facts)
            if wrong:
                raise AnswerError(wrong, text=content)
            return summary

        return str(self._caller.run(messages, check, max_tokens=max_tokens, on_attempt=self.on_attempt,
                                    text_answer="the summary text"))


class LiteLLMPlanner(_Client):
    """Asks the model for a compression plan: the compression decision prompt
    (``context_layers.compression_plan.build_compression_prompt``), the answer validated
    by ``parse_compression_plan`` (an invalid one gets one corrective turn per retry).
    Failures raise ``ModelError``; the engine then runs the rules."""

    def plan(self, ctx: LayeredContext, config: ActivityExtensionConfig | None = None, *,
             attention: Any = None, redact: RedactSetting = True) -> Any:
        from context_layers.compression_plan import build_compression_prompt, parse_compression_plan

        messages: Messages = [dict(m) for m in build_compression_prompt(ctx, config, attention=attention,
                                                                         redact=redact)]

        def check(content: str | None) -> Any:
            try:
                return parse_compression_plan(content or "")
            except ModelError as err:
                raise AnswerError([str(err)], text=content or "") from None

        return self._caller.run(messages, check, on_attempt=self.on_attempt)


class LiteLLMArbiter(_Client):
    """``gateways.arbiter.ConflictArbiter`` through litellm: the gateway's prompt, transient
    retries here, the reply parsed by ``parse_arbiter_answer`` (a malformed one raises
    ``ArbiterAnswerError``, which the resolution chain retries once).

    ``value_schemas`` (the engine sets them from the process: ``declared_values``): key -> the
    ``outputSchema`` property schemas of the steps that write it, by element id. A value the key may
    not take under any of them (``partial`` where the steps' enum is approve, deny, refer; a payout
    under their ``minimum``) is a malformed answer too: a decision, a suggestion a person is offered or
    a timeout takes, it would be a value no step of the process could have written."""

    value_schemas: Mapping[str, Sequence[tuple[str, Mapping[str, Any]]]] = {}

    def arbitrate(self, request: "ArbitrationRequest") -> "ArbitrationAnswer":
        from gateways.arbiter import ArbiterAnswerError, build_conflict_prompt, parse_arbiter_answer

        messages = [dict(m) for m in build_conflict_prompt(request)]
        answer = self._parsed(messages, parse_arbiter_answer, ArbiterAnswerError, what="the join's")
        problem = self._undeclared(request.key, answer.final_value)
        if problem is not None:
            raise ArbiterAnswerError(problem, text=json.dumps(answer.model_dump(), ensure_ascii=False))
        return answer

    def _undeclared(self, key: str, value: Any) -> str | None:
        from gateways.arbiter import from_json_value
        from gateways.conflicts import DELETED

        declared = self.value_schemas.get(key)
        if not declared or from_json_value(value) is DELETED:
            return None
        problems = [validate_schema(value, schema, f"/{key}") for _, schema in declared]
        if any(not p for p in problems):
            return None
        steps = ", ".join(element for element, _ in declared)
        return (f"final_value {json.dumps(value, ensure_ascii=False)} is not a value {key!r} may take "
                f"({'; '.join(problems[0])}: the outputSchema of {steps}); answer a value it allows")


def declared_values(configs: Mapping[str, ActivityExtensionConfig]) -> dict[str, list[tuple[str, Mapping[str, Any]]]]:
    """Key -> ``(element id, property schema)`` of every step whose ``llm.outputSchema`` declares the key
    (``LiteLLMArbiter.value_schemas``), in element id order."""
    out: dict[str, list[tuple[str, Mapping[str, Any]]]] = {}
    for element in sorted(configs):
        llm = configs[element].llm
        props = (llm.output_schema or {}).get("properties") if llm is not None else None
        for key, schema in (props.items() if isinstance(props, Mapping) else ()):
            if isinstance(schema, Mapping):
                out.setdefault(str(key), []).append((element, schema))
    return out
