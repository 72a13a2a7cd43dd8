"""The model tools: schemas from the request models, dispatch to the governance service, and the
seed's sequence (inspect -> compress -> evaluate -> human_confirm) driven by a model, both with a
deterministic fake and through litellm's real HTTP client against the stub server."""

from __future__ import annotations

import json
from typing import Any

import pytest

from engine.governance import CompressArgs, GovernanceService, HumanConfirmArgs, InspectArgs, StartArgs
from engine.runtime import Engine
from engine.tools import TOOL_MODELS, dispatch_tool, run_tool_loop, tool_schemas
from governance_helpers import LOAN_CONFLICT, NOTES, make_catalog
from stub_llm import Reply, StubLLM

MODEL = "openai/stub-model"
PRESERVE = ["risk_level", "assessment_id"]
KEEP = [{"label": "keep the compression", "value": "keep"}, {"label": "undo it", "value": "undo"}]


@pytest.fixture
def service(tmp_path):
    return GovernanceService(Engine("memory://"), make_catalog(tmp_path))


@pytest.fixture
def notes(service):
    return service.start(StartArgs(process_id="notes_review", data=NOTES))["instance_id"]


# ----------------------------------------------------------------------------- schemas

def test_schemas_are_the_request_models():
    schemas = {t["function"]["name"]: t for t in tool_schemas()}
    assert list(schemas) == ["context_inspect", "context_compress", "context_branch", "human_confirm"]
    for name, tool in schemas.items():
        assert tool["type"] == "function" and tool["function"]["description"]
        params = tool["function"]["parameters"]
        text = json.dumps(params)
        assert params["type"] == "object" and "$ref" not in text and "$defs" not in text
        assert set(params["properties"]) == {f.alias or n for n, f in TOOL_MODELS[name].model_fields.items()}
        assert params.get("additionalProperties") is False
    compress = schemas["context_compress"]["function"]["parameters"]
    assert compress["required"] == ["action"]
    assert compress["properties"]["action"]["enum"] == ["compress", "evaluate", "decompress"]
    rule = compress["properties"]["compress_rules"]["items"]["properties"]
    assert {"pattern", "action", "extractKeys", "maxTokens"} <= set(rule)  # the seed's spelling
    confirm = schemas["human_confirm"]["function"]["parameters"]
    assert set(confirm["required"]) == {"message", "options"}
    assert confirm["properties"]["options"]["items"]["required"] == ["label"]


# ----------------------------------------------------------------------------- dispatch

def test_dispatch_runs_the_service(service, notes):
    report = dispatch_tool(service, notes, "context_inspect", json.dumps({
        "layers": ["L3", "L4"], "metrics": ["token_count", "attention_score"], "filter": {"key_prefix": "risk_*"}}))
    assert report["layers"]["L3"]["token_count"] > 0 and "attention_score" in report["layers"]["L4"]
    assert report == service.inspect(notes, InspectArgs(layers=["L3", "L4"], metrics=["token_count", "attention_score"],
                                                        filter={"key_prefix": "risk_*"}))
    done = dispatch_tool(service, notes, "context_compress",
                         {"action": "compress", "target_layers": ["L3"], "preserve_keys": PRESERVE, "max_tokens": 300})
    assert done["changed"] and done["actor"] == "model"
    snap = dispatch_tool(service, notes, "context_branch", {"action": "snapshot", "layers": ["L3"]})
    assert snap["snapshot_id"].startswith("snap:main:")
    check = dispatch_tool(service, notes, "context_branch", {"action": "evaluate", "required_keys": ["risk_level"]})
    assert check["ok"]


def test_inspect_result_has_the_seeds_shape(service, notes):
    """The seed's context_inspect returns {"L3": {"token_count", "key_count", "attention_score", ...},
    "L4": {...}}: each inspected layer at the top level (it was only under "layers")."""
    report = dispatch_tool(service, notes, "context_inspect", {
        "layers": ["L3", "L4"],
        "metrics": ["token_count", "key_count", "attention_score", "last_modified", "size_bytes"],
        "filter": {"key_prefix": "risk_*", "modified_after": "2026-07-08T10:00:00Z"}})
    for layer in ("L3", "L4"):
        assert report[layer] == report["layers"][layer]
        # the "last_modified" metric: the seed's time, and for a model the tape seq of the change too
        assert {"token_count", "key_count", "attention_score", "last_modified", "last_modified_seq",
                "size_bytes"} <= set(report[layer])
        assert {"density", "redundancy"} <= set(report[layer]["attention_score"])
    assert report["L3"]["key_count"] >= 1 and "L0" not in report


@pytest.mark.parametrize("name, arguments, kind", [
    ("context_teleport", {}, "bad_request"),
    ("context_inspect", "{not json", "validation_error"),
    ("context_inspect", "[1]", "validation_error"),
    ("context_inspect", {"layers": ["L8"]}, "validation_error"),
    ("context_compress", {"action": "compress", "target_layers": ["L0"]}, "bad_request"),
    ("context_compress", {"action": "decompress", "snapshot_id": "snap:main:404"}, "not_found"),
    ("context_branch", {"action": "resolve_conflict", "conflict_key": "k", "resolution": 1, "reason": "r"}, "not_found"),
    ("human_confirm", {"message": "ok?", "options": []}, "validation_error"),
    # an endless timeout passed validation and failed the save (invalid_record, no field named)
    ("human_confirm", '{"message": "ok?", "options": [{"label": "yes"}], "timeout": 1e999}', "validation_error"),
])
def test_tool_errors_go_back_to_the_model(service, notes, name, arguments, kind):
    result = dispatch_tool(service, notes, name, arguments)
    assert result["error"]["kind"] == kind and result["error"]["message"]


def test_resolve_conflict_tool(service):
    loan = service.start(StartArgs(process_id="loan_approval", data=LOAN_CONFLICT))["instance_id"]
    done = dispatch_tool(service, loan, "context_branch", {
        "action": "resolve_conflict", "conflict_key": "approval_status", "resolution": "pending_dual_approval",
        "reason": "high risk and high amount need dual approval"})
    assert done["status"] == "completed" and done["confirmation_id"] == "review_join/approval_status"


def test_a_conflict_the_model_settles_names_the_model(service):
    # DESIGN: every conflict lands in _mergedConflicts with its resolution, resolver and reason; a
    # model settling it with context_branch is the "model" resolver, not "a person" (it said human)
    loan = service.start(StartArgs(process_id="loan_approval", data=LOAN_CONFLICT))["instance_id"]
    done = dispatch_tool(service, loan, "context_branch", {
        "action": "resolve_conflict", "conflict_key": "approval_status", "resolution": "approved", "reason": "r"})
    resolution = done["conflicts"][0]["resolution"]
    assert resolution["resolver"] == "model" and resolution["value"] == "approved"
    assert "person" not in resolution["reason"] and resolution["reason"].endswith(": r")
    instance = service.engine.load(loan)
    logged = instance.main.resolve("_mergedConflicts")[0]["resolution"]
    assert logged["resolver"] == "model"
    decision = [e for e in instance.main.tape if e.data.get("note") == "human_decision"][-1]
    assert decision.actor == "model" and decision.data["resolver"] == "model"
    steps = [e.data for e in instance.main.tape if e.data.get("note") == "resolution" and e.data["outcome"] == "answered"]
    assert steps[-1]["resolver"] == "model"
    # a person's answer through the same REST operation stays the person's
    other = service.start(StartArgs(process_id="loan_approval", data=LOAN_CONFLICT))["instance_id"]
    from engine.governance import ResolveArgs
    by_person = service.resolve(other, ResolveArgs(conflict_key="approval_status", resolution="approved", reason="r"),
                                actor="ann")
    assert by_person["conflicts"][0]["resolution"]["resolver"] == "human"


def test_human_confirm_asks_or_waits(service, notes):
    asked: list[dict[str, Any]] = []
    answered = dispatch_tool(service, notes, "human_confirm", {"message": "Keep?", "options": KEEP},
                             ask=lambda item: asked.append(item) or "keep")
    assert answered["status"] == "answered" and answered["answer"] == "keep" and asked[0]["message"] == "Keep?"
    wrong = dispatch_tool(service, notes, "human_confirm", {"message": "Keep?", "options": KEEP}, ask=lambda _: "maybe")
    assert wrong["error"]["kind"] == "invalid_answer"
    pending = dispatch_tool(service, notes, "human_confirm", {"message": "Keep?", "options": KEEP}, ask=lambda _: None)
    assert pending["status"] == "pending"
    assert [c["id"] for c in service.confirmations(notes)] == [pending["confirmation_id"]]


def test_a_human_confirm_default_must_be_one_of_its_options(service, notes):
    # one no option offers could never be taken when the timeout passed (it only escalated): the
    # model is told at once, naming the field
    wrong = dispatch_tool(service, notes, "human_confirm", {"message": "Keep?", "options": KEEP, "timeout": 60,
                                                             "default": "maybe"})
    assert wrong["error"]["kind"] == "validation_error"
    assert [p["field"] for p in wrong["error"]["problems"]] == ["default"] and '"maybe"' in wrong["error"]["message"]
    assert service.confirmations(notes) == []
    by_label = dispatch_tool(service, notes, "human_confirm", {"message": "Keep?", "options": KEEP, "default": "undo it"})
    assert by_label["status"] == "pending"


@pytest.fixture
def clocked(tmp_path):
    """A service whose engine reads a clock the test moves (``now[0]``)."""
    now = [1000.0]
    return GovernanceService(Engine("memory://", clock=lambda: now[0]), make_catalog(tmp_path)), now


def test_a_human_confirm_with_a_timeout_takes_its_default_after_the_deadline(clocked):
    # the schema says "seconds until the default is taken": the confirmation had no deadline, so a
    # run or resume after the timeout left it waiting for ever
    service, now = clocked
    notes = service.start(StartArgs(process_id="notes_review", data=NOTES))["instance_id"]
    pending = dispatch_tool(service, notes, "human_confirm", {"message": "Keep?", "options": KEEP, "timeout": 300,
                                                              "default": "keep"})
    untimed = dispatch_tool(service, notes, "human_confirm", {"message": "Keep?", "options": KEEP})
    engine = service.engine
    assert engine.resume(engine.load(notes)).confirmations[-2]["answered"] is False  # not yet
    now[0] += 301
    instance = engine.resume(engine.load(notes))
    entry = next(c for c in instance.confirmations if c["id"] == pending["confirmation_id"])
    assert entry["answered"] and entry["answer"] == "keep" and entry["timed_out"]
    assert [c["id"] for c in service.confirmations(notes)] == [untimed["confirmation_id"]]


# ----------------------------------------------------------------------------- the loop

def _call(name: str, arguments: dict[str, Any], n: int) -> dict[str, Any]:
    return {"id": f"call_{n}", "type": "function", "function": {"name": name, "arguments": json.dumps(arguments)}}


SEED_SEQUENCE = [
    [("context_inspect", {"layers": ["L3", "L4"], "metrics": ["token_count", "attention_score"]})],
    [("context_compress", {"action": "compress", "target_layers": ["L3"], "preserve_keys": PRESERVE,
                           "max_tokens": 400})],
    [("context_compress", {"action": "evaluate"})],
]
CONFIRM = [("human_confirm", {"type": "compression_review", "message": "The compression folded the notes; keep it?",
                              "options": KEEP, "timeout": 300})]


class FakeModel:
    """A deterministic model: the scripted tool calls, then a text answer; records what it was sent."""

    def __init__(self, turns: list[list[tuple[str, dict[str, Any]]]], final: str = "done") -> None:
        self.turns = list(turns)
        self.final = final
        self.requests: list[dict[str, Any]] = []

    def __call__(self, **kw: Any) -> dict[str, Any]:
        self.requests.append(kw)
        if not self.turns:
            return {"choices": [{"message": {"role": "assistant", "content": self.final}}]}
        calls = [_call(name, args, len(self.requests) * 10 + i) for i, (name, args) in enumerate(self.turns.pop(0))]
        return {"choices": [{"message": {"role": "assistant", "content": None, "tool_calls": calls}}]}


def test_the_seed_sequence_with_a_fake_model(service, notes):
    model = FakeModel(SEED_SEQUENCE, final="Compressed L3; density rose and every preserved key is intact.")
    result = run_tool_loop(service, notes, "fake", completion=model)
    assert result.status == "done" and result.steps == 4 and result.final.startswith("Compressed")
    assert [c["name"] for c in result.calls] == ["context_inspect", "context_compress", "context_compress"]
    compress, evaluation = result.calls[1]["result"], result.calls[2]["result"]
    assert evaluation["snapshot_id"] == compress["snapshot_id"] and evaluation["preserved_intact"]
    assert evaluation["attention_after"]["density"] > evaluation["attention_before"]["density"]
    assert all(r["tools"] == tool_schemas() for r in model.requests)
    # the model saw each result, in order, as a tool message
    tool_messages = [m for m in model.requests[-1]["messages"] if m["role"] == "tool"]
    assert [m["tool_call_id"] for m in tool_messages] == [c["id"] for c in result.calls]
    assert json.loads(tool_messages[1]["content"])["snapshot_id"] == compress["snapshot_id"]
    inst = service.load(notes)
    (note,) = [e for e in inst.main.tape if e.data.get("note") == "model_tools"]
    assert [c["name"] for c in note.data["calls"]] == [c["name"] for c in result.calls]
    assert inst.compressions[-1]["actor"] == "model"


def test_the_loop_stops_while_a_person_decides(service, notes):
    model = FakeModel([*SEED_SEQUENCE, CONFIRM])
    result = run_tool_loop(service, notes, "fake", completion=model)
    assert result.status == "waiting" and result.final is None
    (pending,) = service.confirmations(notes)
    assert pending["type"] == "compression_review" and pending["requested_by"] == "model"


def test_max_steps(service, notes):
    model = FakeModel([SEED_SEQUENCE[0]] * 10)
    result = run_tool_loop(service, notes, "fake", completion=model, max_steps=3)
    assert result.status == "max_steps" and len(result.calls) == 3


def _stub_tool_reply(calls: list[tuple[str, dict[str, Any]]], n: int) -> Reply:
    body = {"id": f"chatcmpl-tools-{n}", "object": "chat.completion", "created": 1700000000, "model": "stub-model",
            "choices": [{"index": 0, "finish_reason": "tool_calls", "message": {
                "role": "assistant", "content": None,
                "tool_calls": [_call(name, args, n * 10 + i) for i, (name, args) in enumerate(calls)]}}],
            "usage": {"prompt_tokens": 50, "completion_tokens": 10, "total_tokens": 60}}
    return Reply(body=json.dumps(body))


@pytest.mark.parametrize("confirm", [False, True], ids=["no-confirmation-needed", "human-confirm"])
def test_the_seed_sequence_through_litellm_and_the_stub_server(service, notes, monkeypatch, confirm):
    monkeypatch.delenv("LAYERFLOW_MODEL_API_BASE", raising=False)
    turns = [*SEED_SEQUENCE, *([CONFIRM] if confirm else [])]
    with StubLLM() as stub:
        stub.push(*[_stub_tool_reply(t, i) for i, t in enumerate(turns)])
        stub.push(Reply.text("Compressed L3 from the notes; preserved keys intact; no confirmation needed."))
        result = run_tool_loop(service, notes, MODEL, api_base=stub.url, api_key="test-key", timeout=10,
                               task=f"Instance {notes}: keep the context small.")
        requests = list(stub.requests)
    names = [c["name"] for c in result.calls]
    assert names == ["context_inspect", "context_compress", "context_compress", *(["human_confirm"] if confirm else [])]
    assert all("error" not in c["result"] for c in result.calls), result.calls
    assert result.status == ("waiting" if confirm else "done")
    assert len(requests) == len(turns) + (0 if confirm else 1)
    first = requests[0]
    assert first["_path"] == "/v1/chat/completions" and first["model"] == "stub-model"
    assert [t["function"]["name"] for t in first["tools"]] == list(TOOL_MODELS)
    # the evaluate request carried the compress result (with its snapshot id) back to the model
    sent = [m for m in requests[3]["messages"] if m["role"] == "tool"]
    snapshot_id = result.calls[1]["result"]["snapshot_id"]
    assert snapshot_id in sent[1]["content"] and sent[1]["tool_call_id"] == result.calls[1]["id"]
    assert result.calls[2]["result"]["snapshot_id"] == snapshot_id
    doc = service.document(notes)
    assert doc["compressions"][-1]["snapshot_id"] == snapshot_id
    assert doc["status"] == "waiting"
    assert any(w["id"].startswith("model:") for w in doc["waiting_for"]) is confirm


def test_a_model_failure_is_a_model_error(service, notes):
    from context_layers.errors import ModelError

    with StubLLM() as stub:
        stub.push(Reply.error(400, "bad request"))
        with pytest.raises(ModelError, match="governance tool loop"):
            run_tool_loop(service, notes, MODEL, api_base=stub.url, api_key="k", timeout=5)


def test_request_models_accept_the_seeds_examples():
    CompressArgs.model_validate({"action": "compress", "target_layers": ["L3"],
                                 "preserve_keys": ["risk_level", "assessment_id", "risk_factors"],
                                 "compress_rules": [{"pattern": "tool_call_result", "action": "extract_keys",
                                                     "extractKeys": ["status", "summary"]},
                                                    {"pattern": "reasoning_chain", "action": "summarize",
                                                     "maxTokens": 100}],
                                 "max_tokens": 2000})
    CompressArgs.model_validate({"action": "evaluate", "before_snapshot_id": "snap_before_compress"})
    CompressArgs.model_validate({"action": "decompress", "snapshot_id": "snap_before_compress"})
    HumanConfirmArgs.model_validate({"type": "conflict_resolution", "message": "choose", "timeout": 300, "options": [
        {"label": "approved", "value": "approved"}, {"label": "rejected", "value": "rejected"},
        {"label": "escalate", "value": "escalate"}]})
    InspectArgs.model_validate({"layers": ["L3", "L4"], "metrics": ["token_count", "key_count", "attention_score",
                                                                     "last_modified", "size_bytes"],
                                "filter": {"key_prefix": "risk_*", "modified_after": "2026-07-08T10:00:00Z"}})
