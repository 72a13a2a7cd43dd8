"""What a save keeps from the last one is dropped when it changes.

* The engine's bookkeeping in a record (branches, conflicts, compressions, ...) is kept as
  JSON text while it does not change; a change in place (a list entry edited, ``1``
  becoming ``1.0`` or ``True``, keys reordered) is saved as the value now is, and a value
  JSON cannot hold fails the save naming it, with nothing written.
* Through a rollback, a resume, a cancel and SpiffWorkflow's reset of a task, every saved
  record is still the long way's (``test_save_fast._CheckingRecords``), and what a memory
  store holds is the state at the save, not what the instance became after it.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, Callable

import pytest

from context_layers import Layer, LayeredContext
from context_layers.canonical import freeze
from context_layers.stores import InvalidRecord, open_store
from engine import Engine, load_process, spiff
from test_save_fast import LOAN_CONFLICT, LOAN_FULL, _CheckingRecords, _Engine

EXAMPLES = Path(__file__).resolve().parents[1] / "bpmn_examples"


def _checking_engine() -> _Engine:
    engine = _Engine()
    engine.store = _CheckingRecords(open_store("memory://"), engine)
    return engine


def _exact(value: Any) -> str:
    """JSON text that tells ``1``, ``1.0`` and ``True`` apart, and key orders."""
    return json.dumps(value)


def _saved_engine_part(engine: Engine, instance: Any) -> dict[str, Any]:
    engine.save(instance)
    return engine.store.load(instance.id)["engine"]  # type: ignore[no-any-return]


def _ratio_float(c: dict[str, Any]) -> None:
    c["ratio"] = 1.0


def _ratio_true(c: dict[str, Any]) -> None:
    c["ratio"] = True


def _reordered(c: dict[str, Any]) -> None:
    items = list(c.items())
    c.clear()
    c.update(reversed(items))


def _nested(c: dict[str, Any]) -> None:
    c["triggers"].append("manual")


@pytest.mark.parametrize("change", [_ratio_float, _ratio_true, _reordered, _nested],
                         ids=["1->1.0", "1->True", "keys-reordered", "nested-list"])
def test_bookkeeping_changed_in_place_is_saved_as_it_now_is(change: Callable[[dict[str, Any]], None]) -> None:
    engine = Engine()
    instance = engine.run(engine.start(load_process(EXAMPLES / "loan_approval.bpmn"), LOAN_FULL))
    assert instance.status == "completed" and instance.compressions, "the loan compresses once"
    record = instance.compressions[0]
    record["ratio"] = 1
    assert _exact(_saved_engine_part(engine, instance)["compressions"]) == _exact(instance.compressions)
    change(record)  # the same list, the same dict, changed in place
    assert _exact(_saved_engine_part(engine, instance)["compressions"]) == _exact(instance.compressions)

    saved = _exact(instance.compressions)
    record["ratio"] = 0.5  # after the save: the memory store keeps the state at the save
    assert _exact(engine.store.load(instance.id)["engine"]["compressions"]) == saved


def test_bookkeeping_marshal_cannot_picture_is_saved_each_time() -> None:
    """A frozen context value in a conflict (a dict subclass) is encoded at every save."""
    engine = Engine()
    instance = engine.run(engine.start(load_process(EXAMPLES / "loan_approval.bpmn"), LOAN_FULL))
    instance.conflicts.append({"key": "k", "base_value": freeze({"a": [1, 2]}), "values": {}})
    assert _saved_engine_part(engine, instance)["conflicts"] == [{"key": "k", "base_value": {"a": [1, 2]}, "values": {}}]
    instance.conflicts[0]["values"]["b"] = freeze({"x": 1.5})
    assert _saved_engine_part(engine, instance)["conflicts"][0]["values"] == {"b": {"x": 1.5}}


def test_bookkeeping_that_is_not_json_fails_the_save_naming_it() -> None:
    engine = Engine()
    instance = engine.run(engine.start(load_process(EXAMPLES / "loan_approval.bpmn"), LOAN_FULL))
    before = engine.store.load(instance.id)
    instance.compressions[0]["ratio"] = math.nan
    with pytest.raises(InvalidRecord, match=rf"instance record '{instance.id}'\['engine'\]\['compressions'\] is not "
                                            "JSON-compatible"):
        engine.save(instance)
    assert engine.store.load(instance.id) == before, "nothing was written"


def test_every_save_through_resume_rollback_put_back_and_cancel_is_the_long_ways_record() -> None:
    engine = _checking_engine()
    before = _CheckingRecords.checked
    process = load_process(EXAMPLES / "loan_approval.bpmn")
    instance = engine.run(engine.start(process, LOAN_CONFLICT))
    assert instance.status == "waiting", instance.error
    done = engine.resume(instance, answers={"confirmations": {"review_join/approval_status": "approved"}})
    assert done.status == "completed", done.error

    main: LayeredContext = done.main
    taken = main.snapshot("before the rollback")
    main.write(Layer.WORKING, "note", "x", actor="operator")
    engine.save(done)
    main.restore(taken.id, actor="operator")  # a rollback: the tape goes on, the layers are as they were
    engine.save(done)
    with pytest.raises(RuntimeError, match="refused"), engine.all_or_nothing(done):
        done.main.write(Layer.WORKING, "note", "y", actor="operator")
        raise RuntimeError("refused")  # put back as stored: new contexts and workflow, the same instance
    assert "note" not in done.main.resolved()
    done.main.write(Layer.WORKING, "note", "z", actor="operator")
    engine.save(done)
    assert engine.store.load(done.id)["contexts"]["main"]["tape"][-1]["changes"][0][2] == "z"

    other = engine.run(engine.start(process, LOAN_CONFLICT))
    assert other.status == "waiting"
    assert engine.cancel(other, reason="withdrawn").status == "cancelled"
    assert _CheckingRecords.checked - before >= done.activities + 5


def test_a_task_reset_by_spiffworkflow_is_written_as_it_now_is() -> None:
    """SpiffWorkflow drops the tasks after a reset one and predicts new ones: the texts kept for
    the dropped tasks are not written, the reset task's is written anew."""
    engine = Engine()
    instance = engine.run(engine.start(load_process(EXAMPLES / "loan_approval.bpmn"), LOAN_FULL))
    wf = instance.workflow
    spiff.serialize_json(wf)  # every task's text kept
    risk = next(t for t in wf.get_tasks() if t.task_spec.name == "risk_assessment")
    wf.reset_from_task_id(risk.id)
    assert json.loads(spiff.serialize_json(wf)) == json.loads(spiff.SERIALIZER.serialize_json(wf))
