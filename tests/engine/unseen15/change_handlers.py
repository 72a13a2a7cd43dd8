"""The offline stand-in of change_request's model step: what a model would make of the change."""

from __future__ import annotations

from typing import Any

from engine import ActivityContext


def assess_risk(ctx: ActivityContext) -> dict[str, Any]:
    score = 30 + 20 * bool(ctx["touches_prod"]) + 12 * bool(ctx["has_migration"])
    notes = " ".join(f"Impact note {i}: {ctx['title']} affects {', '.join(ctx['systems'])} during the "
                     "change window; customers may see slower checkouts while connections drain." for i in range(1, 7))
    return {"risk_score": score, "impact_notes": notes, "reviewed_by": ["model"]}
