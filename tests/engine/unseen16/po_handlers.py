"""The offline stand-ins of purchase_order's model steps."""

from __future__ import annotations

from typing import Any

from engine import ActivityContext


def classify_po(ctx: ActivityContext) -> dict[str, Any]:
    return {"spend_class": "software" if "licen" in ctx["item"] else "goods"}


def legal_review(ctx: ActivityContext) -> dict[str, Any]:
    return {"risk_rating": "medium", "legal_note": f"standard terms with {ctx['vendor']}"}


def security_review(ctx: ActivityContext) -> dict[str, Any]:
    return {"risk_rating": "high", "security_note": "the vendor stores customer emails outside the EU"}
