from engine import ActivityContext


def assess_offline(ctx: ActivityContext) -> dict:
    return {"risk": "low", "recommendation": "offline assessment"}


def draft_offline(ctx: ActivityContext) -> dict:
    return {"po_text": "offline draft for " + str(ctx.get("po_number"))}
