"""Handlers of purchase_order.bpmn: a ledger that may be locked, and finance's review."""

from __future__ import annotations

from typing import Any

from engine import ActivityContext, BpmnError


def reserve_funds(ctx: ActivityContext) -> dict[str, Any]:
    # the ledger is locked for the first `ledger_locked_times` attempts (start data; 0 by default)
    if ctx["reserve_attempts"] < ctx.get("ledger_locked_times", 0):
        raise BpmnError("ledger_locked", "the cost centre's ledger is locked by month-end close",
                        {"locked_by": "month_end_close"})
    return {"reservation_id": f"RES-{ctx['request_id']}", "reserved": ctx["requested_total"]}


def finance_review(ctx: ActivityContext) -> dict[str, Any]:
    approved = bool(ctx["budget_ok"])
    return {"po_status": "approved" if approved else "rejected",
            "finance_comment": f"budget left {ctx['budget_left']}",
            "review_notes": [*ctx.get("review_notes", []), "finance: checked against budget"]}
