from engine import ActivityContext, activity


@activity("classify")
def classify(ctx: ActivityContext) -> dict:
    return {"category": "water", "severity": "medium"}


@activity("fraud_review")
def fraud_review(ctx: ActivityContext) -> dict:
    return {"payout": 4200, "fraud_note": "no indicators"}


@activity("prescreen")
def prescreen(ctx: ActivityContext) -> dict:
    return {"priority": "normal"}
