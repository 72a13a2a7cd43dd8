"""The offline stand-ins of research_loop's search rounds and answer."""

from __future__ import annotations

from typing import Any

from engine import ActivityContext

REFRIGERANTS = ["R290", "R744", "R1234yf", "R32", "R454C", "R600a"]


def search_round(ctx: ActivityContext) -> dict[str, Any]:
    n = int(ctx["search_round"]) + 1
    name = REFRIGERANTS[(n - 1) % len(REFRIGERANTS)]
    raw = " ".join(f"Paragraph {i} of the F-gas regulation review discusses {name} charge limits and safety class."
                   for i in range(8))
    return {
        "search_round": n,
        f"tool_call_result_{n}": {"status": "ok", "data": {"query": f"{name} GWP EU 2027",
                                                          "hits": [{"id": f"DOC-{n}-{k}", "score": 0.9 - k / 10,
                                                                    "snippet": raw[:120]} for k in range(3)]},
                                  "raw": raw},
        f"reasoning_{n}": f"Round {n}: {name} looked promising; the regulation text was long and mostly about "
                          f"installer certification, which the question does not ask about.",
    }


def write_answer(ctx: ActivityContext) -> dict[str, Any]:
    return {"answer": f"Answer to: {ctx['research_question']}", "rounds": int(ctx["search_round"])}
