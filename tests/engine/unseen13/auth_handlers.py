"""The offline stand-in of prior_auth's model step: what a model would extract from the request."""

from __future__ import annotations

from typing import Any

from engine import ActivityContext


def summarize_request(ctx: ActivityContext) -> dict[str, Any]:
    urgent = "emergency" in str(ctx.get("notes", "")).lower()
    return {"clinical_summary": f"{ctx['procedure']} for {ctx['diagnosis_code']}",
            "urgency": "urgent" if urgent else "routine",
            "plan_tier": "gold-reviewed",     # held by KNOWLEDGE (data_layers): promoted there
            "copay": 20, "reviewers": ["intake"]}
