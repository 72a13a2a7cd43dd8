"""Offline handler of sae_review's model activity (run when no --model is given)."""


def safety_assessment(ctx):
    severity = ctx.get("severity")
    term = str(ctx.get("event_term", "")).lower()
    reportable = severity in ("moderate", "severe") or "hepat" in term
    return {"reportable": reportable,
            "signal_terms": list(ctx.get("signal_terms", [])) + ["meddra:" + term.replace(" ", "_")],
            "safety_rationale": f"{ctx.get('reviewer_role')}: {severity} {term} in {ctx.get('trial_id')}"}
