"""Fixture-driven evaluation of the rendering pipeline: fixtures x render options x compression.

    python bench/eval_render.py          # every fixture, format, view and compression setting
    python bench/eval_render.py --quick  # CI: xml, no hooks, fewer fixtures

Fixtures (bench/render_sim.py):

* ``loan-approval``: a real run of ``bpmn_examples/loan_approval.bpmn`` through the engine
  with recorded inputs (the data and the answers below); its tape gives each activity's
  writes, which are replayed under every setting (skipped, with the reason, when the
  engine cannot run it);
* ``generated-30``: the 30-activity process of bench_prefix.py;
* ``tool-heavy-30``: the same with a document read in every activity (tool call + result).

Compression settings, all at the fixture's budget (HISTORY + WORKING tokens):
``off`` (append only), ``cliff`` (token threshold only: fold the oldest activities
into one compaction record), ``detect`` (every trigger of CompressTriggerDetector,
attention scores included, as the engine runs it), ``sliding`` (no compression; the
oldest HISTORY entries are dropped per request until it fits: the usual trimmer).

Per cell: mean request tokens, prefix stability (mean share of each request that
prefixes the previous one), preserved-key retention (share of preserveKeys visible
with their value in each request, averaged), compressions.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from render_sim import Fixture, fixture_from_tape, generated_process, simulate  # noqa: E402

from context_layers.hooks import drop_tool_results  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
LOAN_DATA = {"amount": 120000, "industry": "construction", "purpose": "equipment", "applicant_id": "C-1"}
LOAN_ANSWERS = {"confirmations": {"*": "approve"}}
SETTINGS = ("off", "cliff", "detect", "sliding")
VIEWS = {"all": (), "drop_tool_results": (drop_tool_results,)}


def loan_fixture() -> tuple[Fixture | None, str]:
    try:
        from engine import Engine, load_process

        process = load_process(ROOT / "bpmn_examples" / "loan_approval.bpmn")
        instance = Engine().run_process(process, LOAN_DATA, answers=LOAN_ANSWERS)
        if instance.status != "completed":
            return None, f"the run ended {instance.status!r}: {getattr(instance, 'error', None)}"
        return fixture_from_tape("loan-approval", instance.contexts["main"]), ""
    except Exception as err:  # noqa: BLE001 - the engine is optional for this bench
        return None, f"{type(err).__name__}: {err}"


def fixtures(quick: bool) -> list[tuple[Fixture, int]]:
    out: list[tuple[Fixture, int]] = []
    loan, why = loan_fixture()
    if loan is not None:
        out.append((loan, 400))
    else:
        print(f"(loan-approval fixture skipped: {why})")
    out.append((generated_process(30), 4000))
    if not quick:
        tools = generated_process(30, tool_every=1, seed=11)
        tools.name = "tool-heavy-30"
        out.append((tools, 4000))
    return out


def run_cell(fixture: Fixture, budget: int, fmt: str, view: str, setting: str):
    mode = {"off": "none", "cliff": "layerflow", "detect": "layerflow", "sliding": "sliding"}[setting]
    return simulate(fixture, mode=mode, fmt=fmt, budget=budget, detect=setting == "detect", hooks=VIEWS[view])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="xml only, no hooks, fewer fixtures (CI)")
    args = ap.parse_args()
    start = time.perf_counter()
    formats = ("xml",) if args.quick else ("xml", "json", "plain")
    views = ("all",) if args.quick else tuple(VIEWS)
    print("compression: context_layers.compression (RuleDrivenCompressor)\n")
    header = (f"{'fixture':<15} {'budget':>6} {'format':<6} {'view':<17} {'compression':<11} "
              f"{'tok/req':>8} {'stability':>9} {'retention':>9} {'compress':>8}")
    print(header)
    print("-" * len(header))
    for fixture, budget in fixtures(args.quick):
        for fmt in formats:
            for view in views:
                for setting in SETTINGS:
                    r = run_cell(fixture, budget, fmt, view, setting)
                    print(f"{fixture.name:<15} {budget:>6} {fmt:<6} {view:<17} {setting:<11} "
                          f"{r.mean_tokens:>8.0f} {r.stability:>9.3f} {r.retention:>9.2f} {r.compressions:>8d}")
        print()
    print(f"done in {time.perf_counter() - start:.1f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
