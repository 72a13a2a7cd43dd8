"""Handlers of po50.bpmn (the purchase-order approval)."""

from __future__ import annotations

from typing import Any

from engine import ActivityContext


def record_manager(ctx: ActivityContext) -> dict[str, Any]:
    """The manager's answer (``approved``) as the order's status."""
    return {"po_status": "approved" if ctx.get("approved") else "rejected", "recorded_by": "po50_handlers"}
