"""The contract review of tests/test_outsider47_legal.py with a model, and with a commercial reviewer who
never answers. The model is reached through litellm's real client against the OpenAI-compatible stub on
127.0.0.1 (tests/stub_llm.py), answering by what each request asks; the first extraction breaks the
outputSchema's enum and is asked again. Every step is a ``layerflow`` subprocess.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tests.stub_llm import Reply, StubLLM
from tests.test_outsider47_legal import BPMN, ENV, HERE, doc_of, layerflow

EXTRACTED = {"clauses": ["Clause 1. Services.", "Clause 2. Unlimited liability."], "liability_cap": "standard",
             "governing_law": "england", "clause_notes": "Two clauses; liability is standard."}


class ContractStub(StubLLM):
    """Answers by the step a request comes from: extraction (the first answer off the schema), the legal
    review, and anything else (a compression's summary) with a short text."""

    def _next(self, body: dict[str, Any]) -> Reply:
        with self._lock:
            self.requests.append(body)
            text = json.dumps(body.get("messages"))
            if "Extract the clauses" in text:
                tries = sum("Extract the clauses" in json.dumps(r.get("messages")) for r in self.requests)
                return Reply.json({**EXTRACTED, "liability_cap": "capped"} if tries == 1 else EXTRACTED)
            if "Review the clauses for legal risk" in text:
                return Reply.json({"risk_rating": "low", "redlines": [], "legal_note": "standard terms"})
            return Reply.text("Contract reviewed; low risk.")


def test_model_steps_through_litellm_against_the_stub(tmp_path: Path, monkeypatch: Any) -> None:
    answers = json.loads((HERE / "answers.json").read_text())
    intake = {**answers["user_tasks"]["intake"], "contract_value": 20000, "jurisdiction": "england"}
    with ContractStub() as stub:
        monkeypatch.setitem(ENV, "LAYERFLOW_MODEL_API_BASE", stub.url)
        monkeypatch.setitem(ENV, "LAYERFLOW_MODEL_API_KEY", "test-key")
        monkeypatch.setitem(ENV, "LAYERFLOW_RETRY_BASE_DELAY", "0.01")
        doc = doc_of("run", str(BPMN), "--data", '{"negotiation_round": 0, "processes_personal_data": false}',
                     "--answer", "intake=" + json.dumps(intake), "--model", "openai/stub-model",
                     "--store", f"sqlite:///{tmp_path / 'runs.db'}")
    assert doc["status"] == "completed", doc["error"]
    history = doc["layers"]["L3"]
    assert history["risk_rating"] == "low" and history["liability_cap"] == "standard"   # preserved through the cliff
    assert history["counterparty"] == "Acme GmbH" and history["contract_value"] == 20000
    assert doc["conflicts"] == []                 # one branch taken (small, no personal data): nothing to merge
    extraction = [r for r in stub.requests if "Extract the clauses" in json.dumps(r["messages"])]
    assert len(extraction) == 2                   # the answer off the schema was sent back once
    assert "capped" in json.dumps(extraction[1]["messages"])
    assert all(r["model"] == "stub-model" for r in stub.requests)


def test_the_commercial_reviewer_times_out(tmp_path: Path) -> None:
    store = f"sqlite:///{tmp_path / 'runs.db'}"
    answers = json.loads((HERE / "answers.json").read_text())
    doc = doc_of("run", str(BPMN), "--data", str(HERE / "start.json"), "--answer",
                 "intake=" + json.dumps(answers["user_tasks"]["intake"]), "--store", store, code=3)
    timer = next(w for w in doc["waiting_for"] if w["kind"] == "timer")
    assert timer["task_id"] == "commercial_deadline" and timer["context"].startswith("main/commercial_review")
    late = doc_of("resume", doc["instance_id"], "--now", "2099-01-01T00:00:00Z", "--store", store, code=3)
    (wait,) = late["waiting_for"]
    assert wait["id"] == "review_join/redlines"
    (redlines,) = [c for c in late["conflicts"] if c["key"] == "redlines"]
    assert redlines["values"]["commercial_review"] == ["commercial review timed out"]   # the timer's path
    # the join waits for the partner: main is as the split left it; the branch's tape shows the default path
    assert "activity:commercial_default" not in late["layers"]["L3"]
    tape = layerflow("tape", doc["instance_id"], "--activity", "commercial_default", "--store", store).stdout
    assert "write\tcommercial_default\tcommercial_default\tL4.redlines" in tape
