"""Handlers of eclipse_web_service.bpmn: the work the Pricing web service did."""

from typing import Any


def price(ctx: Any) -> dict[str, Any]:
    return {"price": ctx["total"] + 1}
