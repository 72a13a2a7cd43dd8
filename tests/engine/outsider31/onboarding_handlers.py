"""The fake model of supplier_onboarding: a deterministic risk screening."""

from __future__ import annotations

from typing import Any

from engine import ActivityContext


def screen_risk(ctx: ActivityContext) -> dict[str, Any]:
    score = 20 + 10 * len(ctx["missing_documents"]) + (30 if ctx["annual_spend"] > 1_000_000 else 0)
    band = "high" if score >= 60 else "medium" if score >= 30 else "low"
    return {"risk_score": score, "risk_band": band,
            "screening_notes": f"{ctx['supplier_name']}: {len(ctx['missing_documents'])} document(s) missing"}
