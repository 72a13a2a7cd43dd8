"""Outsider round 26: two processes nobody here had seen, written from DESIGN.md and README.md only
(tests/engine/unseen26/), driven through the Python API, the CLI and a real server on Redis.

sae_review (bpmn.io file with Flowable form properties): a clinical trial's serious adverse event.
  A start form (`flowable:formProperty`: an enum, a `datePattern` date); `open_case` preserves the
  case id; a parallel split whose branches get `reviewer_role` by contextInject: the investigator's
  `medical_review` (a user task with a Flowable form and a non-interrupting boundary cycle timer,
  `"R2/PT12H"`, that reminds the investigator) and the safety physician's `safety_assessment` (a model
  activity run by its offline handler) that, for a severe event, throws the escalation SAE_SEVERE caught
  by a non-interrupting escalation event sub-process (`dsmb_notice`) while the other branch still waits;
  the join reconciles `reportable` through a person (`humanConfirm` with a per-key `defaults:
  {reportable: true}`) and unions `signal_terms`; an expedited report (a send task whose message
  nothing in the instance catches: `messages_out`) waits for the regulator's acknowledgement; a
  non-interrupting signal event sub-process records an emergency unblinding at any time.

vendor_tender (bpmn.io / SpiffArena): a parallel multi-instance sub-process collects one bid per
  vendor; inside each instance a price check and a capacity check run in parallel and a join asks the
  buyer when they disagree on `bid_ok` (humanConfirm, default false); a vendor on the sanctions list
  makes its instance raise `engine.BpmnError` VENDOR_SANCTIONED, caught by an error boundary event of
  the multi-instance sub-process; a boundary timer closes the bid window after seven days; the
  evaluation writes one near-duplicate tool result per bid and compresses by its attention scores
  (extract_keys); legal and finance approve the award in parallel (BRANCH_PRIORITY, reducers
  `append` and `min`).

Expected before anything ran: as README says for each; in particular, an interrupting event that
cancels a sub-process (an error caught at the multi-instance activity, its deadline timer) closes the
confirmations its joins waited for: the instance no longer waits for them, their conflicts keep
`"resolution": null` and add `"cancelled": true`, as README says of a join an interrupting event
sub-process cancelled.

Found: the boundary events did not: the cancelled join's confirmation stayed open (listed in
`waiting_for` beside the compliance task, taken as an answer later, unanswered in a completed
instance) and its branches stayed `open`.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from engine import Engine, load_process

from engine_helpers import cli_in_a_tmp_store, run_json
from test_contracts_cli import check_run_document

cli = cli_in_a_tmp_store  # the fixture "cli", here too

HERE = Path(__file__).resolve().parent / "unseen26"
SAE, TENDER = HERE / "sae_review.bpmn", HERE / "vendor_tender.bpmn"
VENDORS = [{"name": "Acme", "price": 42000, "lead_days": 20}, {"name": "Borealis", "price": 39000, "lead_days": 45},
           {"name": "Cobalt", "price": 47000, "lead_days": 10}]
TENDER_DATA = {"tender_no": 77, "vendors": VENDORS}
T0 = 1_800_000_000.0


class Clock:
    """The engine's clock (``Engine(clock=...)``), moved by the test."""

    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> float:
        return self.now


def _confirmation(doc: dict[str, Any], cid: str) -> dict[str, Any]:
    [found] = [c for c in doc["confirmations"] if c["id"] == cid]
    return found


# ===== the tender: an interrupt of the multi-instance sub-process closes what its joins asked ======

def test_a_sanctioned_vendor_cancels_the_bidding_and_the_question_another_bid_asked(cli: Any) -> None:
    """Cobalt's instance throws VENDOR_SANCTIONED while Borealis's join waits for the buyer: the
    boundary event ends the whole multi-instance sub-process, so nobody will answer that question."""
    doc = run_json(cli, "run", str(TENDER), "--data", json.dumps(dict(TENDER_DATA, sanctions_list=["Cobalt"])), code=3)
    check_run_document(doc)
    assert [w["task_id"] for w in doc["waiting_for"]] == ["compliance_review"]
    history = doc["layers"]["L3"]
    assert (history["error_code"], history["vendor"]) == ("VENDOR_SANCTIONED", "Cobalt")
    [conflict] = doc["conflicts"]
    assert (conflict["gateway_id"], conflict["key"], conflict["resolution"]) == ("bid_join", "bid_ok", None)
    assert conflict["cancelled"] is True
    asked = _confirmation(doc, "bid_join/bid_ok")
    assert asked["cancelled"] is True and asked["answer"] is None
    branches = {c["branch_id"]: c["status"] for name, c in doc["contexts"].items() if "collect_bids#2" in name}
    assert branches["price_check"] == branches["capacity_check"] == "cancelled"
    # an answer to it (a script gives every resume the same answers) changes nothing: not bad input
    late = run_json(cli, "resume", doc["instance_id"], "--answer", "bid_join/bid_ok=false", code=3)
    assert late["conflicts"] == doc["conflicts"] and _confirmation(late, "bid_join/bid_ok")["answer"] is None
    done = run_json(cli, "resume", doc["instance_id"], "--answer", 'compliance_review={"decision": "void"}', code=0)
    assert done["status"] == "completed" and done["conflicts"][0]["cancelled"] is True


def test_the_bid_window_closing_cancels_the_question_a_bid_asked() -> None:
    clock = Clock()
    engine = Engine("memory://", clock=clock)
    waiting = engine.run(engine.start(load_process(TENDER), TENDER_DATA))
    assert [w["id"] for w in waiting.waiting_for if w["kind"] == "confirmation"] == ["bid_join/bid_ok"]
    clock.now += 7 * 86400 + 1
    done = engine.resume(waiting.id)
    doc = done.to_document()
    assert doc["status"] == "completed", doc["error"]
    assert done.main.resolve("tender_outcome").startswith("lapsed")
    assert "bids" not in done.main and "awarded_to" not in done.main
    [conflict] = doc["conflicts"]
    assert conflict["resolution"] is None and conflict["cancelled"] is True
    assert _confirmation(doc, "bid_join/bid_ok")["cancelled"] is True
