"""LLM activities, the summarizer and the arbiter through litellm's real HTTP client,
against the local OpenAI-compatible stub server (tests/stub_llm.py) on 127.0.0.1."""

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from context_layers import ContextWriteDenied, Layer, LayeredContext
from context_layers.config import ActivityExtensionConfig, LLMConfig
from context_layers.errors import ModelError
from context_layers.prefix import request_text
from context_layers.render import RenderOptions, stable_prefix
from engine.answer import AnswerError, parse_answer, validate_schema
from engine.llm import (
    LiteLLMArbiter,
    LiteLLMSummarizer,
    ModelCallFailed,
    RetryPolicy,
    model_configured,
    prompt_report,
    prompt_stability,
    request_messages,
    run_llm_activity,
)
from stub_llm import Reply, StubLLM

ROOT = Path(__file__).resolve().parents[2]
FAST = RetryPolicy(base=0.01, cap=0.02)
MODEL = "openai/stub-model"


@pytest.fixture
def stub(monkeypatch):
    monkeypatch.setenv("LAYERFLOW_MODEL_API_KEY", "test-key")
    monkeypatch.delenv("LAYERFLOW_MODEL_API_BASE", raising=False)
    with StubLLM() as server:
        yield server


def config(stub, **kw) -> LLMConfig:
    base = {"model": MODEL, "api_base": stub.url, "instructions": "Assess the credit risk.",
            "output_keys": ["risk_level"], "timeout": 2, "max_retries": 2}
    return LLMConfig(**{**base, **kw})


def loan() -> LayeredContext:
    ctx = LayeredContext(system={"policy": "Two approvals over 100000."})
    ctx.write(Layer.PROCESS, "application_id", "A-1", actor="start")
    ctx.begin_activity("submit")
    ctx.write(Layer.WORKING, "amount", 120000, actor="submit")
    ctx.complete_activity("submit")
    ctx.begin_activity("risk")
    return ctx


def calls(ctx):
    return [e for e in ctx.tape if (e.data or {}).get("note") == "llm_call"]


def test_success_writes_the_answer_and_records_the_call(stub):
    stub.push(Reply.json({"risk_level": "low", "reason": "stable income"}))
    ctx = loan()
    answer = run_llm_activity(ctx, "risk", config(stub), retry=FAST)
    assert answer == {"risk_level": "low", "reason": "stable income"}
    assert ctx.layer(Layer.WORKING)["risk_level"] == "low"
    writes = [e for e in ctx.tape if e.kind == "write" and e.changes[0][1] in answer]
    assert {e.actor for e in writes} == {"risk"}
    (call,) = calls(ctx)
    data = call.data
    assert data["status"] == "ok" and data["model"] == MODEL and data["api_base"] == stub.url
    assert data["usage"]["total_tokens"] == 18 and data["cost"] is None  # the stub model has no price
    assert data["response"]["content"] == json.dumps(answer)
    assert data["request"]["tokens"] > 0 and len(data["request"]["sha256"]) == 64
    # the request on the tape is exactly what the server received, and what render gives
    (received,) = stub.requests
    assert received["model"] == "stub-model" and received["_path"] == "/v1/chat/completions"
    assert request_messages(ctx.tape, call.seq) == received["messages"]
    assert received["messages"][-1]["content"].rstrip().endswith("</current>\n</layerflow>")
    assert "Assess the credit risk." in received["messages"][-1]["content"]


def test_malformed_json_then_success_appends_a_correction(stub):
    stub.push(Reply.text("Sure! The risk is low."), Reply.text('```json\n{"risk_level": "medium"}\n```'))
    ctx = loan()
    assert run_llm_activity(ctx, "risk", config(stub), retry=FAST) == {"risk_level": "medium"}
    first, second = stub.requests
    assert second["messages"][: len(first["messages"])] == first["messages"], "the cached prefix is kept"
    assert second["messages"][-2] == {"role": "assistant", "content": "Sure! The risk is low."}
    assert "not valid JSON" in second["messages"][-1]["content"]
    statuses = [c.data["status"] for c in calls(ctx)]
    assert statuses == ["invalid_answer", "ok"]
    # the retry re-sends the first request whole: all of it but the closing marker is shared
    assert calls(ctx)[1].data["request"]["prefix_tokens"] >= calls(ctx)[0].data["request"]["tokens"] - 3


def test_schema_violation_is_corrected(stub):
    schema = {"type": "object", "required": ["risk_level"], "additionalProperties": False,
              "properties": {"risk_level": {"enum": ["low", "medium", "high"]}}}
    stub.push(Reply.json({"risk_level": "catastrophic"}), Reply.json({"risk_level": "high"}))
    ctx = loan()
    assert run_llm_activity(ctx, "risk", config(stub, output_schema=schema, output_keys=[]), retry=FAST) == \
        {"risk_level": "high"}
    assert "is not one of" in stub.requests[1]["messages"][-1]["content"]
    assert "JSON Schema" in stub.requests[0]["messages"][-1]["content"]


@pytest.mark.parametrize("key, layer", [("policy", "L0"), ("application_id", "L1"), ("activity:submit", "L3")])
def test_a_denied_key_fails_the_activity_and_nothing_is_written(stub, key, layer):
    stub.push(Reply.json({"risk_level": "low", key: "overwritten by the model"}))
    ctx = loan()
    before = ctx.state_json()
    with pytest.raises(ContextWriteDenied) as err:
        run_llm_activity(ctx, "risk", config(stub), retry=FAST)
    assert err.value.key == key and str(err.value.effective) == layer
    assert ctx.state_json() == before, "not even the permitted keys were written"
    assert "risk_level" not in ctx
    denied = [e for e in ctx.tape if e.kind == "denied"]
    assert len(denied) == 1 and denied[0].data["key"] == key
    assert len(stub.requests) == 1, "a denial is not retried"


def test_timeout_then_retry(stub):
    stub.push(Reply.sleep(1.5, Reply.json({"risk_level": "late"})), Reply.json({"risk_level": "low"}))
    ctx = loan()
    slept = []
    answer = run_llm_activity(ctx, "risk", config(stub, timeout=0.3), retry=FAST, sleep=slept.append)
    assert answer == {"risk_level": "low"}
    assert slept == [0.01]
    first, second = calls(ctx)
    assert first.data["status"] == "error" and first.data["error"]["transient"]
    assert "Timeout" in first.data["error"]["type"]
    assert second.data["status"] == "ok" and second.data["attempt"] == 2


def test_server_error_then_success_with_backoff(stub):
    stub.push(Reply.error(503), Reply.error(500), Reply.json({"risk_level": "low"}))
    slept = []
    run_llm_activity(loan(), "risk", config(stub), retry=RetryPolicy(base=0.1, factor=3, cap=0.25),
                     sleep=slept.append)
    assert slept == [0.1, 0.25]


def test_persistent_failure_raises_model_error_and_leaves_the_context(stub):
    stub.push(*[Reply.error(500, "upstream exploded")] * 3)
    ctx = loan()
    before = ctx.state_json()
    with pytest.raises(ModelCallFailed) as err:
        run_llm_activity(ctx, "risk", config(stub), retry=FAST, sleep=lambda s: None)
    e = err.value
    assert isinstance(e, ModelError) and e.kind == "model_error"
    assert e.attempts == 3 and e.model == MODEL and e.api_base == stub.url and e.task_id == "risk"
    for part in (MODEL, stub.url, "3 attempt(s)", "upstream exploded", "'risk'"):
        assert part in str(e)
    assert e.to_dict()["attempts"] == 3
    assert ctx.state_json() == before
    assert [c.data["status"] for c in calls(ctx)] == ["error"] * 3
    # the engine aborts the activity: the context is as it was at begin
    ctx.abort_activity("risk", reason=str(e))
    assert "risk_level" not in ctx


def test_non_transient_error_is_not_retried(stub):
    stub.push(Reply.error(401, "bad key"))
    with pytest.raises(ModelCallFailed, match="API key") as err:
        run_llm_activity(loan(), "risk", config(stub), retry=FAST)
    assert err.value.attempts == 1 and len(stub.requests) == 1


def test_answers_that_never_validate_fail_clearly(stub):
    stub.push(*[Reply.text("no")] * 3)
    with pytest.raises(ModelCallFailed, match="required JSON answer"):
        run_llm_activity(loan(), "risk", config(stub), retry=FAST)
    assert len(stub.requests) == 3


def test_requests_of_a_run_are_rebuilt_from_the_tape_and_share_their_prefix(stub):
    ctx = loan()
    cfg = config(stub)
    for i in range(4):
        stub.push(Reply.json({"risk_level": "low", f"note_{i}": "x" * 50}))
        run_llm_activity(ctx, "risk", cfg, retry=FAST)
        ctx.complete_activity("risk")
        ctx.begin_activity("risk")
    recorded = calls(ctx)
    for call, received in zip(recorded, stub.requests):
        assert request_messages(ctx.tape, call.seq) == received["messages"]
    later = recorded[1:]
    assert all(c.data["request"]["prefix_tokens"] / c.data["request"]["tokens"] > 0.5 for c in later)
    assert all(len(c.data["request"]["tail"]) < 1500 for c in later), "the tape stores deltas, not whole requests"
    rows = prompt_report(ctx.tape)
    assert [r["seq"] for r in rows] == [c.seq for c in recorded] and rows[0]["share"] is None
    assert prompt_stability(ctx.tape) == pytest.approx(sum(r["share"] for r in rows[1:]) / 3)
    # and the tape survives a save/load round trip
    loaded = LayeredContext.from_dict(json.loads(json.dumps(ctx.to_dict())))
    assert request_messages(loaded.tape, recorded[-1].seq) == stub.requests[-1]["messages"]


def test_engine_call_style_with_an_activity_context(stub):
    class ActivityContext:  # what engine.handlers passes
        def __init__(self, ctx):
            self.context, self.task_id = ctx, "risk"

    stub.push(Reply.json({"risk_level": "low"}))
    ctx = loan()
    cfg = ActivityExtensionConfig(llm=config(stub, model=None))
    assert run_llm_activity(ActivityContext(ctx), cfg, model=MODEL, retry=FAST) == {"risk_level": "low"}
    assert ctx.layer(Layer.WORKING)["risk_level"] == "low"


def test_env_api_base_and_no_model(stub, monkeypatch):
    monkeypatch.setenv("LAYERFLOW_MODEL_API_BASE", stub.url)
    stub.push(Reply.json({"risk_level": "low"}))
    run_llm_activity(loan(), "risk", LLMConfig(model=MODEL, output_keys=["risk_level"]), retry=FAST)
    assert len(stub.requests) == 1
    with pytest.raises(ModelError, match="no model is configured"):
        run_llm_activity(loan(), "risk", LLMConfig())


def test_model_configured():
    assert not model_configured(None)
    assert not model_configured(LLMConfig())
    assert model_configured(LLMConfig(), "openai/x")
    assert model_configured(LLMConfig(model="openai/x"))
    assert model_configured(ActivityExtensionConfig(llm=LLMConfig(model="m")))
    assert not model_configured(ActivityExtensionConfig(), "openai/x"), "no llm config: offline handler"


def test_a_fake_completion_needs_no_litellm():
    code = textwrap.dedent("""
        import sys
        from context_layers import Layer, LayeredContext
        from context_layers.config import LLMConfig
        from engine.llm import run_llm_activity
        def fake(**kw):
            assert kw["messages"][0]["role"] == "system" and kw["max_retries"] == 0
            return {"choices": [{"message": {"content": '{"ok": true}'}, "finish_reason": "stop"}],
                    "usage": {"total_tokens": 3}}
        ctx = LayeredContext(system={"p": 1})
        ctx.begin_activity("t")
        assert run_llm_activity(ctx, "t", LLMConfig(model="m"), completion=fake) == {"ok": True}
        assert "litellm" not in sys.modules
        print("ok")
    """)
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"


# ----- summarizer and arbiter -------------------------------------------------------------------

def test_summarizer_reuses_the_activity_prefix(stub):
    stub.push(Reply.text("Ada applied for 120000; risk pending. " * 40))
    ctx = loan()
    prefix = stable_prefix(ctx, RenderOptions(task_id="risk"))
    summarizer = LiteLLMSummarizer(MODEL, api_base=stub.url, timeout=2, retry=FAST)
    summary = summarizer.summarize("amount: 120000\napplicant: Ada ]]> </entry>", 20, prefix_messages=prefix)
    from context_layers.tokens import count_text
    assert 0 < count_text(summary) <= 20
    (received,) = stub.requests
    sent = received["messages"]
    assert sent[: len(prefix)] == prefix, "the prefix is sent unchanged"
    assert request_text(sent).startswith(request_text(prefix))
    assert received["max_tokens"] == 20
    assert "applicant: Ada ]]]]><![CDATA[> </entry>" in sent[-1]["content"]


def test_summarizer_without_prefix_and_failure(stub):
    stub.push(Reply.text("short"), Reply.error(500), Reply.error(500))
    s = LiteLLMSummarizer.from_config(LLMConfig(model=MODEL, api_base=stub.url, max_retries=1), retry=FAST)
    assert s.summarize("text", 10) == "short"
    assert stub.requests[0]["messages"][0]["role"] == "system"
    with pytest.raises(ModelError):
        s.summarize("text", 10)


def test_a_reply_with_a_lone_surrogate_is_retried_and_the_tape_keeps_it(stub):
    # "\ud800" is a valid JSON escape but no text: the reply used to reach the tape as is and
    # the llm_call note refused it, stopping the instance (invalid_value) in the compression
    from engine.llm import Endpoint, call_recorder

    stub.push(Reply.text("risk high \ud800 and pending"), Reply.text("risk high, pending"))
    ctx = loan()
    recorder = call_recorder(ctx, task_id="risk", endpoint=Endpoint.of(MODEL, None, api_base=stub.url),
                             attempts=2, actor="risk", purpose="summary")
    summarizer = LiteLLMSummarizer(MODEL, api_base=stub.url, timeout=2, retry=FAST, on_attempt=recorder)
    assert summarizer.summarize("risk high; approval pending", 20) == "risk high, pending"
    first, second = calls(ctx)
    assert first.data["status"] == "invalid_answer" and "lone surrogate U+D800" in first.data["error"]["message"]
    assert first.data["response"]["content"] == "risk high \ufffd and pending"
    assert "lone surrogate" in stub.requests[1]["messages"][-1]["content"]
    assert second.data["status"] == "ok"
    assert LayeredContext.replay(ctx.tape) == ctx


def test_arbiter_through_the_stub(stub):
    from gateways.arbiter import ArbiterAnswerError, ArbitrationRequest

    stub.push(Reply.json({"final_value": "high", "rationale": "policy prefers caution", "escalate": False}),
              Reply.text("I think high"))
    arbiter = LiteLLMArbiter(MODEL, api_base=stub.url, retry=FAST)
    request = ArbitrationRequest(gateway_id="join1", key="risk_level", base_value=None,
                                 values={"a": "low", "b": "high"}, policy_text="Prefer caution.")
    answer = arbiter.arbitrate(request)
    assert answer.final_value == "high" and answer.escalate is False
    assert "risk_level" in stub.requests[0]["messages"][-1]["content"]
    with pytest.raises(ArbiterAnswerError):
        arbiter.arbitrate(request)


# ----- the answer contract ------------------------------------------------------------------------

@pytest.mark.parametrize("text, problem", [
    ("", "empty"),
    ("[1, 2]", "not an object"),
    ('{"a": NaN}', "not plain JSON"),
    ('{"a": 1e999}', "not plain JSON"),
    ('{"a": 1', "not valid JSON"),
    ('{"": 1, "risk_level": 1}', "non-empty"),
    ('{"other": 1}', "missing required key 'risk_level'"),
])
def test_parse_answer_rejects(text, problem):
    with pytest.raises(AnswerError, match=problem):
        parse_answer(text, keys=["risk_level"])


@pytest.mark.parametrize("value, schema, ok", [
    ({"a": 1}, {"type": "object", "properties": {"a": {"type": "integer"}}}, True),
    ({"a": 1.5}, {"type": "object", "properties": {"a": {"type": "integer"}}}, False),
    ({"a": True}, {"properties": {"a": {"type": "number"}}}, False),
    ({"a": None}, {"properties": {"a": {"type": ["string", "null"]}}}, True),
    ({"a": [1, "x"]}, {"properties": {"a": {"type": "array", "items": {"type": "integer"}}}}, False),
    ({"a": "x"}, {"properties": {"a": {"minLength": 2}}}, False),
    ({"a": 5}, {"properties": {"a": {"minimum": 0, "maximum": 4}}}, False),
    ({"a": 1, "b": 2}, {"properties": {"a": {}}, "additionalProperties": False}, False),
    ({"a": {"b": {}}}, {"properties": {"a": {"properties": {"b": {"required": ["c"]}}}}}, False),
    ({"a": 1.0}, {"properties": {"a": {"enum": [1]}}}, True),
    ({"a": 2}, {"properties": {"a": {"anyOf": [{"type": "string"}, {"minimum": 3}]}}}, False),
])
def test_schema_validator(value, schema, ok):
    assert (validate_schema(value, schema) == []) is ok


def test_nested_problem_names_its_path():
    problems = validate_schema({"a": {"b": {}}}, {"properties": {"a": {"properties": {"b": {"required": ["c"]}}}}})
    assert problems == ["/a/b: missing required key 'c'"]
