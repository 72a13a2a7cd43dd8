"""Natural-language XOR conditions through litellm: the ``gateways.BranchChooser`` the
engine uses when a model is configured.

The question and the parsing are ``gateways.conditions``; here only the call: the
same client as the conflict arbiter (transient failures retried with backoff, the API
base from the gateway's ``llm.apiBase`` or ``LAYERFLOW_MODEL_API_BASE``). litellm is
imported by the first call, never by building a chooser.
"""

from __future__ import annotations

from typing import Any

from context_layers.config import ActivityExtensionConfig
from gateways.conditions import (BranchAnswer, BranchAnswerError, BranchQuestion, build_branch_prompt,
                                 parse_branch_answer)

# _Client is engine.llm's shared litellm client (endpoint, retries); the arbiter uses it too.
from .llm import _Client

__all__ = ["LiteLLMBranchChooser", "make_chooser"]


class LiteLLMBranchChooser(_Client):
    """Asks the model which branch the designer's sentences pick; a malformed reply raises
    ``BranchAnswerError`` (``gateways.ask_branch`` retries it once)."""

    def choose(self, question: BranchQuestion) -> BranchAnswer:
        messages = [dict(m) for m in build_branch_prompt(question)]
        return self._parsed(messages, lambda text: parse_branch_answer(text, question), BranchAnswerError,
                            what="the gateway's")


def make_chooser(model: str | None, config: ActivityExtensionConfig | None) -> LiteLLMBranchChooser | None:
    """The chooser for a gateway: ``model`` (``--model``) over the gateway's ``llm.model``;
    ``None`` when neither names a model (the expressions decide alone)."""
    llm = config.llm if config is not None else None
    chosen: Any = model or (llm.model if llm is not None else None)
    if not chosen:
        return None
    return LiteLLMBranchChooser.from_config(llm, model_override=chosen)  # type: ignore[no-any-return]
