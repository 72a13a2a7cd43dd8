"""Benchmark: attention scoring and rule-driven compression on generated HISTORY.

    python bench/bench_compression.py            # 100, 1,000 and 10,000 entries
    python bench/bench_compression.py --quick    # CI: 100 and 1,000 entries
    python bench/bench_compression.py --json     # one JSON list on stdout instead of the table

Each generated activity writes notes, a tool result, a reasoning chain and, now and
then, an error-retry log, a repeated status line or a preserved fact; the config
compresses tool results (extract_keys), reasoning chains (summarize, 40 tokens) and
retry logs (count_only, keep 1), with the token threshold at 80% of the generated
context so the cliff runs. Reported per size: the time to score attention, the time
to compress (rules and cliff), tokens before and after, their ratio, and the share of
preserved keys whose value survived byte for byte (must be 1.0).
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from context_layers import Layer, LayeredContext, config_from_dict  # noqa: E402
from context_layers.attention import AttentionScore  # noqa: E402
from context_layers.canonical import canonical_json  # noqa: E402
from context_layers.compression import RuleDrivenCompressor  # noqa: E402

WORDS = ("loan applicant income revenue debt ratio collateral branch review score bureau "
         "overdraft deposit employer contract guarantee risk limit policy exception approval").split()


def sentence(rng: random.Random, n: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(n)) + f" ({rng.randint(1000, 99999)})."


def generate(entries: int, seed: int = 7) -> tuple[LayeredContext, list[str]]:
    """A context whose HISTORY holds about ``entries`` entries (activity records included)."""
    rng = random.Random(seed)
    ctx = LayeredContext(system={"policy": "bench"})
    preserved: list[str] = []
    changes: list[tuple[int, str, Any]] = []
    n = a = 0
    while n < entries:
        task = f"task_{a}"
        keys = []
        writes: dict[str, Any] = {
            f"notes_{a}": " ".join(sentence(rng, 12) for _ in range(4)),
            f"tool:{a}": {"kind": "tool_call_result", "tool": "bureau", "status": "ok",
                          "data": {"id": f"B{a}", "summary": sentence(rng, 8), "rows": [sentence(rng, 10) for _ in range(3)]}},
            f"reasoning_{a}": {"kind": "reasoning_chain", "steps": [sentence(rng, 15) for _ in range(4)]},
        }
        if a % 3 == 0:
            writes[f"retry_{a}"] = {"kind": "error_retry_log", "attempt": a, "error": sentence(rng, 10)}
        if a % 4 == 0:
            writes[f"status_{a}"] = "waiting for the bureau to answer the credit report request"
        if a % 5 == 0:
            writes[f"fact_{a}"] = {"decision": rng.choice(["approve", "review", "decline"]), "ref": f"F{a}"}
            preserved.append(f"fact_{a}")
        for k, v in writes.items():
            changes.append((Layer.HISTORY, k, v))
            keys.append(k)
        changes.append((Layer.HISTORY, f"activity:{task}", {
            "kind": "activity", "activity": task, "status": "completed",
            "summary": f"{task} completed; wrote {', '.join(keys)}", "keys": keys, "tokens": 0}))
        n += len(writes) + 1
        a += 1
    ctx.apply_changes(changes, kind="bench", actor="bench")
    ctx.mark_preserved(preserved, actor="bench")
    return ctx, preserved


def run(entries: int) -> dict[str, Any]:
    ctx, preserved = generate(entries)
    size = len(ctx.layer(Layer.HISTORY))
    tokens = ctx.tokens(Layer.HISTORY) + ctx.tokens(Layer.WORKING)
    config = config_from_dict({
        "compressTokenThreshold": int(tokens * 0.8),
        "compressRules": [
            {"pattern": "tool_call_result", "action": "extract_keys", "extractKeys": ["status", "data.id", "data.summary"]},
            {"pattern": "reasoning_chain", "action": "summarize", "maxTokens": 40},
            {"pattern": "error_retry_log", "action": "count_only", "keepLast": 1},
        ],
    })
    before = {k: canonical_json(ctx.layer(Layer.HISTORY)[k]) for k in preserved}
    t0 = time.perf_counter()
    score = AttentionScore.compute(ctx, config)
    t1 = time.perf_counter()
    result = RuleDrivenCompressor().compress(ctx, config)
    t2 = time.perf_counter()
    history = ctx.layer(Layer.HISTORY)
    kept = sum(1 for k, v in before.items() if k in history and canonical_json(history[k]) == v)
    return {
        "entries": size,
        "history_entries_after": len(history),
        "tokens_before": result.tokens_before,
        "tokens_after": result.tokens_after,
        "ratio": round(result.ratio, 4),
        "attention_ms": round((t1 - t0) * 1000, 1),
        "compress_ms": round((t2 - t1) * 1000, 1),
        "preserved_retention": kept / len(before) if before else 1.0,
        "triggers": result.triggers,
        "redundancy_exact": score.details["redundancy_exact"],
    }


def table(rows: list[dict[str, Any]]) -> str:
    head = ["entries", "tokens before", "tokens after", "ratio", "attention ms", "us/entry",
            "compress ms", "us/entry", "preserved kept", "triggers"]
    lines = [head]
    for r in rows:
        lines.append([f"{r['entries']:,}", f"{r['tokens_before']:,}", f"{r['tokens_after']:,}", f"{r['ratio']:.3f}",
                      f"{r['attention_ms']:,.1f}", f"{r['attention_ms'] * 1000 / r['entries']:.0f}",
                      f"{r['compress_ms']:,.1f}", f"{r['compress_ms'] * 1000 / r['entries']:.0f}",
                      f"{r['preserved_retention']:.0%}", ",".join(r["triggers"])])
    widths = [max(len(row[i]) for row in lines) for i in range(len(head))]
    out = [" | ".join(c.rjust(w) for c, w in zip(row, widths)).rstrip() for row in lines]
    out.insert(1, "-+-".join("-" * w for w in widths))
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="100 and 1,000 entries only (CI)")
    parser.add_argument("--json", action="store_true", help="print the rows as one JSON list")
    args = parser.parse_args(argv)
    sizes = (100, 1_000) if args.quick else (100, 1_000, 10_000)
    rows = [run(n) for n in sizes]
    if args.json:
        print(json.dumps(rows))
    else:
        print(table(rows))
    failed = [r for r in rows if r["preserved_retention"] != 1.0 or r["tokens_after"] >= r["tokens_before"]]
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
