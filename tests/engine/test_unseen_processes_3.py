"""Processes written for this file (``tests/engine/unseen3/``), each combining layerflow's own
governance with a shape the earlier unseen rounds and ``test_governance_configs`` do not:
two model assessors whose conflicts the join's policy rules, rankings and a person settle;
a human appeal behind an XOR whose branches inject context; three KYC checks of which two
conflict, answered after a save and a resume in another process; nested parallel splits
inside an inclusive gateway with reducers and a BRANCH_PRIORITY naming a branch that did not
run; a review loop whose HISTORY grows until compression fires inside the loop; joins inside a
sub-process and after it; a conflict at a join inside a multi-instance body; preserved keys
across two compressions and a join; strategies and reducers on inclusive joins where only
some branches ran (one reducer key starting in WORKING); PROCESS written twice; a
natural-language XOR condition decided by a fake model.

Every expected value here was derived by hand from DESIGN.md and README.md, then checked
through ``layerflow run --json`` (in-process, click's CliRunner), ``--answers``, ``resume``,
``tape``, ``replay --until``, ``rollback`` and the Python API."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any, NamedTuple

import pytest
from click.testing import CliRunner

from context_layers import Layer, LayeredContext, thaw
from engine import Engine, load_process
from engine.cli import main
from gateways import ArbitrationAnswer, ArbitrationRequest
from gateways.conditions import BranchAnswer, BranchQuestion

from test_unseen_processes import _check_document

UNSEEN = Path(__file__).resolve().parent / "unseen3"
ROOT = Path(__file__).resolve().parents[2]


class Case(NamedTuple):
    process: str
    data: dict[str, Any]
    answers: dict[str, Any]  # the --answers document ({} : none)
    config: str | None  # --config FILE in unseen3 (None: PROCESS.layerflow.yaml or the BPMN's own)
    status: str
    values: dict[str, Any]  # data keys after the run (PROCESS and HISTORY), a subset
    conflicts: list[tuple[str, str, dict[str, Any], Any, str | None]]  # gateway, key, values, resolution value, resolver
    compressions: list[tuple[str, list[str]]]  # activity id, triggers
    waiting: list[str]  # waiting_for ids


CLAIMS = {"claim_no": 17, "claim_amount": 6000}
CLAIM_CONFLICTS = [
    ("assess_join", "next_step", {"medical_assessor": "pay", "fraud_assessor": "investigate"}, "investigate", "human"),
    ("assess_join", "payout", {"medical_assessor": 4800, "fraud_assessor": 6000}, 0, "policy"),   # the rule
    ("assess_join", "severity", {"medical_assessor": "moderate", "fraud_assessor": "high"}, "high", "policy")]  # ranking
SHIPMENTS = {"shipments": [{"id": "S1", "kg": 3}, {"id": "S2", "kg": 20}]}
CARRIER = ("carrier_join", "carrier", {"ask_dhl": "dhl", "ask_ups": "ups"})

CASES: dict[str, Case] = {
    "two AI assessors: a policy rule, a ranking and a person settle three conflicts": Case(
        "claims_triage", CLAIMS, {"confirmations": {"assess_join/next_step": "investigate"}}, None, "completed",
        {"claim_ref": "CL-17", "severity": "high", "payout": 0, "next_step": "investigate", "fraud_score": 0.72,
         "medical_note": "fracture, 6 weeks",
         "settlement": {"ref": "CL-17", "payout": 0, "severity": "high", "next": "investigate"}},
        CLAIM_CONFLICTS, [], []),
    "the same claim, nobody answers: the rule and the ranking settle theirs, the person's waits": Case(
        "claims_triage", CLAIMS, {}, None, "waiting", {"claim_ref": "CL-17", "next_step": "triage"},
        [(*c[:3], None, None) if c[1] == "next_step" else c for c in CLAIM_CONFLICTS], [], ["assess_join/next_step"]),
    "content moderation: the appeal branch's contextInject, the person restores the post": Case(
        "content_moderation", {"post_text": "buy spam now"},
        {"user_tasks": {"human_appeal": {"appeal_decision": "restore"}}}, None, "completed",
        {"verdict": "remove", "strikes": 1, "appeal_queue": "tier2", "sla_hours": 48, "appeal_decision": "restore",
         "final_state": "visible", "seen_queue": "tier2"}, [], [], []),
    "content moderation: the default branch gets its own contextInject": Case(
        "content_moderation", {"post_text": "nice photo"}, {}, None, "completed",
        {"verdict": "keep", "strikes": 0, "appeal_queue": "none", "final_state": "visible", "seen_queue": "none"},
        [], [], []),
    "KYC: two of three checks conflict, a person answers from --answers; an append reducer": Case(
        "kyc_checks", {"customer_name": "Ivan Petrov"}, {"confirmations": {"kyc_join/risk_flag": "hit"}}, None,
        "completed", {"risk_flag": "hit", "id_verified": True, "address_ok": True, "onboard": False,
                      "checks_done": ["identity", "sanctions", "address"], "sanctions_list": "EU-2026-11"},
        [("kyc_join", "risk_flag", {"identity_check": "clear", "sanctions_check": "hit"}, "hit", "human")], [], []),
    "KYC: the checks agree, nothing to ask": Case(
        "kyc_checks", {"customer_name": "Ana Silva"}, {}, None, "completed",
        {"risk_flag": "clear", "onboard": True, "checks_done": ["identity", "sanctions", "address"]}, [], [], []),
    "vendor onboarding: a nested parallel inside an inclusive split, the priority's first branch did not run": Case(
        "vendor_onboarding", {"country": "FR", "contract_value": 50000}, {}, None, "completed",
        {"findings": ["record created", "tax ok", "iso ok", "samples ok"], "cost": 450, "vendor_tier": "gold",
         "iso_score": 91, "active": True},
        [("checks_join", "vendor_tier", {"tax_check": "silver", "quality_split": "gold"}, "gold", "strategy")], [], []),
    "vendor onboarding: the other two branches": Case(
        "vendor_onboarding", {"country": "DE", "contract_value": 500000}, {}, None, "completed",
        {"findings": ["record created", "iso ok", "samples ok", "legal ok"], "cost": 1250, "vendor_tier": "platinum"},
        [("checks_join", "vendor_tier", {"quality_split": "gold", "legal_review": "platinum"}, "platinum", "strategy")],
        [], []),
    "a review loop: HISTORY grows each round until its message threshold folds it, twice": Case(
        "review_loop", {"rounds": 3}, {}, None, "completed",
        {"revision": 3, "feedback": "round 3: tighten the wording of the equipment clause and the security clause",
         "published": "Remote work policy v2: staff may work remotely two days a week; laptops are encrypted."},
        [], [("review", ["message_threshold"]), ("review", ["message_threshold"])], []),
    "a join inside a sub-process (LAST_WRITER_WINS, a sum reducer), another right after it": Case(
        "due_diligence", {}, {}, None, "completed",
        {"rating": "C", "open_issues": 7, "ebitda_checked": True, "litigation": ["supplier dispute"],
         "board_memo": "rating C, 7 open issues", "team_memo": "renegotiate"},
        [("dd_join", "rating", {"finance_dd": "B", "legal_dd": "C"}, "C", "strategy")], [], []),
    "joins inside both branches, one branch ends at its inner join, the other runs a step after it": Case(
        "site_audit", {}, {}, None, "completed",
        {"fire_rating": "fail", "power_rating": "replace wiring", "power_summary": "power: replace wiring",
         "report": "fail / replace wiring"},
        [("fire_join", "fire_rating", {"fire_inspector_a": "pass", "fire_inspector_b": "fail"}, "fail", "strategy"),
         ("power_join", "power_rating", {"power_inspector_a": "ok", "power_inspector_b": "replace wiring"},
          "replace wiring", "strategy")], [], []),
    "a conflict at a join inside each instance of a multi-instance body, one answer for both": Case(
        "shipment_quotes", SHIPMENTS, {"confirmations": {"carrier_join/carrier": "ups"}}, None, "completed",
        {"quotes": [{"id": "S1", "carrier": "ups", "price": 18}, {"id": "S2", "carrier": "ups", "price": 35}],
         "total": 53}, [(*CARRIER, "ups", "human")] * 2, [], []),
    "the multi-instance conflicts unanswered: one question and one conflict per instance": Case(
        "shipment_quotes", SHIPMENTS, {}, None, "waiting", {}, [(*CARRIER, None, None)] * 2, [],
        ["carrier_join/carrier", "carrier_join/carrier#2"]),
    "preserved keys across two compressions and a join": Case(
        "customer_profile", {"customer_id": "C-88"}, {}, None, "completed",
        {"profile": {"customer_id": "C-88", "segment": "smb", "contacts": ["ops@acme.example"]},
         "consent": "marketing-no", "consent_seen": "marketing-no", "churn": 0.3, "upsell": 0.6,
         "summary_line": "C-88 churn 0.3 upsell 0.6"},
        [], [("enrich_crm", ["token_threshold"]), ("enrich_calls", ["token_threshold"]),
             ("upsell_score", ["token_threshold"])], []),
    "both branches fold the same HISTORY: the join keeps one summary, the first branch's": Case(
        "account_review", {"customer_id": "C-88"}, {}, None, "completed",
        {"profile": {"customer_id": "C-88", "segment": "smb", "contacts": ["ops@acme.example"]},
         "consent": "marketing-no", "churn": 0.3, "upsell": 0.6, "call_notes": "<absent>"},
        [], [("enrich_crm", ["token_threshold"]), ("enrich_calls", ["token_threshold"]),
             ("churn_score", ["token_threshold"]), ("upsell_score", ["token_threshold"])], []),
    "inclusive join, two of three desks ran: BRANCH_PRIORITY skips the desk that did not": Case(
        "desk_routing", {"regions": ["emea", "apac"], "fill_count": 10}, {}, "desk_routing.BRANCH_PRIORITY.yaml",
        "completed", {"route": "apac", "desk_price": 99, "fill_count": 15, "confirmation": "apac at 99, fills 15",
                      # each branch's contextInject: read there, not surviving the join (no branch changed it)
                      "tz_emea": "CET", "tz_apac": "SGT", "tz_amer": "<absent>", "desk_tz": "<absent>"},
        [("desk_join", "route", {"desk_emea": "emea", "desk_apac": "apac"}, "apac", "strategy")], [], []),
    "inclusive join, two of three desks ran: LAST_WRITER_WINS": Case(
        "desk_routing", {"regions": ["apac", "amer"], "fill_count": 10}, {}, "desk_routing.LAST_WRITER_WINS.yaml",
        "completed", {"route": "amer", "desk_price": 99, "fill_count": 17, "tz_apac": "SGT", "tz_amer": "EST"},
        [("desk_join", "route", {"desk_apac": "apac", "desk_amer": "amer"}, "amer", "strategy")], [], []),
    "inclusive join, one desk ran: FAIL_ON_CONFLICT has nothing to fail on": Case(
        "desk_routing", {"regions": ["amer"], "fill_count": 10}, {}, "desk_routing.FAIL_ON_CONFLICT.yaml",
        "completed", {"route": "amer", "desk_price": 100, "fill_count": 14}, [], [], []),
    "inclusive join, two desks conflict: FAIL_ON_CONFLICT stops the instance": Case(
        "desk_routing", {"regions": ["emea", "amer"], "fill_count": 10}, {}, "desk_routing.FAIL_ON_CONFLICT.yaml",
        "error", {}, [("desk_join", "route", {"desk_emea": "emea", "desk_amer": "amer"}, None, None)], [], []),
    "inclusive join, a policy rule over the reduced value suggests a third value a person confirms": Case(
        "desk_routing", {"regions": ["emea", "amer"], "fill_count": 10}, {}, "desk_routing.confirm.yaml",
        "waiting", {"fill_count": "<absent>"},   # the join has merged nothing yet
        [("desk_join", "route", {"desk_emea": "emea", "desk_amer": "amer"}, None, None)], [], ["desk_join/route"]),
    "PROCESS written twice: the second write is denied and stops the instance": Case(
        "case_numbers", {"ticket": "T9", "tier": "gold"}, {}, None, "error",
        {"case_no": "CASE-T9", "opened": True, "priority": "p2"}, [], [], []),
    "a join in a loop: the person's answer is given again each round, a ranking settles the other key": Case(
        "budget_rounds", {}, {"confirmations": {"review_join/verdict": "revise"}}, None, "completed",
        {"round_no": 3, "verdict": "revise", "cap": 240, "decisions": ["revise@80", "revise@160", "revise@240"]},
        [("review_join", key, {"cfo_review": cfo, "ops_review": ops}, won, resolver)
         for n in (1, 2, 3)
         for key, cfo, ops, won, resolver in (("cap", 100 * n, 80 * n, 80 * n, "policy"),
                                              ("verdict", "approve", "revise", "revise", "human"))], [], []),
    "the loop's person approves in the first round": Case(
        "budget_rounds", {}, {"confirmations": {"review_join/verdict": "approve"}}, None, "completed",
        {"round_no": 1, "verdict": "approve", "decisions": ["approve@80"]},
        [("review_join", "cap", {"cfo_review": 100, "ops_review": 80}, 80, "policy"),
         ("review_join", "verdict", {"cfo_review": "approve", "ops_review": "revise"}, "approve", "human")], [], []),
    "a person's task and a policy script in parallel branches: BRANCH_PRIORITY favours the person": Case(
        "expense_approval", {"amount": 700}, {"user_tasks": {"manager_approval": {"approved": True, "approver": "kim"}}},
        None, "completed", {"approved": True, "approver": "kim", "policy_note": "over limit", "paid": 700},
        [("approval_join", "approved", {"manager_approval": True, "policy_check": False}, True, "strategy")], [], []),
    "a natural-language XOR without a model: the expressions decide": Case(
        "refund_routing", {"message": "hi", "amount": 20, "previous_refunds": 0}, {}, None, "completed",
        {"refunded": 20, "handled_by": "auto", "channel": "auto"}, [], [], []),
}


def _data(doc: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in doc["layers"]["L3"].items() if not k.startswith(("_", "activity:", "compaction:"))} \
        | doc["layers"]["L1"]


def _cli(*args: str) -> tuple[int, Any, str]:
    result = CliRunner().invoke(main, list(args))
    try:
        doc = json.loads(result.stdout) if "--json" in args else result.stdout
    except json.JSONDecodeError:
        raise AssertionError(f"not one JSON document: {result.stdout!r} {result.stderr!r}") from None
    return result.exit_code, doc, result.stderr


def assert_replays(doc: dict[str, Any], store: str) -> Any:
    """Every snapshot of every context of the run ``doc`` rebuilds from its tape byte for byte,
    the whole tape rebuilds the context, and ``replay --until`` the end gives ``doc``'s layers."""
    instance = Engine(store).load(doc["instance_id"])
    for ctx in instance.contexts.values():
        for snap in ctx.snapshots.values():
            rebuilt = LayeredContext.replay(ctx.tape, until=snap.seq, name=ctx.name)
            assert json.dumps(rebuilt.as_dict()) == json.dumps(
                {layer: {k: thaw(v) for k, v in values.items()} for layer, values in snap.as_dict().items()})
        assert LayeredContext.replay(ctx.tape, name=ctx.name) == ctx
    end = instance.main.tape[-1].seq
    rc, replayed, _ = _cli("replay", doc["instance_id"], "--until", str(end), "--store", store, "--json")
    assert rc == 0 and json.dumps(replayed["layers"]) == json.dumps(doc["layers"])
    return instance


def _run(case: Case, tmp_path: Path, *extra: str) -> tuple[int, dict[str, Any], str, str]:
    store = f"sqlite:///{tmp_path / 'u3.db'}"
    args = ["run", str(UNSEEN / f"{case.process}.bpmn"), "--json", "--store", store, "--data", json.dumps(case.data)]
    if case.answers:
        (tmp_path / "answers.json").write_text(json.dumps(case.answers))
        args += ["--answers", str(tmp_path / "answers.json")]
    if case.config:
        args += ["--config", str(UNSEEN / case.config)]
    code, doc, err = _cli(*args, *extra)
    return code, doc, err, store


@pytest.mark.parametrize("name", list(CASES))
def test_run_json_gives_the_outcome_derived_by_hand(name: str, tmp_path: Path) -> None:
    case = CASES[name]
    code, doc, err, _ = _run(case, tmp_path)
    _check_document(doc, code, case.process)
    assert doc["status"] == case.status, (doc["error"], err)
    data = _data(doc)
    assert {k: data.get(k, "<absent>") for k in case.values} == case.values
    got = [(c["gateway_id"], c["key"], c["values"], (c["resolution"] or {}).get("value"),
            (c["resolution"] or {}).get("resolver")) for c in doc["conflicts"]]
    assert sorted(got, key=repr) == sorted(case.conflicts, key=repr)
    assert [(c["activity_id"], c["triggers"]) for c in doc["compressions"]] == case.compressions
    assert [w["id"] for w in doc["waiting_for"]] == case.waiting
    # every conflict of a join that merged is logged once in _mergedConflicts of the context it merged into;
    # a join still waiting for a person (or stopped by FAIL_ON_CONFLICT) has changed nothing yet; the log
    # of a multi-instance body stays in each instance's scope (only the output item comes back)
    logged = doc["layers"]["L3"].get("_mergedConflicts", []) + doc["layers"]["L4"].get("_mergedConflicts", [])
    settled = [c for c in case.conflicts if c[4] is not None] if case.status == "completed" else []
    if case.process != "shipment_quotes":
        assert sorted(((e["gatewayId"], e["key"], e["values"], e["resolution"]["value"], e["resolution"]["resolver"])
                       for e in logged), key=repr) == sorted(settled, key=repr)


@pytest.mark.parametrize("name", list(CASES))
def test_replay_rebuilds_every_snapshot_and_the_end_byte_for_byte(name: str, tmp_path: Path) -> None:
    case = CASES[name]
    code, doc, _, store = _run(case, tmp_path)
    instance = assert_replays(doc, store)
    rc, tape, _ = _cli("tape", doc["instance_id"], "--store", store, "--json")   # every context's: tape_length
    assert rc == 0 and len(tape) == doc["tape_length"] == sum(len(c.tape) for c in instance.contexts.values())
    assert [e["seq"] for e in tape if e["context"] == "main"] == list(range(1, instance.main.tape[-1].seq + 1))


@pytest.mark.parametrize("name", list(CASES))
def test_the_python_api_gives_what_the_cli_gives(name: str, tmp_path: Path) -> None:
    case = CASES[name]
    code, doc, _, _ = _run(case, tmp_path)
    process = load_process(UNSEEN / f"{case.process}.bpmn",
                           config=UNSEEN / case.config if case.config else None)
    engine = Engine("memory://")
    instance = engine.run(engine.start(process, case.data), answers=case.answers or None)
    ours = instance.to_document()
    # ids and due times (a confirmation's timeout, from when each run asked) aside
    mine = [{k: v for k, v in w.items() if k != "due"} for w in ours["waiting_for"]]
    assert ours["status"] == doc["status"] and mine == [
        {**{k: v for k, v in w.items() if k != "due"}, "id": mine[i]["id"]} for i, w in enumerate(doc["waiting_for"])]
    assert [("due" in w) for w in ours["waiting_for"]] == [("due" in w) for w in doc["waiting_for"]]
    assert _data(ours) == _data(doc) and ours["conflicts"] == doc["conflicts"]
    assert [(c["activity_id"], c["triggers"], c["tokens_before"], c["tokens_after"]) for c in ours["compressions"]] \
        == [(c["activity_id"], c["triggers"], c["tokens_before"], c["tokens_after"]) for c in doc["compressions"]]
    assert ours["tape_length"] == doc["tape_length"]


# ----- the governance features one at a time, on these processes -----------------------------------------

def test_a_merged_conflicts_log_the_next_split_carries_is_not_doubled_at_its_join(tmp_path: Path) -> None:
    """dd_join logs its conflict in WORKING; notify_split forks right after the sub-process, each branch's
    activity moves the log into HISTORY unchanged: the notify join must not count it once per branch."""
    code, doc, _, _ = _run(CASES["a join inside a sub-process (LAST_WRITER_WINS, a sum reducer), another right after it"],
                           tmp_path)
    assert code == 0
    log = doc["layers"]["L3"]["_mergedConflicts"]
    assert [(e["gatewayId"], e["key"]) for e in log] == [("dd_join", "rating")]
    assert "_mergedConflicts" not in doc["layers"]["L4"]


def test_the_inner_joins_logs_meet_in_one_log_whatever_layer_each_branch_brings_it_in(tmp_path: Path) -> None:
    """fire_join's log reaches audit_join in its branch's WORKING (no step after it), power_join's in
    HISTORY (power_report moved it): one log, in branch order, in HISTORY; nothing left in WORKING
    for the next step's move to overwrite HISTORY's with."""
    code, doc, _, store = _run(CASES["joins inside both branches, one branch ends at its inner join, the other "
                                     "runs a step after it"], tmp_path)
    assert code == 0
    assert [(e["gatewayId"], e["key"]) for e in doc["layers"]["L3"]["_mergedConflicts"]] == [
        ("fire_join", "fire_rating"), ("power_join", "power_rating")]
    assert doc["layers"]["L4"] == {}


@pytest.mark.parametrize("regions, expected", [(["emea", "apac"], 15), (["emea", "apac", "amer"], 19), (["apac"], 13)])
def test_a_sum_reducer_counts_a_working_start_value_once(regions: list[str], expected: int, tmp_path: Path) -> None:
    """fill_count starts in WORKING (data_layers); each desk's activity moves it into HISTORY with its
    addition: the sum is the start value plus each branch's delta, not the branches' totals added up."""
    case = CASES["inclusive join, two of three desks ran: BRANCH_PRIORITY skips the desk that did not"]
    code, doc, err, _ = _run(case._replace(data={"regions": regions, "fill_count": 10}), tmp_path)
    assert code == 0, err
    assert doc["layers"]["L3"]["fill_count"] == expected and "fill_count" not in doc["layers"]["L4"]


def test_yes_takes_the_rule_suggestion_made_over_the_reduced_value(tmp_path: Path) -> None:
    """The rule's ``when`` reads the merged context: fill_count is 10 + 2 + 4 = 16 there (> 12)."""
    case = CASES["inclusive join, a policy rule over the reduced value suggests a third value a person confirms"]
    code, doc, err, _ = _run(case, tmp_path, "--yes")
    assert code == 0, err
    [asked] = doc["confirmations"]
    assert asked["suggested"] == "split_fill" and asked["answer"] == "split_fill"
    assert [o["value"] for o in asked["options"]] == ["emea", "amer", "split_fill", "$escalate"]
    assert doc["conflicts"][0]["resolution"]["resolver"] == "human"
    assert doc["layers"]["L3"]["confirmation"] == "split_fill at 100, fills 16"


def test_kyc_confirmation_answered_after_a_resume_in_another_process(tmp_path: Path) -> None:
    case = CASES["KYC: the checks agree, nothing to ask"]._replace(data={"customer_name": "Ivan Petrov"})
    code, doc, _, store = _run(case, tmp_path)
    assert code == 3 and [w["id"] for w in doc["waiting_for"]] == ["kyc_join/risk_flag"]
    [asked] = doc["confirmations"]
    assert [o["value"] for o in asked["options"]] == ["clear", "hit", "$escalate"]
    assert asked["default"] == "hit" and asked["timeout"] == 86400
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    # a value not offered is bad input; the instance still waits
    bad = subprocess.run([sys.executable, "-m", "engine.cli", "resume", doc["instance_id"], "--store", store,
                          "--answer", "kyc_join/risk_flag=maybe", "--json"], capture_output=True, text=True, env=env,
                         stdin=subprocess.DEVNULL, timeout=120)
    assert bad.returncode == 2 and "maybe" in json.loads(bad.stdout)["error"]["message"]
    done = subprocess.run([sys.executable, "-m", "engine.cli", "resume", doc["instance_id"], "--store", store,
                           "--answer", "kyc_join/risk_flag=clear", "--json"], capture_output=True, text=True, env=env,
                          stdin=subprocess.DEVNULL, timeout=120)
    assert done.returncode == 0, done.stderr
    final = json.loads(done.stdout)
    assert final["layers"]["L3"]["onboard"] is True and final["layers"]["L3"]["risk_flag"] == "clear"
    assert final["conflicts"][0]["resolution"]["resolver"] == "human"
    assert final["confirmations"][0]["answer"] == "clear" and final["confirmations"][0]["timed_out"] is False
    rc, decisions, _ = _cli("tape", doc["instance_id"], "--kind", "human_decision", "--store", store, "--json")
    assert rc == 0 and [e["data"].get("answer", e["data"].get("value")) for e in decisions] == ["clear"]


def test_an_appeal_answer_that_rewrites_a_process_fact_is_refused_and_the_task_still_waits(tmp_path: Path) -> None:
    case = CASES["content moderation: the default branch gets its own contextInject"]._replace(
        data={"post_text": "buy spam now"})
    code, doc, _, store = _run(case, tmp_path)
    assert code == 3 and [w["task_id"] for w in doc["waiting_for"]] == ["human_appeal"]
    assert doc["waiting_for"][0]["documentation"].startswith("The author appealed")
    # the branch's injected keys are in WORKING while the person decides
    assert {k: doc["layers"]["L4"][k] for k in ("appeal_queue", "sla_hours", "_branch_id")} == {
        "appeal_queue": "tier2", "sla_hours": 48, "_branch_id": "human_appeal"}
    rc, refused, _ = _cli("resume", doc["instance_id"], "--store", store, "--json",
                          "--answer", 'human_appeal={"appeal_decision": "restore", "post_text": "edited"}')
    assert rc == 2 and "post_text" in refused["error"]["message"]
    rc, again, _ = _cli("resume", doc["instance_id"], "--store", store, "--json",
                        "--answer", 'human_appeal={"appeal_decision": "uphold"}')
    assert rc == 0 and again["layers"]["L1"] == {"post_text": "buy spam now"}
    assert again["layers"]["L3"]["final_state"] == "removed"
    rc, denied, _ = _cli("tape", doc["instance_id"], "--kind", "denied", "--store", store, "--json")
    assert rc == 0 and [e["data"]["key"] for e in denied] == ["post_text"]


def test_a_person_in_a_parallel_branch_cannot_change_a_system_key(tmp_path: Path) -> None:
    case = CASES["a person's task and a policy script in parallel branches: BRANCH_PRIORITY favours the person"]
    code, doc, _, store = _run(case._replace(answers={}), tmp_path)
    assert code == 3 and doc["layers"]["L0"] == {"expense_limit": 500}
    rc, refused, _ = _cli("resume", doc["instance_id"], "--store", store, "--json",
                          "--answer", 'manager_approval={"approved": true, "expense_limit": 1000}')
    assert rc == 2 and "expense_limit" in refused["error"]["message"]
    assert [w["task_id"] for w in refused["waiting_for"]] == ["manager_approval"]
    rc, denied, _ = _cli("tape", doc["instance_id"], "--kind", "denied", "--store", store, "--json")
    assert [(e["data"]["key"], e["data"]["effective"], e["data"]["requested"], e["branch"]) for e in denied] == [
        ("expense_limit", 0, 4, "manager_approval")]
    rc, done, _ = _cli("resume", doc["instance_id"], "--store", store, "--json",
                       "--answer", 'manager_approval={"approved": false}')
    assert rc == 0 and done["layers"]["L3"]["paid"] == 0 and done["conflicts"] == []   # both branches said no
    assert done["layers"]["L0"] == {"expense_limit": 500}


def test_the_second_process_write_is_on_the_tape_and_denied_again_on_retry(tmp_path: Path) -> None:
    code, doc, _, store = _run(CASES["PROCESS written twice: the second write is denied and stops the instance"],
                               tmp_path)
    assert code == 1 and doc["error"]["task_id"] == "renumber_case" and "case_no" in doc["error"]["message"]
    assert doc["layers"]["L1"]["case_no"] == "CASE-T9" and "renumbered" not in doc["layers"]["L3"]
    rc, again, _ = _cli("resume", doc["instance_id"], "--store", store, "--json")
    assert rc == 1 and again["layers"]["L1"]["case_no"] == "CASE-T9"
    rc, denied, _ = _cli("tape", doc["instance_id"], "--kind", "denied", "--store", store, "--json")
    assert [(e["activity"], e["data"]["key"], e["data"]["effective"]) for e in denied] == [
        ("renumber_case", "case_no", int(Layer.PROCESS))] * 2
    rc, plain, _ = _cli("tape", doc["instance_id"], "--kind", "denied", "--store", store)
    assert plain.count("case_no") == 2, plain


def test_a_compression_inside_a_branch_folds_the_split_history_and_leaves_preserved_keys_alone(
        tmp_path: Path) -> None:
    """upsell_score's own compression (in its branch) folds compaction:1 and the enrich_calls entries
    of the split's HISTORY into compaction:2; churn_score did not touch them, so the join takes the
    fold (README: a compression is no decision about a value, and nothing here contradicts it)."""
    code, doc, _, store = _run(CASES["preserved keys across two compressions and a join"], tmp_path)
    assert code == 0
    branch_fold = doc["compressions"][2]
    assert branch_fold["context"].startswith("main/upsell_score@")
    assert sorted(branch_fold["folded"]) == ["activity:enrich_calls", "call_notes", "compaction:1"]
    history = doc["layers"]["L3"]
    assert [k for k in history if k.startswith("compaction:")] == ["compaction:2"]
    assert "call_notes" not in history and "crm_notes" not in history
    assert history["upsell_notes"]["_compressed"] == "summarize"
    assert list(history)[:2] == ["profile", "consent"]   # preserved, unchanged, first as they were written
    rc, inspected, _ = _cli("inspect", doc["instance_id"], "--store", store, "--json")
    assert rc == 0 and inspected["preserved"] == ["consent", "profile"]
    assert [b["status"] for b in inspected["branches"]] == ["joined", "joined"]


def test_two_branch_folds_of_one_history_leave_one_summary(tmp_path: Path) -> None:
    code, doc, _, store = _run(CASES["both branches fold the same HISTORY: the join keeps one summary, the first branch's"],
                               tmp_path)
    assert code == 0
    history = doc["layers"]["L3"]
    assert [k for k in history if k.startswith("compaction:")] == ["compaction:2"]
    assert history["compaction:2"]["snapshot_id"].startswith("snap:main/churn_score@")   # a tie: branch order
    assert history["churn_notes"]["_compressed"] == history["upsell_notes"]["_compressed"] == "summarize"
    rc, joins, _ = _cli("tape", doc["instance_id"], "--kind", "join", "--context", "main", "--store", store, "--json")
    [join] = [e for e in joins if e["data"].get("gateway_id") == "score_join"]
    assert join["data"]["dropped_compactions"] == [{"branch": "upsell_score", "key": "compaction:2", "restored": []}]


def test_rollback_of_the_main_context_while_the_kyc_join_waits_is_refused(tmp_path: Path) -> None:
    case = CASES["KYC: the checks agree, nothing to ask"]._replace(data={"customer_name": "Ivan Petrov"})
    code, doc, _, store = _run(case, tmp_path)
    assert code == 3
    rc, refused, _ = _cli("rollback", doc["instance_id"], "snap:main:3", "--store", store, "--json")
    assert rc == 2 and refused["error"]["message"].startswith("rollback: context 'main' of instance ")
    assert "identity_check" in refused["error"]["message"] and "rollback: rollback:" not in refused["error"]["message"]
    rc, done, _ = _cli("resume", doc["instance_id"], "--store", store, "--json", "--answer", "kyc_join/risk_flag=hit")
    assert rc == 0 and done["layers"]["L3"]["onboard"] is False
    assert not Engine(store).load(doc["instance_id"]).main.tape.filter(kind="rollback")   # the refusal changed nothing


def test_rollback_of_the_review_loop_to_its_first_compression(tmp_path: Path) -> None:
    code, doc, _, store = _run(CASES["a review loop: HISTORY grows each round until its message threshold folds it, twice"],
                               tmp_path)
    first = doc["compressions"][0]["snapshot_id"]
    engine = Engine(store)
    snap = engine.load(doc["instance_id"]).main.get_snapshot(first)
    # the snapshot before the first fold: after the second review round (9 HISTORY entries > 6: draft_text,
    # revision, feedback, the records of draft, review, revise and review#2, and the XOR's _branch_id and
    # _snapshot_id, which an activity moved from WORKING with its writes)
    history = snap.layer(Layer.HISTORY)
    assert history["revision"] == 2 and len(history) == 9 and history["_branch_id"] == "revise"
    rc, _, err = _cli("rollback", doc["instance_id"], first, "--layers", "L3", "--store", store, "--json")
    assert rc == 0, err
    after = engine.load(doc["instance_id"]).main
    assert dict(after.layer(Layer.HISTORY)) == dict(snap.layer(Layer.HISTORY))
    assert LayeredContext.replay(after.tape) == after and len(after.tape) > doc["tape_length"]


# ----- the model's parts, faked ------------------------------------------------------------------------

class Chooser:
    def __init__(self, branch: str) -> None:
        self.branch, self.questions = branch, []

    def choose(self, question: BranchQuestion) -> BranchAnswer:
        self.questions.append(question)
        return BranchAnswer(branch=self.branch, rationale=f"the sentences say {self.branch}")


class Arbiter:
    def __init__(self) -> None:
        self.requests: list[ArbitrationRequest] = []

    def arbitrate(self, request: ArbitrationRequest) -> ArbitrationAnswer:
        self.requests.append(request)
        return ArbitrationAnswer(final_value="investigate", rationale="fraud score above 0.7", escalate=False)


@pytest.mark.parametrize("branch, refunded, disagrees", [("auto_refund", 20, False), ("agent_review", 0, True)])
def test_the_model_decides_the_sentences_of_the_refund_route(branch: str, refunded: int, disagrees: bool) -> None:
    chooser = Chooser(branch)
    engine = Engine("memory://", chooser=chooser)
    inst = engine.run(engine.start(load_process(UNSEEN / "refund_routing.bpmn"),
                                   {"message": "hi", "amount": 20, "previous_refunds": 0}))
    assert inst.status == "completed"
    history = inst.main.layer(Layer.HISTORY)
    assert (history["refunded"], history["handled_by"]) == (refunded, branch.split("_")[0])
    [question] = chooser.questions
    notes = [e.data["note"] for e in inst.main.tape if e.kind == "note"]
    assert ("condition_disagreement" in notes) is disagrees


def test_the_model_settles_what_the_claims_policy_leaves_open() -> None:
    arbiter = Arbiter()
    engine = Engine("memory://", arbiter=arbiter)
    inst = engine.run(engine.start(load_process(UNSEEN / "claims_triage.bpmn"), CLAIMS))
    assert inst.status == "completed"
    [request] = arbiter.requests   # the rule and the ranking settled the other two
    assert request.key == "next_step" and dict(request.values) == {"medical_assessor": "pay",
                                                                  "fraud_assessor": "investigate"}
    assert request.related["claim_amount"] == 6000 and "fraud" in (request.policy_text or "")
    resolved = {c["key"]: c["resolution"]["resolver"] for c in inst.conflicts}
    assert resolved == {"next_step": "model", "payout": "policy", "severity": "policy"}
    assert inst.main.resolve("settlement")["next"] == "investigate"


# ----- REST ------------------------------------------------------------------------------------------------

def test_rest_lists_and_answers_each_instance_of_the_multi_instance_conflict(tmp_path: Path) -> None:
    from fastapi.testclient import TestClient

    from engine.api import create_app

    auth = {"Authorization": "Bearer unseen3-token"}
    with TestClient(create_app(f"sqlite:///{tmp_path / 'api.db'}", UNSEEN, "unseen3-token")) as client:
        r = client.post("/api/instances", json={"process_id": "shipment_quotes", "data": SHIPMENTS}, headers=auth)
        assert r.status_code == 201, r.text
        doc = r.json()
        assert doc["status"] == "waiting" and len(doc["conflicts"]) == 2
        iid = doc["instance_id"]
        listed = client.get("/api/confirmations", params={"instance_id": iid}, headers=auth).json()
        assert sorted(c["id"] for c in listed) == ["carrier_join/carrier", "carrier_join/carrier#2"]
        r = client.post("/api/confirmations/carrier_join/carrier", json={"value": "dhl", "instance_id": iid},
                        headers=auth)
        assert r.status_code == 200, r.text
        half = client.get(f"/api/instances/{iid}", headers=auth).json()
        assert half["status"] == "waiting" and [w["id"] for w in half["waiting_for"]] == ["carrier_join/carrier#2"]
        assert sorted(json.dumps(c["resolution"]) for c in half["conflicts"]) == sorted(
            [json.dumps(None), json.dumps({"value": "dhl", "resolver": "human",
                                           "reason": 'a person chose "dhl" (from ask_dhl)'})])
        r = client.post("/api/confirmations/carrier_join/carrier%232", json={"value": "ups", "instance_id": iid},
                        headers=auth)
        assert r.status_code == 200, r.text
        done = client.get(f"/api/instances/{iid}", headers=auth).json()
        assert done["status"] == "completed"
        assert done["layers"]["L3"]["quotes"] == [{"id": "S1", "carrier": "dhl", "price": 16},
                                                  {"id": "S2", "carrier": "ups", "price": 35}]
        assert sorted(c["resolution"]["value"] for c in done["conflicts"]) == ["dhl", "ups"]
        replayed = client.get(f"/api/instances/{iid}/replay", headers=auth).json()
        # the console's replay: per layer, each key with its value (and its tokens, writer, ...)
        assert json.dumps({layer: {k["key"]: k["value"] for k in replayed["layers"][layer]["keys"]}
                           for layer in done["layers"]}) == json.dumps(done["layers"])


@pytest.mark.parametrize("reducer, expected", [("sum", 11), ("max", 9), ("append", None)])
def test_join_contexts_reduces_a_key_the_branches_moved_out_of_working_from_its_split_value(
        reducer: str, expected: int | None) -> None:
    """The pure API: ``n`` (or ``log``) is in the parent's WORKING at the split; each branch's activity
    changes it and moves it into HISTORY, where the split's snapshot has no such key."""
    from gateways import ContextSplitter, apply_join, join_contexts

    ctx = LayeredContext()
    ctx.write(Layer.WORKING, "n", 5, actor="intake")
    ctx.write(Layer.WORKING, "log", ["opened"], actor="intake")
    a, b = ContextSplitter().split(ctx, {"gatewayId": "fork", "branches": [{"id": "a"}, {"id": "b"}]})
    for branch, n in ((a, 7), (b, 9)):
        branch.context.begin_activity(branch.branch_id)
        branch.context.write(Layer.WORKING, "n", n)
        branch.context.write(Layer.WORKING, "log", ["opened", branch.branch_id])
        branch.context.complete_activity(branch.branch_id)
    key = "log" if expected is None else "n"
    joined = join_contexts(ctx.get_snapshot(a.snapshot_id), {"a": a.context, "b": b.context}, gateway_id="fork",
                           config={"reducers": {key: reducer}, "mergeStrategy": "LAST_WRITER_WINS"})
    apply_join(ctx, joined)
    assert ctx.resolve(key) == (["opened", "a", "b"] if expected is None else expected)
    assert key in ctx.layer(Layer.HISTORY) and key not in ctx.layer(Layer.WORKING)
    assert LayeredContext.replay(ctx.tape) == ctx


@pytest.mark.parametrize("name, branch_forks, xor_injects", [
    ("inclusive join, two of three desks ran: BRANCH_PRIORITY skips the desk that did not", 2, 0),
    ("content moderation: the appeal branch's contextInject, the person restores the post", 0, 1),
])
def test_tape_kind_inject_finds_every_context_inject(name: str, branch_forks: int, xor_injects: int,
                                                     tmp_path: Path) -> None:
    """DESIGN lists "inject" among the tape's events: a parallel or inclusive branch's contextInject is
    written by its fork event, an XOR's by an inject change, an operator's (REST inject) by writes
    and a governance note; ``tape --kind inject`` (and ``Tape.filter(kind="inject")``) finds them."""
    code, doc, _, store = _run(CASES[name]._replace(answers={}), tmp_path)   # the appeal waits
    rc, found, err = _cli("tape", doc["instance_id"], "--kind", "inject", "--store", store, "--json")
    assert rc == 0, err
    forks = [e for e in found if e["kind"] == "fork"]
    assert len(forks) == branch_forks and all(e["data"]["inject"]["desk_tz"] for e in forks)
    assert len([e for e in found if e["data"].get("note") == "inject"]) == xor_injects
    assert len(found) == branch_forks + xor_injects
    engine = Engine(store)
    instance = engine.load(doc["instance_id"])
    assert sum(len(c.tape.filter(kind="inject")) for c in instance.contexts.values()) == len(found)
    from engine.governance import GovernanceService, InjectArgs

    if doc["status"] == "completed":
        return
    GovernanceService(engine).inject(doc["instance_id"], InjectArgs(values={"hint": "x"}, reason="ops"))
    rc, found, _ = _cli("tape", doc["instance_id"], "--kind", "inject", "--store", store, "--json")
    assert [e["data"].get("op") for e in found][-1] == "inject"


def test_resolving_the_multi_instance_conflict_by_key_alone_is_ambiguous() -> None:
    from engine.governance import BadRequest, GovernanceService, ResolveArgs

    engine = Engine("memory://")
    inst = engine.run(engine.start(load_process(UNSEEN / "shipment_quotes.bpmn"), SHIPMENTS))
    service = GovernanceService(engine)
    with pytest.raises(BadRequest, match=r"'carrier' is open in several confirmations \(carrier_join/carrier, "
                                         r"carrier_join/carrier#2\); send confirmation_id"):
        service.resolve(inst.id, ResolveArgs(conflict_key="carrier", resolution="dhl", reason="cheaper"))
    out = service.resolve(inst.id, ResolveArgs(confirmation_id="carrier_join/carrier#2", resolution="ups",
                                               reason="faster"))
    assert out["status"] == "waiting" and [w["id"] for w in out["waiting_for"]] == ["carrier_join/carrier"]
    assert sorted(json.dumps(c["resolution"]) for c in out["conflicts"]) == sorted([json.dumps(None), json.dumps(
        {"value": "ups", "resolver": "human", "reason": 'a person chose "ups" (from ask_ups): faster'})])


def test_a_gateway_condition_on_a_key_the_loop_compression_folded_names_the_compression(tmp_path: Path) -> None:
    """record_round's message threshold folds the round's oldest entries (round_no, verdict, cap with
    their activities' records) into compaction:1; the loop's XOR then reads verdict. The error says
    which compression removed it and what to do, as it does for a script (README, "Configuring")."""
    case = CASES["the loop's person approves in the first round"]._replace(
        answers={"confirmations": {"review_join/verdict": "revise"}}, config="budget_rounds.compressed.yaml")
    code, doc, _, _ = _run(case, tmp_path)
    assert code == 1 and doc["error"]["task_id"] == "again"
    [fold] = doc["compressions"]
    assert fold["activity_id"] == "record_round" and "verdict" in fold["folded"]
    message = doc["error"]["message"]
    assert "'verdict' was removed from HISTORY by the compression after activity 'record_round'" in message
    assert fold["snapshot_id"] in message and "preserveKeys" in message
    assert "give 'verdict' a value" not in message
    fixed = tmp_path / "fixed.yaml"
    fixed.write_text((UNSEEN / "budget_rounds.compressed.yaml").read_text().replace(
        "preserveKeys: [decisions]", "preserveKeys: [decisions, verdict, round_no, cap]"))
    code, doc, err, _ = _run(case._replace(config=str(fixed)), tmp_path)
    assert code == 0, err
    assert doc["layers"]["L3"]["decisions"] == ["revise@80", "revise@160", "revise@240"]


def test_one_firing_answered_the_other_timed_out_after_a_reload(tmp_path: Path) -> None:
    now = [1000.0]
    store = f"sqlite:///{tmp_path / 'timeout.db'}"
    process = load_process(UNSEEN / "shipment_quotes.bpmn", config=UNSEEN / "shipment_quotes.timeout.yaml")
    engine = Engine(store, clock=lambda: now[0])
    inst = engine.run(engine.start(process, SHIPMENTS))
    assert [w["id"] for w in inst.waiting_for] == ["carrier_join/carrier", "carrier_join/carrier#2"]
    inst = engine.answer_confirmation(engine.load(inst.id), "carrier_join/carrier#2", "ups")
    assert [w["id"] for w in inst.waiting_for] == ["carrier_join/carrier"]
    now[0] += 59
    assert Engine(store, clock=lambda: now[0]).resume(engine.load(inst.id)).status == "waiting"
    now[0] += 2
    later = Engine(store, clock=lambda: now[0])
    inst = later.resume(later.load(inst.id))
    doc = inst.to_document()
    assert doc["status"] == "completed"
    assert doc["layers"]["L3"]["quotes"] == [{"id": "S1", "carrier": "dhl", "price": 16},
                                             {"id": "S2", "carrier": "ups", "price": 35}]
    assert sorted((c["id"], c["answer"], c["timed_out"]) for c in doc["confirmations"]) == [
        ("carrier_join/carrier", "dhl", True), ("carrier_join/carrier#2", "ups", False)]
    assert sorted(c["resolution"]["value"] for c in doc["conflicts"]) == ["dhl", "ups"]


def test_two_assessors_retrieving_the_same_passages_merge_them_without_asking(tmp_path: Path) -> None:
    """Both assessors' queries find both rule documents, each scored against its own query: one fact
    each, not a disagreement. The join keeps each passage once, at its best confidence."""
    case = CASES["two AI assessors: a policy rule, a ranking and a person settle three conflicts"]._replace(
        config="claims_triage.knowledge.yaml")
    code, doc, err, store = _run(case, tmp_path)
    assert code == 0, err
    assert [c["key"] for c in doc["conflicts"]] == ["next_step", "payout", "severity"]   # no kb: conflict
    instance = Engine(store).load(doc["instance_id"])
    branch_hits = [dict(ctx.layer(Layer.KNOWLEDGE)) for name, ctx in instance.contexts.items() if name != "main"]
    assert len(branch_hits) == 2 and set(branch_hits[0]) == set(branch_hits[1]) == set(doc["layers"]["L2"]) == {
        "kb:claims_rules/fraud.md#1", "kb:claims_rules/medical.md#1"}
    for key, hit in doc["layers"]["L2"].items():
        scores = [thaw(hits[key])["confidence"] for hits in branch_hits]
        assert scores[0] != scores[1] and hit["confidence"] == max(scores)
        assert hit["text"] == thaw(branch_hits[0][key])["text"] and hit["source"] == key.removeprefix("kb:")


@pytest.mark.parametrize("bpmn, config", sorted({(c.process, c.config) for c in CASES.values()}, key=repr)
                         + [("claims_triage", "claims_triage.knowledge.yaml"), ("claims_triage", "claims_triage.confirm.yaml"),
                            ("budget_rounds", "budget_rounds.compressed.yaml"),
                            ("shipment_quotes", "shipment_quotes.timeout.yaml")])
def test_every_process_and_config_here_validates_clean(bpmn: str, config: str | None) -> None:
    args = ["validate", str(UNSEEN / f"{bpmn}.bpmn"), "--json"] + (["--config", str(UNSEEN / config)] if config else [])
    code, doc, _ = _cli(*args)
    assert code == 0 and doc["ok"] is True and doc["problems"] == [], doc["problems"]


def test_the_model_is_not_asked_again_when_the_join_runs_on_after_a_persons_answer() -> None:
    """The payout rule asks a person to confirm; the model settles next_step in the same run of the join.
    Once the person answers, the join runs again: the model's decision, already reported (run --json
    showed it while the instance waited), stays; a model asked again may answer otherwise."""
    class FlipFlop:
        calls = 0

        def arbitrate(self, request: ArbitrationRequest) -> ArbitrationAnswer:
            FlipFlop.calls += 1
            return ArbitrationAnswer(final_value=["investigate", "pay"][(FlipFlop.calls - 1) % 2],
                                     rationale=f"call {FlipFlop.calls}")

    engine = Engine("memory://", arbiter=FlipFlop())
    process = load_process(UNSEEN / "claims_triage.bpmn", config=UNSEEN / "claims_triage.confirm.yaml")
    inst = engine.run(engine.start(process, CLAIMS))
    assert inst.status == "waiting" and [w["id"] for w in inst.waiting_for] == ["assess_join/payout"]
    shown = {c["key"]: c["resolution"] for c in inst.to_document()["conflicts"]}
    assert shown["next_step"]["value"] == "investigate" and shown["payout"] is None
    inst = engine.answer_confirmation(engine.load(inst.id), "assess_join/payout", 0)
    assert inst.status == "completed" and FlipFlop.calls == 1
    final = {c["key"]: c["resolution"] for c in inst.to_document()["conflicts"]}
    assert len(inst.conflicts) == 3 and final["next_step"]["value"] == "investigate"
    assert final["next_step"]["resolver"] == "model" and final["payout"]["resolver"] == "human"
    assert inst.main.resolve("next_step") == "investigate"
