from engine import ActivityContext


def review_offline(ctx: ActivityContext) -> dict:
    return {"verdict": "needs_edit", "edits": "offline review"}
