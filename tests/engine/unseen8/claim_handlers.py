"""Offline stand-in for the fraud model: a deterministic score from the claim."""


def fraud_check(ctx):
    score = 0.9 if ctx.get("prior_claims", 0) >= 3 else 0.1
    status = "hold_for_fraud" if score > 0.5 else "fraud_clear"
    return {"fraud_score": score, "claim_status": status, "notes": ctx.get("notes", []) + ["fraud scored"]}
