"""Prefix stability: the layerflow pipeline vs a sliding-window trimmer, same run, same budget.

    python bench/bench_prefix.py          # headline + sweep (system size, budget, rewrites, formats)
    python bench/bench_prefix.py --quick  # CI: the headline scenario only

A generated 30-activity process (bench/render_sim.py) runs twice from the same inputs:

* layerflow: HISTORY only grows by appending; volatile parts (KNOWLEDGE hits, WORKING,
  the task) are bound late, at the end of the request; when HISTORY + WORKING passes
  the budget the compressor folds the oldest activities into one compaction record
  (a cliff: one cache miss, then a stable prefix again);
* sliding window: the same requests, but instead of compressing, every request drops
  the oldest HISTORY entries until HISTORY + WORKING fits the budget, as most agent
  frameworks do; its head changes on every request once the budget is reached.

Prefix stability: for each request, the share of its tokens that is a prefix of the
previous request (tiktoken cl100k_base, whole tokens), averaged over requests 2..30.
"weighted" is the same by tokens (the cache hit rate that input cost follows).
Target (issue 6): >= 0.9 for layerflow on the headline scenario.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from render_sim import generated_process, simulate  # noqa: E402

from context_layers.prefix import prefix_report, prefix_stability  # noqa: E402

HEADLINE = {"policy_sentences": 200, "rewrite_every": 5, "budget": 4000, "fmt": "xml"}
TARGET = 0.9


def compare(*, policy_sentences: int, rewrite_every: int, budget: int, fmt: str, n: int = 30) -> dict:
    fixture = generated_process(n, policy_sentences=policy_sentences, rewrite_every=rewrite_every)
    lf = simulate(fixture, mode="layerflow", fmt=fmt, budget=budget)
    sw = simulate(fixture, mode="sliding", fmt=fmt, budget=budget)
    return {
        "lf": lf, "sw": sw,
        "lf_weighted": prefix_stability(lf.requests, weighted=True),
        "sw_weighted": prefix_stability(sw.requests, weighted=True),
    }


def row(label: str, r: dict) -> str:
    lf, sw = r["lf"], r["sw"]
    return (f"{label:<34} {lf.stability:>6.3f} {r['lf_weighted']:>6.3f} {lf.mean_tokens:>7.0f} {lf.compressions:>4d} "
            f"{lf.retention:>5.2f} | {sw.stability:>6.3f} {r['sw_weighted']:>6.3f} {sw.mean_tokens:>7.0f} "
            f"{sw.retention:>5.2f}")


HEADER = (f"{'scenario':<34} {'layerflow':^31} | {'sliding window':^28}\n"
          f"{'':<34} {'stab':>6} {'wtd':>6} {'tok/req':>7} {'cmp':>4} {'keep':>5} | "
          f"{'stab':>6} {'wtd':>6} {'tok/req':>7} {'keep':>5}")


def shares_line(requests) -> str:
    marks = []
    for p in prefix_report(requests):
        if p.share is None:
            continue
        s = p.share
        marks.append("#" if s >= 0.9 else "+" if s >= 0.75 else "-" if s >= 0.5 else ".")
    return "".join(marks)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="headline scenario only (CI)")
    ap.add_argument("--activities", type=int, default=30)
    args = ap.parse_args()
    start = time.perf_counter()
    print("compression: context_layers.compression (RuleDrivenCompressor)")
    print("stab: mean prefix share per request; wtd: token-weighted; tok/req: mean request tokens;")
    print("cmp: compressions; keep: share of preserved keys visible with their value\n")
    print(HEADER)
    head = compare(**HEADLINE, n=args.activities)
    label = (f"headline: sys~2.7k, budget {HEADLINE['budget']}, rw/5")
    print(row(label, head))
    print(f"\nper-request shares (#>=0.9 +>=0.75 ->=0.5 .<0.5)\n  layerflow {shares_line(head['lf'].requests)}"
          f"\n  sliding   {shares_line(head['sw'].requests)}")
    if not args.quick:
        print("\nsweep\n" + HEADER)
        for policy in (60, 200):
            for rewrite in (0, 5):
                for budget in (3000, 6000, 10000):
                    r = compare(policy_sentences=policy, rewrite_every=rewrite, budget=budget, fmt="xml",
                                n=args.activities)
                    sys_size = "~0.8k" if policy == 60 else "~2.7k"
                    print(row(f"sys{sys_size} budget {budget:>5} rw/{rewrite or '-'}", r))
        print("\nformats (headline scenario)\n" + HEADER)
        for fmt in ("xml", "json", "plain"):
            print(row(f"format {fmt}", compare(**{**HEADLINE, "fmt": fmt}, n=args.activities)))
    ok = head["lf"].stability >= TARGET
    print(f"\nlayerflow {head['lf'].stability:.3f} vs sliding window {head['sw'].stability:.3f} "
          f"(target >= {TARGET}: {'met' if ok else 'NOT met'}) in {time.perf_counter() - start:.1f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
