"""Handler of review18.bpmn. ``work`` appends a line to ``$LF18_ATTEMPTS`` on every attempt (the
side effect a test counts) and, when ``$LF18_GATE`` names a file that does not exist yet, writes
its pid to ``$LF18_STARTED`` and waits for the gate: a test kills its worker there."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any


def work(ctx: Any) -> dict[str, Any]:
    attempts = os.environ.get("LF18_ATTEMPTS")
    if attempts:
        with open(attempts, "a") as log:
            log.write(f"{os.getpid()}\n")
    gate = os.environ.get("LF18_GATE")
    if gate and not Path(gate).exists():
        Path(os.environ["LF18_STARTED"]).write_text(str(os.getpid()))
        deadline = time.monotonic() + 120
        while not Path(gate).exists() and time.monotonic() < deadline:
            time.sleep(0.05)
    return {"decision": "approve", "work_result": len(ctx["ticket"]["items"]) * ctx["n"]}
