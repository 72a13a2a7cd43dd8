"""Offline stand-ins of the insurance claim's agent steps (deterministic, as the stub model is)."""

from __future__ import annotations

from typing import Any

from engine import ActivityContext


def triage(ctx: ActivityContext) -> dict[str, Any]:
    incident = ctx.get("incident", "") or ""
    return {"fraud_suspect": "again" in incident or ctx["amount"] > 20000,
            "coverage_needed": "flood" in incident or "storm" in incident,
            "claim_status": "open", "covered": True, "coverage_limit": 10000,
            "triage_note": f"Claim {ctx['claim_id']} on policy {ctx['policy_no']}: {incident}"}


def check_coverage(ctx: ActivityContext) -> dict[str, Any]:
    flood = "flood" in (ctx.get("incident", "") or "")
    return {"covered": not flood, "coverage_limit": 15000,
            "coverage_note": "flood excluded by clause 7.2" if flood else "storm damage covered up to 15000"}


def draft_letter(ctx: ActivityContext) -> dict[str, Any]:
    return {"letter": f"Dear policy holder, claim {ctx['claim_id']} is {ctx['claim_status']}; payout {ctx['payout']}."}
