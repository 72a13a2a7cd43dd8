"""The offline stand-in for the liability model: what a model would answer, deterministically."""

from __future__ import annotations

from typing import Any


def model_liability(ctx: Any) -> dict[str, Any]:
    reason = ctx.get("reason_code")
    liability = "merchant" if reason in ("fraud", "not_received") else "issuer"
    return {"liability": liability, "liability_reason": f"model read reason code {reason}"}
