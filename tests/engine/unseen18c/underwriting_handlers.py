"""The offline stand-ins of underwriting_file's reviews, notes and decision."""

from __future__ import annotations

from typing import Any

from engine import ActivityContext


def medical_review(ctx: ActivityContext) -> dict[str, Any]:
    return {"medical_class": {"class": "standard_plus", "flags": ["bmi_ok", "non_smoker"]},
            "medical_memo": "The attending physician statement was reviewed page by page; blood pressure, "
                            "cholesterol and the family history are within the standard plus band."}


def financial_review(ctx: ActivityContext) -> dict[str, Any]:
    return {"income_verified": True,
            "finance_memo": "Tax returns for three years were reconciled against the stated income; the "
                            "sum insured is within twenty times the verified annual income."}


def chase_documents(ctx: ActivityContext) -> dict[str, Any]:
    base = ("Called the applicant's broker about the missing attending physician statement for policy "
            "LIFE-88-2041; the broker promised to send it by the end of the week")
    return {f"uw_note_{k}": f"{base} (attempt {k})." for k in range(1, 8)}


def decide(ctx: ActivityContext) -> dict[str, Any]:
    medical = ctx["medical_class"]
    return {"decision": "accept" if ctx["income_verified"] and medical["class"] == "standard_plus" else "refer"}
