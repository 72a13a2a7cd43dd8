"""Outsider round 27: processes nobody here had seen, written from DESIGN.md and README.md only
(tests/engine/unseen27/), driven through the CLI, a real server and a worker on Redis.

customs_declaration + goods_inspection (two files, `run main.bpmn called.bpmn`): a broker lodges an
  import declaration (`declaration_ref` preserved); a call activity runs the customs office's
  goods_inspection process of the other file, whose parallel split gives each desk its `desk` by
  contextInject: the tariff desk computes the duty and holds goods over 50000 EUR, the documents desk
  holds goods without an origin certificate; the join (configured by the called file's
  goods_inspection.layerflow.yaml) appends the desks' notes and puts a disagreement on `hold_required`
  to the customs officer (humanConfirm, default true, two days); the main process then releases or
  holds the goods by an XOR on `hold_required`.

Expected before anything ran: as README says; in particular a cancelled instance closes what it waited
for: the confirmation (`"cancelled": true`), its conflict (`"resolution": null, "cancelled": true`),
`waiting_for` empty; and, as for the branches an interrupting event cancels, the branches of the join
nobody will reach any more.

Found: `layerflow cancel` (and REST cancel, `Engine.cancel`) closed the confirmation but left the
branch contexts of the join it asked for `"status": "open"` in `contexts`, as if a join were still to
merge them, with no `cancelled` event on their tapes.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from engine_helpers import cli_in_a_tmp_store, run_json
from test_contracts_cli import check_run_document

cli = cli_in_a_tmp_store  # the fixture "cli", here too

HERE = Path(__file__).resolve().parent / "unseen27"
CUSTOMS, INSPECTION = HERE / "customs_declaration.bpmn", HERE / "goods_inspection.bpmn"
LINES = [{"hs_code": "847130", "value": 18000}, {"hs_code": "940360", "value": 4000}]
DISPUTED = {"declaration_no": 7781, "origin_certificate": False, "lines": LINES}   # tariff: clear; documents: hold


def _lodge(cli: Any, data: dict[str, Any], code: int = 3) -> dict[str, Any]:
    doc = run_json(cli, "run", str(CUSTOMS), str(INSPECTION), "--data", json.dumps(data), code=code)
    check_run_document(doc)
    return doc


def _branch_statuses(doc: dict[str, Any]) -> dict[str, str]:
    return {c["branch_id"]: c["status"] for c in doc["contexts"].values()}


# ===== the customs declaration: a join inside a call activity asks the officer ======================

def test_the_desks_disagree_inside_the_called_process_and_the_officer_holds_the_goods(cli: Any) -> None:
    doc = _lodge(cli, DISPUTED)
    assert [(w["kind"], w["id"]) for w in doc["waiting_for"]] == [("confirmation", "inspection_join/hold_required")]
    [conflict] = doc["conflicts"]
    assert conflict["values"] == {"tariff_check": False, "document_check": True} and conflict["resolution"] is None
    [asked] = doc["confirmations"]
    assert asked["message"].startswith("The tariff and documents desks disagree") and asked["default"] is True
    assert _branch_statuses(doc) == {"tariff_check": "open", "document_check": "open"}
    done = run_json(cli, "resume", doc["instance_id"], "--answer", "inspection_join/hold_required=true")
    history = done["layers"]["L3"]
    assert (history["clearance"], history["amount_payable"], history["duty_due"]) == ("held", 0, 2640.0)
    assert history["inspection_notes"] == ["tariff: tariff", "documents: documents"]
    assert "desk" not in history and "desk" not in done["layers"]["L4"]
    assert done["conflicts"][0]["resolution"]["resolver"] == "human"
    assert _branch_statuses(done) == {"tariff_check": "joined", "document_check": "joined"}


def test_the_desks_agree_and_the_goods_are_released_with_the_duty(cli: Any) -> None:
    doc = _lodge(cli, dict(DISPUTED, origin_certificate=True), code=0)
    history = doc["layers"]["L3"]
    assert (history["clearance"], history["amount_payable"], history["hold_required"]) == ("released", 2640.0, False)
    assert doc["conflicts"] == [] and doc["confirmations"] == []


def test_cancelling_while_the_officer_is_asked_closes_the_question_and_the_branches(cli: Any) -> None:
    doc = _lodge(cli, DISPUTED)
    iid = doc["instance_id"]
    cancelled = run_json(cli, "cancel", iid, "--reason", "broker withdrew the declaration")
    assert cancelled["status"] == "cancelled" and cancelled["waiting_for"] == []
    [conflict] = cancelled["conflicts"]
    assert conflict["resolution"] is None and conflict["cancelled"] is True
    [asked] = cancelled["confirmations"]
    assert asked["cancelled"] is True and asked["answer"] is None
    # nobody will merge the desks' contexts any more: they say so, as a cancelling event's branches do
    assert _branch_statuses(cancelled) == {"tariff_check": "cancelled", "document_check": "cancelled"}
    for name in cancelled["contexts"]:
        events: Any = run_json(cli, "tape", iid, "--context", name, "--kind", "cancelled")
        assert [(e["kind"], e["data"]["note"], e["actor"]) for e in events] == [("note", "cancelled", "cli")], events
    late = cli("resume", iid, "--answer", "inspection_join/hold_required=true", "--json")
    assert late.exit_code == 2 and "was cancelled" in json.loads(late.stdout)["error"]["message"]
