"""Offline stand-ins of the HR team's model steps: deterministic, no model called."""

from typing import Any


def role_profile(ctx: Any) -> dict[str, Any]:
    title = ctx.get("title", "")
    level = "senior" if "senior" in title.lower() else "junior"
    return {"role_level": level, "profile_summary": f"{title} approved by {len(ctx.get('approvals', []))} managers"}
