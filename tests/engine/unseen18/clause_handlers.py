"""Offline handlers of clause_review (run when no model is given)."""


def liability_offline(ctx):
    return {"clause_verdict": "reject", "risk_rating": "high", "liability_reason": "unlimited liability"}


def ip_offline(ctx):
    return {"clause_verdict": "accept", "risk_rating": "low", "ip_reason": "standard licence"}


def memo_offline(ctx):
    return {"memo": "see the conflicts"}
