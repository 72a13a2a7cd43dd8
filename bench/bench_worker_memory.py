"""A long-running worker's memory: one `layerflow worker` process runs many short instances,
and its resident set (VmRSS from /proc/PID/status) is sampled as it goes.

    python bench/bench_worker_memory.py                       # 2,000 loan runs on $REDIS_URL
    python bench/bench_worker_memory.py --count 3000 --process chain
    python bench/bench_worker_memory.py --same-data           # every instance with the same data
    python bench/bench_worker_memory.py --quick               # CI: 200 runs

The instances are submitted first, each with data of its own (an applicant id and an amount, as
in production: every text the worker meets is new; ``engine.worker.submit`` from this process),
or, with ``--same-data``, all with the same data by `layerflow submit --count` (real processes,
in batches). Then one `layerflow worker --stop-after COUNT` runs them all. The table shows RSS after the first tenth of
the runs (imports and first-use caches are in by then) and at every further tenth; the last lines
the growth over the first half and over the second half of the samples, per 1,000 runs. A worker that keeps something per
instance (a parsed process, a record, a tape buffer) grows with the runs; a bounded one levels
off. Nothing here asserts a size: the machine is shared. Linux only (reads /proc).

Processes: ``loan`` (bpmn_examples/loan_approval.bpmn, the fast-track application: a script, a
retrieval, two service tasks) or ``chain`` (parallel_scripts.bpmn: a split, three scripts, a join).
Keys go under a prefix of the bench's own on ``$REDIS_URL`` (default redis://127.0.0.1:6379/0),
removed at the end.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
REDIS_URL = os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0")
PROCESSES = {
    "loan": (REPO / "bpmn_examples" / "loan_approval.bpmn",
             {"amount": 20000, "applicant_id": "APP003", "purpose": "equipment", "industry": "bakery"}),
    "chain": (REPO / "bpmn_examples" / "parallel_scripts.bpmn", {}),
}


def layerflow(*args: str) -> list[str]:
    return [sys.executable, "-m", "engine.cli", *args]


def env() -> dict[str, str]:
    e = dict(os.environ)
    e["PYTHONPATH"] = os.pathsep.join([str(REPO), e.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    return e


def rss_kb(pid: int) -> int | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except OSError:
        return None
    return None


def acked(client: object, stream: str, group: str) -> int:
    """Entries the group read and acknowledged so far."""
    for g in client.xinfo_groups(stream):  # type: ignore[attr-defined]
        if g["name"] == group:
            return int(g.get("entries-read") or 0) - int(g["pending"])
    return 0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--count", type=int, default=2000)
    parser.add_argument("--process", choices=sorted(PROCESSES), default="loan")
    parser.add_argument("--same-data", action="store_true", help="every instance with the same start data")
    parser.add_argument("--quick", action="store_true", help="200 runs")
    args = parser.parse_args()
    count = 200 if args.quick else args.count
    import redis

    prefix = f"lfbenchmem{uuid.uuid4().hex[:8]}"
    store = f"{REDIS_URL}{'&' if '?' in REDIS_URL else '?'}prefix={prefix}"
    stream, group = f"{prefix}-ready", "workers"
    client = redis.Redis.from_url(REDIS_URL, decode_responses=True)
    bpmn, data = PROCESSES[args.process]
    worker = None
    try:
        if args.same_data:
            left = count
            while left:
                batch = min(left, 500)
                subprocess.run(layerflow("submit", str(bpmn), "--data", json.dumps(data), "--count", str(batch),
                                         "--store", store, "--stream", stream, "--group", group, "--json"),
                               check=True, capture_output=True, env=env(), cwd=REPO)
                left -= batch
        else:
            sys.path.insert(0, str(REPO))
            from engine import load_process
            from engine.worker import submit

            process = load_process(bpmn)
            for i in range(count):
                own = {**data, "applicant_id": f"APP{i:06d}", "amount": 20_000 + 7 * i} if data else {"n": i}
                submit(store, process, own, stream=stream, group=group, client=client)
        worker = subprocess.Popen(layerflow("worker", "--store", store, "--stream", stream, "--group", group,
                                            "--stop-after", str(count), "--timer-interval", "0", "--json"),
                                  stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env(), cwd=REPO)
        samples: list[tuple[int, int, float]] = []  # (runs done, RSS kB, seconds)
        t0 = time.perf_counter()
        step = max(1, count // 10)
        next_at = step
        while worker.poll() is None:
            done = acked(client, stream, group)
            if done >= next_at:
                kb = rss_kb(worker.pid)
                if kb is not None:
                    samples.append((done, kb, time.perf_counter() - t0))
                next_at = (done // step + 1) * step
            time.sleep(0.05)
        out = worker.stdout.read().decode() if worker.stdout else ""
        stats = json.loads(out) if out.strip() else {}
        print(f"{args.process}: {count} instances ({'the same' if args.same_data else 'distinct'} data), one worker "
              f"({stats.get('statuses')})")
        print(f"{'runs':>8} {'RSS MB':>8} {'s':>7}")
        for done, kb, s in samples:
            print(f"{done:>8} {kb / 1024:>8.1f} {s:>7.1f}")
        if len(samples) >= 3:
            # a bounded worker grows while its memories fill, then stays level
            mid = len(samples) // 2
            for (d0, k0, _), (d1, k1, _) in ((samples[0], samples[mid]), (samples[mid], samples[-1])):
                per = (k1 - k0) / 1024 / max(1, d1 - d0) * 1000
                print(f"growth from {d0} to {d1} runs: {(k1 - k0) / 1024:+.1f} MB ({per:+.2f} MB per 1,000 runs)")
    finally:
        if worker is not None and worker.poll() is None:
            worker.kill()
            worker.wait()
        for key in client.scan_iter(match=f"{prefix}*", count=1000):
            client.delete(key)
        client.close()


if __name__ == "__main__":
    main()
