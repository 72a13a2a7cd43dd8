"""Store backends: tape append latency and save / load throughput.

    python bench/bench_store.py            # memory, sqlite, redis ($REDIS_URL or 127.0.0.1:6379)
    python bench/bench_store.py --quick    # CI: fewer operations

Appends are single events (``append_events``: one transaction / one script each);
a save replaces a ~10 KB record and appends 3 events in the same transaction, as an
engine step does. Redis is skipped with a note when no server answers.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from context_layers.stores import Store, StoreUnavailable, open_store  # noqa: E402

REDIS_URL = os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0")


@contextmanager
def backend(name: str) -> Iterator[Store]:
    if name == "memory":
        yield open_store("memory://")
    elif name == "sqlite":
        with tempfile.TemporaryDirectory() as d:
            store = open_store(f"sqlite:///{d}/bench.db")
            yield store
            store.close()
    else:
        prefix = f"lfbench-{uuid.uuid4().hex[:8]}"
        store = open_store(f"{REDIS_URL}{'&' if '?' in REDIS_URL else '?'}prefix={prefix}")
        try:
            yield store
        finally:
            client = store.redis  # type: ignore[attr-defined]
            for key in client.scan_iter(match=f"{prefix}:*", count=1000):
                client.delete(key)
            store.close()


def record(iid: str, step: int) -> dict[str, Any]:
    return {"id": iid, "process_id": "loan_approval", "status": "running", "step": step,
            "workflow": "w" * 10_000, "engine": {"branches": {}, "activities": step}}


def event(seq: int) -> dict[str, Any]:
    return {"seq": seq, "kind": "write", "time": time.time(), "actor": "bench", "activity": "risk",
            "changes": [[4, "risk_level", {"level": "medium", "score": seq}]]}


def timed(fn: Callable[[], Any], n: int) -> list[float]:
    samples = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - t0)
    return samples


def p99(samples: list[float]) -> float:
    return sorted(samples)[min(len(samples) - 1, int(len(samples) * 0.99))]


def bench(store: Store, n: int) -> dict[str, float]:
    store.create(record("append", 0))
    seq = iter(range(1, 10 ** 9))
    appends = timed(lambda: store.append_events("append", "main", [event(next(seq))]), n)

    store.create(record("save", 0), tape_appends={"main": [event(1)]})
    state = {"version": 1, "seq": 1}

    def save() -> None:
        s = state["seq"]
        state["version"] = store.save("save", record("save", state["version"]), state["version"],
                                      {"main": [event(s + 1), event(s + 2), event(s + 3)]})
        state["seq"] = s + 3

    saves = timed(save, n)
    loads = timed(lambda: store.load("save"), n)
    return {"append_median_ms": statistics.median(appends) * 1e3, "append_p99_ms": p99(appends) * 1e3,
            "saves_per_s": n / sum(saves), "loads_per_s": n / sum(loads)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="fewer operations (CI)")
    parser.add_argument("--backends", default="memory,sqlite,redis")
    args = parser.parse_args(argv)
    n = 200 if args.quick else 2000

    print(f"store backends, {n} operations each")
    print(f"| backend | append median (ms) | append p99 (ms) | saves/s | loads/s |")
    print(f"|---|---:|---:|---:|---:|")
    for name in args.backends.split(","):
        try:
            with backend(name) as store:
                r = bench(store, n)
        except StoreUnavailable as exc:
            print(f"| {name} | skipped: {exc} | | | |")
            continue
        print(f"| {name} | {r['append_median_ms']:.3f} | {r['append_p99_ms']:.3f} | "
              f"{r['saves_per_s']:,.0f} | {r['loads_per_s']:,.0f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
