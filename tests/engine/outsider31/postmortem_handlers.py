"""Handlers of incident_postmortem: a long, noisy incident history, as a chat-ops bot leaves it."""

from __future__ import annotations

from typing import Any

from engine import ActivityContext

HOSTS = ["db-1", "db-2", "api-3"]


def collect_timeline(ctx: ActivityContext) -> dict[str, Any]:
    lines = {f"log_line_{i:02d}": f"{9 + i // 6:02d}:{(i * 7) % 60:02d} {ctx['service']} pager: "
             f"p99 latency {400 + 37 * i} ms on {HOSTS[i % 3]}, retrying health check #{i}" for i in range(12)}
    return {**lines, "timeline_collected": True, "first_alert": "09:00"}


def root_cause(ctx: ActivityContext) -> dict[str, Any]:
    results = {f"tool_call_result_{i}": {"kind": "tool_call_result", "status": "ok", "tool": "grep",
                                          "data": {"host": host, "matches": [f"ERROR pool exhausted {n}" for n in range(6)],
                                                   "elapsed_ms": 120 + i}}
               for i, host in enumerate(HOSTS)}
    chain = " ".join(f"Step {n}: the connection pool on db-1 saturated because the retry storm from the checkout "
                     f"service multiplied requests by {n + 2}." for n in range(8))
    return {**results, "reasoning_chain_rca": chain, "root_cause": "retry storm exhausted the db-1 connection pool",
            "severity": "sev1"}


def customer_impact(ctx: ActivityContext) -> dict[str, Any]:
    return {"affected_customers": 1840, "refunds_due": True, "severity": "sev2"}
