"""The offline stand-ins of contract_review's three model steps: deterministic, long-winded notes included
(a model's reviews are), so the branches' compressions have something to fold."""

from __future__ import annotations

from typing import Any

from engine import ActivityContext


def extract_terms(ctx: ActivityContext) -> dict[str, Any]:
    clauses = [f"Clause {n}: the supplier shall {verb} within {n * 5} business days of written notice."
               for n, verb in enumerate(["remedy defects", "refund fees", "provide records", "cure breaches",
                                         "return data", "notify incidents"], start=1)]
    return {"liability_cap": ctx["contract_value"] * 2, "term_months": 36, "deviating_clauses": clauses}


def legal_review(ctx: ActivityContext) -> dict[str, Any]:
    return {"risk_rating": "high", "recommendation": "negotiate",
            "legal_notes": " ".join(f"Clause {n} departs from the template's remedy period and must be redlined."
                                    for n in range(1, 7))}


def commercial_review(ctx: ActivityContext) -> dict[str, Any]:
    return {"risk_rating": "medium", "recommendation": "sign",
            "commercial_notes": f"The cap of {ctx['liability_cap']} is twice the contract value; the margin holds."}
