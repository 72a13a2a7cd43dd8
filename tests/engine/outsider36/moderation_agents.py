"""Offline stand-in of the moderation classifier (deterministic, as the stub model is)."""

from __future__ import annotations

from typing import Any

from engine import ActivityContext


def classify(ctx: ActivityContext) -> dict[str, Any]:
    text = ctx["item"]["text"].lower()
    label = "spam" if "buy now" in text else "abuse" if "idiot" in text else "ok"
    return {"label": label, "classifier_reason": f"item {ctx['item']['id']}: '{text[:40]}' reads as {label}"}
