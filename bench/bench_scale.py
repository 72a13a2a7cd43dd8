"""Sizes a deployment reaches, by hand (round 54): how long a step takes as it grows.

* ``voters``: a parallel multi-instance user task over N items, all answered by one
  ``resume`` (``{"user_tasks": {"vote": {...}}}``): each answered instance settles what the
  instance waits for again, so the resume costs the square of N (it cost the cube before
  ``settle`` numbered the instances once per multi-instance: 1,000 voters through
  ``layerflow resume`` on sqlite took 213 s, now 71 s; 400 in memory 7.7 s, now 1.4 s).
* ``loop``: the xor_loop example for N passes, saving after every activity (the default) and
  only at the stop: SpiffWorkflow keeps every pass in its task tree, so both grow faster than N,
  and the saved record grows with it (1.5 MB after 2,000 passes).

    python bench/bench_scale.py                     # voters 100 200 400, loop 250 500
    python bench/bench_scale.py --quick             # voters 50 100, loop 100 (CI)
    python bench/bench_scale.py --voters 1000 --loop 2000
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from engine import Engine, load_process  # noqa: E402

VOTES = ROOT / "tests" / "engine" / "fixtures" / "scale54_votes.bpmn"  # a vote of N voters, then a count


def voters(n: int) -> float:
    engine = Engine("memory://")
    instance = engine.run(load_process(VOTES), {"voters": [f"v{i}" for i in range(n)]})
    start = time.perf_counter()
    done = engine.resume(instance.id, answers={"user_tasks": {"vote": {"ballot": "yes"}}})
    assert done.status == "completed", done.status
    return time.perf_counter() - start


def loop(n: int, save: str) -> float:
    engine = Engine("memory://", save=save)
    start = time.perf_counter()
    done = engine.run(load_process(ROOT / "bpmn_examples" / "xor_loop.bpmn"), {"batch_size": n})
    assert done.status == "completed", done.status
    return time.perf_counter() - start


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--voters", type=int, nargs="*", default=[100, 200, 400])
    ap.add_argument("--loop", type=int, nargs="*", default=[250, 500])
    ap.add_argument("--quick", action="store_true", help="voters 50 100, loop 100 (CI)")
    args = ap.parse_args(argv)
    if args.quick:
        args.voters, args.loop = [50, 100], [100]
    for n in args.voters:
        print(f"voters {n:>5}: one resume answers all in {voters(n):7.2f} s")
    for n in args.loop:
        for save in ("activity", "stop"):
            print(f"loop   {n:>5}: save={save:<8} {loop(n, save):7.2f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
