"""Offline stand-ins for the model steps of the support escalation (no model configured)."""


def classify(ctx):
    return {"severity": "high", "sla_hours": 8, "draft_reply": "We are looking into it.", "triage_notes": "offline triage"}


def agent_work(ctx):
    return {"resolution": "refund", "agent_notes": "offline agent"}
