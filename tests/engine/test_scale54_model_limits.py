"""Round 54, at scale: a context far over the model's limit.

The request is not sent and the step fails naming ``model_limits``, the sizes and what to do
(tests/engine/test_model_paths_31.py); with a context of thousands of keys the user must also
learn *what* is big: the error names the largest keys with their layer and tokens.
"""

from __future__ import annotations

from typing import Any

import pytest

from context_layers import Layer, LayeredContext
from context_layers.config import LLMConfig
from engine.llm import ModelCallFailed, run_llm_activity


def _never(**kw: Any) -> Any:
    raise AssertionError("a request over model_limits was sent")


def _over_the_limit(notes: int) -> LayeredContext:
    ctx = LayeredContext(system={"policy": "p", "model_limits": {"max_context_tokens": 2000,
                                                                  "max_output_tokens": 200}})
    ctx.apply_changes([(Layer.PROCESS, "applicant", "ann")], kind="input", actor="input")
    ctx.begin_activity("gather")
    for n in range(notes):
        ctx.write(Layer.WORKING, f"note_{n}", "a short note ", actor="gather")
    ctx.complete_activity("gather")
    ctx.begin_activity("decide")
    ctx.write(Layer.WORKING, "dossier", "the applicant's dossier " * 3000, actor="decide")
    ctx.write(Layer.WORKING, "scan", "page " * 1500, actor="decide")
    return ctx


def test_a_request_far_over_the_limit_names_its_largest_keys_and_layers() -> None:
    ctx = _over_the_limit(300)
    before = ctx.state_json()
    with pytest.raises(ModelCallFailed) as err:
        run_llm_activity(ctx, "decide", LLMConfig(model="openai/x", instructions="Decide.", output_keys=["decision"]),
                         completion=_never)
    text = str(err.value)
    assert "model_limits" in text and "max_context_tokens 2000" in text
    assert f"L4 'dossier' {ctx.key_tokens(Layer.WORKING, 'dossier')} tokens" in text
    assert f"L4 'scan' {ctx.key_tokens(Layer.WORKING, 'scan')} tokens" in text
    assert text.index("'dossier'") < text.index("'scan'")  # the largest first
    assert "note_299" not in text and len(text) < 1_500  # a few keys, not thousands
    assert ctx.state_json() == before
