"""The fake model and the fraud screening of motor_claim: deterministic, no provider."""

from __future__ import annotations

from typing import Any

from engine import ActivityContext, BpmnError


def triage(ctx: ActivityContext) -> dict[str, Any]:
    estimate = ctx["estimate"]
    severity = "total_loss" if estimate > 15000 else "major" if estimate > 3000 else "minor"
    suspect = ctx["prior_claims"] >= 2 or "cash" in ctx["description"].lower()
    return {"severity": severity, "fraud_suspect": suspect,
            "triage_note": f"{ctx['claim_ref']}: {severity}, {len(ctx['damage_items'])} damaged part(s)"}


def fraud_screening(ctx: ActivityContext) -> dict[str, Any]:
    if "police_report" not in ctx["documents"]:
        raise BpmnError("docs_missing", "a police report is needed for a suspected fraud",
                        {"missing": ["police_report"]})
    return {"fraud_cleared": True, "checked_by": ["fraud"]}
