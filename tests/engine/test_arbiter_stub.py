"""Join conflicts settled by the model, and natural-language XOR conditions checked by it,
through the CLI (`--model openai/stub`) and litellm's real HTTP client against the local
OpenAI-compatible stub server (tests/stub_llm.py) on 127.0.0.1."""

from __future__ import annotations

import json
import socket
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from engine import Engine, load_process
from engine.cli import main

from engine_helpers import BPMN_HEAD
from stub_llm import Reply, StubLLM

MODEL = "openai/stub"
CONFIRM_ID = "join/decision"

VOTE = BPMN_HEAD.format(pid="vote") + """
    <bpmn:startEvent id="start"/>
    <bpmn:parallelGateway id="fork"/>
    <bpmn:scriptTask id="finance"><bpmn:script>decision = "approve"
finance_note = "income verified"</bpmn:script></bpmn:scriptTask>
    <bpmn:scriptTask id="risk"><bpmn:script>decision = "reject"
risk_note = "debt ratio too high"</bpmn:script></bpmn:scriptTask>
    <bpmn:parallelGateway id="join"/>
    <bpmn:scriptTask id="close"><bpmn:script>outcome = decision</bpmn:script></bpmn:scriptTask>
    <bpmn:endEvent id="end"/>
    <bpmn:sequenceFlow id="f0" sourceRef="start" targetRef="fork"/>
    <bpmn:sequenceFlow id="f1" sourceRef="fork" targetRef="finance"/>
    <bpmn:sequenceFlow id="f2" sourceRef="fork" targetRef="risk"/>
    <bpmn:sequenceFlow id="f3" sourceRef="finance" targetRef="join"/>
    <bpmn:sequenceFlow id="f4" sourceRef="risk" targetRef="join"/>
    <bpmn:sequenceFlow id="f5" sourceRef="join" targetRef="close"/>
    <bpmn:sequenceFlow id="f6" sourceRef="close" targetRef="end"/>
  </bpmn:process>
</bpmn:definitions>
"""

VOTE_CONFIG = """
fork:
  branches:
    - {id: finance, reasonKey: finance_note}
    - {id: risk, reasonKey: risk_note}
join:
  conflictPolicy:
    policyText: Prefer caution when the reviews disagree.
  humanConfirm: {timeout: 600}
"""


def closed_port_url() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}/v1"  # nothing listens there any more: connection refused


@pytest.fixture
def stub(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("LAYERFLOW_MODEL_API_KEY", "test-key")
    monkeypatch.setenv("LAYERFLOW_RETRY_BASE_DELAY", "0.01")
    with StubLLM() as server:
        monkeypatch.setenv("LAYERFLOW_MODEL_API_BASE", server.url)
        yield server


@pytest.fixture
def cli(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    store = f"sqlite:///{tmp_path / 'cli.db'}"
    monkeypatch.setenv("LAYERFLOW_STORE", store)

    def invoke(*args: str) -> tuple[int, dict[str, Any]]:
        result = CliRunner().invoke(main, list(args), catch_exceptions=False)
        return result.exit_code, json.loads(result.stdout)
    invoke.store = store  # type: ignore[attr-defined]
    return invoke


@pytest.fixture
def vote(tmp_path: Path) -> str:
    path = tmp_path / "vote.bpmn"
    path.write_text(VOTE, encoding="utf-8")
    (tmp_path / "vote.layerflow.yaml").write_text(VOTE_CONFIG, encoding="utf-8")
    return str(path)


def resolution_steps(cli, instance_id: str) -> list[tuple[str, str, str]]:
    instance = Engine(cli.store).load(instance_id)
    return [(e.data["resolver"], e.data["outcome"], e.data["detail"]) for e in instance.main.tape
            if (e.data or {}).get("note") == "resolution"]


def arbiter_reply(value: Any, rationale: str = "caution wins when the reviews disagree", escalate: bool = False) -> Reply:
    return Reply.json({"final_value": value, "rationale": rationale, "escalate": escalate})


# ----- the conflict arbiter ------------------------------------------------------------------------

def test_model_resolves_the_conflict(stub, cli, vote) -> None:
    stub.push(arbiter_reply("reject"))
    code, doc = cli("run", vote, "--model", MODEL, "--json")
    assert code == 0, doc["error"]
    assert doc["layers"]["L3"]["outcome"] == "reject"
    [conflict] = doc["conflicts"]
    assert conflict["values"] == {"finance": "approve", "risk": "reject"}
    assert conflict["resolution"] == {"value": "reject", "resolver": "model",
                                      "reason": "caution wins when the reviews disagree"}
    [merged] = {**doc["layers"]["L4"], **doc["layers"]["L3"]}["_mergedConflicts"]
    assert merged["resolution"]["resolver"] == "model"
    # the prompt carried the key, both values with their reasons, and the policy
    [request] = stub.requests
    assert request["model"] == "stub"
    body = json.loads(request["messages"][-1]["content"].split("\n", 1)[1])
    assert body["key"] == "decision" and body["company_policy"] == "Prefer caution when the reviews disagree."
    assert body["branches"] == [{"branch": "finance", "value": "approve", "reason": "income verified"},
                                {"branch": "risk", "value": "reject", "reason": "debt ratio too high"}]


def test_without_a_conflict_policy_the_prompt_still_has_the_policy_and_the_facts(stub, cli, vote, tmp_path) -> None:
    # DESIGN: the conflict prompt carries related context and the policy. Without a
    # conflictPolicy the model was sent "related_context": {} and "company_policy": null,
    # though SYSTEM holds the policy and PROCESS the application's facts.
    (tmp_path / "vote.layerflow.yaml").write_text(
        "system:\n  policy: Two approvals above 100,000.\n"
        "fork:\n  branches:\n    - {id: finance, reasonKey: finance_note}\n    - {id: risk, reasonKey: risk_note}\n",
        encoding="utf-8")
    stub.push(arbiter_reply("reject"))
    code, doc = cli("run", vote, "--model", MODEL, "--json", "--data", '{"amount": 120000, "_internal": 1}')
    assert code == 0, doc["error"]
    [request] = stub.requests
    body = json.loads(request["messages"][-1]["content"].split("\n", 1)[1])
    assert body["company_policy"] == "Two approvals above 100,000."
    assert body["related_context"] == {"amount": 120000}


def test_malformed_then_valid_answer(stub, cli, vote) -> None:
    stub.push(Reply.text("I would reject it."), arbiter_reply("reject"))
    code, doc = cli("run", vote, "--model", MODEL, "--json")
    assert code == 0 and doc["conflicts"][0]["resolution"]["resolver"] == "model"
    assert len(stub.requests) == 2
    steps = resolution_steps(cli, doc["instance_id"])
    assert [(r, o) for r, o, _ in steps] == [("model", "failed"), ("model", "resolved")]
    assert "attempt 1" in steps[0][2] and "not JSON" in steps[0][2]


def test_escalation_goes_to_a_person_with_the_model_suggestion(stub, cli, vote) -> None:
    stub.push(arbiter_reply("hold", "neither review is conclusive", escalate=True))
    code, doc = cli("run", vote, "--model", MODEL, "--json")
    assert code == 3 and doc["status"] == "waiting"
    [asked] = doc["confirmations"]
    assert asked["id"] == CONFIRM_ID and asked["suggested"] == "hold" and asked["suggested_by"] == "model"
    assert [o["value"] for o in asked["options"]] == ["approve", "reject", "hold", "$escalate"]
    assert doc["conflicts"][0]["resolution"] is None

    code, done = cli("resume", doc["instance_id"], "--model", MODEL, "--answer", f"{CONFIRM_ID}=hold", "--json")
    assert code == 0, done["error"]
    assert done["layers"]["L3"]["outcome"] == "hold"
    assert done["conflicts"][0]["resolution"] == {
        "value": "hold", "resolver": "human",
        "reason": "a person confirmed the model suggestion: neither review is conclusive"}
    assert len(stub.requests) == 1, "the person's answer settles it: the model is not asked again"


def test_server_down_falls_back_to_a_person_and_loses_nothing(stub, cli, vote, monkeypatch) -> None:
    down = closed_port_url()
    monkeypatch.setenv("LAYERFLOW_MODEL_API_BASE", down)
    code, doc = cli("run", vote, "--model", MODEL, "--json")
    assert code == 3 and doc["status"] == "waiting" and doc["error"] is None
    [conflict] = doc["conflicts"]
    assert conflict["values"] == {"finance": "approve", "risk": "reject"} and conflict["resolution"] is None
    [asked] = doc["confirmations"]
    assert asked["suggested_by"] is None and [o["value"] for o in asked["options"]] == ["approve", "reject", "$escalate"]
    steps = resolution_steps(cli, doc["instance_id"])
    assert [(r, o) for r, o, _ in steps] == [("model", "failed"), ("human", "pending")]
    failure = steps[0][2]
    for part in ("ModelCallFailed", "3 attempt(s)", MODEL, down):
        assert part in failure

    code, done = cli("resume", doc["instance_id"], "--answer", f"{CONFIRM_ID}=reject", "--json")
    assert code == 0 and done["layers"]["L3"]["outcome"] == "reject"
    assert done["layers"]["L3"]["finance_note"] == "income verified"  # both branches' work survived
    assert done["conflicts"][0]["resolution"]["resolver"] == "human"


# ----- natural-language XOR conditions ------------------------------------------------------------------

def branch_reply(branch: str) -> Reply:
    return Reply.json({"branch": branch, "rationale": f"the context fits {branch}"})


def loan_fast(cli) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    code, doc = cli("demo", "loan", "--scenario", "fast", "--model", MODEL, "--json")
    assert code == 0, doc["error"]
    instance = Engine(cli.store).load(doc["instance_id"])
    events = [e.data for e in instance.main.tape if str((e.data or {}).get("note", "")).startswith("condition_")]
    return doc, events


@pytest.mark.parametrize(("replies", "model_branch", "disagrees", "failures"), [
    ([branch_reply("fast_track")], "fast_track", False, 0),
    ([branch_reply("full_review")], "full_review", True, 0),
    ([Reply.text("fast track, clearly"), branch_reply("fast_track")], "fast_track", False, 1),
    ([Reply.json({"branch": "express_lane", "rationale": "x"}), branch_reply("fast_track")], "fast_track", False, 1),
], ids=["agree", "disagree", "malformed-then-valid", "unknown-branch-then-valid"])
def test_condition_checked_through_the_stub(stub, cli, replies, model_branch, disagrees, failures) -> None:
    stub.push(*replies)
    doc, events = loan_fast(cli)
    # the model decides (DESIGN: "evaluated by the model with the expression as fallback")
    assert doc["layers"]["L3"]["track_type"] == ("full" if model_branch == "full_review" else "fast")
    decision = next(e for e in events if e["note"] == "condition_decision")
    assert decision["branch"] == model_branch and decision["decided_by"] == "model"
    assert decision["model"]["branch"] == model_branch
    assert [e for e in events if e["note"] == "condition_disagreement"] == (
        [{"note": "condition_disagreement", "gateway": "approval_split", "followed": "full_review",
          "followed_by": "model", "model_branch": "full_review", "expression_branch": "fast_track",
          "model_rationale": "the context fits full_review",
          "conditions": {"fast_track": decision["conditions"]["fast_track"],
                         "full_review": "Otherwise take the full review"}}] if disagrees else [])
    assert len([e for e in events if e["note"] == "condition_model_failed"]) == failures
    # with a model, disbursement_decision's compression asks it for summaries too (engine.model_compression)
    routed = [r for r in stub.requests if r["messages"][0]["content"].startswith("You route a business process")]
    assert len(routed) == 1 + failures
    prompt = routed[0]["messages"][-1]["content"]
    assert "If the risk level is low and the amount is below 50,000" in prompt and '"amount": 20000' in prompt
    assert 'risk_level == "low"' not in prompt, "the check must not be handed the expression it checks"


def test_condition_with_the_server_down_is_decided_by_the_expression(stub, cli, monkeypatch) -> None:
    monkeypatch.setenv("LAYERFLOW_MODEL_API_BASE", closed_port_url())
    doc, events = loan_fast(cli)
    assert doc["layers"]["L3"]["track_type"] == "fast"
    [failed] = [e for e in events if e["note"] == "condition_model_failed"]
    assert "ModelCallFailed" in failed["error"] and MODEL in failed["error"]
    decision = next(e for e in events if e["note"] == "condition_decision")
    assert decision["decided_by"] == "expression" and decision["model"] is None and decision["model_configured"]


# ----- a sentence as a flow's own conditionExpression ---------------------------------------------------

SENTENCE_FLOW = BPMN_HEAD.format(pid="sentence") + """
    <bpmn:startEvent id="start"/>
    <bpmn:scriptTask id="prep"><bpmn:script>amount = 20000
risk_level = "low"</bpmn:script></bpmn:scriptTask>
    <bpmn:exclusiveGateway id="gw" default="f_full"/>
    <bpmn:scriptTask id="fast"><bpmn:script>track = "fast"</bpmn:script></bpmn:scriptTask>
    <bpmn:scriptTask id="full"><bpmn:script>track = "full"</bpmn:script></bpmn:scriptTask>
    <bpmn:endEvent id="e1"/><bpmn:endEvent id="e2"/>
    <bpmn:sequenceFlow id="f0" sourceRef="start" targetRef="prep"/>
    <bpmn:sequenceFlow id="f1" sourceRef="prep" targetRef="gw"/>
    <bpmn:sequenceFlow id="f_fast" sourceRef="gw" targetRef="fast"><bpmn:conditionExpression>If the risk level is low and the amount is below 50,000, take the fast track</bpmn:conditionExpression></bpmn:sequenceFlow>
    <bpmn:sequenceFlow id="f_full" sourceRef="gw" targetRef="full"/>
    <bpmn:sequenceFlow id="f2" sourceRef="fast" targetRef="e1"/>
    <bpmn:sequenceFlow id="f3" sourceRef="full" targetRef="e2"/>
  </bpmn:process>
</bpmn:definitions>
"""


@pytest.mark.parametrize(("model_says", "taken", "offline"), [
    ("fast", "fast", False), ("full", "full", False), (None, "full", True)])
def test_a_sentence_as_the_flow_condition_is_decided_by_the_model(stub, cli, tmp_path, model_says, taken,
                                                                  offline) -> None:
    """DESIGN: "a condition may also be natural language (the designer's sentence), evaluated by
    the model". A sentence written as the flow's conditionExpression was refused at load
    ("condition is not valid Python"); now the model decides that flow, offline the default does."""
    path = tmp_path / "sentence.bpmn"
    path.write_text(SENTENCE_FLOW, encoding="utf-8")
    if model_says:
        stub.push(branch_reply(model_says))
    code, doc = cli("run", str(path), "--json", *(() if offline else ("--model", MODEL)))
    assert code == 0, doc["error"]
    assert doc["layers"]["L3"]["track"] == taken
    assert len(stub.requests) == (0 if offline else 1)
    if not offline:
        prompt = stub.requests[0]["messages"][-1]["content"]
        assert "If the risk level is low and the amount is below 50,000" in prompt
    decision = next(e.data for e in Engine(cli.store).load(doc["instance_id"]).main.tape
                    if (e.data or {}).get("note") == "condition_decision")
    assert decision["branch"] == taken and decision["decided_by"] == ("default" if offline else "model")


def test_validate_warns_about_a_sentence_condition_and_still_refuses_a_broken_expression(tmp_path) -> None:
    from engine.validate import validate_process

    good = tmp_path / "sentence.bpmn"
    good.write_text(SENTENCE_FLOW, encoding="utf-8")
    broken = tmp_path / "broken.bpmn"
    broken.write_text(SENTENCE_FLOW.replace("If the risk level is low and the amount is below 50,000, take the fast track",
                                            "amount &gt;"), encoding="utf-8")
    problems = validate_process(good).problems
    assert [(p.code, p.severity) for p in problems if p.code.startswith("condition")] == [
        ("condition_natural_language", "warning")]
    assert "condition_syntax" in [p.code for p in validate_process(broken).problems]


# ----- every arbiter / condition call is on the tape ------------------------------------------------------

def llm_calls(cli, instance_id: str, purpose: str) -> list[Any]:
    return [e for e in Engine(cli.store).load(instance_id).main.tape
            if (e.data or {}).get("note") == "llm_call" and e.data.get("purpose") == purpose]


def test_arbiter_attempts_are_noted_on_the_tape_garbage_included(stub, cli, vote) -> None:
    """A garbage answer from the arbiter was visible on the tape only as its consequence (a
    failed resolution step); now each attempt is an llm_call note with the request and reply."""
    from engine.llm import request_messages

    stub.push(Reply.text("I would reject it."), arbiter_reply("reject"))
    code, doc = cli("run", vote, "--model", MODEL, "--json")
    assert code == 0, doc["error"]
    calls = llm_calls(cli, doc["instance_id"], "conflict_resolution")
    assert [json.loads(c.data["response"]["content"])["final_value"] if i else c.data["response"]["content"]
            for i, c in enumerate(calls)] == ["I would reject it.", "reject"]
    assert all(c.data["task_id"] == "join" and c.data["model"] == MODEL for c in calls)
    tape = Engine(cli.store).load(doc["instance_id"]).main.tape
    assert request_messages(tape, calls[0].seq) == stub.requests[0]["messages"]


def test_server_down_arbiter_attempts_are_noted_as_errors(stub, cli, vote, monkeypatch) -> None:
    monkeypatch.setenv("LAYERFLOW_MODEL_API_BASE", closed_port_url())
    code, doc = cli("run", vote, "--model", MODEL, "--json")
    assert code == 3
    calls = llm_calls(cli, doc["instance_id"], "conflict_resolution")
    assert len(calls) == 3 and {c.data["status"] for c in calls} == {"error"}
    assert all(c.data["error"]["transient"] for c in calls)


def test_condition_attempts_are_noted_on_the_tape(stub, cli) -> None:
    stub.push(Reply.text("fast track, clearly"), branch_reply("fast_track"))
    doc, _ = loan_fast(cli)
    calls = llm_calls(cli, doc["instance_id"], "condition")
    assert [c.data["response"]["content"] for c in calls][0] == "fast track, clearly"
    assert len(calls) == 2 and all(c.data["task_id"] == "approval_split" for c in calls)


def _seed_sentence_flows(tmp_path) -> Path:
    """The seed's XOR sentences written as the flows' conditions, no default flow."""
    bpmn = SENTENCE_FLOW.replace('<bpmn:exclusiveGateway id="gw" default="f_full"/>', '<bpmn:exclusiveGateway id="gw"/>')
    bpmn = bpmn.replace("If the risk level is low and the amount is below 50,000, take the fast track",
                        "如果风险等级为低且金额小于5万，走快速通道")
    bpmn = bpmn.replace('<bpmn:sequenceFlow id="f_full" sourceRef="gw" targetRef="full"/>',
                        '<bpmn:sequenceFlow id="f_full" sourceRef="gw" targetRef="full">'
                        '<bpmn:conditionExpression>其他情况走完整审核流程</bpmn:conditionExpression></bpmn:sequenceFlow>')
    path = tmp_path / "seed_xor.bpmn"
    path.write_text(bpmn, encoding="utf-8")
    return path


def test_the_seeds_chinese_sentences_as_flow_conditions(stub, cli, tmp_path) -> None:
    """The seed's XOR sentences written as the flows' conditions; "其他情况走完整审核流程" parses
    as a Python name and was evaluated as one (an undefined variable) instead of read by the model."""
    path = _seed_sentence_flows(tmp_path)
    stub.push(branch_reply("full"))
    code, doc = cli("run", str(path), "--json", "--model", MODEL)
    assert code == 0, doc["error"]
    assert doc["layers"]["L3"]["track"] == "full"
    prompt = stub.requests[0]["messages"][-1]["content"]
    assert "其他情况走完整审核流程" in prompt and "如果风险等级为低且金额小于5万" in prompt


def test_offline_the_seeds_sentences_stop_the_gateway_naming_them_as_sentences(tmp_path) -> None:
    # the error said "the context has no '其他情况走完整审核流程'": a sentence read as a variable name
    path = _seed_sentence_flows(tmp_path)
    engine = Engine()
    instance = engine.run(engine.start(load_process(str(path)), {"amount": 20000, "risk_level": "low"}))
    assert instance.status == "error" and instance.error["task_id"] == "gw"
    message = instance.error["message"]
    assert "其他情况走完整审核流程 (a sentence: only the model decides it" in message
    assert "no '其他情况走完整审核流程'" not in message and "--model" in message
