"""Handlers of goods_claim: each records the context it sees (name, last tape seq, six layers) into
the JSON-lines file named by LAYERFLOW_UNSEEN10_RECORD, so a test can compare replays against it."""

from __future__ import annotations

import json
import os
from typing import Any


def _record(ctx: Any) -> None:
    path = os.environ.get("LAYERFLOW_UNSEEN10_RECORD")
    if not path:
        return
    context = ctx.context
    layers = {f"L{i}": ctx.layer(i) for i in range(6)}
    with open(path, "a", encoding="utf-8") as out:
        out.write(json.dumps({"task": ctx.task_id, "context": context.name, "seq": context.tape[-1].seq,
                              "layers": layers}, sort_keys=True) + "\n")


def note_damage(ctx: Any) -> dict[str, Any]:
    _record(ctx)
    return {"damage": f"{ctx['damaged_units']} of {ctx['units']} units crushed"}


def pull_logs(ctx: Any) -> dict[str, Any]:
    _record(ctx)
    scans = [{"status": "scanned", "hub": f"HUB-{i}", "note": "parcel scanned at the hub, handling code "
              f"{i * 7}, temperature nominal, no damage reported by the handler on duty"} for i in range(12)]
    return {"tool_call_result_tracking": {"status": "delivered", "data": {"id": "TRK-88", "scans": scans}},
            "carrier": "FastFreight"}


def assess_carrier(ctx: Any) -> dict[str, Any]:
    _record(ctx)
    return {"carrier_liable": ctx.get("tool_call_result_tracking", {}).get("status") == "delivered"}


def settle(ctx: Any) -> dict[str, Any]:
    _record(ctx)
    liable = ctx["carrier_liable"]
    return {"settlement": f"{'carrier' if liable else 'insurer'} pays for {ctx['damaged_units']} units"}


def customs_check(ctx: Any) -> dict[str, Any]:
    """Stalls (as a hung customs service would) while LAYERFLOW_UNSEEN10_STALL names a file: it
    writes that file and sleeps, so a test can kill the worker mid-activity."""
    import time

    stall = os.environ.get("LAYERFLOW_UNSEEN10_STALL")
    if stall:
        with open(stall, "w", encoding="utf-8") as out:
            out.write(ctx.context.name)
        time.sleep(120)
    return {"customs": "cleared"}
