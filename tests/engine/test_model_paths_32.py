"""Round 32 on the model paths: a claims triage (tests/engine/model32/) no earlier round ran, every
model call through litellm's real HTTP client to the local stub server (tests/stub_llm.py).

``intake`` (a script) -> ``triage_split`` -> ``fraud_screen`` (a model step with an ``outputSchema``) and
``coverage_check`` (a model step with ``outputKeys``) in parallel; both write ``recommendation``, differently
-> ``triage_join`` (no policy: the model arbitrates) -> ``settle`` (a model step with the governance tools,
KNOWLEDGE hits from ``knowledge/claims_rules``, preserved keys and a ``summarize`` rule the model writes).

What DESIGN.md and README.md lead a user to expect, and this round found missing (each test failed on main):

* a reply cut off at ``max_tokens`` (``finish_reason: "length"``) is told to the model as such, and the
  activity's error says so and what to do (raise ``llm.maxTokens`` / ``model_limits.max_output_tokens``),
  instead of "not valid JSON ... use a stronger model";
* a 429/503 whose server says when to come back (``Retry-After``, ``retry-after-ms``) is retried after that
  wait, not after the shorter backoff that would only be refused again; a wait longer than a step may block
  fails the step at once, naming it and saying to resume later;
* a model configured with no API key is not a server that cannot be reached: litellm reports it as an
  HTTP 500, which was retried with backoff and told the user to check the server; it is one attempt, and
  the error names ``LAYERFLOW_MODEL_API_KEY``.
"""

from __future__ import annotations

import email.utils
import json
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from context_layers import Layer, LayeredContext
from context_layers.config import LLMConfig
from engine import Engine, load_process
from engine.llm import ModelCallFailed, RetryPolicy, load_litellm, run_llm_activity

from stub_llm import Reply, StubLLM

HERE = Path(__file__).resolve().parent / "model32"
CLAIMS = HERE / "claims_triage.bpmn"
MODEL = "openai/stub-model"
START = {"claim_no": 77, "incident": "burst pipe", "claimant": "Bo Ekdahl"}

FRAUD = Reply.json({"recommendation": "refer", "fraud_note": "filed 5 days after the policy start"})
COVERAGE = Reply.json({"recommendation": "pay", "coverage_note": "a burst pipe is covered"})
ARBITER = Reply.json({"final_value": "refer", "rationale": "fraud signals go to the SIU first", "escalate": False})
SETTLE = Reply.json({"payout": 0, "settlement_note": "referred to the special investigations unit"})
SUMMARY = Reply.text("The adjuster saw water, smoke, roof and window damage in the kitchen, attic and garage.")
ANSWER = LLMConfig(instructions="Settle the claim. Answer with payout.", max_retries=1, timeout=2,
                   output_schema={"type": "object", "required": ["payout"],
                                  "properties": {"payout": {"type": "integer", "minimum": 0}}})


@pytest.fixture
def stub(monkeypatch: pytest.MonkeyPatch) -> Any:
    with StubLLM(default=SUMMARY) as server:
        monkeypatch.setenv("LAYERFLOW_MODEL_API_BASE", server.url)
        monkeypatch.setenv("LAYERFLOW_MODEL_API_KEY", "test-key")
        monkeypatch.setenv("LAYERFLOW_RETRY_BASE_DELAY", "0.01")
        yield server


def _cut(content: str) -> Reply:
    return Reply(content=content, finish_reason="length")


def _notes(ctx: LayeredContext) -> list[dict[str, Any]]:
    return [dict(e.data) for e in ctx.tape if (e.data or {}).get("note") == "llm_call"]


def _activity(**limits: int) -> LayeredContext:
    ctx = LayeredContext(system={"policy": "Pay covered water damage.", **({"model_limits": limits} if limits else {})})
    ctx.begin_activity("settle")
    return ctx


# ===== the whole triage through litellm ===========================================================

def _cli(*args: str) -> tuple[int, dict[str, Any]]:
    """``layerflow ARGS --json`` in this process (click's runner, stdin no terminal)."""
    from click.testing import CliRunner

    from engine.cli import main
    result = CliRunner(env={"LAYERFLOW_STORE": None}).invoke(main, [*args, "--json"], input="", prog_name="layerflow",
                                                             catch_exceptions=False)
    return result.exit_code, json.loads(result.stdout)


def test_the_triage_runs_through_litellm_and_inspect_counts_the_tokens_run_reported(stub: Any, tmp_path: Path) -> None:
    stub.push(FRAUD, COVERAGE, ARBITER, SETTLE)
    store = f"sqlite:///{tmp_path / 'runs.db'}"
    code, doc = _cli("run", str(CLAIMS), "--data", json.dumps(START), "--store", store, "--model", MODEL)
    assert (code, doc["status"], doc["error"]) == (0, "completed", None), doc["error"]
    [conflict] = doc["conflicts"]
    assert conflict["values"] == {"fraud_screen": "refer", "coverage_check": "pay"}, conflict
    assert (conflict["resolution"]["value"], conflict["resolution"]["resolver"]) == ("refer", "model"), conflict
    assert doc["layers"]["L3"]["payout"] == 0 and doc["layers"]["L3"]["claim_ref"] == "CLM-77"   # preserved
    assert doc["model_fallbacks"] == [], doc["model_fallbacks"]
    [compression] = doc["compressions"]
    assert compression["activity_id"] == "settle" and compression["tokens_after"] < compression["tokens_before"]
    # settle read the knowledge hits late, after HISTORY
    settle = next(r for r in stub.requests if "tools" in r)
    user = settle["messages"][1]["content"]
    assert user.index("</history>") < user.index('collection="claims_rules"') < user.index("<task")
    # inspect counts what run --json reported, layer by layer
    code, inspected = _cli("inspect", doc["instance_id"], "--store", store)
    assert code == 0 and inspected["tokens"] == doc["tokens"], (inspected["tokens"], doc["tokens"])
    assert doc["tokens"]["total"] == sum(v for k, v in doc["tokens"].items() if k != "total")


# ===== a reply cut off at max_tokens ===============================================================

def test_a_reply_cut_at_max_tokens_is_named_as_cut_to_the_model_and_in_the_error(stub: Any) -> None:
    stub.push(_cut('{"payout": 12'), _cut('{"payout": 1200, "no'))
    ctx = _activity(max_output_tokens=40)
    with pytest.raises(ModelCallFailed) as failed:
        run_llm_activity(ctx, "settle", ANSWER, model=MODEL)
    message = str(failed.value)
    assert "'settle'" in message and "cut off" in message and "40" in message, message
    assert "llm.maxTokens" in message and "max_output_tokens" in message, message
    assert "stronger model" not in message, message
    # the corrective turn tells the model why, so it can answer shorter instead of repeating itself
    correction = stub.requests[1]["messages"][-1]["content"]
    assert "cut off" in correction and "40 tokens" in correction and "shorter" in correction, correction
    assert [n["response"]["finish_reason"] for n in _notes(ctx)] == ["length", "length"]
    assert [n["status"] for n in _notes(ctx)] == ["invalid_answer", "invalid_answer"]
    assert dict(ctx.layer(Layer.WORKING)) == {}                                   # nothing half-written


def test_a_cut_reply_then_a_whole_one_is_taken(stub: Any) -> None:
    stub.push(_cut('{"payout": 12'), Reply.json({"payout": 1200}))
    ctx = _activity()
    assert run_llm_activity(ctx, "settle", ANSWER, model=MODEL) == {"payout": 1200}
    correction = stub.requests[1]["messages"][-1]["content"]
    # no max_tokens was sent: the model's own limit cut it
    assert "cut off at the model's answer token limit" in correction, correction
    assert ctx.layer(Layer.WORKING)["payout"] == 1200


def test_the_engine_stops_the_branch_whose_reply_was_cut_naming_the_activity(stub: Any) -> None:
    stub.push(_cut('{"recommendation": "refer", "fraud_note": "the claimant'),
              _cut('{"recommendation": "refer", "fraud_note": "the claimant filed'))
    done = Engine("memory://", model=MODEL).run_process(load_process(CLAIMS), START)
    assert done.status == "error", done.status
    error = done.to_document()["error"]
    assert error["task_id"] == "fraud_screen" and "cut off" in error["message"], error
    assert "llm.maxTokens" in error["message"], error


# ===== Retry-After ==============================================================================

@pytest.mark.parametrize("headers, waited", [
    pytest.param((("Retry-After", "3"),), 3.0, id="seconds"),
    pytest.param((("retry-after-ms", "2500"),), 2.5, id="milliseconds"),
    pytest.param((("Retry-After", "0.001"),), 0.5, id="shorter-than-the-backoff"),
])
def test_a_rate_limit_is_retried_after_the_wait_the_server_asks_for(stub: Any, headers: Any, waited: float) -> None:
    stub.push(Reply.error(429, "rate limited", headers=headers), Reply.json({"payout": 5}))
    slept: list[float] = []
    ctx = _activity()
    out = run_llm_activity(ctx, "settle", ANSWER, model=MODEL, retry=RetryPolicy(), sleep=slept.append)
    assert out == {"payout": 5} and slept == [waited], slept
    assert [n["status"] for n in _notes(ctx)] == ["error", "ok"]


def test_a_retry_after_given_as_a_date_is_waited_until_then(stub: Any) -> None:
    load_litellm()  # its first import takes seconds: not counted in the wait
    when = email.utils.formatdate(time.time() + 30, usegmt=True)
    stub.push(Reply.error(429, "rate limited", headers=(("Retry-After", when),)), Reply.json({"payout": 5}))
    slept: list[float] = []
    assert run_llm_activity(_activity(), "settle", ANSWER, model=MODEL, retry=RetryPolicy(),
                            sleep=slept.append) == {"payout": 5}
    [waited] = slept
    assert 20 <= waited <= 30, waited


def test_a_wait_longer_than_a_step_may_block_fails_at_once_naming_it(stub: Any) -> None:
    stub.push(Reply.error(503, "overloaded", headers=(("Retry-After", "7200"),)), Reply.json({"payout": 5}))
    slept: list[float] = []
    ctx = _activity()
    with pytest.raises(ModelCallFailed) as failed:
        run_llm_activity(ctx, "settle", ANSWER, model=MODEL, retry=RetryPolicy(), sleep=slept.append)
    message = str(failed.value)
    assert slept == [] and len(stub.requests) == 1, (slept, len(stub.requests))
    assert "'settle'" in message and "Retry-After" in message and "7200" in message, message
    assert "resume" in message, message
    assert dict(ctx.layer(Layer.WORKING)) == {}


# ===== no API key ================================================================================

def test_a_model_without_an_api_key_is_one_attempt_naming_the_variable(stub: Any,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("LAYERFLOW_MODEL_API_KEY")
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    slept: list[float] = []
    ctx = _activity()
    with pytest.raises(ModelCallFailed) as failed:
        run_llm_activity(ctx, "settle", ANSWER, model=MODEL, retry=RetryPolicy(), sleep=slept.append)
    message = str(failed.value)
    assert "LAYERFLOW_MODEL_API_KEY" in message and "after 1 attempt" in message, message
    assert "reachable" not in message, message
    assert slept == [] and stub.requests == []
    [note] = _notes(ctx)
    assert note["error"]["transient"] is False, note["error"]


# ===== the arbiter: the join's llm block and SYSTEM's model_limits ====================================

def _claims(tmp_path: Path, join_llm: dict[str, Any] | None = None, limits: dict[str, int] | None = None,
            free_text: bool = False) -> Any:
    """The triage with the join's ``llm:`` block and SYSTEM's ``model_limits`` set as given
    (``free_text``: fraud_screen's recommendation any string, not one of three words)."""
    config = yaml.safe_load((HERE / "claims_triage.layerflow.yaml").read_text())
    if free_text:
        config["fraud_screen"]["llm"]["outputSchema"]["properties"]["recommendation"] = {"type": "string"}
    if join_llm is not None:
        config["triage_join"]["llm"] = join_llm
    if limits is not None:
        config["system"]["model_limits"] = limits
    path = tmp_path / "claims.layerflow.yaml"
    path.write_text(yaml.safe_dump(config))
    return load_process(CLAIMS, config=path)


def _long(word: str, n: int) -> str:
    return " ".join(f"{word}{i}" for i in range(n))


def test_the_joins_llm_block_sets_the_arbiters_retries(stub: Any, tmp_path: Path) -> None:
    # validate takes an llm: block on the join, and the arbiter's error says to raise llm.maxRetries: the
    # arbiter ran with the defaults (3 attempts, 30 s) whatever the join said
    stub.push(FRAUD, COVERAGE, Reply.error(500), Reply.error(500), Reply.error(500))
    done = Engine("memory://", model=MODEL).run_process(_claims(tmp_path, join_llm={"maxRetries": 0, "timeout": 2}),
                                                         START)
    assert done.status == "waiting", done.error
    [fallback] = done.to_document()["model_fallbacks"]
    assert (fallback["element_id"], fallback["fallback"]) == ("triage_join", "human"), fallback
    assert "after 1 attempt" in fallback["error"], fallback
    assert len(stub.requests) == 3, len(stub.requests)                          # two activities, one arbiter call


def test_the_arbiter_sends_within_systems_model_limits(stub: Any, tmp_path: Path) -> None:
    limits = {"max_context_tokens": 4000, "max_output_tokens": 120}
    stub.push(FRAUD, COVERAGE, ARBITER, SETTLE)
    done = Engine("memory://", model=MODEL).run_process(_claims(tmp_path, limits=limits), START)
    assert done.status == "completed", done.error
    arbiter = stub.requests[2]
    assert "Resolve this conflict" in arbiter["messages"][-1]["content"], arbiter["messages"][-1]
    assert arbiter.get("max_tokens") == 120, arbiter.get("max_tokens")


def test_a_conflict_prompt_over_the_limit_is_not_sent_and_a_person_decides(stub: Any, tmp_path: Path) -> None:
    limits = {"max_context_tokens": 1500, "max_output_tokens": 120}
    # each branch's request fits; the two long answers in one conflict prompt do not
    fraud = Reply.json({"recommendation": "refer: " + _long("signal", 400), "fraud_note": "early"})
    coverage = Reply.json({"recommendation": "pay: " + _long("clause", 400), "coverage_note": "covered"})
    stub.push(fraud, coverage)
    done = Engine("memory://", model=MODEL).run_process(_claims(tmp_path, limits=limits, free_text=True), START)
    assert done.status == "waiting", done.error
    assert len(stub.requests) == 2, [r["messages"][-1]["content"][:80] for r in stub.requests[2:]]
    [fallback] = done.to_document()["model_fallbacks"]
    assert fallback["purpose"] == "conflict_resolution" and fallback["fallback"] == "human", fallback
    assert "model_limits" in fallback["error"] and "was not sent" in fallback["error"], fallback
    [waiting] = done.to_document()["waiting_for"]
    assert waiting["id"] == "triage_join/recommendation", waiting


# ===== an integer the schema asks for, written as 1200.0 ============================================

def test_an_integer_answered_as_a_whole_float_is_written_as_the_integer(stub: Any) -> None:
    # JSON Schema takes 1200.0 as an integer; the context held the float, so a later script's
    # range(payout) failed and the next request showed 1200.0 where the same answer as 1200 showed 1200
    schema = {"type": "object", "required": ["payout", "instalments"],
              "properties": {"payout": {"type": "integer"}, "share": {"type": "number"},
                             "instalments": {"type": "array", "items": {"type": "integer"}}}}
    stub.push(Reply.text('{"payout": 1200.0, "share": 2.0, "instalments": [400.0, 800]}'))
    ctx = _activity()
    cfg = ANSWER.model_copy(update={"output_schema": schema})
    out = run_llm_activity(ctx, "settle", cfg, model=MODEL)
    assert out == {"payout": 1200, "share": 2.0, "instalments": [400, 800]}
    assert type(ctx.resolve("payout")) is int and [type(v) for v in ctx.resolve("instalments")] == [int, int]
    assert type(ctx.resolve("share")) is float                              # a number stays as the model wrote it
    assert list(range(ctx.resolve("payout")))[-1] == 1199


def test_a_conditions_question_is_sent_within_systems_model_limits(stub: Any, tmp_path: Path) -> None:
    # round 16's expense triage: its first step is an XOR gateway whose branches the model reads
    expense = HERE.parent / "model16" / "expense_triage.bpmn"
    config = yaml.safe_load(expense.with_suffix(".layerflow.yaml").read_text())
    config["system"]["model_limits"] = {"max_output_tokens": 60}
    path = tmp_path / "expense.layerflow.yaml"
    path.write_text(yaml.safe_dump(config))
    stub.push(Reply.json({"branch": "manager_review", "rationale": "a taxi is no client dinner"}))
    claim = {"claim_id": "EXP-32", "amount": 80, "receipt_attached": True, "description": "Taxi to the airport"}
    done = Engine("memory://", model=MODEL).run_process(load_process(expense, config=path), claim)
    assert done.status == "completed", done.error
    [question] = stub.requests
    assert question.get("max_tokens") == 60, question.get("max_tokens")
