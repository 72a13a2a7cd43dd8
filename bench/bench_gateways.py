"""Split + join of 3 branches, each changing 10 keys, vs context size; against a
deepcopy-based split and a full-dict diff join with the same merge rules.

    python bench/bench_gateways.py          # contexts of 1,000 and 100,000 keys
    python bench/bench_gateways.py --quick  # CI: fewer repetitions

layerflow: ``ContextSplitter.split`` (snapshot, split event, 3 forks) and
``join_contexts`` + ``apply_join`` (the touched keys of each branch's tape, three-way
merged, applied as one event). Baseline: ``copy.deepcopy`` of the layers for the
snapshot and for each branch, and ``three_way_merge`` of every key of every merged
layer (the same equality rules, on full dicts). The branches' own work (an activity
writing 10 keys) is done between the two timings and not counted.

Target (issue 4): the join grows with the changed keys, not the context: the join at
100,000 keys within 5x of the join at 1,000 keys.
"""

from __future__ import annotations

import argparse
import copy
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import immutables  # noqa: E402

from context_layers import Layer, LayeredContext  # noqa: E402
from context_layers.config import config_from_dict  # noqa: E402
from context_layers.context import _State  # noqa: E402
from gateways import ContextSplitter, apply_join, join_contexts, three_way_merge  # noqa: E402

BRANCHES = ("finance", "risk", "legal")
CHANGED = 10
MERGED = (Layer.PROCESS, Layer.KNOWLEDGE, Layer.HISTORY, Layer.WORKING)
CONFIG = config_from_dict({"branches": [{"id": b, "contextInject": {"review_type": b}} for b in BRANCHES]})


def build(n_keys: int) -> LayeredContext:
    """A context of ``n_keys`` keys (80% HISTORY, 20% KNOWLEDGE), built directly in the
    persistent maps: writing them one by one would time the writes, not the join."""
    ctx = LayeredContext(system={"policy": "p"})
    sizes = {Layer.HISTORY: n_keys * 8 // 10, Layer.KNOWLEDGE: n_keys - n_keys * 8 // 10}
    layers, tokens = list(ctx._state.layers), list(ctx._state.tokens)
    totals = list(ctx._state.totals)
    order = 0
    for layer, n in sizes.items():
        m = {}
        for i in range(n):
            order += 1
            m[f"{layer.name.lower()}_{i}"] = (order, 1, {"id": i, "text": f"value {i}"})
        layers[layer] = immutables.Map(m)
        tokens[layer] = immutables.Map({k: 7 for k in m})
        totals[layer] = 7 * n
    ctx._state = _State(layers=tuple(layers), tokens=tuple(tokens), totals=tuple(totals), counter=order)
    return ctx


_ROUNDS = iter(range(1, 1 << 30))


def branch_work(index: int, round_: int) -> dict[str, Any]:
    """The 10 keys a branch changes: disjoint HISTORY keys, values new in every round."""
    return {f"history_{index * CHANGED + j}": {"id": -j, "text": f"round {round_}, branch {index}"} for j in range(CHANGED)}


def layerflow_round(ctx: LayeredContext) -> tuple[float, float]:
    t0 = time.perf_counter()
    branches = ContextSplitter().split(ctx, "review_split", BRANCHES, CONFIG)
    t_split = time.perf_counter() - t0
    round_ = next(_ROUNDS)
    for i, b in enumerate(branches):
        b.context.begin_activity(f"{b.branch_id}_review")
        for key, value in branch_work(i, round_).items():
            b.context.write(Layer.WORKING, key, value, actor=b.branch_id)
        b.context.complete_activity(f"{b.branch_id}_review")
    t0 = time.perf_counter()
    snapshot = ctx.get_snapshot(branches[0].snapshot_id)
    result = join_contexts(snapshot, {b.branch_id: b.context for b in branches}, config=CONFIG,
                           gateway_id="review_join")
    apply_join(ctx, result)
    t_join = time.perf_counter() - t0
    assert not result.conflicts and len(result.changes[Layer.HISTORY]) >= len(BRANCHES) * CHANGED
    return t_split, t_join


def baseline_round(layers: dict[Layer, dict[str, Any]]) -> tuple[float, float]:
    t0 = time.perf_counter()
    base = copy.deepcopy(layers)
    branches = {b: copy.deepcopy(base) for b in BRANCHES}
    for b, branch in branches.items():
        branch[Layer.WORKING].update({"review_type": b, "_branch_id": b})
        branch[Layer.EPHEMERAL].clear()
    t_split = time.perf_counter() - t0
    round_ = next(_ROUNDS)
    for i, branch in enumerate(branches.values()):
        branch[Layer.HISTORY].update(branch_work(i, round_))
        branch[Layer.HISTORY].update(branch.pop(Layer.WORKING))
        branch[Layer.WORKING] = {}
    t0 = time.perf_counter()
    for layer in MERGED:
        out = three_way_merge(base[layer], {b: branches[b][layer] for b in BRANCHES})
        layers[layer] = out.merged
    t_join = time.perf_counter() - t0
    return t_split, t_join


def median(samples: list[float]) -> float:
    return statistics.median(samples)


def measure(round_: Callable[[], tuple[float, float]], repeat: int) -> tuple[float, float]:
    splits, joins = zip(*(round_() for _ in range(repeat)))
    return median(list(splits)), median(list(joins))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="fewer repetitions (CI)")
    args = ap.parse_args()
    sizes = [1_000, 100_000]
    rows = []
    for n in sizes:
        ctx = build(n)
        lf_split, lf_join = measure(lambda: layerflow_round(ctx), 5 if args.quick else 30)
        plain = {layer: dict(ctx.layer(layer).items()) for layer in Layer}
        bl_split, bl_join = measure(lambda: baseline_round(plain), 1 if args.quick or n >= 100_000 else 5)
        rows.append((n, lf_split, lf_join, bl_split, bl_join))
    print(f"{'keys':>8} | {'split':>9} | {'join':>9} | {'deepcopy split':>14} | {'full-diff join':>14} "
          f"| {'split x':>8} | {'join x':>7}")
    print("-" * 88)
    for n, lf_split, lf_join, bl_split, bl_join in rows:
        print(f"{n:>8,} | {lf_split * 1e3:>7.2f}ms | {lf_join * 1e3:>7.2f}ms | {bl_split * 1e3:>12.1f}ms | "
              f"{bl_join * 1e3:>12.1f}ms | {bl_split / lf_split:>7.0f}x | {bl_join / lf_join:>6.0f}x")
    growth = rows[-1][2] / rows[0][2]
    # a verdict, not an exit code: a loaded machine can stretch one size's timings, and the
    # tests run this quick mode (they check the table, never a time)
    print(f"\njoin at {sizes[-1]:,} keys / at {sizes[0]:,} keys: {growth:.2f}x (target <= 5x: "
          f"{'met' if growth <= 5 else 'NOT met'}); 3 branches x {CHANGED} changed keys")


if __name__ == "__main__":
    main()
