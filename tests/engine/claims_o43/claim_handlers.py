"""The deterministic stand-in for the triage model: what the model would answer, offline."""

from __future__ import annotations

from typing import Any

from engine import ActivityContext


def triage(ctx: ActivityContext) -> dict[str, Any]:
    damage = ctx["estimated_damage"]
    text = str(ctx.get("description") or "").lower()
    suspicious = "cash" in text or damage > 50000
    category = "total_loss" if damage > 30000 else "repair"
    return {"claim_category": category, "suspicious": suspicious, "triage_note": f"{category}, damage {damage}"}
