"""Whole runs compared with recorded ones: the full tapes, every context, the saved record and
the state after each activity, byte for byte (canonical JSON).

The recording (``fixtures/golden/runs.json``) was made by the engine before its hot paths were
tuned; a change meant to be only faster must leave every run here exactly as it was. A change
of behaviour that is meant updates the recording on purpose:

    python tests/engine/test_golden_runs.py --write      # from the repository root
"""

from __future__ import annotations

import itertools
import json
import re
import sys
from pathlib import Path
from typing import Any, Callable

import pytest

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path[:0] = [str(p) for p in (ROOT, ROOT / "bpmn_examples", ROOT / "bench") if str(p) not in sys.path]

from bench_engine import multi_instance_bpmn  # noqa: E402  (the benchmark's row, kept as it is measured)
from engine import Engine, Instance, load_process  # noqa: E402

RECORDING = HERE / "fixtures" / "golden" / "runs.json"
EXAMPLES = ROOT / "bpmn_examples"
LOAN = EXAMPLES / "loan_approval.bpmn"
LOAN_FAST = {"amount": 20000, "applicant_id": "APP003", "purpose": "equipment", "industry": "bakery"}
LOAN_FULL = {"amount": 120000, "applicant_id": "APP002", "purpose": "warehouse expansion", "industry": "logistics"}
LOAN_CONFLICT = {"amount": 120000, "applicant_id": "APP001", "purpose": "business loan", "industry": "gambling"}
_UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")


def _uuids_numbered(text: str) -> str:
    """SpiffWorkflow's task ids are random: number them in order of appearance."""
    seen: dict[str, str] = {}
    return _UUID.sub(lambda m: seen.setdefault(m.group(0), f"uuid-{len(seen)}"), text)


def _canonical(value: Any, folder: Path) -> Any:
    """Task ids numbered in the order the engine lists them (before any sorting by the random
    ids), SpiffWorkflow's wall-clock stamps dropped, file paths relative to the repository; the
    digests of the files a process was loaded from (its definition's version) dropped too: they
    change with every edit of an example, which is not what the recording is about."""
    text = _uuids_numbered(json.dumps(value, default=repr)).replace(str(ROOT) + "/", "").replace(str(folder) + "/", "")
    return json.loads(text, object_hook=lambda d: {k: v for k, v in d.items() if k not in _UNRECORDED})


_UNRECORDED = frozenset({"last_state_change", "digests", "definition"})


def _play(path: Path, data: dict[str, Any], then: Callable[[Engine, Instance], Instance] | None = None,
          **engine_kw: Any) -> dict[str, Any]:
    """One run on a fake clock (every read one second later): its document and contexts after
    each activity, and at the end the document, every context whole (tapes, snapshots) and the
    record the store holds."""
    ticks = itertools.count()
    steps: list[Any] = []

    def progress(instance: Instance, task_id: str, ctx: Any) -> None:
        steps.append({"task": task_id, "context": ctx.name, "layers": ctx.as_dict(), "tokens": ctx.token_report(),
                      "tape_length": len(ctx.tape)})

    engine = Engine(clock=lambda: 1_000_000.0 + next(ticks), progress=progress, **engine_kw)
    instance = engine.run(engine.start(load_process(path), data, instance_id="golden"))
    if then is not None:
        instance = then(engine, instance)
    record = engine.store.load(instance.id)
    return _canonical({"steps": steps, "document": instance.to_document(),
                       "contexts": {name: ctx.to_dict() for name, ctx in instance.contexts.items()},
                       "record": record}, path.parent)


def _answer_conflict(engine: Engine, instance: Instance) -> Instance:
    return engine.answer_confirmation(instance, "review_join/approval_status", "pending_dual_approval")


def _runs(tmp: Path) -> dict[str, Callable[[], dict[str, Any]]]:
    mi = tmp / "mi.bpmn"
    mi.write_text(multi_instance_bpmn(), encoding="utf-8")
    return {
        "loan-fast": lambda: _play(LOAN, LOAN_FAST),
        "loan-full": lambda: _play(LOAN, LOAN_FULL),
        "loan-full-save-at-stop": lambda: _play(LOAN, LOAN_FULL, save="stop"),
        "loan-conflict-answered": lambda: _play(LOAN, LOAN_CONFLICT, _answer_conflict),
        "multi-instance-30": lambda: _play(mi, {"items": list(range(30))}),
        "nested-parallel": lambda: _play(EXAMPLES / "nested_parallel.bpmn", {}),
        "inclusive-gateway": lambda: _play(EXAMPLES / "inclusive_gateway.bpmn", {"need_credit": True, "need_identity": False, "need_address": True}),
        "xor-loop-12": lambda: _play(EXAMPLES / "xor_loop.bpmn", {"batch_size": 12}),
    }


NAMES = [
    "loan-fast", "loan-full", "loan-full-save-at-stop", "loan-conflict-answered", "multi-instance-30",
    "nested-parallel", "inclusive-gateway", "xor-loop-12"]


@pytest.fixture(scope="module")
def recording() -> dict[str, Any]:
    return dict(json.loads(RECORDING.read_text(encoding="utf-8")))


@pytest.mark.parametrize("name", NAMES)
def test_run_is_the_recorded_one(name: str, recording: dict[str, Any], tmp_path: Path) -> None:
    got = _runs(tmp_path)[name]()
    want = recording[name]
    for part in ("document", "contexts", "record", "steps"):  # the first difference names its part
        assert got[part] == want[part], f"{name}: {part} differs from the recording"
        # key order too: HISTORY's order is what a model is sent
        assert json.dumps(got[part]) == json.dumps(want[part]), f"{name}: {part} is in another order"


def _write() -> None:
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        runs = _runs(Path(tmp))
        assert sorted(runs) == sorted(NAMES)
        recorded = {name: runs[name]() for name in NAMES}
    RECORDING.parent.mkdir(parents=True, exist_ok=True)
    RECORDING.write_text(json.dumps(recorded, separators=(",", ":")) + "\n",
                         encoding="utf-8")


if __name__ == "__main__":
    if sys.argv[1:] != ["--write"]:
        raise SystemExit(__doc__)
    _write()
