"""Engine overhead: layerflow vs plain SpiffWorkflow on the same BPMN, in one run.

Workloads:

* ``loan``: the loan-approval demo, full-review path (medium risk, 120,000: nine
  activities, a parallel split and join, knowledge retrieval). Plain SpiffWorkflow runs
  the same handlers through its service-task hook on ``task.data``.
* ``chain50``: a generated process of 50 script tasks, started with 1,000 data keys
  (every task reads one key and writes one).

layerflow runs with a memory store, saving after every activity (the default) and
saving only when the run stops (``Engine(save="stop")``), and without the compression
hook (``Engine(compress=False)``); the differences are the costs of per-activity
persistence and of compression (attention scoring after every configured activity). Per-activity overhead = (layerflow - plain) / activities.
Targets (issue 3): under 1 ms per activity at 1,000 context keys, under 2x plain
SpiffWorkflow end to end. The rows of a workload run interleaved, one run each per round,
so a slower stretch of the shared machine hits them alike.

Then larger runs, a few times each: the loop example for 800 passes, a multi-instance
script task over 500 items and a loop through a sub-process for 200 passes, against plain SpiffWorkflow with and without a save after every
activity (every loop pass stays in SpiffWorkflow's task tree, and every instance is a task
of its own, so a step costs more the more came before it, in both).

Then, for each workload, where layerflow's time goes (median ms per run by phase, save
after every activity, in separate runs with a timer around each phase), and how much of
it is work that plain SpiffWorkflow does too: plain SpiffWorkflow keeps no context
layers, retrieves nothing, counts no tokens, compresses nothing and saves nothing, so
on a process as small as the loan demo those make most of layerflow's time.

    python bench/bench_engine.py               # 100 runs per row
    python bench/bench_engine.py --quick       # 10 runs (CI)
    python bench/bench_engine.py --clock cpu   # each run's CPU time, not its wall clock (a shared machine)
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bpmn_examples"))

from SpiffWorkflow.bpmn.script_engine import PythonScriptEngine  # noqa: E402
from SpiffWorkflow.bpmn.workflow import BpmnWorkflow  # noqa: E402
from SpiffWorkflow.spiff.parser.process import SpiffBpmnParser  # noqa: E402

from SpiffWorkflow.bpmn.serializer import BpmnWorkflowSerializer  # noqa: E402
from SpiffWorkflow.spiff.serializer.config import SPIFF_CONFIG  # noqa: E402

from engine import Engine, load_process  # noqa: E402
from engine.spiff import TWINS, LayerflowBpmnParser, is_activity  # noqa: E402

LOAN = ROOT / "bpmn_examples" / "loan_approval.bpmn"
LOAN_DATA = {"amount": 120000, "applicant_id": "APP002", "purpose": "warehouse expansion", "industry": "logistics"}
CHAIN_LENGTH = 50
# what a run's time is: the wall clock, or the CPU time of the thread running it (a loaded, shared
# machine stretches the wall clock of a run whenever a neighbour takes its core; not its CPU time)
CLOCKS: dict[str, Callable[[], float]] = {"wall": time.perf_counter, "cpu": time.thread_time}
CONTEXT_KEYS = 1000


def chain_bpmn(n: int) -> str:
    tasks = "".join(f'<bpmn:scriptTask id="t{i}"><bpmn:script>v{i} = k{i} + {i}</bpmn:script></bpmn:scriptTask>\n'
                    for i in range(n))
    nodes = ["start", *[f"t{i}" for i in range(n)], "end"]
    flows = "".join(f'<bpmn:sequenceFlow id="f{i}" sourceRef="{a}" targetRef="{b}"/>\n'
                    for i, (a, b) in enumerate(zip(nodes, nodes[1:])))
    return ('<?xml version="1.0" encoding="UTF-8"?>\n'
            '<bpmn:definitions xmlns:bpmn="http://www.omg.org/spec/BPMN/20100524/MODEL" id="d" targetNamespace="b">\n'
            '<bpmn:process id="chain" isExecutable="true">\n<bpmn:startEvent id="start"/>\n'
            f'{tasks}<bpmn:endEvent id="end"/>\n{flows}</bpmn:process>\n</bpmn:definitions>\n')


def multi_instance_bpmn() -> str:
    """A parallel multi-instance script task over ``items``, collecting ``out``."""
    return ('<?xml version="1.0" encoding="UTF-8"?>\n'
            '<bpmn:definitions xmlns:bpmn="http://www.omg.org/spec/BPMN/20100524/MODEL" id="d" targetNamespace="b">\n'
            '<bpmn:process id="mi" isExecutable="true">\n<bpmn:startEvent id="start"/>\n'
            '<bpmn:scriptTask id="each"><bpmn:multiInstanceLoopCharacteristics>'
            '<bpmn:loopDataInputRef>items</bpmn:loopDataInputRef><bpmn:loopDataOutputRef>out</bpmn:loopDataOutputRef>'
            '<bpmn:inputDataItem id="item"/><bpmn:outputDataItem id="res"/></bpmn:multiInstanceLoopCharacteristics>'
            '<bpmn:script>res = item * 2</bpmn:script></bpmn:scriptTask>\n'
            '<bpmn:scriptTask id="fin"><bpmn:script>total = sum(out)</bpmn:script></bpmn:scriptTask>\n'
            '<bpmn:endEvent id="end"/>\n<bpmn:sequenceFlow id="f1" sourceRef="start" targetRef="each"/>\n'
            '<bpmn:sequenceFlow id="f2" sourceRef="each" targetRef="fin"/>\n'
            '<bpmn:sequenceFlow id="f3" sourceRef="fin" targetRef="end"/>\n</bpmn:process>\n</bpmn:definitions>\n')


def subprocess_loop_bpmn() -> str:
    """A loop back through a sub-process (one script task) until ``count`` reaches ``n``."""
    flow = '<bpmn:sequenceFlow id="{0}_{1}" sourceRef="{0}" targetRef="{1}"/>'
    return ('<?xml version="1.0" encoding="UTF-8"?>\n'
            '<bpmn:definitions xmlns:bpmn="http://www.omg.org/spec/BPMN/20100524/MODEL" id="d" targetNamespace="b">\n'
            '<bpmn:process id="subloop" isExecutable="true">\n<bpmn:startEvent id="start"/>\n'
            '<bpmn:scriptTask id="init"><bpmn:script>count = 0</bpmn:script></bpmn:scriptTask>\n'
            '<bpmn:subProcess id="sub"><bpmn:startEvent id="s_start"/>'
            '<bpmn:scriptTask id="s_work"><bpmn:script>count = count + 1</bpmn:script></bpmn:scriptTask>'
            f'<bpmn:endEvent id="s_end"/>{flow.format("s_start", "s_work")}{flow.format("s_work", "s_end")}'
            '</bpmn:subProcess>\n<bpmn:exclusiveGateway id="more" default="more_end"/>\n<bpmn:endEvent id="end"/>\n'
            f'{flow.format("start", "init")}{flow.format("init", "sub")}{flow.format("sub", "more")}'
            '<bpmn:sequenceFlow id="again" sourceRef="more" targetRef="sub">'
            '<bpmn:conditionExpression>count &lt; n</bpmn:conditionExpression></bpmn:sequenceFlow>'
            f'{flow.format("more", "end")}\n</bpmn:process>\n</bpmn:definitions>\n')


# ----------------------------------------------------------------------------- plain SpiffWorkflow

class _DataView:
    """What a loan handler needs of ``ActivityContext``, over plain ``task.data``."""

    def __init__(self, data: dict[str, Any]) -> None:
        self.data = data
        self.knowledge: dict[str, Any] = {}

    def __getitem__(self, key: str) -> Any:
        return self.data[key]

    def get(self, key: str, default: Any = None) -> Any:
        return self.data.get(key, default)


class _HandlerScriptEngine(PythonScriptEngine):
    """Service tasks call the loan handlers on task.data (the plain-SpiffWorkflow baseline)."""

    def __init__(self, handlers: dict[str, Callable[..., Any]]) -> None:
        super().__init__()
        self.handlers = handlers

    def call_service(self, task: Any, **kwargs: Any) -> str:
        result = self.handlers[task.task_spec.bpmn_id](_DataView(task.data)) or {}
        task.data.update(result)
        return json.dumps(None)


def stock_serializer() -> BpmnWorkflowSerializer:
    """SpiffWorkflow's own serializer (``SPIFF_CONFIG``); the loan demo's specs are
    layerflow's parser twins, serialized by the converters of the classes they extend."""
    config = dict(SPIFF_CONFIG)
    for stock, twin in TWINS.items():
        config[twin] = config[stock]
    return BpmnWorkflowSerializer(BpmnWorkflowSerializer.configure(config))


def plain_runner(path: Path, data: dict[str, Any], parser_class: type, handlers: dict[str, Any] | None,
                 save: str | None = None) -> Callable[[], int]:
    """Plain SpiffWorkflow on the same BPMN. ``save``: None (no persistence, the strict
    baseline), ``"activity"`` (the stock serializer after every activity, kept in a
    dict as a memory store keeps text) or ``"stop"`` (once at the end): the persistence a
    SpiffWorkflow user writes to get what layerflow's save modes give."""
    parser = parser_class()
    parser.add_bpmn_file(str(path))
    pid = parser.get_process_ids()[0]
    spec, subs = parser.get_spec(pid), parser.get_subprocess_specs(pid)
    serializer = stock_serializer()
    saved: dict[str, Any] = {}

    def after(task: Any) -> None:
        spec = task.task_spec
        if is_activity(spec) or is_activity(TWINS.get(type(spec))):  # twins, or a stock parser's specs
            saved["instance"] = serializer.serialize_json(task.workflow.top_workflow)  # the whole instance, from a sub-process too
            saved["saves"] += 1

    def run() -> int:
        engine = _HandlerScriptEngine(handlers) if handlers else PythonScriptEngine()
        wf = BpmnWorkflow(spec, subs, script_engine=engine)
        wf.task_tree.data.update(data)
        saved["saves"] = 0
        wf.do_engine_steps(did_complete_task=after if save == "activity" else None)
        if save == "stop":
            saved["instance"] = serializer.serialize_json(wf)
        assert wf.is_completed()
        return int(saved["saves"])
    return run


def layerflow_runner(path: Path, data: dict[str, Any], save: str, compress: bool) -> Callable[[], int]:
    process = load_process(path)
    engine = Engine(save=save, compress=compress)

    def run() -> int:
        instance = engine.run(engine.start(process, data))
        assert instance.status == "completed", instance.error
        return instance.activities
    return run


# ----------------------------------------------------------------------------- where the time goes

# (owner, attribute, phase); a phase's time excludes the phases it calls. What is left of
# a run is SpiffWorkflow's own work (the task tree, predictions) and layerflow's glue.
_PHASES = (
    ("Engine", "start", "start (contexts, workflow, first save)"),
    ("_Runtime", "run_activity", "activity begin/complete (context)"),
    ("_Runtime", "_run_handler", "handlers + their context writes"),
    ("_Runtime", "_retrieve", "retrieval (BM25 -> KNOWLEDGE)"),
    ("_Runtime", "split", "gateways (split/join contexts)"),
    ("_Runtime", "join", "gateways (split/join contexts)"),
    ("_Runtime", "evaluate", "conditions"),
    ("runtime", "_after_activity", "compression hook"),
    ("spiff", "serialize_json", "save: workflow JSON"),
    ("runtime", "to_record", "save: record (tapes, bookkeeping)"),
    ("store", "create", "save: store"),
    ("store", "save", "save: store"),
)
REST = "SpiffWorkflow + engine glue (rest)"
# phases that also happen, in their plain form, in the plain SpiffWorkflow run
SHARED = frozenset({REST, "handlers + their context writes", "conditions"})


class _Phases:
    """Wraps the functions of ``_PHASES`` with timers (``clock``) for the breakdown runs only (the
    timed rows above run unwrapped)."""

    def __init__(self, clock: Callable[[], float] = time.perf_counter) -> None:
        self.clock = clock
        self.totals: dict[str, float] = {}
        self._stack: list[float] = []
        self._undo: list[tuple[Any, str, Any]] = []

    def wrap(self, owner: Any, attr: str, phase: str) -> None:
        fn = getattr(owner, attr)
        stack, totals, clock = self._stack, self.totals, self.clock

        def timed(*args: Any, **kwargs: Any) -> Any:
            t0 = clock()
            stack.append(0.0)
            try:
                return fn(*args, **kwargs)
            finally:
                dt = clock() - t0
                inner = stack.pop()
                totals[phase] = totals.get(phase, 0.0) + dt - inner
                if stack:
                    stack[-1] += dt

        in_class = isinstance(owner, type) and attr in vars(owner)
        self._undo.append((owner, attr, vars(owner)[attr] if in_class else fn))
        setattr(owner, attr, timed)

    def undo(self) -> None:
        for owner, attr, fn in reversed(self._undo):
            setattr(owner, attr, fn)
        self._undo.clear()


def breakdown(path: Path, data: dict[str, Any], save: str, compress: bool, runs: int,
              clock: Callable[[], float] = time.perf_counter) -> tuple[dict[str, float], float]:
    """Median milliseconds per run in each phase (``_PHASES``), and the median run."""
    from engine import runtime, spiff

    process = load_process(path)
    engine = Engine(save=save, compress=compress)
    owners = {"Engine": Engine, "_Runtime": runtime._Runtime, "runtime": runtime, "spiff": spiff,
              "store": engine.store}
    phases = _Phases(clock)
    for owner, attr, phase in _PHASES:
        phases.wrap(owners[owner], attr, phase)
    samples: list[dict[str, float]] = []
    try:
        engine.run(engine.start(process, data))  # warm up
        for _ in range(runs):
            phases.totals.clear()
            t0 = clock()
            instance = engine.run(engine.start(process, data))
            total = clock() - t0
            assert instance.status == "completed", instance.error
            sample = {phase: s * 1000 for phase, s in phases.totals.items()}
            sample[REST] = total * 1000 - sum(sample.values())
            sample[""] = total * 1000
            samples.append(sample)
    finally:
        phases.undo()
    # medians per phase (a noisy neighbour hits single runs, not the median)
    per_run = {phase: statistics.median(s.get(phase, 0.0) for s in samples) for phase in samples[0]}
    return {k: v for k, v in per_run.items() if k}, per_run[""]


def interleaved(runners: dict[str, Callable[[], int]], runs: int, *, warm: bool = True,
                clock: Callable[[], float] = time.perf_counter) -> dict[str, tuple[float, int]]:
    """Median milliseconds per run of each runner (on ``clock``: the wall clock, or
    ``time.thread_time`` for the CPU time, as ``bench_ab`` times), and what its last run returned.

    The runners take turns, one run each per round, in an order that rotates from round to
    round: a slower stretch of a shared machine falls on every row alike, so the ratios
    between rows hold even when the absolute times drift."""
    for fn in runners.values():
        if warm:
            fn()  # warm up (imports, caches)
    names = list(runners)
    times: dict[str, list[float]] = {name: [] for name in names}
    counts = dict.fromkeys(names, 0)
    for i in range(runs):
        for name in names[i % len(names):] + names[:i % len(names)]:
            t0 = clock()
            counts[name] = runners[name]()
            times[name].append(clock() - t0)
    return {name: (statistics.median(times[name]) * 1000, counts[name]) for name in names}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="10 runs per row instead of 100 (CI)")
    ap.add_argument("--runs", type=int, default=None)
    ap.add_argument("--clock", choices=sorted(CLOCKS), default="wall",
                    help="wall: the wall clock (default); cpu: the thread's CPU time, steady on a loaded machine")
    args = ap.parse_args(argv)
    runs = args.runs or (10 if args.quick else 100)
    clock = CLOCKS[args.clock]

    import loan_handlers  # the demo's handlers, registered on import

    loan_handler_map = {name: getattr(loan_handlers, name) for name in (
        "submit_application", "risk_assessment", "fast_track", "full_review", "finance_review", "risk_review",
        "disbursement_decision")}
    tmp = Path(tempfile.mkdtemp())
    chain = tmp / "chain.bpmn"
    chain.write_text(chain_bpmn(CHAIN_LENGTH), encoding="utf-8")
    chain_data = {f"k{i}": i for i in range(CONTEXT_KEYS)}

    workloads = [
        ("loan (full review)", LOAN, LOAN_DATA, LayerflowBpmnParser, loan_handler_map),
        (f"chain{CHAIN_LENGTH} @ {CONTEXT_KEYS} keys", chain, chain_data, SpiffBpmnParser, None),
    ]
    modes = (("activity", True), ("stop", True), ("stop", False))
    rows = []
    for name, path, data, parser_class, handlers in workloads:
        runners = {"plain": plain_runner(path, data, parser_class, handlers)}
        for mode in ("activity", "stop"):
            runners[f"plain+{mode}"] = plain_runner(path, data, parser_class, handlers, save=mode)
        for save, compress in modes:
            runners[f"layerflow {save} {compress}"] = layerflow_runner(path, data, save, compress)
        measured = interleaved(runners, runs, clock=clock)
        plain_ms = measured["plain"][0]
        for save, compress in modes:
            lf_ms, activities = measured[f"layerflow {save} {compress}"]
            like_ms, plain_saves = measured[f"plain+{save}"]
            if save == "activity":
                assert plain_saves == activities, (plain_saves, activities)  # the same number of saves
            rows.append({"workload": name, "save": save + ("" if compress else ", no compress"),
                         "activities": activities, "plain_ms": plain_ms, "plain_saved_ms": like_ms,
                         "layerflow_ms": lf_ms, "overhead_ms_per_activity": (lf_ms - plain_ms) / activities,
                         "ratio": lf_ms / plain_ms, "ratio_saved": lf_ms / like_ms})

    header = f"{'workload':<22} {'save after':<19} {'acts':>4} {'plain ms':>8} {'+saves ms':>9} " \
             f"{'layerflow ms':>12} {'overhead/act ms':>15} {'x plain':>7} {'x +saves':>8}"
    print(f"bench_engine: median of {runs} runs each ({args.clock} time), the rows of a workload interleaved run by "
          f"run (Python {sys.version.split()[0]})")
    print(header)
    print("-" * len(header))
    for r in rows:
        print(f"{r['workload']:<22} {r['save']:<19} {r['activities']:>4} {r['plain_ms']:>8.2f} "
              f"{r['plain_saved_ms']:>9.2f} {r['layerflow_ms']:>12.2f} {r['overhead_ms_per_activity']:>15.3f} "
              f"{r['ratio']:>7.2f} {r['ratio_saved']:>8.2f}")
    chain_rows = [r for r in rows if r["workload"].startswith("chain")]
    worst = max(r["overhead_ms_per_activity"] for r in chain_rows)
    print("\nplain ms: plain SpiffWorkflow, no persistence; +saves ms: plain SpiffWorkflow with its stock serializer "
          "run as often as layerflow saves (after every activity / once at the stop)")
    print(f"target: < 1 ms overhead per activity at {CONTEXT_KEYS} keys -> worst {worst:.3f} ms "
          f"({'met' if worst < 1 else 'NOT met'}); < 2x plain end to end -> worst "
          f"{max(r['ratio'] for r in rows):.2f}x against plain, {max(r['ratio_saved'] for r in rows):.2f}x against "
          "plain with the same saves")

    # How a run grows with the work in it: every pass of a loop stays in SpiffWorkflow's task
    # tree, and a multi-instance activity makes one task per item (each saved, under layerflow).
    small = args.quick or runs < 10
    passes, items, sub_passes = (100, 50, 20) if small else (800, 500, 200)
    mi, subloop = tmp / "mi.bpmn", tmp / "subloop.bpmn"
    mi.write_text(multi_instance_bpmn(), encoding="utf-8")
    subloop.write_text(subprocess_loop_bpmn(), encoding="utf-8")
    growing = [(f"loop, {passes} passes", ROOT / "bpmn_examples" / "xor_loop.bpmn", {"batch_size": passes}),
               (f"multi-instance, {items} items", mi, {"items": list(range(items))}),
               (f"sub-process loop, {sub_passes} passes", subloop, {"n": sub_passes})]
    rounds = 1 if small else 3
    print(f"\nlarger runs: median of {rounds} interleaved runs each (plain SpiffWorkflow sees a loop past ~500 "
          "passes only with engine.deep_trees in place, as here)")
    head = f"{'workload':<30} {'plain ms':>9} {'+saves ms':>10} {'layerflow ms':>13} {'x plain':>8} {'x +saves':>9}"
    print(head)
    print("-" * len(head))
    for name, path, data in growing:
        measured = interleaved({"plain": plain_runner(path, data, SpiffBpmnParser, None),
                                "plain+activity": plain_runner(path, data, SpiffBpmnParser, None, save="activity"),
                                "layerflow": layerflow_runner(path, data, "activity", True)}, rounds, warm=False,
                                clock=clock)
        plain_ms, saved_ms, lf_ms = (measured[k][0] for k in ("plain", "plain+activity", "layerflow"))
        print(f"{name:<30} {plain_ms:>9.1f} {saved_ms:>10.1f} {lf_ms:>13.1f} {lf_ms / plain_ms:>8.2f} "
              f"{lf_ms / saved_ms:>9.2f}")

    # Where layerflow's time goes, per run (separate runs with timers around each phase).
    for name, path, data, _, _ in workloads:
        plain_ms = next(r["plain_ms"] for r in rows if r["workload"] == name)
        table, total = breakdown(path, data, "activity", True, runs, clock)
        print(f"\n{name}, save after every activity: ms per run by phase (plain SpiffWorkflow: {plain_ms:.2f} ms)")
        for phase, ms in sorted(table.items(), key=lambda kv: -kv[1]):
            print(f"  {phase:<40} {ms:>8.2f}  {ms / total:>5.0%}")
        print(f"  {'total (median run, with timers)':<40} {total:>8.2f}")
        shared = sum(ms for phase, ms in table.items() if phase in SHARED)
        print(f"  work plain SpiffWorkflow also does (task tree, handlers, conditions): {shared:.2f} ms = "
              f"{shared / plain_ms:.2f}x plain; layerflow-only work (context layers, retrieval, compression, "
              f"persistence, branch merges): {total - shared:.2f} ms")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
