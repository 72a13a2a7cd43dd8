"""Snapshot and 3-branch split cost vs context size, against copy.deepcopy of the same layers.

    python bench/bench_snapshot.py          # 10, 1,000 and 100,000 keys x 6 layers
    python bench/bench_snapshot.py --quick  # CI: fewer repetitions

Targets (issue "core"): snapshot+split at 100,000 keys within 3x of the time at 10
keys, and at least 1,000x faster than deepcopy at 100,000 keys.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import gc
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import immutables  # noqa: E402

from context_layers import Layer, LayeredContext  # noqa: E402
from context_layers.context import _State  # noqa: E402


def build(n_keys: int) -> LayeredContext:
    """A context with ``n_keys`` keys in each of the six layers, built directly in the
    persistent maps (writing 600,000 keys one by one would time the writes, not this)."""
    ctx = LayeredContext(system={"policy": "p"})
    layers, tokens = [], []
    for layer in Layer:
        m = {f"{layer.name.lower()}_{i}": (i, 1, {"id": i, "text": f"value {i}"}) for i in range(n_keys)}
        layers.append(immutables.Map(m))
        tokens.append(immutables.Map({k: 7 for k in m}))
    ctx._state = _State(layers=tuple(layers), tokens=tuple(tokens), totals=(7 * n_keys,) * 6, counter=n_keys)
    return ctx


@contextlib.contextmanager
def gc_paused():
    """Untimed setup allocates millions of objects: without this, the cyclic collector walks
    the growing heap again and again (most of a quick run's time, none of it measured)."""
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


def median_time(fn, repeat: int) -> float:
    samples = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - t0)
    return statistics.median(samples)


def snapshot_and_split(ctx: LayeredContext) -> None:
    snap = ctx.snapshot()
    for b in ("a", "b", "c"):
        LayeredContext.fork(snap, name=f"main/{b}", branch_id=b, inject={"review_type": b})


def deepcopy_split(layers: list[dict]) -> None:
    base = copy.deepcopy(layers)
    for _ in range(3):
        copy.deepcopy(base)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="fewer repetitions (CI)")
    args = ap.parse_args()
    sizes = [10, 1_000, 100_000]
    rep = 20 if args.quick else 200
    rows = []
    for n in sizes:
        with gc_paused():
            ctx = build(n)
            plain = [{k: v for k, v in ctx.layer(layer).items()} for layer in Layer]
        t_snap = median_time(ctx.snapshot, rep)
        t_split = median_time(lambda: snapshot_and_split(ctx), rep)
        t_deep = median_time(lambda: deepcopy_split(plain), 1 if n >= 100_000 else (3 if args.quick else 10))
        rows.append((n, t_snap, t_split, t_deep))
    print(f"{'keys/layer':>10} | {'snapshot':>10} | {'snap+3 split':>12} | {'deepcopy+3':>11} | {'speed-up':>9}")
    print("-" * 64)
    for n, t_snap, t_split, t_deep in rows:
        print(f"{n:>10,} | {t_snap * 1e6:>8.1f}us | {t_split * 1e6:>10.1f}us | {t_deep * 1e3:>9.1f}ms | {t_deep / t_split:>8.0f}x")
    growth = rows[-1][2] / rows[0][2]
    print(f"\nsnapshot+split at {sizes[-1]:,} keys / at {sizes[0]} keys: {growth:.2f}x (target <= 3x)")
    print(f"speed-up over deepcopy at {sizes[-1]:,} keys: {rows[-1][3] / rows[-1][2]:,.0f}x (target >= 1,000x)")


if __name__ == "__main__":
    main()
