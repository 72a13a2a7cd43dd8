"""Handlers of the bank's KYC / AML case review (tests/test_outsider49_kyc.py).

``screening`` stands in for the screening model offline: it matches the customer's name against the
sanctions passages retrieval put in KNOWLEDGE. ``pep_check`` and ``analyst_b`` are external calls: each
start is a line ``INSTANCE STEP PID`` in the file $KYC49_SIDE_EFFECTS (so a test counts how often each
ran); the step $KYC49_SLOW_STEP of the case $KYC49_SLOW_CASE then waits while the file $KYC49_HOLD exists
(30 s at most): the call a test kills a worker in."""

from __future__ import annotations

import os
import time
from typing import Any


def screening(ctx: Any) -> dict[str, Any]:
    name = str(ctx.get("customer_name", "")).lower()
    hits = [item for item in ctx.knowledge.values() if isinstance(item, dict) and name
            and name in str(item.get("text", "")).lower()]
    return {"screening_hit": bool(hits), "screening_score": 0.95 if hits else 0.05}


def _external_call(ctx: Any, step: str) -> None:
    log = os.environ.get("KYC49_SIDE_EFFECTS")
    if log:
        with open(log, "a", encoding="utf-8") as out:
            out.write(f"{ctx.instance_id} {step} {os.getpid()}\n")
    hold = os.environ.get("KYC49_HOLD")
    if hold and step == os.environ.get("KYC49_SLOW_STEP") and ctx.get("case_id") == os.environ.get("KYC49_SLOW_CASE"):
        deadline = time.monotonic() + 30
        while os.path.exists(hold) and time.monotonic() < deadline:
            time.sleep(0.05)


def pep_check(ctx: Any) -> dict[str, Any]:
    _external_call(ctx, "pep_check")
    return {"pep": str(ctx.get("customer_name", "")).startswith("Minister")}


def analyst_b(ctx: Any) -> dict[str, Any]:
    """Analyst B's customer-profile review, kept by the case-management system (an external call)."""
    _external_call(ctx, "analyst_b")
    high = ctx.get("screening_hit") or ctx.get("pep")
    return {"risk_rating": "high" if high else "medium", "notes_b": f"pep {ctx.get('pep')}"}
