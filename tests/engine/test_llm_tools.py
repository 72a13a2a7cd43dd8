"""An LLM activity with the governance tools (``llm.tools: true``), end to end through the CLI,
litellm's real HTTP client and the stub server: the seed's sequence inspect -> compress ->
evaluate -> (human_confirm when the density did not improve, else the final answer) runs inside
the activity against the running instance; a human_confirm makes the instance wait with the
activity open, and the activity goes on once a person answered (`layerflow resume --answer`)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from context_layers import Layer, LayeredContext
from context_layers.canonical import thaw
from engine import Engine, load_process
from engine.cli import main
from engine.llm import activity_request, request_messages
from engine.tools import TOOL_MODELS
from engine_helpers import script_task, without_due, write_process
from stub_llm import Reply, StubLLM

MODEL = "openai/stub-model"
KEEP = [{"label": "keep the compression", "value": "keep"}, {"label": "undo it", "value": "undo"}]
STEPS = [f"Step {i}: checked the {w} records of applicant APP-7 against the {w} policy; nothing unusual in "
         f"period {i}." for i, w in enumerate(["income", "credit", "tax", "employment", "housing", "fraud"] * 3)]
NOTES = " ".join(f"Market note {i}: the regional bakery sector grew {i} percent with stable margins." for i in range(12))

PROCESS = [
    script_task("gather", f"risk_score = 42\nreasoning_chain = {{'kind': 'reasoning_chain', 'steps': {STEPS!r}}}"),
    script_task("research", f"market_notes = {NOTES!r}"),
    '<bpmn:task id="review" name="Review the application"/>',
    script_task("archive", "archived = decision"),
]

INSPECT = ("context_inspect", {"layers": ["L3", "L4"], "metrics": ["token_count", "attention_score"]})
EVALUATE = ("context_compress", {"action": "evaluate"})
DECISION = {"decision": "approve", "reason": "all checks clean; context compressed"}


def compress(preserve: list[str]) -> tuple[str, dict[str, Any]]:
    return ("context_compress", {"action": "compress", "target_layers": ["L3"], "preserve_keys": preserve,
                                 "max_tokens": 250})


def config(preserve: list[str]) -> str:
    return ("review:\n"
            f"  preserveKeys: {json.dumps(preserve)}\n"
            "  llm:\n"
            "    tools: true\n"
            "    instructions: Keep the context small, then decide on the application.\n"
            "    outputKeys: [decision]\n"
            "    maxRetries: 1\n"
            "    timeout: 5\n")


def tool_reply(n: int, name: str, arguments: dict[str, Any]) -> Reply:
    body = {"id": f"chatcmpl-tools-{n}", "object": "chat.completion", "created": 1700000000, "model": "stub-model",
            "choices": [{"index": 0, "finish_reason": "tool_calls", "message": {
                "role": "assistant", "content": None,
                "tool_calls": [{"id": f"call_{n}", "type": "function",
                                "function": {"name": name, "arguments": json.dumps(arguments)}}]}}],
            "usage": {"prompt_tokens": 50, "completion_tokens": 10, "total_tokens": 60}}
    return Reply(body=json.dumps(body))


DECIDE = Reply.text("<decide from the evaluation>")
FOLD_SUMMARY = Reply.text("APP-7 passed every records check; the bakery sector grew with stable margins.")


class DecidingStub(StubLLM):
    """The stub, plus one step that reads what the model was sent: after the evaluation, the final
    answer when the density improved, else a human_confirm."""

    def _next(self, body: dict[str, Any]) -> Reply:
        reply = super()._next(body)
        if reply is not DECIDE:
            return reply
        evaluation = json.loads(body["messages"][-1]["content"])
        gain = evaluation.get("density_gain") or 0
        if gain > 0 and evaluation.get("preserved_intact"):
            return Reply.json(DECISION)
        return tool_reply(4, "human_confirm", {
            "type": "compression_review", "options": KEEP, "timeout": 300,
            "message": f"The compression did not raise the density ({gain:+.3f}); keep it?"})


@pytest.fixture
def stub(monkeypatch):
    monkeypatch.setenv("LAYERFLOW_MODEL_API_KEY", "test-key")
    monkeypatch.setenv("LAYERFLOW_RETRY_BASE_DELAY", "0.01")
    with DecidingStub() as server:
        monkeypatch.setenv("LAYERFLOW_MODEL_API_BASE", server.url)
        yield server


@pytest.fixture
def cli(tmp_path: Path, monkeypatch):
    store = f"sqlite:///{tmp_path / 'cli.db'}"
    monkeypatch.setenv("LAYERFLOW_STORE", store)

    def invoke(*args: str) -> tuple[int, dict[str, Any]]:
        result = CliRunner().invoke(main, list(args), catch_exceptions=False)
        return result.exit_code, json.loads(result.stdout)
    invoke.store = store  # type: ignore[attr-defined]
    return invoke


def notes(ctx: LayeredContext, name: str) -> list[Any]:
    return [e for e in ctx.tape if (e.data or {}).get("note") == name]


@pytest.mark.parametrize("preserve, confirm", [(["risk_score"], False), ([], True)],
                         ids=["density-improved-final-answer", "density-flat-human-confirm"])
def test_the_seed_sequence_inside_an_llm_activity(tmp_path, stub, cli, preserve, confirm):
    bpmn = write_process(tmp_path, "tool_review", PROCESS, config(preserve))
    # the compression the model asks for folds HISTORY: the model writes its summary (not a tool turn)
    stub.push(tool_reply(1, *INSPECT), tool_reply(2, *compress(preserve)), FOLD_SUMMARY, tool_reply(3, *EVALUATE),
              DECIDE)
    if confirm:
        stub.push(Reply.json({**DECISION, "reason": "a person kept the compression"}))

    code, doc = cli("run", str(bpmn), "--model", MODEL, "--data", _data(tmp_path), "--json")
    engine = Engine(cli.store)
    if confirm:
        # the instance waits for a person, the activity still open
        assert code == 3 and doc["status"] == "waiting", doc["error"]
        [waiting] = doc["waiting_for"]
        assert without_due([waiting]) == [{"kind": "confirmation", "id": "model:1", "task_id": "review", "key": None,
                                                     "context": "main"}]
        [asked] = doc["confirmations"]
        assert asked["type"] == "compression_review" and asked["requested_by"] == "review" and asked["deadline"]
        held = engine.load(doc["instance_id"])
        assert held.main.current_activity == "review" and "decision" not in held.main
        assert len(stub.requests) == 5
        code, doc = cli("resume", doc["instance_id"], "--model", MODEL, "--answer", "model:1=keep", "--json")
    assert code == 0 and doc["status"] == "completed", doc["error"]
    assert len(stub.requests) == 6 if confirm else 5

    instance = engine.load(doc["instance_id"])
    ctx = instance.main
    # the tool calls, in order, each on the tape with its result
    calls = notes(ctx, "tool_call")
    names = ["context_inspect", "context_compress", "context_compress", *(["human_confirm"] if confirm else [])]
    assert [c.data["tool"] for c in calls] == names
    assert all(c.data["error"] is None and c.actor == "review" and c.activity == "review" for c in calls)
    inspected = json.loads(calls[0].data["result"])
    assert inspected["context"] == "main" and inspected["layers"]["L3"]["token_count"] > 0
    # the compression: a compress event on the running activity's context, in the instance's report
    compressed = json.loads(calls[1].data["result"])
    assert compressed["changed"] and compressed["activity_id"] == "review" and compressed["actor"] == "review"
    [event] = [e for e in ctx.tape if e.data.get("note") == "compress"]
    assert event.activity == "review" and event.data["snapshot_id"] == compressed["snapshot_id"]
    assert instance.compressions[0]["snapshot_id"] == compressed["snapshot_id"]
    evaluation = json.loads(calls[2].data["result"])
    assert evaluation["snapshot_id"] == compressed["snapshot_id"] and evaluation["preserved_intact"]
    assert (evaluation["density_gain"] > 0) is not confirm
    assert "market_notes" not in ctx.layer(Layer.HISTORY) or "reasoning_chain" not in ctx.layer(Layer.HISTORY)
    # the final answer: written by the activity, moved to HISTORY, read by the next task
    final = {**DECISION, "reason": "a person kept the compression"} if confirm else DECISION
    writes = [e for e in ctx.tape if e.kind == "write" and e.activity == "review"]
    assert {e.changes[0][1]: e.changes[0][2] for e in writes} == final
    assert ctx.layer(Layer.HISTORY)["decision"] == "approve" and ctx.layer(Layer.HISTORY)["archived"] == "approve"
    assert ("risk_score" in ctx.layer(Layer.HISTORY)) is bool(preserve), "only a preserved key survives the fold"

    # every model request is on the tape, exactly as the server received it, with the tools offered
    llm = notes(ctx, "llm_call")
    assert len(llm) == len(stub.requests) and all(c.data["status"] == "ok" for c in llm)
    for call, received in zip(llm, stub.requests):
        assert request_messages(ctx.tape, call.seq) == received["messages"]
    # the fold's summary: the model's, asked on the step's own request, without the tools
    [summary] = [r for r in stub.requests if "tools" not in r]
    assert summary["messages"][:2] == stub.requests[0]["messages"][:2]
    assert FOLD_SUMMARY.content in json.dumps(thaw(dict(ctx.layer(Layer.HISTORY))))
    requests = [r for r in stub.requests if "tools" in r]
    for call, received in zip([c for c in llm if c.data.get("tools")], requests):
        assert [t["function"]["name"] for t in received["tools"]] == list(TOOL_MODELS) == call.data["tools"]
    # the first request is the activity's normal request; each later one extends the one before
    process = load_process(bpmn)
    begin = next(e.seq for e in ctx.tape if e.kind == "begin" and e.activity == "review")
    first = activity_request(LayeredContext.replay(list(ctx.tape), until=begin), "review", process.config("review").llm)
    assert requests[0]["messages"] == first
    for before, after in zip(requests, requests[1:]):
        assert after["messages"][: len(before["messages"])] == before["messages"]
    # the evaluate request carried the compress result back, with its snapshot id
    assert compressed["snapshot_id"] in requests[3]["messages"][-3]["content"]

    if confirm:
        assert [n.data["confirmations"] for n in notes(ctx, "tool_loop_waiting")] == [["model:1"]]
        [resumed] = notes(ctx, "tool_loop_resumed")
        assert resumed.data["answers"] == {"model:1": {"answer": "keep", "timed_out": False}}
        answered = json.loads(requests[-1]["messages"][-1]["content"])
        assert answered == {"confirmation_id": "model:1", "status": "answered", "answer": "keep", "timed_out": False}
        assert doc["confirmations"][0]["answer"] == "keep" and not instance.suspended


def _data(tmp_path: Path) -> str:
    path = tmp_path / "data.json"
    path.write_text(json.dumps({"applicant_id": "APP-7"}), encoding="utf-8")
    return str(path)


# ----- how the person's answer arrives -------------------------------------------------------------

ASK = ("human_confirm", {"type": "compression_review", "message": "Keep the notes out of the context?",
                         "options": KEEP, "timeout": 60, "default": "keep"})


@pytest.mark.parametrize("how", ["rest", "timeout", "model-fails-after"])
def test_an_activity_waits_for_the_answer_and_goes_on(tmp_path, stub, how):
    from engine.governance import AnswerArgs, GovernanceService

    bpmn = write_process(tmp_path, "tool_review", PROCESS, config(["risk_score"]))
    now = [1000.0]
    engine = Engine("memory://", model=MODEL, clock=lambda: now[0])
    stub.push(tool_reply(1, *ASK))
    instance = engine.run_process(load_process(bpmn), {"applicant_id": "APP-7"})
    assert instance.status == "waiting" and instance.waiting_for[0]["id"] == "model:1"
    [entry] = instance.confirmations
    assert entry["deadline"] == 1060.0 and entry["context"] == "main" and entry["task"] in instance.suspended

    if how == "model-fails-after":
        stub.push(*[Reply.error(500, "upstream down")] * 2)
        done = GovernanceService(engine).answer("model:1", AnswerArgs(value="undo", reason="no"))
        assert done["status"] == "error" and done["error"]["task_id"] == "review"
        failed = engine.load(instance.id)
        # the person's answer is kept: the activity stays open where the conversation stood, and the
        # resume gives the model the answer (nobody is asked again)
        assert failed.main.current_activity == "review" and entry["task"] in failed.suspended
        assert notes(failed.main, "tool_loop_resumed")
        stub.push(Reply.json(DECISION))
        done = engine.resume(failed).to_document()
        assert done["status"] == "completed", done["error"]
        answered = json.loads(stub.requests[-1]["messages"][-1]["content"])
        assert answered["answer"] == "undo" and answered["status"] == "answered"
        assert [c["id"] for c in done["confirmations"]] == ["model:1"]
        return
    stub.push(Reply.json(DECISION))
    if how == "rest":
        done = GovernanceService(engine).answer("model:1", AnswerArgs(value="undo", reason="keep the notes"))
        expected = {"answer": "undo", "timed_out": False}
    else:
        now[0] = 1061.0  # past the deadline: the default is the answer
        done = engine.resume(engine.load(instance.id)).to_document()
        expected = {"answer": "keep", "timed_out": True}
    assert done["status"] == "completed", done["error"]
    final = engine.load(instance.id)
    assert final.main.layer(Layer.HISTORY)["archived"] == "approve" and not final.suspended
    told = json.loads(stub.requests[-1]["messages"][-1]["content"])
    assert told == {"confirmation_id": "model:1", "status": "answered", **expected}
    [resumed] = notes(final.main, "tool_loop_resumed")
    assert resumed.data["answers"] == {"model:1": expected}


# ----- the loop itself, with a deterministic fake model ---------------------------------------------

def _fake(turns: list[Any]) -> Any:
    """A completion that answers each call with the next scripted message (tool calls or text)."""
    sent: list[dict[str, Any]] = []

    def completion(**kw: Any) -> dict[str, Any]:
        sent.append(kw)
        turn = turns.pop(0)
        if isinstance(turn, str):
            message: dict[str, Any] = {"role": "assistant", "content": turn}
        else:
            message = {"role": "assistant", "content": None, "tool_calls": [
                {"id": f"c{len(sent)}", "type": "function", "function": {"name": n, "arguments": json.dumps(a)}}
                for n, a in turn]}
        return {"id": "fake", "choices": [{"message": message, "finish_reason": "stop"}], "usage": {"total_tokens": 5}}
    completion.sent = sent  # type: ignore[attr-defined]
    return completion


def _open_activity() -> LayeredContext:
    ctx = LayeredContext(system={"policy": "p"})
    ctx.begin_activity("review")
    return ctx


def test_tool_errors_go_back_and_a_bad_answer_is_corrected():
    from context_layers.config import LLMConfig
    from engine.llm import run_llm_tool_activity

    seen: list[tuple[str, str]] = []

    def dispatch(name: str, arguments: str) -> dict[str, Any]:
        seen.append((name, arguments))
        return {"error": {"kind": "validation_error", "message": "layers: L8 is not a layer"}}

    fake = _fake([[("context_inspect", {"layers": ["L8"]})], "I approve.", json.dumps({"decision": "approve"})])
    ctx = _open_activity()
    outcome = run_llm_tool_activity(ctx, "review", LLMConfig(output_keys=["decision"], tools=True), model="fake",
                                    dispatch=dispatch, schemas=[], completion=fake)
    assert outcome.answer == {"decision": "approve"} and ctx.layer(Layer.WORKING)["decision"] == "approve"
    assert seen == [("context_inspect", '{"layers": ["L8"]}')]
    [call] = notes(ctx, "tool_call")
    assert call.data["error"] == "validation_error"
    last = fake.sent[-1]["messages"]
    assert json.loads(last[-3]["content"])["error"]["kind"] == "validation_error"  # the model saw the error
    assert last[-2] == {"role": "assistant", "content": "I approve."} and "not valid JSON" in last[-1]["content"]
    assert [c.data["status"] for c in notes(ctx, "llm_call")] == ["ok", "invalid_answer", "ok"]


def test_a_model_that_never_answers_fails_the_activity():
    from context_layers.config import LLMConfig
    from engine.llm import ModelCallFailed, run_llm_tool_activity

    fake = _fake([[("context_inspect", {})]] * 3)
    with pytest.raises(ModelCallFailed, match="called tools in 3 turns without giving its answer"):
        run_llm_tool_activity(_open_activity(), "review", LLMConfig(tools=True), model="fake", max_turns=3,
                              dispatch=lambda name, arguments: {"ok": True}, schemas=[], completion=fake)


def test_settling_a_confirmation_from_inside_the_activity_is_refused(tmp_path, stub):
    bpmn = write_process(tmp_path, "tool_review", PROCESS, config(["risk_score"]))
    stub.push(tool_reply(1, "context_branch", {"action": "resolve_conflict", "conflict_key": "approval_status",
                                               "resolution": "approved", "reason": "looks fine"}),
              Reply.json(DECISION))
    instance = Engine("memory://", model=MODEL).run_process(load_process(bpmn), {"applicant_id": "APP-7"})
    assert instance.status == "completed", instance.error
    [call] = notes(instance.main, "tool_call")
    assert call.data["error"] == "invalid_state"
    told = json.loads(stub.requests[1]["messages"][-1]["content"])
    assert "cannot settle confirmation 'approval_status' while it runs" in told["error"]["message"]


def test_the_tools_of_an_activity_a_worker_runs_do_not_wait_for_its_lease(tmp_path, stub):
    """A tool call governs the live instance, whose runner (here a worker) holds its lease: the
    lease the REST API waits for is not the tools' to take."""
    bpmn = write_process(tmp_path, "tool_review", PROCESS, config(["risk_score"]))
    engine = Engine("memory://", model=MODEL)
    instance = engine.start(load_process(bpmn), {"applicant_id": "APP-7"})
    assert engine.store.store.acquire_lease(instance.id, "worker-1", 60)  # type: ignore[attr-defined]
    stub.push(tool_reply(1, *ASK))
    instance = engine.run(instance)
    assert instance.status == "waiting" and instance.waiting_for[0]["id"] == "model:1", instance.error
