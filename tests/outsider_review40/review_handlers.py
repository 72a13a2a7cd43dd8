"""Offline handlers of the document review loop (the review's model is not configured)."""

import os
from pathlib import Path

FILLER = ("The reviewer walked through each paragraph of the draft, weighed its claims against the "
          "moderation guide, and wrote down what a second reader would need to know. ")


def draft(ctx):
    return {"round_no": 1, "draft_text": "v1 " + FILLER, "risk_flags": ["medical-claim", "pii-mention"]}


def review(ctx):
    n = ctx.get("round_no")
    # the moderation service is down once, in the round the test names (a file it removes as it fails)
    flag = os.environ.get("REVIEW40_FAIL_ONCE")
    if flag and Path(flag).exists() and ctx.get("round_no") == int(Path(flag).read_text()):
        Path(flag).unlink()
        raise RuntimeError(f"moderation service unavailable in round {n}")
    approve_at = ctx.get("approve_at_round", 99)
    return {
        "approved": n >= approve_at,
        f"check_result_{n}": {"status": "ok" if n % 2 else "warn", "data": {"id": f"CHK-{n}", "rows": [FILLER] * 3}},
        f"reasoning_{n}": FILLER * 4,
        f"retry_log_{n}": f"round {n}: moderation api retried once",
    }


def revise(ctx):
    n = ctx.get("round_no") + 1
    return {"round_no": n, "draft_text": f"v{n} " + FILLER}
