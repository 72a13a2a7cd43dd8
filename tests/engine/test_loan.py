"""The loan-approval demo: fast track, full review, and the seed's conflict path."""

from __future__ import annotations

import pytest

from context_layers import Layer
from engine import Engine, load_process

from engine_helpers import LOAN, LOAN_CONFLICT, LOAN_FAST, LOAN_FULL, path_of, without_due


@pytest.fixture(scope="module")
def process():
    return load_process(LOAN)


@pytest.mark.parametrize(("data", "risk", "track", "approval", "disbursement", "reviewed"), [
    (LOAN_FAST, "low", "fast", "approved", "disburse", False),
    (LOAN_FULL, "medium", "full", "approved", "disburse", True),
    ({**LOAN_CONFLICT, "amount": 80000}, "high", "full", "rejected", "decline", True),  # no dual approval: cautious wins
], ids=["fast-track", "full-review", "high-risk-ranking"])
def test_paths_complete(process, data, risk, track, approval, disbursement, reviewed) -> None:
    engine = Engine()
    instance = engine.run(engine.start(process, data))
    assert instance.status == "completed", instance.error
    ctx = instance.main
    assert (ctx.resolve("risk_level"), ctx.resolve("track_type"), ctx.resolve("approval_status"),
            ctx.resolve("disbursement")) == (risk, track, approval, disbursement)
    assert ("finance_review" in path_of(instance.workflow)) is reviewed
    # preserveKeys of risk_assessment are marked preserved
    assert {"risk_level", "assessment_id", "risk_factors"} <= ctx.preserved
    # SYSTEM comes from the config file and PROCESS from the data
    assert ctx.layer(Layer.SYSTEM)["currency"] == "EUR"
    assert dict(ctx.layer(Layer.PROCESS)) == data


def test_knowledge_items_carry_source_and_confidence(process) -> None:
    engine = Engine()
    instance = engine.run(engine.start(process, LOAN_CONFLICT))
    knowledge = instance.main.layer(Layer.KNOWLEDGE)
    assert knowledge, "risk_assessment retrieves from risk_rules and industry_blacklist"
    for key, item in knowledge.items():
        assert key == f"kb:{item['source']}"
        assert 0.3 <= item["confidence"] <= 1.0  # confidenceThreshold 0.3 dropped the rest
        assert item["collection"] in ("risk_rules", "industry_blacklist")
    assert any(item["collection"] == "industry_blacklist" for item in knowledge.values())
    retrieval = [e for e in instance.main.tape if e.data.get("note") == "retrieval"]
    assert retrieval and retrieval[0].data["dropped"] >= 1


def test_conflict_waits_for_a_person_then_completes(process) -> None:
    engine = Engine()
    instance = engine.run(engine.start(process, LOAN_CONFLICT))
    assert instance.status == "waiting"
    assert without_due(instance.waiting_for) == [{"kind": "confirmation", "id": "review_join/approval_status",
                                     "task_id": "review_join", "key": "approval_status", "context": "main"}]
    [conflict] = instance.conflicts
    assert conflict["key"] == "approval_status" and conflict["resolution"] is None
    assert conflict["values"] == {"finance_review": "approved", "risk_review": "rejected"}
    [confirmation] = instance.confirmations
    assert confirmation["suggested"] == "pending_dual_approval" and confirmation["suggested_by"] == "policy"

    instance = engine.answer_confirmation(instance, "review_join/approval_status", "pending_dual_approval")
    assert instance.status == "completed", instance.error
    ctx = instance.main
    assert ctx.resolve("approval_status") == "pending_dual_approval"
    assert ctx.resolve("disbursement") == "hold_for_second_approval"
    [conflict] = instance.conflicts
    assert conflict["resolution"]["resolver"] == "human"
    assert ctx.resolve("_mergedConflicts")[0]["key"] == "approval_status"
    assert instance.confirmations[0]["answer"] == "pending_dual_approval"
    # the branch-local injections did not survive the join
    assert ctx.get("review_type") is None


def test_answers_document_answers_in_advance(process) -> None:
    engine = Engine()
    answers = {"confirmations": {"review_join/approval_status": "rejected"}}
    instance = engine.run(engine.start(process, LOAN_CONFLICT), answers=answers)
    assert instance.status == "completed"
    assert instance.main.resolve("disbursement") == "decline"


def test_an_answer_outside_the_options_is_refused(process) -> None:
    from context_layers.errors import ActivityError

    engine = Engine()
    instance = engine.run(engine.start(process, LOAN_CONFLICT))
    with pytest.raises(ActivityError, match="not one of the offered option values"):
        engine.answer_confirmation(instance, "review_join/approval_status", "maybe")
    assert instance.status == "waiting"


def test_escalation_fails_the_instance_naming_the_key(process) -> None:
    engine = Engine()
    instance = engine.run(engine.start(process, LOAN_CONFLICT))
    instance = engine.answer_confirmation(instance, "review_join/approval_status", "escalate")
    assert instance.status == "error"
    assert instance.error["kind"] == "merge_conflict"
    assert "approval_status" in instance.error["message"]
    assert "An escalation is final" in instance.error["message"]


def test_the_word_escalate_is_recorded_as_the_option_it_picks(process) -> None:
    # The CLI offers the word `escalate` for the option "$escalate" (a shell expands "$escalate" to
    # nothing); the answer was recorded as the word, so the confirmation and the tape said "escalate"
    # where REST's answer of the same option said "$escalate".
    engine = Engine()
    instance = engine.run(engine.start(process, LOAN_CONFLICT))
    instance = engine.answer_confirmation(instance, "review_join/approval_status", "escalate")
    (entry,) = [c for c in instance.confirmations if c["id"] == "review_join/approval_status"]
    assert entry["answer"] == "$escalate"
    (decision,) = [e.data for e in instance.main.tape if e.data.get("note") == "human_decision"]
    assert decision["value"] == "$escalate"


def test_an_escalated_conflict_is_settled_by_the_rule_an_administrator_adds(process) -> None:
    # The error named "Add a conflictPolicy rule" as a way out, but the person's "$escalate"
    # was consulted first on every resume, so no rule could ever settle the conflict.
    from engine.governance import ConfigArgs, GovernanceService, ResumeArgs

    engine = Engine()
    instance = engine.run(engine.start(process, LOAN_CONFLICT))
    instance = engine.answer_confirmation(instance, "review_join/approval_status", "escalate")
    assert instance.status == "error"
    service = GovernanceService(engine)
    again = service.resume(instance.id, ResumeArgs())  # nothing changed: still escalated
    assert again["status"] == "error" and "escalated by a person" in again["error"]["message"]
    rule = {"key": "approval_status", "when": "True", "value": "pending_dual_approval", "reason": "board decision"}
    service.config(instance.id, ConfigArgs(activity_id="review_join", config={"conflictPolicy": {"rules": [rule]}}))
    done = service.resume(instance.id, ResumeArgs())
    assert done["status"] == "completed", done["error"]
    (conflict,) = done["conflicts"]
    assert conflict["resolution"]["resolver"] == "policy" and conflict["resolution"]["value"] == "pending_dual_approval"
    assert "escalated" in conflict["resolution"]["reason"]
    assert engine.load(instance.id).main.resolve("approval_status") == "pending_dual_approval"


@pytest.mark.parametrize("data", [LOAN_FULL, LOAN_CONFLICT], ids=["full-review", "conflict"])
def test_final_activity_compresses_on_the_token_threshold(process, data) -> None:
    """Issue "compression": the final activity fires on the token threshold, at least the
    seed walk-through's ratio (5000 -> 1800), every preserved key intact, density up."""
    from context_layers import evaluate

    engine = Engine()
    instance = engine.run(engine.start(process, data), answers={"confirmations": {"*": "pending_dual_approval"}})
    assert instance.status == "completed", instance.error
    (report,) = [c for c in instance.compressions if c["activity_id"] == "disbursement_decision"]
    assert "token_threshold" in report["triggers"]
    assert report["tokens_after"] <= 0.36 * report["tokens_before"]
    assert report["attention_after"]["density"] > report["attention_before"]["density"]
    check = evaluate(instance.main, report["snapshot_id"], process.config("disbursement_decision"))
    assert check.preserved_intact and not check.changed_preserved
    for key in ("risk_level", "assessment_id", "risk_factors", "approval_status", "track_type"):
        assert instance.main.get_snapshot(report["snapshot_id"]).layer(Layer.HISTORY)[key] == \
            instance.main.layer(Layer.HISTORY)[key]
