"""Engine calls recorded from a scenario, played again; an instance as a comparable document.

Shared by ``test_tape_invariants.py`` and the Python process it resumes saved instances in:
``python tape_helpers.py JOBS.json`` loads each job's instance from its store, plays the
job's calls on it (loading it again before each one) and prints one JSON document:
``{job key: [{"op", "raised", "doc"}, ...]}``, the instance as loaded, then after each call.
"""

from __future__ import annotations

import json
import re
import sys
import traceback
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(p) for p in (HERE.parents[1], HERE) if str(p) not in sys.path]

from engine import Engine, Instance  # noqa: E402

from engine_helpers import path_of  # noqa: E402

# the engine calls a scenario makes; ``load`` too (played as a load, or not at all)
CALLS = ("start", "run", "complete_user_task", "answer_confirmation", "send_event", "resume", "inject", "load")
_UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")


class Clock:
    """The engine clock of a played call: the time the scenario's engine read at that call."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def play(engine: Engine, clock: Clock, instance: Instance, calls: list[dict[str, Any]], *,
         reload: bool) -> tuple[Instance, list[dict[str, Any]]]:
    """Play recorded calls (``{"op", "args", "clock"}``) on ``instance``; with ``reload``, load it
    from the store before each, and take each step's document from the store too. Returns
    the instance and, per call, what it raised (an exception's name, or None) and
    ``instance_doc`` after it."""
    steps = []
    for call in calls:
        clock.now = call["clock"]
        if call["op"] == "load":
            continue
        if reload:
            instance = engine.load(instance.id)
        args = dict(call["args"])
        for name in ("task_id", "confirmation_id"):
            if isinstance(args.get(name), dict):  # a waiting item's id (a SpiffWorkflow task id): by position
                args[name] = instance.waiting_for[args[name]["waiting"]]["id"]
        raised = None
        try:
            instance = getattr(engine, call["op"])(instance, **args)
        except Exception as err:  # noqa: BLE001 - the scenario's own refusals, compared by name
            raised = type(err).__name__
        steps.append({"op": call["op"], "raised": raised,
                      "doc": instance_doc(engine.load(instance.id) if reload else instance)})
    return instance, steps


def instance_doc(instance: Instance) -> dict[str, Any]:
    """What a resumed run must share with an uninterrupted one: status, error, path, what it
    waits for, branches, conflicts, confirmations, and per context its layers, state, tokens
    and tape. The wall-clock time of each tape event and SpiffWorkflow's task ids are left out."""
    doc = {
        "status": instance.status,
        "error": instance.error if instance.status == "error" else None,
        "path": path_of(instance.workflow),
        "waiting_for": instance.waiting_for,
        "branches": instance.branches,
        "conflicts": instance.conflicts,
        "confirmations": instance.confirmations,
        "contexts": {name: {"layers": ctx.as_dict(), "state": json.loads(ctx.state_json()), "tokens": ctx.token_report(),
                            "tape": [{k: v for k, v in e.items() if k != "time"} for e in ctx.tape.to_list()]}
                     for name, ctx in instance.contexts.items()},
    }
    return json.loads(_UUID.sub("<task id>", json.dumps(doc, default=str)))  # type: ignore[no-any-return]


def resume_jobs(jobs: dict[str, dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, job in jobs.items():
        clock = Clock()
        engine = Engine(job["store"], clock=clock)
        try:
            instance = engine.load(job["instance_id"])
            out[key] = [{"op": "load", "raised": None, "doc": instance_doc(instance)},
                        *play(engine, clock, instance, job["calls"], reload=True)[1]]
        except Exception:  # noqa: BLE001 - reported with its scenario
            out[key] = {"crash": traceback.format_exc()}
    return out


if __name__ == "__main__":
    print(json.dumps(resume_jobs(json.loads(Path(sys.argv[1]).read_text(encoding="utf-8")))))
