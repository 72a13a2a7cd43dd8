"""Offline stand-in of the hotel reservation agent (deterministic)."""

from __future__ import annotations

from typing import Any

from engine import ActivityContext


def reserve_hotel(ctx: ActivityContext) -> dict[str, Any]:
    full = ctx["city"] in ("Venice",)
    return {"hotel_available": not full, "hotel_note": f"{ctx['city']}: {'fully booked' if full else 'room held'}"}
