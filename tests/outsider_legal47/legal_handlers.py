"""Offline stand-ins for the model steps of the contract review, and the security check."""

from __future__ import annotations

import re
from typing import Any

from engine import ActivityContext, BpmnError


def extract_clauses(ctx: ActivityContext) -> dict[str, Any]:
    text = str(ctx["contract_text"])
    clauses = [c.strip() for c in re.split(r"(?<=\.)\s+", text) if c.strip()]
    cap = "raised" if "liability cap raised" in text else ("unlimited" if "unlimited liability" in text else "standard")
    return {"clauses": clauses[:20], "liability_cap": cap,
            "governing_law": str(ctx["jurisdiction"]),
            "clause_notes": "Clause-by-clause reading of the draft. " + " ".join(clauses)}


def legal_review(ctx: ActivityContext) -> dict[str, Any]:
    cap = ctx["liability_cap"]
    if cap == "unlimited":
        return {"risk_rating": "high", "redlines": ["cap liability at 12 months of fees"],
                "legal_note": "Unlimited liability is not acceptable."}
    return {"risk_rating": "medium" if cap == "raised" else "low", "redlines": ["mutual indemnity"],
            "legal_note": "Liability acceptable after amendment."}


def security_review(ctx: ActivityContext) -> dict[str, Any]:
    if "data processing agreement" not in str(ctx["contract_text"]).lower():
        raise BpmnError("NO_DPA", "the contract processes personal data without a DPA")
    return {"security_finding": "DPA present"}


def sign_off(ctx: ActivityContext) -> dict[str, Any]:
    return {"sign_off_memo": f"Approve contract with {ctx['counterparty']} at risk {ctx['risk_rating']}",
            "status": "approved_for_signature"}
