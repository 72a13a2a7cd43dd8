"""Handlers of the ops team's claims process (tests/test_outsider_ops36.py).

``slow_check`` is the external call the tests kill a worker in: it records each start in the file
named by $OPS36_SIDE_EFFECTS (one line per run, so a test counts how often it ran) and sleeps
$OPS36_SLOW_S seconds (default 0)."""

from __future__ import annotations

import os
import time
from typing import Any


def triage(ctx: Any) -> dict[str, Any]:
    return {"severity": "high" if ctx.get("amount", 0) > 5000 else "low"}


def slow_check(ctx: Any) -> dict[str, Any]:
    log = os.environ.get("OPS36_SIDE_EFFECTS")
    if log:
        with open(log, "a", encoding="utf-8") as out:
            out.write(f"{ctx.instance_id} {os.getpid()}\n")
    time.sleep(float(os.environ.get("OPS36_SLOW_S", "0")))
    return {"checked": True}
