"""Handlers of vendor_tender's service tasks: the vendor portal's quote and the bid evaluation."""

from engine import BpmnError


def request_quote(ctx):
    vendor = ctx.get("vendor")
    if vendor["name"] in ctx.get("sanctions_list", []):
        raise BpmnError("VENDOR_SANCTIONED", f"{vendor['name']} is on the sanctions list", {"vendor": vendor["name"]})
    return {"quote": {"vendor": vendor["name"], "price": vendor["price"], "lead_days": vendor["lead_days"]}}


def evaluate_bids(ctx):
    bids = ctx.get("bids", [])
    out = {}
    for n, bid in enumerate(bids, 1):
        out[f"tool_call_result_{n}"] = {
            "kind": "tool_call_result", "status": "ok", "tool": "vendor_portal.fetch_bid",
            "data": {"id": bid["vendor"], "price": bid["price"]},
            "raw": "Vendor portal response. Terms: net 30, delivery DAP, warranty 24 months, "
                   "standard liability cap, no exclusivity. " * 4}
    ok = sorted((b for b in bids if b["ok"]), key=lambda b: b["price"])
    out["shortlist"] = [b["vendor"] for b in ok]
    out["best_price"] = ok[0]["price"] if ok else None
    return out
