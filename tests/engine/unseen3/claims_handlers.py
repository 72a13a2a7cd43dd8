"""Offline stand-ins for the two AI assessors of claims_triage (no model is called)."""

from typing import Any


def medical_assessor(ctx: Any) -> dict[str, Any]:
    return {"severity": "moderate", "payout": int(ctx["claim_amount"] * 0.8), "next_step": "pay",
            "medical_note": "fracture, 6 weeks"}


def fraud_assessor(ctx: Any) -> dict[str, Any]:
    return {"severity": "high", "payout": ctx["claim_amount"], "next_step": "investigate", "fraud_score": 0.72}
