"""Offline handlers of the grant review (no model configured)."""


def reject(ctx):
    return {"rejection": "not eligible"}


def science_review(ctx):
    return {"funding_decision": "fund", "science_note": "sound method"}


def budget_review(ctx):
    return {"funding_decision": "fund", "budget_note": "within budget"}


def award_letter(ctx):
    return {"letter": "Dear applicant, your grant is awarded."}


def screen(ctx):
    return {"eligible": True, "screen_note": "offline screen"}
