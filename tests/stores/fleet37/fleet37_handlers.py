"""Handlers of the fleet scene (tests/stores/test_worker_fleet_37.py): each run of an activity is one line
in $FLEET37_SIDE_EFFECTS (activity, instance id, pid). The first ``prepare`` of the scene (the one that
makes the file $FLEET37_GATE) takes $FLEET37_HOLD_S seconds, long enough for the test to kill its worker
inside it; every other run of it takes $FLEET37_SLOW_S seconds (an external call)."""

from __future__ import annotations

import os
import time
from typing import Any


def _record(activity: str, ctx: Any) -> None:
    log = os.environ.get("FLEET37_SIDE_EFFECTS")
    if log:
        with open(log, "a", encoding="utf-8") as out:
            out.write(f"{activity} {ctx.instance_id} {os.getpid()}\n")


def _first(gate: str | None) -> bool:
    if not gate:
        return False
    try:
        os.close(os.open(gate, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
    except FileExistsError:
        return False
    return True


def prepare(ctx: Any) -> dict[str, Any]:
    _record("prepare", ctx)
    hold = _first(os.environ.get("FLEET37_GATE"))
    time.sleep(float(os.environ.get("FLEET37_HOLD_S" if hold else "FLEET37_SLOW_S", "0")))
    return {"prepared": True}


def finish(ctx: Any) -> dict[str, Any]:
    _record("finish", ctx)
    return {"finished": True}
