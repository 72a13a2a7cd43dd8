"""Handlers of the document review loop: each round logs a check and a long reviewer comment."""

from typing import Any


def review_round(ctx: Any) -> dict[str, Any]:
    n = int(ctx.get("round_no", 0)) + 1
    return {"round_no": n,
            f"check_log_{n}": f"spelling check {n}: passed",
            f"reviewer_comment_{n}": f"Round {n}: the introduction repeats the scope section; "
                                     "the tables need units; the conclusion should name the owner. " * 3}
