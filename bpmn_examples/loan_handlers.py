"""Deterministic handlers of the loan-approval demo (``loan_approval.bpmn``).

They stand where an LLM agent or a service would be: each reads the context through
``ctx`` and returns the keys it writes to WORKING. Risk, per the shipped risk rules
(``knowledge/risk_rules``): below 50,000 and no blacklisted industry is low; up to
150,000 is medium; above 150,000, or a blacklisted industry at any amount, is high.
The blacklist itself is read from KNOWLEDGE, as retrieved for the activity.
"""

from __future__ import annotations

import hashlib
import re
from typing import Any

from engine import ActivityContext, activity

FAST_TRACK_LIMIT = 50_000
MEDIUM_LIMIT = 150_000


@activity("submit_application")
def submit_application(ctx: ActivityContext) -> dict[str, Any]:
    missing = [k for k in ("amount", "applicant_id", "purpose") if ctx.get(k) is None]
    if missing:
        raise ValueError(f"application is missing {', '.join(missing)}; pass them in --data")
    amount = ctx["amount"]
    if not isinstance(amount, (int, float)) or amount <= 0:
        raise ValueError(f"amount must be a positive number, got {amount!r}")
    return {
        "application_status": "submitted",
        "approval_status": "pending",
        "application_summary": f"{ctx['applicant_id']} asks {amount:,} {ctx.get('currency', 'EUR')} for {ctx['purpose']}",
    }


def _blacklist(ctx: ActivityContext) -> set[str]:
    """Industries named on a "Blacklisted industries:" line of a retrieved blacklist passage."""
    names: set[str] = set()
    for item in ctx.knowledge.values():
        if not isinstance(item, dict) or item.get("collection") != "industry_blacklist":
            continue
        for match in re.finditer(r"Blacklisted industries:\s*([^.\n]+)", str(item.get("text", ""))):
            names.update(n.strip().lower() for n in match.group(1).split(",") if n.strip())
    return names


@activity("risk_assessment")
def risk_assessment(ctx: ActivityContext) -> dict[str, Any]:
    amount = ctx["amount"]
    industry = str(ctx.get("industry", "")).lower()
    blacklisted = any(name in industry for name in _blacklist(ctx)) if industry else False
    factors = []
    if ctx.get("new_customer", True):
        factors.append("new customer")
    if blacklisted:
        factors.append(f"blacklisted industry: {industry}")
    if blacklisted or amount > MEDIUM_LIMIT:
        level = "high"
    elif amount >= FAST_TRACK_LIMIT:
        level = "medium"
        factors.append("amount above the fast-track limit")
    else:
        level = "low"
    if amount > MEDIUM_LIMIT:
        factors.append("amount above 150,000")
    digest = hashlib.sha1(f"{ctx['applicant_id']}:{amount}:{industry}".encode()).hexdigest()[:6].upper()
    sources = sorted({str(v.get("source")) for v in ctx.knowledge.values() if isinstance(v, dict)})
    return {
        "risk_level": level,
        "risk_factors": factors,
        "assessment_id": f"RA-{digest}",
        # Entries the disbursement step's compression rules act on (seed: tool results,
        # reasoning chains).
        "credit_bureau_result": {"kind": "tool_call_result", "status": "ok",
                                 "data": {"id": f"CB-{digest}", "summary": f"no defaults on record for {ctx['applicant_id']}",
                                          "raw": _bureau_report(digest)}},
        "risk_reasoning": {"kind": "reasoning_chain", "text": " ".join([
            f"Step 1: the applicant {ctx['applicant_id']} asks {amount:,} for {ctx['purpose']}.",
            f"Step 2: the fast-track limit is {FAST_TRACK_LIMIT:,} and the medium-risk limit {MEDIUM_LIMIT:,}; "
            f"the amount is {'below' if amount < FAST_TRACK_LIMIT else 'above'} the first and "
            f"{'below' if amount <= MEDIUM_LIMIT else 'above'} the second.",
            f"Step 3: industry {industry or 'unknown'} is {'on' if blacklisted else 'not on'} the blacklist "
            f"retrieved from {', '.join(sources) or 'no source'}.",
            "Step 4: the credit bureau reports no defaults; the tradelines are listed in the bureau result.",
            f"Step 5: the customer is {'new' if ctx.get('new_customer', True) else 'known'} to the bank.",
            f"Conclusion: risk level {level}; factors: {', '.join(factors) or 'none'}.",
        ])},
    }


def _bureau_report(digest: str) -> dict[str, Any]:
    """A deterministic credit-bureau report, as long as real ones are (the compression rules cut it)."""
    seed = int(digest, 16)
    lenders = ["Northbank", "Citycredit", "Agrilease", "Metro Savings", "Harbor Finance", "Union Trust"]
    kinds = ["term loan", "credit line", "lease", "card"]
    tradelines = [{"lender": lenders[(seed >> i) % len(lenders)], "type": kinds[(seed >> (i + 3)) % len(kinds)],
                   "opened": f"20{10 + (seed >> i) % 14}-{1 + (seed >> (i + 1)) % 12:02d}",
                   "limit": 5_000 * (1 + (seed >> (i + 2)) % 20), "balance": 1_000 * ((seed >> (i + 4)) % 30),
                   "status": "current", "late_payments_24m": 0} for i in range(8)]
    return {"bureaus": [{"bureau": "A", "score": 600 + seed % 150}, {"bureau": "B", "score": 590 + seed % 160}],
            "tradelines": tradelines, "inquiries_12m": seed % 4, "public_records": []}


@activity("fast_track")
def fast_track(ctx: ActivityContext) -> dict[str, Any]:
    return {"approval_status": "approved", "approval_reason": "fast track: low risk and an amount below 50,000"}


@activity("full_review")
def full_review(ctx: ActivityContext) -> dict[str, Any]:
    return {"review_deadline_days": 5, "reviewers": ["finance", "risk"]}


@activity("finance_review")
def finance_review(ctx: ActivityContext) -> dict[str, Any]:
    limit = ctx.get("finance_authority_limit", 500_000)
    months = [{"month": f"2026-{m:02d}", "inflow": 40_000 + 1_500 * (m % 5), "outflow": 31_000 + 1_200 * (m % 4)}
              for m in range(1, 13)]
    analysis = {"kind": "tool_call_result", "status": "ok",
                "data": {"id": f"CF-{ctx['assessment_id']}", "summary": "positive net cash flow in 12 of 12 months",
                         "months": months}}
    if ctx["amount"] <= limit:
        return {"approval_status": "approved", "cashflow_analysis": analysis,
                "finance_comment": f"income stable; amount within the finance authority limit of {limit:,}"}
    return {"approval_status": "rejected", "cashflow_analysis": analysis,
            "finance_comment": f"amount above the finance authority limit of {limit:,}"}


@activity("risk_review")
def risk_review(ctx: ActivityContext) -> dict[str, Any]:
    if ctx["risk_level"] == "high":
        return {"approval_status": "rejected",
                "risk_comment": "abnormal transaction pattern for the risk level: " + ", ".join(ctx["risk_factors"])}
    return {"approval_status": "approved", "risk_comment": f"{ctx['risk_level']} risk accepted with standard covenants"}


@activity("disbursement_decision")
def disbursement_decision(ctx: ActivityContext) -> dict[str, Any]:
    status = ctx["approval_status"]
    action = {"approved": "disburse", "pending_dual_approval": "hold_for_second_approval"}.get(status, "decline")
    return {"disbursement": action,
            "decision_summary": f"{ctx['assessment_id']}: {status} ({ctx['risk_level']} risk, track {ctx.get('track_type')})"}
