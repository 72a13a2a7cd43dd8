"""The offline stand-in of patent_prior_art's novelty analysis."""

from __future__ import annotations

from typing import Any

from engine import ActivityContext


def analyze_novelty(ctx: ActivityContext) -> dict[str, Any]:
    found = [ctx[f"tool_call_result_{i}"] for i in (1, 2, 3)]
    hits = [r["data"]["id"] for r in found if r["status"] == "ok"]
    return {"novelty_score": 0.72, "closest_art": hits[0], "cited": hits}
