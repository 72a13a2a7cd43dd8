"""The offline stand-in of churn_retention's model step."""

from __future__ import annotations

from typing import Any

from engine import ActivityContext


def score_churn(ctx: ActivityContext) -> dict[str, Any]:
    risk = min(1.0, round(0.2 + 0.1 * ctx["complaints"] + (0.3 if ctx["logins_last_30d"] < 5 else 0.0), 2))
    return {"churn_risk": risk, "offer_percent": 20 if risk >= 0.6 else 10}
