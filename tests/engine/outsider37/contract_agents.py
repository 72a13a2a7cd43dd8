"""Offline stand-ins of the contract review's agent steps (deterministic, as the stub model is)."""

from __future__ import annotations

from typing import Any

from engine import ActivityContext


def draft(ctx: ActivityContext) -> dict[str, Any]:
    """The drafting agent asks for another round until the clause caps liability (round 2)."""
    round_no = int(ctx.get("draft_round", 0) or 0) + 1
    capped = round_no >= 2
    return {"draft_round": round_no, "needs_rework": not capped,
            "clause": f"Round {round_no}: liability {'capped at 1x fees' if capped else 'unlimited'}."}


def screen(ctx: ActivityContext) -> dict[str, Any]:
    sanctioned = bool(ctx.get("listed", False))
    return {"sanctioned": sanctioned, "approval": "reject" if ctx["value"] > 500000 else "approve",
            "screening_note": f"{ctx['counterparty']}: {'on the EU list' if sanctioned else 'clear'}"}
