"""Process simulations for the rendering benches: fixtures, one run per setting, metrics.

A fixture is what a process run does to its context, step by step: the SYSTEM it
starts with, and per activity the writes before the model request (retrieval into
KNOWLEDGE, inputs into WORKING) and after it (the activity's outputs). ``simulate``
replays a fixture under one setting and renders the request of every activity:

* ``mode="layerflow"``: HISTORY grows by appending; when HISTORY + WORKING is over the
  token budget the compressor folds the oldest activities into one compaction record
  (a cliff: ``context_layers.compression.RuleDrivenCompressor``);
* ``mode="sliding"``: no compression; each request drops the oldest HISTORY entries
  until HISTORY + WORKING fits the same budget (``prefix.sliding_window_trim``), as
  most agent frameworks do;
* ``mode="none"``: no compression, no trimming (the budget is ignored).

Fixtures come from a generator (``generated_process``) or from a recorded tape of a
real run (``fixture_from_tape``: the writes of each activity between its begin and
complete events, so the same inputs can be replayed under other settings).
"""

from __future__ import annotations

import random
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from context_layers import Layer, LayeredContext  # noqa: E402
from context_layers.compression import RuleDrivenCompressor  # noqa: E402
from context_layers.config import config_from_dict  # noqa: E402
from context_layers.prefix import prefix_stability, sliding_window_trim  # noqa: E402
from context_layers.render import RenderOptions, logged_entries, render_entries, request_tokens  # noqa: E402

Write = tuple[Layer, str, Any]


@dataclass
class Step:
    task_id: str
    instructions: str
    pre: list[Write] = field(default_factory=list)  # engine changes before begin (joins, injects)
    before: list[Write] = field(default_factory=list)  # written after begin, before the request
    after: list[Write] = field(default_factory=list)  # the activity's outputs
    preserve: list[str] = field(default_factory=list)


@dataclass
class Fixture:
    name: str
    system: dict[str, Any]
    process: dict[str, Any]
    steps: list[Step]
    start: list[Write] = field(default_factory=list)  # the instance's data, before any activity


@dataclass
class Run:
    requests: list[list[dict[str, str]]]
    tokens: list[int]
    compressions: int
    retention: float  # mean share of preserved keys visible, with their value, in each request
    stability: float = 0.0

    @property
    def mean_tokens(self) -> float:
        return sum(self.tokens) / len(self.tokens) if self.tokens else 0.0


# ----- fixtures -----------------------------------------------------------------------------

WORDS = ("applicant revenue margin collateral covenant exposure liquidity guarantor sector forecast audit "
         "invoice supplier contract payment schedule variance ratio approval review escalation record "
         "evidence statement balance quarterly growth decline default history rating bureau score limit "
         "region customer churn pipeline backlog inventory warehouse freight tariff currency hedge").split()


def _sentence(rng: random.Random, n: int) -> str:
    words = [rng.choice(WORDS) for _ in range(n)]
    return " ".join(words).capitalize() + "."


def _text(rng: random.Random, sentences: int, words: tuple[int, int] = (8, 16)) -> str:
    return " ".join(_sentence(rng, rng.randint(*words)) for _ in range(sentences))


ACTIVITIES = ("collect_documents", "verify_identity", "credit_check", "income_analysis", "collateral_review",
              "sector_risk", "fraud_screen", "pricing", "compliance_check", "summarize_case")


def generated_process(n: int = 30, *, seed: int = 7, note_sentences: tuple[int, int] = (2, 4),
                      policy_sentences: int = 200, tool_every: int = 3, rewrite_every: int = 5) -> Fixture:
    """An ``n``-activity loan-like process: each activity writes a few scored fields and a
    note; retrieval adds fresh KNOWLEDGE hits per activity; every ``tool_every``-th activity
    reads one of three documents (tool call + result entries; 0: never), and every ``rewrite_every``-th one rewrites a
    status key that lives in HISTORY (0: never). ``policy_sentences`` sizes the SYSTEM
    policy (200 sentences: about 2,700 tokens, the order of a regulated process's system
    prompt)."""
    rng = random.Random(seed)
    system = {"policy": _text(rng, policy_sentences), "currency": "EUR", "max_amount": 500000}
    process = {"application_id": "APP-0001", "amount": 120000, "applicant": "Northwind Traders"}
    steps = []
    for i in range(n):
        name = f"{ACTIVITIES[i % len(ACTIVITIES)]}_{i:02d}"
        before: list[Write] = [
            (Layer.KNOWLEDGE, f"hit_{i}_{j}", {"text": _text(rng, 2), "source": f"kb://rules/{rng.randint(1, 40)}",
                                              "confidence": round(rng.uniform(0.3, 0.95), 2)})
            for j in range(2)]
        before.append((Layer.WORKING, f"{name}_input", {"step": i, "question": _sentence(rng, 10)}))
        after: list[Write] = [
            (Layer.WORKING, f"{name}_score", round(rng.uniform(0, 1), 3)),
            (Layer.WORKING, f"{name}_status", rng.choice(["ok", "review", "flagged"])),
            (Layer.WORKING, f"{name}_note", _text(rng, rng.randint(*note_sentences))),
        ]
        if tool_every and i % tool_every == tool_every - 1:
            doc = f"docs/statement_{rng.randint(1, 3)}.pdf"
            after += [
                (Layer.WORKING, f"tool:{i}:call", {"kind": "tool_call", "tool": "read_file", "path": doc}),
                (Layer.WORKING, f"tool:{i}:result", {"kind": "tool_call_result", "tool": "read_file", "path": doc,
                                                     "content": _text(rng, 4)}),
            ]
        if rewrite_every and i % rewrite_every == rewrite_every - 1:  # a status field that several activities rewrite (in place, in HISTORY)
            after.append((Layer.WORKING, "case_status", rng.choice(["open", "in_review", "escalated"])))
        preserve = []
        if i == 0:
            after.append((Layer.WORKING, "credit_limit", 150000))
            preserve = ["credit_limit"]
        if i == 5:
            after.append((Layer.WORKING, "risk_level", "medium"))
            preserve = ["risk_level"]
        steps.append(Step(name, f"Activity {name}: {_sentence(rng, 12)} Answer with JSON.", before=before,
                          after=after, preserve=preserve))
    return Fixture(f"generated-{n}", system, process, steps)


def fixture_from_tape(name: str, ctx: LayeredContext) -> Fixture:
    """The recorded inputs of a run: each activity's writes (as requested) between its
    begin and complete events, the model request placed after its KNOWLEDGE writes
    (retrieval runs first); writes before the first activity (the instance's data), and
    engine changes between activities (join results, branch injections) are replayed
    too; recorded compressions are not (the setting under test decides those)."""
    system: dict[str, Any] = {}
    process: dict[str, Any] = {}
    start: list[Write] = []
    pending: list[Write] = []
    steps: list[Step] = []
    current: Step | None = None
    for e in ctx.tape:
        if e.kind == "init":
            system = {key: value for _, key, value in e.changes}
        elif e.kind == "changes" and current is None and e.data.get("note") != "compress":
            pending += [(Layer(layer), key, value) for layer, key, value in e.changes]
        elif e.kind == "begin":
            current = Step(e.data["task_id"], f"Activity {e.data['task_id']}.", pre=pending)
            pending = []
        elif e.kind == "complete" and current is not None:
            current.preserve = list(e.data.get("preserve") or [])
            steps.append(current)
            current = None
        elif e.kind == "write":
            layer, key, value = e.changes[0]
            requested = Layer(e.data.get("requested", layer))
            if current is None:
                if requested == Layer.PROCESS:
                    process[key] = value
                elif not steps:
                    start.append((requested, key, value))
                else:
                    pending.append((layer, key, value))
                continue
            target = current.before if requested == Layer.KNOWLEDGE and not current.after else current.after
            target.append((requested if requested != Layer.HISTORY else Layer.WORKING, key, value))
    return Fixture(name, system, process, steps, start)


# ----- compression ------------------------------------------------------------------------------

def _history_working(ctx: LayeredContext) -> int:
    return ctx.tokens(Layer.HISTORY) + ctx.tokens(Layer.WORKING)


def _compress(ctx: LayeredContext, budget: int, ratio: float, preserved: set[str], detect: bool) -> bool:
    cfg = config_from_dict({"compressTokenThreshold": budget, "preserveKeys": sorted(preserved),
                            "contextStrategy": {"compressTargetRatio": ratio}})
    if not detect and _history_working(ctx) <= budget:
        return False
    result = RuleDrivenCompressor().compress(ctx, cfg, triggers=None if detect else ["token_threshold"], actor="bench")
    return bool(result.entries_affected)


# ----- one run ------------------------------------------------------------------------------------

def simulate(fixture: Fixture, *, mode: str = "layerflow", fmt: str = "xml", budget: int = 4000,
             ratio: float = 0.5, detect: bool = False, hooks: Sequence[Callable[..., Any]] = (),
             knowledge_scope: str = "activity") -> Run:
    if mode not in ("layerflow", "sliding", "none"):
        raise ValueError(f"unknown mode {mode!r}")
    ctx = LayeredContext(system=fixture.system)
    for key, value in fixture.process.items():
        ctx.write(Layer.PROCESS, key, value, actor="start")
    for layer, key, value in fixture.start:
        _write(ctx, layer, key, value, "start")
    preserved: set[str] = set()
    requests, tokens, retention = [], [], []
    compressions = 0
    for step in fixture.steps:
        if step.pre:
            ctx.apply_changes(step.pre, kind="replay", actor="engine")
        ctx.begin_activity(step.task_id)
        begin_seq = ctx.tape[-1].seq
        for layer, key, value in step.before:
            _write(ctx, layer, key, value, step.task_id)
        options = RenderOptions(format=fmt, instructions=step.instructions, task_id=step.task_id,  # type: ignore[arg-type]
                                hooks=tuple(hooks), knowledge_scope=knowledge_scope)  # type: ignore[arg-type]
        # both modes see HISTORY as a log (a rewritten key is appended, as a chat log would)
        entries, revisions = logged_entries(ctx.view(), options)
        if mode == "sliding":
            entries = sliding_window_trim(entries, budget)
        messages = render_entries(entries, options, activity_start=begin_seq, revisions=revisions)
        requests.append(messages)
        tokens.append(request_tokens(messages))
        retention.append(_retention(ctx, entries, preserved))
        for layer, key, value in step.after:
            _write(ctx, layer, key, value, step.task_id)
        ctx.complete_activity(step.task_id, preserve_keys=step.preserve)
        preserved.update(step.preserve)
        if mode == "layerflow" and _compress(ctx, budget, ratio, preserved, detect):
            compressions += 1
    run = Run(requests, tokens, compressions, sum(retention) / len(retention) if retention else 1.0)
    run.stability = prefix_stability(requests)
    return run


def _write(ctx: LayeredContext, layer: Layer, key: str, value: Any, actor: str) -> None:
    try:
        ctx.write(layer, key, value, actor=actor)
    except Exception:  # noqa: BLE001 - a recorded write the replay cannot repeat (e.g. a record key)
        pass


def _retention(ctx: LayeredContext, entries: Sequence[Any], preserved: set[str]) -> float:
    if not preserved:
        return 1.0
    shown = {e.key: e.value for e in entries}
    kept = sum(1 for k in preserved if k in shown and ctx.get(k) == shown[k])
    return kept / len(preserved)
