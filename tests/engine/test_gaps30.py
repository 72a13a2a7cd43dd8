"""Round 30 gaps: the instance clock never runs backward; what the model is sent by
``context_inspect`` tells the seq of each change; a tool request's recorded tokens count its tool schemas;
a cut-off arbiter / XOR reply is named as cut; REST and CLI replay past the tape's end agree."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from engine import Engine, load_process
from engine.runtime import InstanceClock

HERE = Path(__file__).resolve().parent / "outsider36"
CLAIM = HERE / "insurance_claim.bpmn"
CONFIRM = HERE / "insurance_claim_confirm.layerflow.yaml"
STORM = {"claim_id": "CL-1042", "policy_no": "HP-77", "amount": 12000, "incident": "storm damage again to roof"}
HOURS_5 = 5 * 3600.0


# ----------------------------------------------------------------------------- 1. the instance clock


def test_the_instance_clock_runs_on_from_its_floor_at_the_base_pace_and_never_back() -> None:
    base = [1000.0]
    clock = InstanceClock(lambda: base[0], floor=1000.0 + HOURS_5)
    assert clock() == 1000.0 + HOURS_5
    base[0] += 60  # a minute later on the wall: a minute later on the instance
    assert clock() == 1060.0 + HOURS_5
    base[0] -= 120  # a base that steps back (another host's clock): the instance's does not
    assert clock() == 1060.0 + HOURS_5
    ahead = InstanceClock(lambda: 5000.0, floor=1000.0)  # a base ahead of the floor (--now): the base
    assert ahead() == 5000.0 and ahead.floor == 5000.0


def test_an_engine_on_the_wall_clock_runs_on_an_instance_an_engine_ahead_left(tmp_path: Path) -> None:
    """The Python API's side of ``resume --now`` then ``resume`` (REST and workers load the same way):
    the confirmation is answered after it was asked, every tape's times go forward."""
    store = f"sqlite:///{tmp_path / 'store.db'}"
    wall = Engine(store)
    first = wall.run(load_process(CLAIM, config=CONFIRM), STORM)
    assert [w["task_id"] for w in first.waiting_for] == ["Activity_adjuster", "Event_adjuster_sla"]
    later = Engine(store, clock=lambda: time.time() + HOURS_5)  # resume --now: the adjuster's SLA fires
    escalated = later.run(first.id)
    assert [w["task_id"] for w in escalated.waiting_for] == ["Activity_senior"]
    asked = later.complete_user_task(escalated, "Activity_senior", {"claim_status": "deny"})
    [waiting] = [w for w in asked.waiting_for if w["kind"] == "confirmation"]
    # back on the wall clock, five hours behind the instance
    loaded = wall.load(asked.id)
    done = wall.answer_confirmation(loaded, waiting["id"], "deny")
    assert done.status == "completed"
    [entry] = done.confirmations
    assert entry["answered_at"] >= entry["created"] > time.time() + HOURS_5 - 600
    assert done.updated >= entry["answered_at"]
    for name, ctx in wall.load(done.id).contexts.items():
        times = [e.time for e in ctx.tape]
        assert times == sorted(times), name


# ----------------------------------------------------------------------------- 2. context_inspect to the model

INSPECT_ALL = {"layers": ["L3", "L4"], "metrics": ["token_count", "key_count", "last_modified", "top_keys", "keys"]}


def test_context_inspect_tells_the_model_the_seq_of_each_change_beside_the_seeds_time(tmp_path: Path) -> None:
    """``dispatch_tool`` is what an activity's tool loop, ``run_tool_loop`` and REST's tool endpoint
    run; its result is what the model is sent. It keeps the seed's ``last_modified`` time and adds the
    tape seq of the change, which is the same in two identical runs years apart."""
    from engine.governance import GovernanceService, InspectArgs
    from engine.tools import dispatch_tool
    from engine_helpers import script_task, write_process

    bpmn = write_process(tmp_path, "notes", [script_task("gather", "risk_score = 42"),
                                             script_task("research", "market_notes = 'grew 3 percent'")])
    told, times = [], []
    for base in (1_800_000_000.0, 1_900_000_000.0):  # two identical runs, years apart
        ticks = iter(range(10**6))
        engine = Engine("memory://", clock=lambda base=base: base + next(ticks) / 1000)
        done = engine.run(engine.start(load_process(bpmn), {"applicant_id": "APP-7"}, instance_id="same-id"))
        service = GovernanceService(engine)
        told.append(dispatch_tool(service, done.id, "context_inspect", INSPECT_ALL))
        times.append(service.inspect(done.id, InspectArgs.model_validate(INSPECT_ALL))["L3"]["last_modified"])
    seqs = [(r["L3"]["last_modified_seq"], [(k["key"], k["last_modified_seq"]) for k in r["L3"]["top_keys"]])
            for r in told]
    assert seqs[0] == seqs[1]
    l3 = told[0]["L3"]
    [top] = [k for k in l3["top_keys"] if k["key"] == "risk_score"]
    assert isinstance(top["last_modified_seq"], int) and l3["last_modified_seq"] > top["last_modified_seq"]
    assert l3["last_modified"] == times[0] and top["last_modified"] <= l3["last_modified"]  # the seed's time too
    assert times[0].startswith("2027-01-15") and times[1].startswith("2030-03-17")


# ----------------------------------------------------------------------------- 3. a tool request's tokens


def test_a_tool_requests_recorded_tokens_count_its_tool_schemas_as_the_size_check_does() -> None:
    from context_layers.canonical import canonical_json
    from context_layers.config import LLMConfig
    from context_layers.tokens import count_text
    from engine.llm import _token_text, run_llm_tool_activity
    from engine.tools import tool_schemas
    from test_llm_tools import _fake, _open_activity

    schemas = tool_schemas()
    fake = _fake(['{"decision": "approve"}'])
    ctx = _open_activity()
    run_llm_tool_activity(ctx, "review", LLMConfig(output_keys=["decision"], tools=True), model="fake",
                          dispatch=lambda name, arguments: {}, schemas=schemas, completion=fake)
    [call] = [e for e in ctx.tape if (e.data or {}).get("note") == "llm_call"]
    [sent] = fake.sent
    assert sent["tools"] == schemas
    messages_only = count_text(_token_text(sent["messages"]))
    with_schemas = count_text(_token_text(sent["messages"]) + canonical_json(schemas))
    assert with_schemas > messages_only + 100
    assert call.data["request"]["tokens"] == with_schemas


# ----------------------------------------------------------------------------- 4. cut-off arbiter / XOR replies




def _choice(content: str, finish: str) -> Any:
    def completion(**kw: Any) -> dict[str, Any]:
        return {"id": "x", "choices": [{"message": {"role": "assistant", "content": content},
                                        "finish_reason": finish}], "usage": {"total_tokens": 20}}
    return completion


def test_a_cut_off_reply_of_the_join_arbiter_or_an_xor_chooser_is_named_as_cut_with_the_limit_to_raise() -> None:
    from context_layers.config import LLMConfig
    from engine.conditions import LiteLLMBranchChooser
    from engine.llm import LiteLLMArbiter
    from gateways import ArbiterAnswerError, BranchAnswerError
    from gateways.arbiter import ArbitrationRequest
    from gateways.conditions import BranchOption, BranchQuestion
    from gateways.policy import _ask_model

    cfg = LLMConfig(max_tokens=24)
    request = ArbitrationRequest(gateway_id="join", key="tier", base_value="basic", values={"a": "gold", "b": "silver"},
                                 reasons={"a": "contract", "b": "usage"}, related={}, policy_text=None, layer="L4")
    arbiter = LiteLLMArbiter("openai/fake", completion=_choice('{"final_value": "gold", "rationale": "the con', "length"),
                             llm_config=cfg)
    steps: list[Any] = []
    assert _ask_model(arbiter, request, steps) == (None, None)
    assert [s.outcome for s in steps] == ["failed", "failed"]
    assert "cut off at max_tokens (24 tokens)" in steps[0].detail and "raise the join's llm.maxTokens" in steps[0].detail
    question = BranchQuestion(gateway_id="route", branches=(BranchOption("grant", "the vendor is trusted"),
                                                           BranchOption("deny", default=True)), context={})
    chooser = LiteLLMBranchChooser("openai/fake", completion=_choice('{"branch": "gra', "length"), llm_config=cfg)
    try:
        chooser.choose(question)
        raise AssertionError("a cut-off reply was taken")
    except BranchAnswerError as err:
        assert "cut off at max_tokens (24 tokens)" in str(err) and "raise the gateway's llm.maxTokens" in str(err)
    # a malformed reply the provider did not cut is reported as before
    arbiter = LiteLLMArbiter("openai/fake", completion=_choice("gold, I think", "stop"), llm_config=cfg)
    try:
        arbiter.arbitrate(request)
        raise AssertionError("a malformed reply was taken")
    except ArbiterAnswerError as err:
        assert "cut off" not in str(err) and "not JSON" in str(err)


# ----------------------------------------------------------------------------- 5. replay past the tape's end


def test_rest_and_cli_replay_past_the_tapes_end_carry_the_same_fields(tmp_path: Path) -> None:
    from click.testing import CliRunner
    from fastapi.testclient import TestClient

    from engine.api import create_app
    from engine.cli import LOAN_SCENARIOS, main

    store = f"sqlite:///{tmp_path / 'replay.db'}"
    token = "gaps30-replay-token-0123456789"
    auth = {"Authorization": f"Bearer {token}"}
    with TestClient(create_app(store, Path(__file__).resolve().parents[2] / "bpmn_examples", token)) as client:
        started = client.post("/api/instances", json={"process_id": "loan_approval",
                                                      "data": LOAN_SCENARIOS["conflict"]}, headers=auth)
        iid = started.json()["instance_id"]
        rest = client.get(f"/api/instances/{iid}/replay", params={"until": 99999}, headers=auth).json()
    ran = CliRunner().invoke(main, ["replay", iid, "--until", "99999", "--store", store, "--json"])
    assert ran.exit_code == 0, ran.output
    cli = json.loads(ran.stdout)
    end = rest["tape_last_seq"]
    assert end > 1 and rest["tape_end"] == end  # REST: the CLI's name for the tape's end too
    assert cli["tape_end"] == cli["tape_last_seq"] == end  # the CLI: REST's name too
    assert {"until", "tape_end", "tape_last_seq"} <= set(rest) & set(cli)
