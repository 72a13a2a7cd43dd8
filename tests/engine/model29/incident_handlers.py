from engine import ActivityContext


def triage_offline(ctx: ActivityContext) -> dict:
    return {"severity": "low", "incident_summary": "offline triage"}
