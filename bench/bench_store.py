"""Store backends: tape append latency, save / load throughput, and loan-demo instances
per second with 1 and 2 workers.

    python bench/bench_store.py            # memory, sqlite, redis ($REDIS_URL or 127.0.0.1:6379)
    python bench/bench_store.py --quick    # CI: fewer operations

Appends are single events (``append_events``: one transaction / one script each);
a save replaces a ~10 KB record and appends 3 events in the same transaction, as an
engine step does. Redis is skipped with a note when no server answers.

Workers: N loan-demo instances ("full" scenario: risk assessment, two parallel reviews,
join, decision) are created first; the clock runs from putting their ids on a fresh
stream to the last acknowledgement. Workers on memory:// are threads of this process
(one interpreter lock: a second thread adds little); on sqlite and redis they are
processes (``run_worker`` in a subprocess each), as in production.
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


def sqlite_url(name: str, directory: str) -> str:
    """``sqlite``: the default (WAL, synchronous=FULL: every commit is fsynced);
    ``sqlite-normal``: synchronous=NORMAL (survives a crashed process, not a power cut)."""
    return f"sqlite:///{directory}/bench.db" + ("?synchronous=normal" if name == "sqlite-normal" else "")


@contextmanager
def backend(name: str) -> Iterator[Store]:
    if name == "memory":
        yield open_store("memory://")
    elif name.startswith("sqlite"):
        with tempfile.TemporaryDirectory() as d:
            store = open_store(sqlite_url(name, d))
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


LOAN = Path(__file__).resolve().parent.parent / "bpmn_examples" / "loan_approval.bpmn"
FULL = {"amount": 120000, "applicant_id": "APP002", "purpose": "warehouse expansion", "industry": "logistics"}
_WORKER = ("import sys; from engine.worker import run_worker; "
           "run_worker(sys.argv[1], queue_url=sys.argv[2], stream=sys.argv[3], consumer=sys.argv[4], block_ms=100)")


def bench_workers(name: str, workers: int, n: int) -> float:
    """Loan-demo instances per second with ``workers`` workers on backend ``name``."""
    import signal
    import subprocess
    import threading

    from context_layers.stores import InstanceRecords
    from engine import Engine, load_process
    from engine.worker import DEFAULT_GROUP, queue_client, run_worker

    tag = uuid.uuid4().hex[:8]
    stream = f"lfbench-{tag}:ready"
    client = queue_client(queue_url=REDIS_URL)
    with tempfile.TemporaryDirectory() as d:
        url = (f"memory://bench-{tag}" if name == "memory" else sqlite_url(name, d) if name.startswith("sqlite")
               else f"{REDIS_URL}{'&' if '?' in REDIS_URL else '?'}prefix=lfbench-{tag}")
        store = open_store(url)
        engine = Engine(InstanceRecords(store))
        process = load_process(LOAN)
        ids = [engine.start(process, FULL).id for _ in range(n)]
        client.xgroup_create(stream, DEFAULT_GROUP, id="$", mkstream=True)
        stop = threading.Event()
        threads, procs = [], []
        for i in range(workers):
            if name == "memory":
                t = threading.Thread(target=run_worker, args=(store,), kwargs=dict(
                    queue_url=REDIS_URL, stream=stream, consumer=f"w{i}", block_ms=100, stop=stop))
                t.start()
                threads.append(t)
            else:
                procs.append(subprocess.Popen([sys.executable, "-c", _WORKER, url, REDIS_URL, stream, f"w{i}"],
                                              cwd=Path(__file__).resolve().parent.parent))
        try:
            while len(client.xinfo_consumers(stream, DEFAULT_GROUP)) < workers:  # all warmed up and reading
                if any(p.poll() is not None for p in procs):
                    raise RuntimeError("a worker process exited early")
                time.sleep(0.05)
            t0 = time.perf_counter()
            pipe = client.pipeline(transaction=False)
            for iid in ids:
                pipe.xadd(stream, {"instance_id": iid})
            pipe.execute()
            while True:
                group = client.xinfo_groups(stream)[0]
                if group["pending"] == 0 and group["lag"] == 0:
                    break
                time.sleep(0.005)
            elapsed = time.perf_counter() - t0
        finally:
            stop.set()
            for p in procs:
                p.send_signal(signal.SIGTERM)
            for p in procs:
                p.wait(timeout=30)
            for t in threads:
                t.join(timeout=30)
            client.delete(stream)
        done = sum(1 for s in store.list_instances() if s["status"] == "completed")
        if done != n:
            raise RuntimeError(f"{name}: {done} of {n} instances completed")
        if name == "redis":
            for key in store.redis.scan_iter(match=f"lfbench-{tag}:*", count=1000):  # type: ignore[attr-defined]
                store.redis.delete(key)  # type: ignore[attr-defined]
        store.close()
    return n / elapsed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="fewer operations (CI)")
    parser.add_argument("--backends", default="memory,sqlite,sqlite-normal,redis")
    parser.add_argument("--no-workers", action="store_true", help="skip the loan-demo worker runs")
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
    if args.no_workers:
        return 0
    from engine.worker import queue_client

    try:
        queue_client(queue_url=REDIS_URL).ping()
    except Exception as exc:  # noqa: BLE001 - any failure to reach Redis skips this part
        print(f"\nworkers skipped: the queue needs Redis at {REDIS_URL} ({exc})")
        return 0
    instances, rounds = (10, 1) if args.quick else (60, 3)
    print(f"\nloan demo ('full' scenario), {instances} instances, workers on a Redis stream, "
          f"best and worst of {rounds} rounds ({os.cpu_count()} CPUs)")
    print("| store | workers | mode | instances/s (best) | (worst) |")
    print("|---|---:|---|---:|---:|")
    for name in args.backends.split(","):
        for workers in (1, 2):
            # best of N: other load on the machine only ever slows a round down
            rates = [bench_workers(name, workers, instances) for _ in range(rounds)]
            mode = "threads" if name == "memory" else "processes"
            print(f"| {name} | {workers} | {mode} | {max(rates):,.1f} | {min(rates):,.1f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
