"""Offline stand-ins of claim_triage's two agent steps: each writes its own part of the shared
findings object (and both an opinion on `liability`), its flags, notes, reserve and severity."""

from __future__ import annotations

from typing import Any

from engine import ActivityContext


def assess_injuries(ctx: ActivityContext) -> dict[str, Any]:
    return {"findings": {**ctx["findings"], "medical": {"icd": "S82.0", "days_off": 21}},
            "liability": "insured",
            "flags": ctx["flags"] + ["injury", "hospital"], "notes": ctx["notes"] + ["medical: fractured knee"],
            "reserve": 4200, "severity": 3}


def assess_property(ctx: ActivityContext) -> dict[str, Any]:
    return {"findings": {**ctx["findings"], "property": {"estimate": 1800}},
            "liability": "third_party",
            "flags": ctx["flags"] + ["property", "hospital"], "notes": ctx["notes"] + ["property: bumper"],
            "reserve": 1800, "severity": 2}
