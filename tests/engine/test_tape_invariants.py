"""Tape and persistence invariants over every process shape the scenario tests run.

The engine tests of ``SWEPT`` that need no fixture but ``tmp_path`` (test_conformance.py
first: parallel gateways in loops, sub-processes, call activities, multi-instance,
boundary events, event-based gateways, messages, signals, timers, user tasks,
ioSpecification; then events, joins, the examples, governance, model tools, DMN decisions,
user task forms, ...) run as
they are, imported, not copied, under a recorder that notes every state a context reaches
(one per tape event), every instance the engine hands back, and every engine call the
scenario makes; its engines keep their instances in sqlite. Then, per scenario:

1. every context of every instance, as saved, replays from its tape to the state it had
   at each sequence number (seqs run 1, 2, ... without gaps);
2. the scenario's calls, played again on its process, do what they did (an instance
   inherits nothing from an earlier one); in a new Python process (one for all scenarios)
   each instance loads as it was saved, and one that waited (a user task, a message, a
   timer, a confirmation) is saved at its first wait and answered there with the
   scenario's own calls, loaded again before each: after every call it is what an
   uninterrupted run in this process is (status, path, what it waits for, layers, tapes;
   wall-clock times aside);
3. ``layerflow inspect``, ``tape`` and ``replay --until N`` (``--json``) read it.
"""

from __future__ import annotations

import copy
import inspect
import itertools
import json
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from click.testing import CliRunner

from context_layers import Layer, LayeredContext
from context_layers.canonical import canonical_json
from engine import Engine, Instance
from engine.cli import main as cli

import test_activities
import test_arbiter_stub
import test_caches
import test_call_activity_files
import test_configfile
import test_conformance
import test_dmn
import test_end_join
import test_events
import test_examples
import test_forms
import test_gateway_engine
import test_governance
import test_governance_configs
import test_llm
import test_llm_tools
import test_loan
import test_model_compression
import test_multi_instance
import test_persistence
import test_tools
from engine_helpers import ROOT
from tape_helpers import CALLS, Clock, instance_doc, play

SWEPT: tuple[ModuleType, ...] = (
    test_conformance, test_events, test_multi_instance, test_end_join, test_examples, test_gateway_engine,
    test_call_activity_files, test_activities, test_governance, test_governance_configs, test_loan, test_llm,
    test_llm_tools, test_tools, test_model_compression, test_arbiter_stub, test_persistence, test_caches,
    test_configfile, test_dmn, test_forms,
)
# scenarios that keep two copies of one instance on purpose (the later save must fail): their calls
# are not one history; and one whose own store fails a save on purpose (no other store does)
NOT_SWEPT = {
    "test_governance.test_concurrent_injects_through_two_services_never_lose_a_write",
    "test_persistence.test_a_stale_instance_cannot_overwrite_a_newer_save",
    "test_persistence.test_a_store_that_misses_one_save_mid_run_leaves_the_instance_to_retry_not_in_error",
}


# ----- the scenarios ---------------------------------------------------------------------------------

@dataclass(frozen=True)
class Case:
    id: str
    module: ModuleType
    test: Callable[..., Any]
    params: dict[str, Any]


def _cases(module: ModuleType) -> list[Case]:
    """The module's tests, one case per parameter set, that need no fixture but ``tmp_path``."""
    out = []
    for name, test in vars(module).items():
        if not name.startswith("test_") or not inspect.isfunction(test) or test.__module__ != module.__name__:
            continue
        marks = [m for m in getattr(test, "pytestmark", []) if m.name == "parametrize"]
        sets: list[tuple[str, dict[str, Any]]] = [("", {})]
        for mark in marks:
            names = [n.strip() for n in mark.args[0].split(",")] if isinstance(mark.args[0], str) else list(mark.args[0])
            values = [getattr(v, "values", v) if type(v).__name__ == "ParameterSet" else v for v in mark.args[1]]
            sets = [(f"{sid}-{i}".lstrip("-"), {**params, **dict(zip(names, value if len(names) > 1 else (value,)))})
                    for sid, params in sets for i, value in enumerate(values)]
        if set(inspect.signature(test).parameters) - {"tmp_path", *sets[0][1]}:
            continue  # a fixture of its own module (a CLI runner, a loan instance, ...)
        if f"{module.__name__}.{name}" not in NOT_SWEPT:
            # copies taken now, before pytest runs the test itself: a parameter may be used up by a
            # run (a scripted fake model pops its replies)
            out += [Case(f"{module.__name__}.{name}" + (f"[{sid}]" if sid else ""), module, test, copy.deepcopy(params))
                    for sid, params in sets]
    return out


CASES = [case for module in SWEPT for case in _cases(module)]


# ----- the recorder ----------------------------------------------------------------------------------

@dataclass
class Recording:
    # (instance id, context name) -> seq -> the context's state after that event (``_context_doc``;
    # what the engine did: a scenario's own writes to a context, unsaved, are not noted)
    states: dict[tuple[str, str], dict[int, str]] = field(default_factory=dict)
    instances: dict[str, tuple[Engine, Instance]] = field(default_factory=dict)  # the last one handed back
    calls: dict[str, list[dict[str, Any]]] = field(default_factory=dict)  # per instance id, in order
    unplayable: dict[str, str] = field(default_factory=dict)  # instance id -> why its calls cannot be played
    problems: list[str] = field(default_factory=list)


def record(case: Case, tmp_path: Path) -> Recording:
    """Run the case's test; its engines keep their instances in sqlite files under ``tmp_path``."""
    rec = Recording()
    emitted: list[tuple[LayeredContext, int, str]] = []
    owner: dict[int, str] = {}  # id(context) -> instance id
    odd_engines: dict[int, str] = {}  # id(engine) -> what a played call could not give it
    depth = 0
    stores = itertools.count()
    emit, init = LayeredContext._emit, Engine.__init__

    def recording_emit(self: LayeredContext, *args: Any, **kwargs: Any) -> Any:
        event = emit(self, *args, **kwargs)
        if depth:  # the engine's doing, not a scenario's own write to a context
            emitted.append((self, event.seq, _context_doc(self)))
        return event

    def recording_init(self: Engine, store: Any = None, *args: Any, **kwargs: Any) -> None:
        if store is None or store == "memory://":
            store = f"sqlite:///{tmp_path / f'store{next(stores)}.db'}"  # the CLI and a new process read it
        init(self, store, *args, **kwargs)
        extra = sorted(set(kwargs) - {"clock"}) + ["handlers"] * bool(args)
        if extra:
            odd_engines[id(self)] = f"an engine with {', '.join(extra)}"

    def recording(op: str, method: Callable[..., Any]) -> Callable[..., Any]:
        signature = inspect.signature(method)

        def call(self: Engine, *args: Any, **kwargs: Any) -> Any:
            nonlocal depth
            if depth:
                return method(self, *args, **kwargs)
            bound = dict(signature.bind(self, *args, **kwargs).arguments)
            del bound["self"]
            instance = bound.pop("instance", None)
            iid = instance.id if instance is not None else bound.pop("instance_id", None)
            for name in ("task_id", "confirmation_id"):
                ids = [w["id"] for w in instance.waiting_for] if instance is not None else []
                if bound.get(name) in ids:
                    bound[name] = {"waiting": ids.index(bound[name])}
            note = {"op": op, "clock": self.clock(), "args": bound, "raised": None}
            depth += 1
            try:
                out = method(self, *args, **kwargs)
            except Exception as err:
                note["raised"] = type(err).__name__
                if instance is not None:
                    note["doc"] = instance_doc(instance)
                raise
            else:
                iid = out.id
                rec.instances[iid] = (self, out)
                owner.update((id(ctx), iid) for ctx in out.contexts.values())
                note.update(status=out.status, doc=instance_doc(out))
            finally:
                depth -= 1
                if iid is not None:
                    rec.calls.setdefault(iid, []).append(note)
                    why = odd_engines.get(id(self)) or (f"{op}(ask=...)" if bound.get("ask") else None)
                    if why:
                        rec.unplayable.setdefault(iid, why)
            return out
        return call

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(LayeredContext, "_emit", recording_emit)
        mp.setattr(Engine, "__init__", recording_init)
        for op in CALLS:
            mp.setattr(Engine, op, recording(op, getattr(Engine, op)))
        kwargs = copy.deepcopy(case.params)
        if "tmp_path" in inspect.signature(case.test).parameters:
            kwargs["tmp_path"] = tmp_path
        case.test(**kwargs)
    for ctx, seq, state in emitted:
        iid = owner.get(id(ctx))
        if iid is None:
            continue  # a context no instance holds (a scenario's own)
        known = rec.states.setdefault((iid, ctx.name), {}).setdefault(seq, state)
        if known != state:
            rec.problems.append(f"{iid}/{ctx.name}: two copies of the context differ at seq {seq}")
    return rec


def _context_doc(ctx: LayeredContext) -> str:
    """A context's state, canonical: each layer's keys in order with their values, insertion
    order and the seq that set them, token counts, preserved keys, the open activity, and the
    id its next snapshot gets."""
    layers = [[[k, view.order_of(k), view.seq_of(k), view[k], ctx.key_tokens(layer, k)] for k in view]
              for layer, view in ((layer, ctx.layer(layer)) for layer in Layer)]
    return canonical_json({"layers": layers, "tokens": ctx.token_report(), "preserved": sorted(ctx.preserved),
                           "activity": ctx.current_activity, "next_snapshot": ctx.next_snapshot_id})


# ----- what the sweep finds, per case ------------------------------------------------------------------

@dataclass
class Result:
    recording: Recording | None = None
    error: BaseException | None = None
    # instance id -> (steps of the scenario's run, steps of its calls played again uninterrupted);
    # a step: {"op", "raised", "doc": tape_helpers.instance_doc after the call}
    replayed: dict[str, tuple[list[dict[str, Any]], list[dict[str, Any]]]] = field(default_factory=dict)
    # instance id -> (steps of the uninterrupted run, with a load at the cut; steps of the run
    # saved there and loaded and answered in the new process)
    # (or {"crash": traceback} when the new process could not go on)
    resumed: dict[str, tuple[list[dict[str, Any]], Any]] = field(default_factory=dict)
    stored: dict[str, str] = field(default_factory=dict)  # instance id -> the URL of the store it ended in


def _playable(rec: Recording, iid: str) -> bool:
    """Whether the instance's calls can be played again: they start it, and need nothing but
    JSON (no engine with handlers or a model, no ``ask`` callback)."""
    calls = rec.calls.get(iid, [])
    if iid in rec.unplayable or not calls or calls[0]["op"] != "start":
        return False
    try:
        json.dumps([c["args"] for c in calls[1:]])
    except (TypeError, ValueError):
        return False
    return True


def _cut(calls: list[dict[str, Any]]) -> int | None:
    """The call after which a played run is saved and left for the new process: the first that
    left the instance waiting with more calls to come (None: it never waited)."""
    return next((i for i, c in enumerate(calls[:-1]) if c.get("status") == "waiting"), None)


def _start(engine: Engine, clock: Clock, iid: str, call: dict[str, Any]) -> Instance:
    clock.now = call["clock"]
    args = {k: v for k, v in call["args"].items() if k in ("process", "data")}
    return engine.start(**args, instance_id=iid)


def _steps(calls: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{k: c.get(k) for k in ("op", "raised", "doc")} for c in calls if c["op"] != "load"]


def _clock_free(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _clock_free(v) for k, v in value.items() if k not in ("due", "created", "deadline", "time", "answered_at")}
    if isinstance(value, list):
        return [_clock_free(v) for v in value]
    return value


def _prepare(rec: Recording, result: Result, tmp: Path, n: int, case: Case, jobs: dict[str, dict[str, Any]],
             expected: dict[str, tuple[str, str, list[dict[str, Any]]]]) -> None:
    """Play the recorded instances' calls again here; add a job for the new process per instance."""
    for iid, (engine, _) in rec.instances.items():
        calls = rec.calls[iid]
        playable = _playable(rec, iid)
        if playable:
            clock = Clock()
            straight = Engine("memory://", clock=clock)
            _, want = play(straight, clock, _start(straight, clock, iid, calls[0]), calls[1:], reload=False)
            # the engine's clock stood still during each played call; the scenario's may have
            # read the wall clock, so the times it gave (a timer's due time, ...) are left out
            result.replayed[iid] = (_clock_free(_steps(calls[1:])), _clock_free(want))
        cut = _cut(calls) if playable else None
        if cut is not None:
            store = f"sqlite:///{tmp / 'resumed.db'}"
            saved = Engine(store, clock=clock)
            _, done = play(saved, clock, _start(saved, clock, iid, calls[0]), calls[1:cut + 1], reload=False)
            job_calls = [{k: v for k, v in c.items() if k != "doc"} for c in calls[cut + 1:]]
            want.insert(len(done), {"op": "load", "raised": None, "doc": done[-1]["doc"]})
        elif str(engine.store.url).startswith("sqlite"):
            store, done, job_calls = str(engine.store.url), [], []
            want = [{"op": "load", "raised": None, "doc": instance_doc(engine.load(iid))}]
        else:
            continue
        key = f"{n}/{iid}"
        jobs[key] = {"store": store, "instance_id": iid, "calls": job_calls}
        expected[key] = (case.id, iid, want)
        result.resumed[iid] = (want, done)
        result.stored[iid] = store


@pytest.fixture(scope="module")
def sweep(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Result]:
    """Every case recorded; each of its instances played again (uninterrupted, in this process),
    and, in one new Python process, loaded from its store and answered there."""
    results: dict[str, Result] = {}
    jobs: dict[str, dict[str, Any]] = {}
    expected: dict[str, tuple[str, str, list[dict[str, Any]]]] = {}  # job key -> (case id, instance id, steps)
    for n, case in enumerate(CASES):
        tmp = tmp_path_factory.mktemp(f"case{n}")
        result = results[case.id] = Result()
        try:
            rec = result.recording = record(case, tmp)
        except Exception as err:  # noqa: BLE001 - the scenario's own failure, reported with it
            result.error = err
            continue
        try:
            _prepare(rec, result, tmp, n, case, jobs, expected)
        except Exception as err:  # noqa: BLE001 - playing the scenario's calls again failed: reported with it
            result.error = err
    path = tmp_path_factory.mktemp("jobs") / "jobs.json"
    path.write_text(json.dumps(jobs), encoding="utf-8")
    child = subprocess.run([sys.executable, str(Path(__file__).with_name("tape_helpers.py")), str(path)],
                           capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert child.returncode == 0, child.stderr
    for key, steps in json.loads(child.stdout).items():
        case_id, iid, want = expected[key]
        done = results[case_id].resumed[iid][1]
        results[case_id].resumed[iid] = (want, steps if "crash" in steps else done + steps)
    return results


def _recording(sweep: dict[str, Result], case: Case) -> Recording:
    result = sweep[case.id]
    if result.error is not None:
        raise result.error
    assert result.recording is not None
    return result.recording


# ----- the invariants ------------------------------------------------------------------------------------

@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_every_saved_context_replays_to_each_state_it_had(sweep: dict[str, Result], case: Case) -> None:
    rec = _recording(sweep, case)
    problems = list(rec.problems)
    for iid, (engine, live) in rec.instances.items():
        saved = engine.load(iid)
        assert set(saved.contexts) == set(live.contexts), iid
        for name, ctx in saved.contexts.items():
            seqs = [e.seq for e in ctx.tape]
            assert seqs == list(range(1, len(seqs) + 1)), f"{iid}/{name}: seqs {seqs}"
            states = rec.states.get((iid, name), {})
            assert max(states, default=0) <= len(seqs), f"{iid}/{name}: events after the last save"
            for seq in range(len(seqs) + 1):
                replayed = LayeredContext.replay(ctx.tape, until=seq, name=name)
                if seq in states and _context_doc(replayed) != states[seq]:
                    problems.append(f"{iid}/{name} replayed until {seq} differs from the context then")
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_a_saved_instance_goes_on_in_a_new_process_as_in_this_one(sweep: dict[str, Result], case: Case) -> None:
    """Also: the scenario's calls, played again on its process, do as they did in the scenario
    (an instance does not inherit anything from an earlier one of the same process)."""
    _recording(sweep, case)
    result = sweep[case.id]
    for how, runs in (("played again", result.replayed), ("resumed in a new process", result.resumed)):
        for iid, (want, got) in runs.items():
            assert "crash" not in got, got["crash"]
            assert [(s["op"], s["raised"]) for s in got] == [(s["op"], s["raised"]) for s in want], f"{iid} {how}"
            for i, (w, g) in enumerate(zip(want, got)):
                for part in w["doc"]:
                    assert g["doc"][part] == w["doc"][part], f"{iid} {how}: {part} after call {i + 1} ({w['op']})"


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_the_cli_reads_the_saved_instance(sweep: dict[str, Result], case: Case) -> None:
    _recording(sweep, case)
    runner = CliRunner()
    for iid, store in sweep[case.id].stored.items():
        def doc(*args: str) -> Any:
            result = runner.invoke(cli, [*args, "--store", store, "--json"])
            assert result.exit_code == 0 and result.exception is None, (args, result.output, result.exception)
            return json.loads(result.stdout)

        saved = Engine(store).load(iid)
        assert doc("inspect", iid)["instance_id"] == iid
        events = doc("tape", iid)
        for name, ctx in saved.contexts.items():
            assert [e["seq"] for e in events if e["context"] == name] == list(range(1, len(ctx.tape) + 1))
            n = len(ctx.tape)
            for until in sorted({0, 1, n // 2, n}):
                layers = doc("replay", iid, "--until", str(until), "--context", name)["layers"]
            assert layers == ctx.as_dict(), name
        for name in [n for n in saved.contexts if n != "main"][:2]:
            assert doc("inspect", iid, "--context", name)["context"] == name
