"""Offline handler of food_complaint's model activity (run when no model is given)."""

HAZARD_WORDS = {"glass": "foreign_object", "metal": "foreign_object", "plastic": "foreign_object",
                "peanut": "allergen", "mould": "spoilage", "taste": "quality"}


def classify_complaint(ctx):
    text = str(ctx.get("complaint_text", "")).lower()
    hazard = next((kind for word, kind in HAZARD_WORDS.items() if word in text), "other")
    return {"hazard_type": hazard, "illness_reported": any(w in text for w in ("sick", "vomit", "hospital"))}
