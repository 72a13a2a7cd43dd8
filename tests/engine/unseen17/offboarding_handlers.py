"""The account-disabling step of access_revocation (called by employee_offboarding)."""

from __future__ import annotations

from typing import Any

from engine import ActivityContext


def disable_accounts(ctx: ActivityContext) -> dict[str, Any]:
    systems = ["sso", "email", "vpn"] + (["github"] if ctx.get("engineer", False) else [])
    return {"revoked_systems": systems, "access_ticket": "ACC-" + ctx["employee_id"]}
