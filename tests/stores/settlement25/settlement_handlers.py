"""Handlers of trade_settlement.bpmn.

``book_settlement`` appends ``TRADE PID`` to ``$LF25_ATTEMPTS`` on every attempt (the side
effect a test counts) and, for the trade ``$LF25_SLOW_TRADE`` while the file ``$LF25_GATE`` does
not exist, writes its pid to ``$LF25_STARTED`` and waits for the gate: a test kills its worker
there. Everything else is a pure function of the context."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any


def enrich_trade(ctx: Any) -> dict[str, Any]:
    return {"notional": round(ctx["quantity"] * ctx["price"], 2), "settle_date": "T+2"}


def match_confirmation(ctx: Any) -> dict[str, Any]:
    matched = ctx["confirmation"] == "matched"
    return {"settlement_status": "ready" if matched else "break", "match_note": f"confirmation {ctx['confirmation']}"}


def check_cash(ctx: Any) -> dict[str, Any]:
    enough = ctx["cash_available"] >= ctx["notional"]
    return {"settlement_status": "ready" if enough else "short_cash", "cash_checked": True}


def book_settlement(ctx: Any) -> dict[str, Any]:
    attempts = os.environ.get("LF25_ATTEMPTS")
    if attempts:
        with open(attempts, "a") as log:
            log.write(f"{ctx['trade_id']} {os.getpid()}\n")
    gate = os.environ.get("LF25_GATE")
    if gate and ctx["trade_id"] == os.environ.get("LF25_SLOW_TRADE") and not Path(gate).exists():
        Path(os.environ["LF25_STARTED"]).write_text(str(os.getpid()))
        deadline = time.monotonic() + 60
        while not Path(gate).exists() and time.monotonic() < deadline:
            time.sleep(0.05)
    status = ctx["settlement_status"]
    return {"booked": status == "ready", "booking_ref": f"BK-{ctx['trade_id']}-{status}"}
