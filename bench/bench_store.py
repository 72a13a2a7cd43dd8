"""Store backends: tape append latency, save / load throughput, finding due timers, and
loan-demo instances per second with 1 and 2 workers.

    python bench/bench_store.py            # memory, sqlite, redis ($REDIS_URL or 127.0.0.1:6379)
    python bench/bench_store.py --quick    # CI: fewer operations

Appends are single events (``append_events``: one transaction / one script each);
a save replaces a ~10 KB record and appends 3 events in the same transaction, as an
engine step does. Redis is skipped with a note when no server answers.

Due timers: ``Engine.due_timers()`` over 5,000 instances waiting for a timer, of which 10 are
due (``--quick``: 500 and 5), on the timer index (``Store.due_instances``) and on the full
scan it replaced (every instance listed, the record head of every waiting one read), in the
same run: the first call (``layerflow timers``, a new process) and the next one with nothing
changed (a worker's scan every ``--timer-interval``); plus the one-time filling of the index
of a store written before it existed.

Tapes of an agent loop: a process whose step appends a message to a list on every pass
(``messages = messages + [...]``), run for 100, 300 and 1,000 passes (``--quick``: 30, 100,
300) with the engine saving after every activity, once with every tape value stored whole
(``tape_part_bytes=None``: the format before tape parts, the baseline) and once in parts
(the default), same run: the bytes its tape takes in the store (event texts and parts),
the time of all its saves, and the time to load the finished instance. Whole, the bytes
grow with the square of the passes; in parts, with the passes.

Workers: N loan-demo instances ("full" scenario: risk assessment, two parallel reviews,
join, decision) are created first; the clock runs from putting their ids on a fresh
stream to the last acknowledgement. Workers on memory:// are threads of this process
(one interpreter lock: a second thread adds little); on sqlite and redis they are
processes (``run_worker`` in a subprocess each), as in production.
"""

from __future__ import annotations

import argparse
import json
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
from context_layers.stores.tape_parts import PART_BYTES  # noqa: E402

REDIS_URL = os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0")


def sqlite_url(name: str, directory: str) -> str:
    """``sqlite``: the default (WAL, synchronous=FULL: every commit is fsynced);
    ``sqlite-normal``: synchronous=NORMAL (survives a crashed process, not a power cut)."""
    return f"sqlite:///{directory}/bench.db" + ("?synchronous=normal" if name == "sqlite-normal" else "")


@contextmanager
def backend(name: str, **options: Any) -> Iterator[Store]:
    if name == "memory":
        yield open_store("memory://", **options)
    elif name.startswith("sqlite"):
        with tempfile.TemporaryDirectory() as d:
            store = open_store(sqlite_url(name, d), **options)
            yield store
            store.close()
    else:
        prefix = f"lfbench-{uuid.uuid4().hex[:8]}"
        store = open_store(f"{REDIS_URL}{'&' if '?' in REDIS_URL else '?'}prefix={prefix}", **options)
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


def timer_record(iid: str, due: float) -> dict[str, Any]:
    """A record as the engine saves an instance waiting for a timer: ~10 KB, the timer in its
    engine part."""
    from datetime import datetime, timezone

    when = datetime.fromtimestamp(due, timezone.utc).isoformat()
    return {"id": iid, "process_id": "wait_an_hour", "status": "waiting", "workflow": "w" * 10_000,
            "engine": {"waiting_for": [{"kind": "timer", "id": f"t-{iid}", "task_id": "an_hour", "due": when}]}}


def bench_due_timers(name: str, waiting: int, due: int) -> list[tuple[str, float, int, float, int]]:
    """Rows ``(call, full scan ms, its head reads, index ms, its head reads)``; raises if the
    two ways ever disagree."""
    from context_layers.stores import InstanceRecords
    from engine import Engine

    class FullScan(InstanceRecords):
        """``due_timers`` as it was before the index: every waiting instance is a candidate."""

        heads = 0

        def list_due(self, until: Any) -> list[dict[str, Any]]:
            return [row for row in self.list() if row["status"] == "waiting"]

        def load_head(self, instance_id: str) -> dict[str, Any]:
            self.heads += 1
            return super().load_head(instance_id)

    class Indexed(InstanceRecords):
        heads = 0

        def load_head(self, instance_id: str) -> dict[str, Any]:
            self.heads += 1
            return super().load_head(instance_id)

    now = time.time()
    with backend(name) as store:
        for i in range(waiting):  # the first `due` came due a minute ago, the rest in an hour
            store.create(timer_record(f"i{i:06d}", now - 60 if i < due else now + 3600))
        rows = []
        scan, index = FullScan(store), Indexed(store)
        engines = Engine(scan, clock=lambda: now), Engine(index, clock=lambda: now)
        for call in ("first call", "next call"):
            scan.heads = index.heads = 0
            scan_ms, expected = timed_call(engines[0].due_timers)
            index_ms, got = timed_call(engines[1].due_timers)
            if got != expected or len(got) != due:
                raise RuntimeError(f"{name}: the index found {len(got)} due timers, the scan {len(expected)}")
            rows.append((call, scan_ms, scan.heads, index_ms, index.heads))
        if name != "memory":  # a store from before the index: the first call fills it, once
            forget_index(name, store)
            older = Indexed(reopen(store))
            fill_ms, got = timed_call(Engine(older, clock=lambda: now).due_timers)
            if len(got) != due:
                raise RuntimeError(f"{name}: after filling, the index found {len(got)} due timers, not {due}")
            rows.append(("first call, index to fill", float("nan"), 0, fill_ms, older.heads))
            older.store.close()
    return rows


def timed_call(fn: Callable[[], Any]) -> tuple[float, Any]:
    t0 = time.perf_counter()
    result = fn()
    return (time.perf_counter() - t0) * 1e3, result


def forget_index(name: str, store: Store) -> None:
    """Make ``store`` look as a layerflow before the timer index left it."""
    if name.startswith("sqlite"):
        import sqlite3

        with sqlite3.connect(store.path) as c:  # type: ignore[attr-defined]
            c.execute("UPDATE instances SET due = NULL")
            c.execute("DELETE FROM meta WHERE key = 'timer_index'")
    else:
        prefix = store.prefix  # type: ignore[attr-defined]
        store.redis.delete(f"{prefix}:due")  # type: ignore[attr-defined]
        store.redis.hdel(f"{prefix}:meta", "timer_index")  # type: ignore[attr-defined]


def reopen(store: Store) -> Store:
    """A new handle on the same store (a new process after an upgrade)."""
    if hasattr(store, "prefix"):
        return open_store(f"{REDIS_URL}{'&' if '?' in REDIS_URL else '?'}prefix={store.prefix}")
    return open_store(store.url)


AGENT_LOOP = """<?xml version="1.0" encoding="UTF-8"?>
<bpmn:definitions xmlns:bpmn="http://www.omg.org/spec/BPMN/20100524/MODEL"
    xmlns:xsi="http://www.w3.org/2001/XMLSchema-instance" id="defs" targetNamespace="https://layerflow.dev/bench">
  <bpmn:process id="agent_loop" isExecutable="true">
    <bpmn:startEvent id="start"/>
    <bpmn:scriptTask id="init"><bpmn:script>messages = []
n = 0</bpmn:script></bpmn:scriptTask>
    <bpmn:scriptTask id="step"><bpmn:script>messages = messages + [{"role": "assistant", "content": "step %d ..." % n}]
n = n + 1</bpmn:script></bpmn:scriptTask>
    <bpmn:exclusiveGateway id="more" default="again"/>
    <bpmn:endEvent id="end"/>
    <bpmn:sequenceFlow id="f1" sourceRef="start" targetRef="init"/>
    <bpmn:sequenceFlow id="f2" sourceRef="init" targetRef="step"/>
    <bpmn:sequenceFlow id="f3" sourceRef="step" targetRef="more"/>
    <bpmn:sequenceFlow id="again" sourceRef="more" targetRef="step"/>
    <bpmn:sequenceFlow id="done" sourceRef="more" targetRef="end">
      <bpmn:conditionExpression xsi:type="bpmn:tFormalExpression">n &gt;= passes</bpmn:conditionExpression>
    </bpmn:sequenceFlow>
  </bpmn:process>
</bpmn:definitions>
"""


def tape_bytes(store: Store, instance_id: str) -> int:
    """Bytes the instance's tapes take in the store: its stored event texts and its parts."""
    if hasattr(store, "_instances"):
        texts = [t for tape in store._instances[instance_id].tapes.values() for t in tape]
    elif hasattr(store, "path"):
        import sqlite3

        with sqlite3.connect(store.path) as c:
            texts = [r[0] for r in c.execute("SELECT event FROM events WHERE instance_id = ?", (instance_id,))]
    else:
        texts = [t for ctx in store.tape_heads(instance_id)
                 for t in store.redis.lrange(store._ik(instance_id, "t", ctx), 0, -1)]  # type: ignore[attr-defined]
    return sum(len(t.encode()) for t in texts) + store.blob_stats(instance_id).bytes


def bench_tape(name: str, passes: int, part_bytes: int | None) -> dict[str, float]:
    """The agent loop run for ``passes`` on backend ``name``, tape values whole (``None``) or in parts."""
    from context_layers.stores import InstanceRecords
    from engine import Engine, load_process

    class TimedRecords(InstanceRecords):
        seconds = 0.0

        def save(self, record: Any, expected_version: int) -> int:
            t0 = time.perf_counter()
            try:
                return super().save(record, expected_version)
            finally:
                self.seconds += time.perf_counter() - t0

    with tempfile.TemporaryDirectory() as d, backend(name, tape_part_bytes=part_bytes) as store:
        (Path(d) / "agent_loop.bpmn").write_text(AGENT_LOOP)
        records = TimedRecords(store)
        engine = Engine(records)
        instance = engine.run(engine.start(load_process(Path(d) / "agent_loop.bpmn"), {"passes": passes}))
        if instance.status != "completed":
            raise RuntimeError(f"{name}: the agent loop ended {instance.status}: {instance.error}")
        t0 = time.perf_counter()
        loaded = Engine(InstanceRecords(store)).load(instance.id)
        load_s = time.perf_counter() - t0
        if loaded.main.state_json() != instance.main.state_json() or len(loaded.main.tape) != len(instance.main.tape):
            raise RuntimeError(f"{name}: the loaded instance differs from the one that ran")
        return {"bytes": tape_bytes(store, instance.id), "save_s": records.seconds, "load_s": load_s,
                "list_bytes": len(json.dumps(instance.main.resolve("messages"), separators=(",", ":")))}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="fewer operations (CI)")
    parser.add_argument("--backends", default="memory,sqlite,sqlite-normal,redis")
    parser.add_argument("--no-workers", action="store_true", help="skip the loan-demo worker runs")
    args = parser.parse_args(argv)
    n = 200 if args.quick else 2000

    print(f"store backends, {n} operations each")
    print("| backend | append median (ms) | append p99 (ms) | saves/s | loads/s |")
    print("|---|---:|---:|---:|---:|")
    for name in args.backends.split(","):
        try:
            with backend(name) as store:
                r = bench(store, n)
        except StoreUnavailable as exc:
            print(f"| {name} | skipped: {exc} | | | |")
            continue
        print(f"| {name} | {r['append_median_ms']:.3f} | {r['append_p99_ms']:.3f} | "
              f"{r['saves_per_s']:,.0f} | {r['loads_per_s']:,.0f} |")

    waiting, due = (500, 5) if args.quick else (5000, 10)
    print(f"\ndue timers: Engine.due_timers() over {waiting:,} instances waiting for a timer, {due} due; "
          "full scan vs timer index, same run")
    print("| backend | call | full scan (ms) | heads read | index (ms) | heads read | x faster |")
    print("|---|---|---:|---:|---:|---:|---:|")
    for name in args.backends.split(","):
        if name == "sqlite-normal":
            continue  # the index is read, not written, here: synchronous changes nothing
        try:
            rows = bench_due_timers(name, waiting, due)
        except StoreUnavailable as exc:
            print(f"| {name} | skipped: {exc} | | | | | |")
            continue
        for call, scan_ms, scan_heads, index_ms, index_heads in rows:
            if scan_ms != scan_ms:  # nan: no scan to compare with
                print(f"| {name} | {call} | | | {index_ms:,.1f} | {index_heads:,} | |")
            else:
                print(f"| {name} | {call} | {scan_ms:,.1f} | {scan_heads:,} | {index_ms:,.1f} | {index_heads:,} | "
                      f"{scan_ms / index_ms:,.0f}x |")
    tape_passes = (30, 100, 300) if args.quick else (100, 300, 1000)
    print("\ntape of an agent loop (a message appended to a list each pass, a save after every activity): "
          "values stored whole (baseline) vs in parts, same run")
    print("| backend | passes | final list (KB) | tape whole (KB) | tape in parts (KB) | x smaller | "
          "saves whole (s) | saves in parts (s) | load whole (ms) | load in parts (ms) |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for name in args.backends.split(","):
        if name == "sqlite-normal":
            continue  # fsync or not changes no byte of a tape
        try:
            for passes in tape_passes:
                whole, parts = bench_tape(name, passes, None), bench_tape(name, passes, PART_BYTES)
                print(f"| {name} | {passes:,} | {parts['list_bytes'] / 1e3:,.1f} | {whole['bytes'] / 1e3:,.0f} | "
                      f"{parts['bytes'] / 1e3:,.0f} | {whole['bytes'] / parts['bytes']:,.1f} | "
                      f"{whole['save_s']:,.2f} | {parts['save_s']:,.2f} | {whole['load_s'] * 1e3:,.0f} | "
                      f"{parts['load_s'] * 1e3:,.0f} |")
        except StoreUnavailable as exc:
            print(f"| {name} | skipped: {exc} | | | | | | | | |")
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
