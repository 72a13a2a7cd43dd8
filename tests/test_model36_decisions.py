"""Where the model decides rather than does a step, and answers the way real models go wrong: a join's
conflict (the arbiter), the summaries a compression asks it for, and the tools of a step. Every call goes
through litellm's real HTTP client to the local OpenAI-compatible stub (tests/stub_llm.py; ``ClaimStub``
answers each request from a queue of its kind), never a real provider.

claim_payout (tests/model36/): ``intake`` (a script) -> ``review_split`` -> ``fraud_review`` and
``payout_review`` (model steps) disagree on ``claim_decision`` and ``payout_amount`` -> ``review_join`` (no
policy: the model arbitrates) -> ``settle`` (a model step with the tools, preserved keys and a ``summarize``
rule the model writes).

What this round found (each test failed on main):

* the model's value for a conflict was written whatever it was: ``"partial"``, a decision the steps'
  ``outputSchema`` does not allow (enum approve, deny, refer), became the claim's decision with nobody asked;
  it is a malformed answer now, asked again once, then a person decides (a compromise the schema allows,
  ``refer`` or a payout of 600, is still the model's to settle);
* ``"1200"`` (a string) for a payout the branches gave as numbers was written as the payout; it is a
  malformed answer, asked again once, then a person decides;
* a malformed answer was asked again with the same request, the model never told what was wrong (a model
  that wrapped its JSON in prose did it again); the retry carries its reply and what was wrong;
* a blank rationale was taken: the conflict log and the person's question gave no reason;
* a join's own ``llm: {model, apiBase}`` was ignored unless ``--model`` was given: its conflicts went to a
  person as if no model were configured, while the steps' own ``llm.model`` were called;
* a model summary that restated a preserved key with another value (``claim_ref: CLM-999``) went into
  HISTORY ahead of the real value; it is refused, asked again, and written offline when the model insists.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from engine import Engine, load_process
from tests.model36.claim_stub import ClaimStub, kind_of
from tests.stub_llm import Reply

HERE = Path(__file__).resolve().parent / "model36"
ROOT = HERE.parent.parent
MODEL = "openai/stub-model"
START = {"claim_no": 7}
FRAUD = Reply.json({"claim_decision": "deny", "payout_amount": 0, "fraud_note": "filed two days after the policy began"})
PAYOUT = Reply.json({"claim_decision": "approve", "payout_amount": 1200, "payout_note": "covered water damage"})
SUMMARY = "Adjuster visits found water, smoke, roof and window damage in the kitchen, attic and garage."
DEFAULTS = {"fraud_review": FRAUD, "payout_review": PAYOUT, "settle": Reply.json({"settlement_note": "paid"}),
            "summary": Reply.text(SUMMARY)}


def arbiter(value: Any, rationale: str = "fraud signals come first", escalate: bool = False, **kw: Any) -> Reply:
    return Reply.json({"final_value": value, "rationale": rationale, "escalate": escalate}, **kw)


@pytest.fixture
def stub(monkeypatch: pytest.MonkeyPatch) -> Any:
    monkeypatch.setenv("LAYERFLOW_MODEL_API_KEY", "test-key")
    monkeypatch.setenv("LAYERFLOW_RETRY_BASE_DELAY", "0.01")
    with ClaimStub(DEFAULTS) as server:
        monkeypatch.setenv("LAYERFLOW_MODEL_API_BASE", server.url)
        yield server


def _run(engine: Engine | None = None, process: Path = HERE / "claim_payout.bpmn") -> Any:
    engine = engine or Engine("memory://", model=MODEL)
    return engine.run(engine.start(load_process(process), START))


def _steps(instance: Any, key: str) -> list[tuple[str, str, str]]:
    return [(e.data["resolver"], e.data["outcome"], e.data["detail"]) for e in instance.main.tape
            if (e.data or {}).get("note") == "resolution" and e.data.get("key") == key]


def _conflict_requests(stub: ClaimStub, key: str) -> list[list[dict[str, Any]]]:
    return [b["messages"] for b in stub.requests
            if kind_of(b) == "conflict" and b["messages"][1]["content"].startswith(f"Resolve this conflict on key {key!r}")]


# ===== the arbiter's value ===========================================================================

def test_a_value_the_steps_schema_does_not_allow_is_asked_again_then_a_person_decides_without_it(
        stub: ClaimStub, tmp_path: Path) -> None:
    stub.on("conflict", arbiter("partial", "pay part of it"), arbiter("partial", "pay part of it"), arbiter(0))
    store = f"sqlite:///{tmp_path / 'runs.db'}"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "LAYERFLOW_STORE": store}
    run = subprocess.run([sys.executable, "-m", "engine.cli", "run", str(HERE / "claim_payout.bpmn"), "--data",
                          json.dumps(START), "--model", MODEL, "--json"], capture_output=True, text=True, cwd=ROOT,
                         env=env, timeout=120)
    assert run.returncode == 3, run.stderr
    doc = json.loads(run.stdout)
    assert doc["status"] == "waiting" and [w["id"] for w in doc["waiting_for"]] == ["review_join/claim_decision"]
    [asked] = doc["confirmations"]
    assert asked["suggested"] is None and "partial" not in json.dumps(asked)
    assert "partial" not in json.dumps(doc["layers"])                    # nothing of it written
    [fallback] = doc["model_fallbacks"]
    assert (fallback["key"], fallback["fallback"]) == ("claim_decision", "human")
    assert "'claim_decision' may take" in fallback["error"] and "fraud_review, payout_review" in fallback["error"]
    first, second = _conflict_requests(stub, "claim_decision")
    assert "may take" in second[-1]["content"] and "approve" in second[-1]["content"], second[-1]["content"]
    payout = next(c for c in doc["conflicts"] if c["key"] == "payout_amount")
    assert payout["resolution"]["resolver"] == "model" and payout["resolution"]["value"] == 0

    done = Engine(store, model=MODEL).resume(doc["instance_id"],
                                             answers={"confirmations": {"review_join/claim_decision": "deny"}})
    assert done.status == "completed", done.error
    assert done.main.resolve("claim_decision") == "deny" and done.main.resolve("payout_amount") == 0


def test_a_compromise_the_steps_schema_allows_is_the_models_to_settle(stub: ClaimStub) -> None:
    stub.on("conflict", arbiter("refer", "fraud signals go to investigation"), arbiter(600, "half, pending review"))
    done = _run()
    assert done.status == "completed", done.error
    assert (done.main.resolve("claim_decision"), done.main.resolve("payout_amount")) == ("refer", 600)
    assert [c["resolution"]["resolver"] for c in done.conflicts] == ["model", "model"]


def _without_schemas(tmp_path: Path) -> Path:
    """The claim process whose review steps name their keys (``outputKeys``) instead of an ``outputSchema``:
    nothing bounds the arbiter's value but the conflict's own values."""
    config = yaml.safe_load((HERE / "claim_payout.layerflow.yaml").read_text(encoding="utf-8"))
    for step in ("fraud_review", "payout_review"):
        schema = config[step]["llm"].pop("outputSchema")
        config[step]["llm"]["outputKeys"] = schema["required"]
    shutil.copy(HERE / "claim_payout.bpmn", tmp_path)
    (tmp_path / "claim_payout.layerflow.yaml").write_text(yaml.safe_dump(config), encoding="utf-8")
    return tmp_path / "claim_payout.bpmn"


@pytest.mark.parametrize("schemas", [True, False], ids=["output-schema", "output-keys"])
def test_a_value_of_another_json_type_is_asked_again_told_why_and_the_number_is_written(
        stub: ClaimStub, tmp_path: Path, schemas: bool) -> None:
    stub.on("conflict", arbiter("approve", "the damage is covered"), arbiter("1200", "covered"), arbiter(1200, "covered"))
    done = _run(process=HERE / "claim_payout.bpmn" if schemas else _without_schemas(tmp_path))
    assert done.status == "completed", done.error
    assert done.main.resolve("payout_amount") == 1200 and done.main.resolve("claim_decision") == "approve"
    first, second = _conflict_requests(stub, "payout_amount")
    assert second[:len(first)] == first                                   # the retry shares the cached prefix
    assert json.loads(second[len(first)]["content"])["final_value"] == "1200"
    told = second[-1]["content"]
    assert second[-1]["role"] == "user" and '"1200"' in told and "string" in told and ("integer" in told or "number" in told), told
    [failed, resolved] = _steps(done, "payout_amount")
    assert failed[:2] == ("model", "failed") and '"1200"' in failed[2] and "string" in failed[2], failed
    assert resolved[:2] == ("model", "resolved") and done.model_fallbacks() == []


def test_a_value_of_another_json_type_twice_goes_to_a_person_without_it(stub: ClaimStub, tmp_path: Path) -> None:
    stub.on("conflict", arbiter("deny"), arbiter("0"), arbiter("0"))
    waiting = _run(process=_without_schemas(tmp_path))
    assert waiting.status == "waiting", waiting.error
    [asked] = waiting.confirmations
    assert asked["id"] == "review_join/payout_amount" and asked["suggested"] is None
    assert "0" not in [o["value"] for o in asked["options"]]
    [fallback] = waiting.model_fallbacks()
    assert (fallback["key"], fallback["purpose"]) == ("payout_amount", "conflict_resolution")
    assert 'final_value "0" is a string' in fallback["error"], fallback


@pytest.mark.parametrize(("bad", "problem"), [
    pytest.param(Reply.text('Here is my decision: {"final_value": "deny", "rationale": "fraud", "escalate": false}'),
                 "not JSON", id="prose"),
    pytest.param(Reply.json({"final_value": "deny", "escalate": True}), "rationale", id="escalate-without-rationale"),
    pytest.param(arbiter("deny", "  "), "rationale", id="blank-rationale"),
    pytest.param(Reply.text('{"final_value": "deny", "ratio', finish_reason="length"), "cut off", id="cut-at-max-tokens"),
])
def test_a_malformed_answer_is_asked_again_with_the_reply_and_what_was_wrong(stub: ClaimStub, bad: Reply,
                                                                            problem: str) -> None:
    stub.on("conflict", bad, arbiter("deny"), arbiter(0))
    done = _run()
    assert done.status == "completed", done.error
    assert done.main.resolve("claim_decision") == "deny"
    first, second = _conflict_requests(stub, "claim_decision")
    assert second[:len(first)] == first
    assert [m["role"] for m in second[len(first):]] == ["assistant", "user"]
    assert second[len(first)]["content"] == bad.content
    assert problem in second[-1]["content"] and "final_value" in second[-1]["content"], second[-1]["content"]
    [failed, resolved] = _steps(done, "claim_decision")
    assert failed[:2] == ("model", "failed") and resolved[:2] == ("model", "resolved")
    assert all(c["resolution"]["reason"].strip() for c in done.conflicts)


# ===== two models: each element's own ================================================================

def test_the_joins_own_model_settles_its_conflicts_at_its_own_endpoint(stub: ClaimStub, tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("LAYERFLOW_MODEL_API_BASE")
    with ClaimStub({"conflict": arbiter("deny")}) as judge:
        judge.on("conflict", arbiter("deny"), arbiter(0))
        config = yaml.safe_load((HERE / "claim_payout.layerflow.yaml").read_text(encoding="utf-8"))
        for step in ("fraud_review", "payout_review", "settle"):
            config[step]["llm"].update(model="openai/worker-model", apiBase=stub.url)
        config["review_join"]["llm"].update(model="openai/judge-model", apiBase=judge.url)
        shutil.copy(HERE / "claim_payout.bpmn", tmp_path)
        (tmp_path / "claim_payout.layerflow.yaml").write_text(yaml.safe_dump(config), encoding="utf-8")
        done = _run(Engine("memory://"), tmp_path / "claim_payout.bpmn")
        assert done.status == "completed", done.error
        assert judge.kinds() == ["conflict", "conflict"] and {r["model"] for r in judge.requests} == {"judge-model"}
        assert "conflict" not in stub.kinds() and {r["model"] for r in stub.requests} == {"worker-model"}
        assert [c["resolution"]["resolver"] for c in done.conflicts] == ["model", "model"]
        calls = [e.data for e in done.main.tape if (e.data or {}).get("note") == "llm_call"
                 and e.data.get("purpose") == "conflict_resolution"]
        assert {c["model"] for c in calls} == {"openai/judge-model"}, calls


# ===== the summaries ================================================================================

def _summaries(instance: Any) -> str:
    history = instance.main.layer(3)
    return json.dumps({k: v for k, v in history.items() if isinstance(v, dict) and "summary" in v})


def test_a_summary_that_restates_a_preserved_key_with_another_value_is_asked_again(stub: ClaimStub) -> None:
    stub.on("conflict", arbiter("deny"), arbiter(0))
    stub.on("summary", Reply.text("claim_ref: CLM-999. payout_amount: 5000. " + SUMMARY))
    done = _run()
    assert done.status == "completed", done.error
    assert done.main.resolve("claim_ref") == "CLM-7" and done.main.resolve("payout_amount") == 0
    assert "CLM-999" not in _summaries(done) and "5000" not in _summaries(done)
    retry = [b["messages"] for b in stub.requests if kind_of(b) == "summary"][1]
    assert "claim_ref" in retry[-1]["content"] and "CLM-7" in retry[-1]["content"], retry[-1]["content"]
    assert done.model_fallbacks() == []


def test_a_summary_that_keeps_restating_a_preserved_key_is_written_offline_and_listed(
        stub: ClaimStub, monkeypatch: pytest.MonkeyPatch) -> None:
    stub.defaults["summary"] = Reply.text("payout_amount: 5000. " + SUMMARY)
    stub.on("conflict", arbiter("deny"), arbiter(0))
    done = _run()
    assert done.status == "completed", done.error
    assert "5000" not in _summaries(done)
    [fallback] = done.model_fallbacks()
    assert (fallback["element_id"], fallback["purpose"]) == ("settle", "compression_summary")
    assert "payout_amount" in fallback["error"] and "preserved" in fallback["error"], fallback


# ===== the tools ====================================================================================

def test_a_tool_call_on_system_or_process_is_refused_to_the_model_and_nothing_changes(stub: ClaimStub) -> None:
    stub.on("conflict", arbiter("deny"), arbiter(0))
    stub.on("settle", Reply.calls(("context_compress", {"action": "compress", "target_layers": ["L0", "L1"]}),
                                  ("context_branch", {"action": "snapshot", "label": "before", "layers": ["L0"]})))
    done = _run()
    assert done.status == "completed", done.error
    calls = [e.data for e in done.main.tape if (e.data or {}).get("note") == "tool_call"]
    assert [c["error"] for c in calls] == ["bad_request", None]
    assert "L0, L1" in json.loads(calls[0]["result"])["error"]["message"]
    back = [b["messages"] for b in stub.requests if kind_of(b) == "settle"][1]
    assert "drop L0, L1 from target_layers" in back[-2]["content"]       # the model reads why
    assert dict(done.main.layer(0)) == {"policy": done.main.resolve("policy")}


@pytest.mark.parametrize(("summary", "misstated"), [
    ("claim_ref: CLM-7. payout_amount: 0. approved: true", []),
    ("claim_ref: CLM-70; payout_amount = 0", ["claim_ref"]),
    ("payout_amount: $5,000 for the kitchen", ["payout_amount"]),
    ("payout_amount: 0.0, approved: False", ["approved"]),
    ("the payout_amount was set by the join; my.claim_ref: X; payout_amount: pending review", []),
    ("notes: {\"claim_ref\": 1}", []),  # another object's field, in JSON: not the key's own statement
])
def test_a_summary_is_judged_by_what_it_states_in_key_value_form(summary: str, misstated: list[str]) -> None:
    from context_layers.summarize import misstated_keys

    facts = {"claim_ref": "CLM-7", "payout_amount": 0, "approved": True, "lines": [1, 2]}
    found = misstated_keys(summary, facts)
    assert [p.split(":", 1)[0].removeprefix("it states ") for p in found] == misstated, found
