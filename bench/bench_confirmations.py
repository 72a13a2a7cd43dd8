"""Listing every open confirmation (``GET /confirmations``, the console's queue) with many
instances waiting for people, in one run against its baseline.

baseline: rebuild every unfinished instance (``Engine.load``: workflow deserialized, tapes
read and replayed) and read its confirmations, which is what a listing did before.
layerflow: read only the record head of each unfinished instance (no tape, no workflow
rebuilt), and on the next listing only of those whose version changed.

    python bench/bench_confirmations.py            # 300 waiting instances, sqlite
    python bench/bench_confirmations.py --quick    # 30 (CI)
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bpmn_examples"))

from engine import Engine, load_process  # noqa: E402
from engine.cli import LOAN_SCENARIOS  # noqa: E402
from engine.governance import GovernanceService, _open_of  # noqa: E402


def full_loads(engine: Engine) -> list[dict]:
    """The baseline: every unfinished instance rebuilt."""
    out = []
    for row in engine.store.list():
        if row["status"] == "completed":
            continue
        inst = engine.load(row["id"])
        out += _open_of(inst.id, inst.version, inst.confirmations)  # the same shape, from the full load
    return out


def timed(fn) -> tuple[float, object]:
    t = time.perf_counter()
    result = fn()
    return (time.perf_counter() - t) * 1000, result


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="30 waiting instances instead of 300 (CI)")
    ap.add_argument("--instances", type=int, default=None)
    args = ap.parse_args(argv)
    n = args.instances or (30 if args.quick else 300)

    import loan_handlers  # noqa: F401 - the demo's handlers, registered on import

    db = Path(tempfile.mkdtemp()) / "bench.db"
    engine = Engine(f"sqlite:///{db}")
    process = load_process(ROOT / "bpmn_examples" / "loan_approval.bpmn")
    for _ in range(n):
        instance = engine.run(engine.start(process, dict(LOAN_SCENARIOS["conflict"])))
        assert instance.status == "waiting", instance.error
    done = engine.run(engine.start(process, dict(LOAN_SCENARIOS["fast"])))
    assert done.status == "completed"

    base_ms, expected = timed(lambda: full_loads(engine))
    service = GovernanceService(Engine(f"sqlite:///{db}"))
    cold_ms, cold = timed(service.confirmations)
    warm_ms, warm = timed(service.confirmations)
    key = lambda c: (c["instance_id"], c["id"])  # noqa: E731
    assert sorted(cold, key=key) == sorted(expected, key=key) == sorted(warm, key=key) and len(cold) == n
    # one answer: the next listing reads that instance again, and only it
    first = cold[0]
    engine.answer_confirmation(engine.load(first["instance_id"]), first["id"], "rejected")
    changed_ms, after = timed(service.confirmations)
    assert len(after) == n - 1

    print(f"bench_confirmations: list the open confirmations of {n} waiting instances (sqlite, one run)")
    header = f"{'listing':<44} {'ms':>9} {'x faster':>9}"
    print(header)
    print("-" * len(header))
    for name, ms in (("baseline: rebuild every unfinished instance", base_ms),
                     ("record heads, first listing", cold_ms),
                     ("record heads, nothing changed", warm_ms),
                     ("record heads, one instance answered", changed_ms)):
        print(f"{name:<44} {ms:>9.1f} {base_ms / ms:>9.1f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
