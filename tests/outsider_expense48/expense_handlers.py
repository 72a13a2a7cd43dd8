"""The travel-policy check of expense.bpmn, offline: it stands in for the model (deterministic)."""

LIMITS = {"meals": 60, "hotel": 250, "flight": 900}


def policy_check(ctx):
    limit = LIMITS.get(ctx["category"], 100)
    claimed = ctx["amount_claimed"]
    return {"policy_ok": claimed <= limit, "policy_limit": limit,
            "policy_note": f"{ctx['category']}: {claimed} claimed against a limit of {limit}"}
