"""Offline stand-in of the price benchmark agent: a line priced over its list price is overpriced."""

from __future__ import annotations

from typing import Any

from engine import ActivityContext

LIST_PRICES = {"BOLT-M8": 0.12, "PUMP-3KW": 840.0, "GLOVE-L": 2.5}


def benchmark_price(ctx: ActivityContext) -> dict[str, Any]:
    line = ctx["line"]
    reference = LIST_PRICES.get(line["sku"], line["price"])
    status = "ok" if line["price"] <= reference * 1.05 else "overpriced"
    return {"line_status": status, "reference_price": reference}
