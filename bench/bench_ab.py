"""A/B of the loan demo between two checkouts, in separate processes, on one machine.

The host's speed drifts by ~10% from one process to the next, so one comparison of two
processes proves nothing. Here each round starts one process per checkout (A first in
even rounds, B first in odd ones); each process runs plain SpiffWorkflow and layerflow's
three save modes of ``bench_engine`` interleaved run by run and prints its medians. The
table gives every round's medians (and layerflow / plain of that process, which the
drift of the host cancels out of), then the median over the rounds and B / A.

Times are the CPU time of the running thread (``time.thread_time``) by default: on a shared,
loaded machine the wall clock of one run doubles whenever a neighbour takes the core, while the
CPU time it needed stays within a few per cent (``--clock wall`` times the wall clock, as
``bench_engine`` does).

    python bench/bench_ab.py /work/main                 # A: that checkout, B: this one
    python bench/bench_ab.py /work/main --rounds 8 --runs 100 --clock wall

Both checkouts run this file's copy of ``bench_engine`` (its plain baseline and runners),
over their own ``engine``, ``context_layers``, ``gateways`` and loan handlers.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
ROWS = ("plain", "activity", "stop", "stop, no compress")
MODES = {"activity": ("activity", True), "stop": ("stop", True), "stop, no compress": ("stop", False)}
CLOCKS = ("cpu", "wall")  # bench_engine.CLOCKS


def worker(root: Path, runs: int, clock: str) -> dict[str, float]:
    """Medians (ms) of the loan demo's rows, with ``root``'s packages imported before this
    bench's ``bench_engine`` (which would put its own checkout first)."""
    sys.path[:0] = [str(root), str(root / "bpmn_examples")]
    import context_layers
    import engine
    import gateways
    import loan_handlers

    for module in (context_layers, engine, gateways, loan_handlers):
        assert Path(module.__file__).resolve().is_relative_to(root), (module, root)  # type: ignore[arg-type]
    spec = importlib.util.spec_from_file_location("bench_engine", HERE / "bench_engine.py")
    bench = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    spec.loader.exec_module(bench)  # type: ignore[union-attr]
    handlers = {name: getattr(loan_handlers, name) for name in (
        "submit_application", "risk_assessment", "fast_track", "full_review", "finance_review", "risk_review",
        "disbursement_decision")}
    runners = {"plain": bench.plain_runner(bench.LOAN, bench.LOAN_DATA, bench.LayerflowBpmnParser, handlers)}
    for row, (save, compress) in MODES.items():
        runners[row] = bench.layerflow_runner(bench.LOAN, bench.LOAN_DATA, save, compress)
    return {row: ms for row, (ms, _) in bench.interleaved(runners, runs, clock=bench.CLOCKS[clock]).items()}


def _one(root: Path, runs: int, clock: str) -> dict[str, float]:
    env = {**os.environ, "PYTHONPATH": str(root)}
    out = subprocess.run([sys.executable, __file__, "--worker", str(root), "--runs", str(runs), "--clock", clock],
                         cwd=root, env=env, capture_output=True, text=True, check=False)
    if out.returncode != 0:
        raise SystemExit(f"the run in {root} failed:\n{out.stderr}")
    return json.loads(out.stdout.splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("base", type=Path, nargs="?", help="checkout A (the baseline)")
    ap.add_argument("--new", type=Path, default=ROOT, help="checkout B (default: this one)")
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--runs", type=int, default=60, help="runs per row in each process")
    ap.add_argument("--clock", choices=CLOCKS, default="cpu",
                    help="cpu: the thread's CPU time (default; steady on a loaded machine); wall: the wall clock")
    ap.add_argument("--worker", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        print(json.dumps(worker(args.worker.resolve(), args.runs, args.clock)))
        return 0
    if args.base is None:
        ap.error("name checkout A (the baseline): bench_ab.py PATH")
    sides = {"A": args.base.resolve(), "B": args.new.resolve()}
    got: dict[str, list[dict[str, float]]] = {"A": [], "B": []}
    print(f"A = {sides['A']}\nB = {sides['B']}\nloan demo, median ms ({args.clock} time) of {args.runs} runs per row "
          "and process")
    head = f"{'round':>5} {'side':>4} " + " ".join(f"{row:>18}" for row in ROWS) + "   layerflow/plain per mode"
    print(head)
    print("-" * len(head))
    for n in range(args.rounds):
        for side in ("AB" if n % 2 == 0 else "BA"):
            medians = _one(sides[side], args.runs, args.clock)
            got[side].append(medians)
            ratios = " ".join(f"{medians[row] / medians['plain']:.2f}" for row in ROWS[1:])
            print(f"{n + 1:>5} {side:>4} " + " ".join(f"{medians[row]:>18.2f}" for row in ROWS) + f"   {ratios}",
                  flush=True)
    print("-" * len(head))
    over = {side: {row: statistics.median(m[row] for m in got[side]) for row in ROWS} for side in got}
    ratio = {side: {row: statistics.median(m[row] / m["plain"] for m in got[side]) for row in ROWS} for side in got}
    for side in "AB":
        print(f"{'med':>5} {side:>4} " + " ".join(f"{over[side][row]:>18.2f}" for row in ROWS)
              + "   " + " ".join(f"{ratio[side][row]:.2f}" for row in ROWS[1:]))
    print(f"{'B/A':>10} " + " ".join(f"{over['B'][row] / over['A'][row]:>18.3f}" for row in ROWS)
          + "   (of the medians over rounds)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
