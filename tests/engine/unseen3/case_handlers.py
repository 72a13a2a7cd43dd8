"""Handlers of case_numbers: the case number is a fact of the process (PROCESS, append-only)."""

from typing import Any

from context_layers import Layer


def open_case(ctx: Any) -> dict[str, Any]:
    ctx.write(Layer.PROCESS, "case_no", "CASE-" + ctx["ticket"])
    return {"opened": True}


def renumber_case(ctx: Any) -> dict[str, Any]:
    ctx.write(Layer.PROCESS, "case_no", "CASE-" + ctx["ticket"] + "-B")   # a second write: denied
    return {"renumbered": True}
