"""Compression after an activity when the engine has a model (engine.model_compression), through
litellm's real HTTP client against the stub server (tests/stub_llm.py): the model's summaries on
the activity's own request prefix, the model's compression plan (run, or rejected and replaced by
the rules), the rules when the server is down; and offline, the rules without importing litellm."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from context_layers import Layer, LayeredContext
from context_layers.compression_plan import PROMPT_SYSTEM
from context_layers.summarize import SUMMARY_INSTRUCTION
from context_layers.tokens import count_text
from engine import Engine, load_process
from engine.llm import activity_request, request_messages
from engine_helpers import ROOT, script_task, write_process
from stub_llm import Reply, StubLLM

MODEL = "openai/stub-model"
APPLICANT = {"applicant_id": "APP-7"}
WORDS = ["income", "credit", "tax", "employment", "housing", "insurance", "collateral", "reference", "fraud", "sanctions"]
STEPS = [f"Step {i}: checked the {w} records of applicant APP-7 against the bank's {w} policy; nothing unusual "
         f"in period {i}." for i, w in enumerate(WORDS * 2)]
NOTES = " ".join(f"Market note {i}: the regional bakery sector grew {i} percent with stable margins." for i in range(12))

GATHER = script_task("gather", f"risk_score = 42\nreasoning_chain = {{'kind': 'reasoning_chain', 'steps': {STEPS!r}}}")
RESEARCH = script_task("research", f"market_notes = {NOTES!r}")
ASSESS_LLM = '<bpmn:task id="assess" name="Assess the risk"/>'
ASSESS_SCRIPT = script_task("assess", "risk_level = 'low'")
SUMMARIZE_RULE = "    - {pattern: reasoning_chain, action: summarize, maxTokens: 40}\n"


def config(*, llm: bool = True, planner: str = "rules", rules: bool = True, threshold: int = 800) -> str:
    text = ("assess:\n"
            "  preserveKeys: [risk_score, risk_level]\n"
            f"  compressTokenThreshold: {threshold}\n"
            f"  contextStrategy: {{compressionPlanner: {planner}}}\n")
    if rules:
        text += "  compressRules:\n" + SUMMARIZE_RULE
    if llm:
        text += ("  llm:\n"
                 "    instructions: Assess the credit risk of the applicant.\n"
                 "    outputKeys: [risk_level]\n"
                 "    maxRetries: 1\n"
                 "    timeout: 5\n")
    return text


def run(tmp_path: Path, cfg: str, *, llm: bool = True, model: str | None = MODEL) -> Any:
    path = write_process(tmp_path, "model_compression", [GATHER, RESEARCH, ASSESS_LLM if llm else ASSESS_SCRIPT], cfg)
    process = load_process(path)
    instance = Engine("memory://", model=model).run_process(process, APPLICANT)
    assert instance.status == "completed", instance.error
    return instance, process


def notes(ctx: LayeredContext, name: str) -> list[Any]:
    return [e for e in ctx.tape if (e.data or {}).get("note") == name]


def llm_calls(ctx: LayeredContext, purpose: str | None = None) -> list[Any]:
    return [e for e in notes(ctx, "llm_call") if e.data.get("purpose") == purpose]


def at(ctx: LayeredContext, seq: int) -> LayeredContext:
    """The context as it was just before tape event ``seq``."""
    return LayeredContext.replay(list(ctx.tape), until=seq - 1)


def closed_port_url() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}/v1"


@pytest.fixture
def stub(monkeypatch):
    monkeypatch.setenv("LAYERFLOW_MODEL_API_KEY", "test-key")
    monkeypatch.setenv("LAYERFLOW_RETRY_BASE_DELAY", "0.01")
    with StubLLM() as server:
        monkeypatch.setenv("LAYERFLOW_MODEL_API_BASE", server.url)
        yield server


# ----- summaries ----------------------------------------------------------------------------------

LONG_SUMMARY = ("APP-7: income, credit, tax, employment, housing, insurance, collateral, references, fraud and "
                "sanctions checks all clean over twenty periods; nothing unusual was found in any record, and the "
                "applicant's file is complete. " * 3)


@pytest.mark.parametrize("answer", ["APP-7: all twenty checks clean.", LONG_SUMMARY], ids=["fits", "cut-to-fit"])
def test_a_summarize_rule_is_served_by_the_model_on_the_activity_prefix(tmp_path, stub, answer):
    stub.push(Reply.json({"risk_level": "low"}), Reply.text(answer))
    instance, process = run(tmp_path, config())
    ctx = instance.main
    assert len(stub.requests) == 2
    activity_req, summary_req = stub.requests

    (call,) = llm_calls(ctx, "summary")
    sent = summary_req["messages"]
    # the request is the activity's normal request, byte for byte, as it was when the summary was asked for...
    assert sent[:-1] == activity_request(at(ctx, call.seq), "assess", process.config("assess").llm)
    # ...and the activity's own earlier request shares its head (provider caches serve it)
    assert sent[0] == activity_req["messages"][0]
    assert call.data["request"]["prefix_tokens"] > 0.5 * call.data["request"]["tokens"]
    # the instruction comes last, with the entry to summarize
    assert sent[-1]["role"] == "user"
    assert sent[-1]["content"].startswith(SUMMARY_INSTRUCTION.format(max_tokens=40))
    assert STEPS[7] in sent[-1]["content"]
    assert summary_req["max_tokens"] == 40
    # recorded like an activity's call: the exact request, the response, the usage
    assert request_messages(ctx.tape, call.seq) == sent
    assert call.data["status"] == "ok" and call.data["usage"]["total_tokens"] == 18
    assert call.data["task_id"] == "assess" and call.actor == "assess"

    entry = ctx.layer(Layer.HISTORY)["reasoning_chain"]
    summary = entry["summary"]
    assert entry["_compressed"] == "summarize" and entry["kind"] == "reasoning_chain"
    # the budget is a hard limit: a longer answer is cut at a token boundary to fit
    assert 0 < count_text(summary) <= 40
    assert summary == answer.strip() if count_text(answer) <= 40 else answer.startswith(summary)
    (record,) = instance.compressions
    assert record["activity_id"] == "assess" and record["source"] == "rules" and "token_threshold" in record["triggers"]
    assert ctx.layer(Layer.HISTORY)["risk_score"] == 42 and ctx.layer(Layer.HISTORY)["risk_level"] == "low"


# ----- the model's plan -----------------------------------------------------------------------------

def test_a_valid_plan_is_executed(tmp_path, stub):
    plan = {"summarize": ["research"], "keep_points": ["bakery sector grew, margins stable"], "drop": [],
            "max_tokens": 30}
    stub.push(Reply.json({"risk_level": "low"}), Reply.json(plan), Reply.text("Twelve market notes: steady growth."))
    instance, _ = run(tmp_path, config(planner="model", rules=False))
    ctx = instance.main
    assert len(stub.requests) == 3
    plan_req = stub.requests[1]["messages"]
    assert plan_req[0] == {"role": "system", "content": PROMPT_SYSTEM}
    assert '"risk_level"' in plan_req[1]["content"] and '"risk_score"' in plan_req[1]["content"]
    (plan_call,) = llm_calls(ctx, "compression_plan")
    assert plan_call.data["agent"] == MODEL + "#compression_plan" and plan_call.data["status"] == "ok"
    assert request_messages(ctx.tape, plan_call.seq) == plan_req
    (summary_call,) = llm_calls(ctx, "summary")  # the compaction summary of the folded activity

    (record,) = instance.compressions
    assert record["source"] == "plan" and record["compaction_key"] == "compaction:1"
    history = ctx.layer(Layer.HISTORY)
    assert "market_notes" not in history and "activity:research" not in history
    compaction = history["compaction:1"]
    assert compaction["covers"] == ["activity:research"]
    assert compaction["summary"] == "- bakery sector grew, margins stable\nTwelve market notes: steady growth."
    assert history["risk_score"] == 42 and history["risk_level"] == "low" and "reasoning_chain" in history
    assert not notes(ctx, "compression_fallback") and not notes(ctx, "compression_plan_rejected")
    assert plan_call.seq < summary_call.seq < record["event_seq"]


def test_a_plan_that_drops_a_preserved_key_is_rejected_and_the_rules_run(tmp_path, stub):
    bad = {"summarize": ["research"], "keep_points": [], "drop": ["risk_score"]}
    stub.push(Reply.json({"risk_level": "low"}), Reply.json(bad), Reply.text("Gathered: all checks clean."))
    instance, _ = run(tmp_path, config(planner="model", rules=False))
    ctx = instance.main
    (rejected,) = notes(ctx, "compression_plan_rejected")
    assert rejected.data["keys"] == ["risk_score"] and rejected.data["reasons"] == {"risk_score": "preserved"}
    (fallback,) = notes(ctx, "compression_fallback")
    assert fallback.data["reason"] == "plan_rejected" and fallback.data["fallback"] == "rules"
    assert rejected.seq < fallback.seq
    (record,) = instance.compressions
    assert record["source"] == "rules" and any("plan was rejected" in n for n in record["notes"])
    history = ctx.layer(Layer.HISTORY)
    assert history["risk_score"] == 42 and history["risk_level"] == "low"
    # the rules' cliff folded the oldest activity; its summary still came from the model
    assert history["compaction:1"]["covers"] == ["activity:gather"]
    assert history["compaction:1"]["summary"] == "Gathered: all checks clean."
    assert len(llm_calls(ctx, "summary")) == 1 and len(stub.requests) == 3


# ----- the model fails --------------------------------------------------------------------------------

@pytest.mark.parametrize("planner", ["model", "rules"])
def test_server_down_the_rules_run_and_the_tape_says_so(tmp_path, monkeypatch, planner):
    monkeypatch.setenv("LAYERFLOW_MODEL_API_KEY", "test-key")
    monkeypatch.setenv("LAYERFLOW_RETRY_BASE_DELAY", "0.01")
    monkeypatch.setenv("LAYERFLOW_MODEL_API_BASE", closed_port_url())
    instance, _ = run(tmp_path, config(llm=False, planner=planner), llm=False)
    ctx = instance.main
    purpose = "compression_plan" if planner == "model" else "summary"
    failed = llm_calls(ctx, purpose)
    assert len(failed) == 3 and all(c.data["status"] == "error" and c.data["error"]["transient"] for c in failed)
    # after the first failed call nothing more is asked of the model in this compression
    assert not llm_calls(ctx, "summary" if planner == "model" else "compression_plan")
    if planner == "model":
        (fallback,) = notes(ctx, "compression_fallback")
        assert fallback.data["reason"] == "model_failed" and "ModelCallFailed" in fallback.data["error"]
    else:
        (failure,) = notes(ctx, "compression_model_failed")
        assert failure.data["purpose"] == "summary" and failure.data["fallback"] == "extractive"
    (shown,) = instance.to_document()["model_fallbacks"]
    assert shown["purpose"] == ("compression_plan" if planner == "model" else "compression_summary")
    assert shown["fallback"] == ("rules" if planner == "model" else "extractive")
    assert "ModelCallFailed" in shown["error"] and shown["context"] == "main"
    (record,) = instance.compressions
    assert record["source"] == "rules" and record["tokens_after"] < record["tokens_before"]
    assert (planner == "model") is any("the rules ran instead" in n for n in record["notes"])
    summary = ctx.layer(Layer.HISTORY)["reasoning_chain"]["summary"]
    assert 0 < count_text(summary) <= 40 and "APP-7" in summary  # the extractive summary
    assert ctx.layer(Layer.HISTORY)["risk_score"] == 42


# ----- offline -------------------------------------------------------------------------------------------

def test_offline_the_rules_run_and_litellm_is_never_imported(tmp_path):
    path = write_process(tmp_path, "model_compression", [GATHER, RESEARCH, ASSESS_SCRIPT],
                         config(llm=False, planner="model"))
    code = textwrap.dedent(f"""
        import json, sys
        from engine import Engine, load_process
        instance = Engine("memory://").run_process(load_process({str(path)!r}), {APPLICANT!r})
        print(json.dumps({{"status": instance.status, "compressions": instance.compressions,
                          "litellm": "litellm" in sys.modules, "engine.llm": "engine.llm" in sys.modules,
                          "calls": [e.data.get("note") for e in instance.main.tape
                                    if e.data.get("note") in ("llm_call", "compression_fallback")]}}))
    """)
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                         env={**_clean_env(), "PYTHONPATH": str(ROOT)})
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    assert doc["status"] == "completed" and not doc["litellm"] and not doc["engine.llm"] and doc["calls"] == []
    (record,) = doc["compressions"]
    assert record["source"] == "rules" and record["rules"][0]["entries"] == 1
    assert any("no model is configured" in n for n in record["notes"]), "the planner asked for says why it did not run"


def _clean_env() -> dict[str, str]:
    import os

    return {k: v for k, v in os.environ.items() if not k.startswith("LAYERFLOW_MODEL")}


def test_the_model_summarizes_the_rest_and_the_kept_lines_stay_verbatim(tmp_path, stub):
    """What an extract_keys rule kept of the folded tool results is carried in the compaction's
    ``kept`` as it is; the model is asked to summarize only the rest (and never sees the lines in
    the text to summarize), and its summary is the record's ``summary``."""
    results = "".join(f"tool_call_result_{i} = {{'status': 'ok', 'data': {{'id': 'BUR-{i}', "
                      f"'raw': 'bureau record ' * 60}}}}\n" for i in (1, 2))
    gather = script_task("gather", f"risk_score = 42\n{results}"
                                   f"reasoning_chain = {{'kind': 'reasoning_chain', 'steps': {STEPS!r}}}")
    cfg = config(rules=False) + ("  compressRules:\n"
                                 "    - {pattern: tool_call_result, action: extract_keys, extractKeys: [status, data.id]}\n")
    stub.push(Reply.json({"risk_level": "low"}), Reply.text("Gathered: twenty checks, all clean."))
    path = write_process(tmp_path, "model_compression", [gather, RESEARCH, ASSESS_LLM], cfg)
    instance = Engine("memory://", model=MODEL).run_process(load_process(path), APPLICANT)
    assert instance.status == "completed", instance.error
    ctx = instance.main
    record = ctx.layer(Layer.HISTORY)["compaction:1"]
    assert record["covers"][0] == "activity:gather"
    assert record["kept"] == ["tool_call_result_1: data.id: BUR-1; status: ok",
                              "tool_call_result_2: data.id: BUR-2; status: ok"]
    assert record["summary"] == "Gathered: twenty checks, all clean."
    (call,) = llm_calls(ctx, "summary")
    asked = request_messages(ctx.tape, call.seq)[-1]["content"]
    assert asked.startswith(SUMMARY_INSTRUCTION.split("{")[0]) and STEPS[0] in asked and "BUR-" not in asked
    (compression,) = instance.compressions
    assert record["tokens_after"] == compression["tokens_after"] < compression["tokens_before"]
    assert LayeredContext.replay(ctx.tape) == ctx
