"""Handlers of scholarship_award: the academic rule, and the offline stand-in of the need model."""


def academic_review(ctx):
    gpa = float(ctx.get("gpa", 0))
    verdict = "award" if gpa >= 3.5 else "decline"
    return {"academic_band": "A" if gpa >= 3.7 else "B" if gpa >= 3.0 else "C", "recommendation": verdict,
            "reviewer_notes": [f"academic: gpa {gpa} -> {verdict}"]}


def need_assessment(ctx):
    income = int(ctx.get("household_income", 0))
    level = "high" if income < 25000 else "medium" if income < 50000 else "low"
    verdict = {"high": "award", "medium": "waitlist", "low": "decline"}[level]
    return {"need_level": level, "recommendation": verdict, "reviewer_notes": [f"need: {level} -> {verdict}"]}
