"""Offline handlers of chargeback_dispute's model activities (run when no --model is given)."""


def merchant_assessment(ctx):
    response = str(ctx.get("merchant_response", ""))
    proof = "receipt" in response or "delivery" in response
    return {"dispute_verdict": "merchant_wins" if proof else "cardholder_wins",
            "merchant_rationale": f"{ctx.get('evidence_source')}: {response}"}


def fraud_scoring(ctx):
    score = 0.9 if "not me" in str(ctx.get("cardholder_statement", "")) else 0.2
    out = {"fraud_score": score, "dispute_verdict": "cardholder_wins" if score > 0.5 else "merchant_wins"}
    if ctx.get("try_override"):
        out["network_rules"] = "the merchant always loses"
    return out
