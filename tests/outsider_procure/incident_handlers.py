"""Handlers of incident_response.bpmn: the offline stand-in for the triage model, the log
collector (bulky tool results) and the post-mortem writer."""

from __future__ import annotations

from typing import Any

from engine import ActivityContext


def triage_offline(ctx: ActivityContext) -> dict[str, Any]:
    text = str(ctx["alert_text"]).lower()
    category = "security" if any(w in text for w in ("login", "malware", "exfiltration")) else "availability"
    severity = "critical" if "production" in text else "low"
    runbooks = sorted({str(hit.get("source")) for hit in ctx.knowledge.values() if isinstance(hit, dict)})
    return {"severity": severity, "category": category, "runbooks": runbooks,
            "reasoning_chain": {"kind": "reasoning_chain",
                                "text": f"The alert says: {ctx['alert_text']}. " * 6}}


def collect_logs(ctx: ActivityContext) -> dict[str, Any]:
    lines = [f"{ctx['host']} sshd[{1000 + i}]: session opened for user svc{i % 3} from 10.0.0.{i}" for i in range(40)]
    return {f"tool_call_result_{n}": {"kind": "tool_call_result", "status": "ok",
                                      "data": {"id": f"LOG-{n}", "lines": lines}} for n in range(3)}


def postmortem(ctx: ActivityContext) -> dict[str, Any]:
    return {"postmortem": f"{ctx['severity']} {ctx['category']} incident on {ctx['host']}: contained "
                          f"({ctx['isolation']['status']})"}
