"""Handlers of building_permit (the city's permit register, faked offline)."""


def issue_permit(ctx):
    parcel = ctx.get("parcel_id")
    return {
        "permit_id": f"PRM-{parcel}",
        "tool_call_result_registry": {
            "status": "ok",
            "data": {"id": f"REG-{parcel}", "raw": "register row " + "lorem ipsum dolor sit amet " * 20},
        },
    }
