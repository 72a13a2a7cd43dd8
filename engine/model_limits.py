"""SYSTEM's ``model_limits``: what one model request and its answer may take.

Pure (no litellm, no engine.llm): ``layerflow validate`` checks a config's with it, and a run
without a model never loads the model path. ``engine.llm`` sends within them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from context_layers.context import LayeredContext, View
from context_layers.errors import ModelError
from context_layers.layers import Layer

__all__ = ["MODEL_LIMITS_KEY", "ModelLimits", "ModelLimitsError"]


class ModelLimitsError(ModelError):
    """A ``model_limits`` that cannot bound a request (the model step that meets it fails, naming it)."""


MODEL_LIMITS_KEY = "model_limits"


@dataclass(frozen=True, slots=True)
class ModelLimits:
    """SYSTEM's ``model_limits`` (DESIGN: SYSTEM holds "policy, system prompt, model limits"):
    ``max_context_tokens``, what one request and its answer may take together, and
    ``max_output_tokens``, what the answer may take. Other fields are left to whoever reads them."""

    context: int | None = None
    output: int | None = None

    @classmethod
    def of(cls, ctx: LayeredContext | View | None) -> "ModelLimits":
        """The limits SYSTEM (L0) names; a value that cannot be one is refused by name, nothing sent."""
        ctx = ctx.context if isinstance(ctx, View) else ctx
        return cls.parse(ctx.layer(Layer.SYSTEM).get(MODEL_LIMITS_KEY) if isinstance(ctx, LayeredContext) else None)

    @classmethod
    def parse(cls, raw: Any) -> "ModelLimits":
        """The limits of a ``model_limits`` value (``layerflow validate`` checks the config's with it)."""
        if raw is None:
            return cls()
        where = f"SYSTEM (L0) key {MODEL_LIMITS_KEY!r}"
        if not isinstance(raw, Mapping):
            raise cls._refused(f"{where} is {raw!r}; write a mapping such as "
                               "{max_context_tokens: 8000, max_output_tokens: 1000} in the config's system section")
        found: dict[str, int | None] = {}
        for name in ("max_context_tokens", "max_output_tokens"):
            value = raw.get(name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value <= 0):
                raise cls._refused(f"{MODEL_LIMITS_KEY}.{name} in SYSTEM (L0) is {value!r}; write a positive whole "
                                   "number of tokens, or leave it out")
            found[name] = value
        limits = cls(found["max_context_tokens"], found["max_output_tokens"])
        if limits.context is not None and limits.output is not None and limits.output >= limits.context:
            raise cls._refused(f"{MODEL_LIMITS_KEY}.max_output_tokens {limits.output} in SYSTEM (L0) leaves no room "
                               f"for the request in max_context_tokens {limits.context}; lower max_output_tokens")
        return limits

    @staticmethod
    def _refused(message: str) -> "ModelLimitsError":
        return ModelLimitsError(f"no model request was sent: {message}")

    def answer_tokens(self, asked: int | None) -> int | None:
        """The ``max_tokens`` to send: what was asked, at most ``max_output_tokens``."""
        if self.output is None:
            return asked
        return min(asked, self.output) if asked else self.output

    def request_budget(self, asked: int | None) -> int | None:
        """Tokens the request may take: ``max_context_tokens`` less the answer's ``max_tokens``."""
        if self.context is None:
            return None
        return self.context - (self.answer_tokens(asked) or 0)

    def describe(self, asked: int | None) -> str:
        answer = self.answer_tokens(asked)
        return (f"{MODEL_LIMITS_KEY} in SYSTEM (L0): max_context_tokens {self.context}"
                + (f" less {answer} for the answer" if answer else ""))
