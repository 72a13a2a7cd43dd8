"""The screening service of kyc_onboarding: a deterministic stand-in for the sanctions/PEP provider."""

from __future__ import annotations

from typing import Any

from engine import ActivityContext

HIGH_RISK_COUNTRIES = {"XX", "YY"}


def screen(ctx: ActivityContext) -> dict[str, Any]:
    hits = [ctx["full_name"]] if ctx["full_name"].lower().startswith("ivan") else []
    band = "high" if hits or ctx["country"] in HIGH_RISK_COUNTRIES else "low"
    return {"screening_hits": hits, "risk_band": band}
