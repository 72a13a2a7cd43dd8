"""Outsider round 45: a public tender evaluation embedded through the Python API only
(tests/engine/tender_o45/: tender.bpmn and tender_band.dmn), as a newcomer with the README writes it.

Bids arrive as the start data; a parallel multi-instance service task scores each bid (a handler
registered with ``@activity``); a script ranks them; a DMN table (hit policy FIRST) picks the band; an
exclusive gateway with a default sends a weak field to a re-tender; a sub-process vets the winner
(a debarred bidder throws ``engine.BpmnError``, caught by the sub-process's error boundary event) and
waits for a person to confirm the award, while a ``tender_cancelled`` signal sent from outside
cancels the evaluation (an interrupting signal boundary event); the award script ends it.

Found (each test below failed first):
- a person's answer holding a value JSON cannot hold by its type (a set, bytes) escaped
  ``Engine.complete_user_task`` as a bare ``TypeError: value is of type set`` naming neither the task
  nor the key, where a NaN gets ``InvalidAnswer`` naming both (README: ``InvalidAnswer`` for a person's
  answer);
- a person who confirms with an empty answer (the user task has no form) stopped the award script
  with Python's bare ``NameError``: it now says where to give the key, or to correct the script, and
  names the user task whose answer left it out;
- a stale ``Instance`` object (two engines of one application) got ``VersionConflict`` telling an
  Engine user to ``store.load``: it now says ``engine.load(ID)`` or to give the id;
- ``view(anchor=...)`` of an anchor nobody set said only "not found": README never said how an
  application sets one (``ctx.anchor``); the error and README now do;
- ``Engine.inject(..., context="mian")`` raised a bare ``KeyError: 'mian'``: now ``ContextKeyError``
  naming the instance's contexts.
Kept as they are, as documented: sqlite and Redis load to the same contexts and tape, replay rebuilds
them, and a rollback then the rest of the run ends with the same layers as the first run.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from context_layers import Layer, LayeredContext
from engine import ActivityContext, BpmnError, Engine, activity, load_process
from engine.governance import InvalidAnswer

from engine_helpers import redis_scratch

HERE = Path(__file__).resolve().parent / "tender_o45"
REDIS = "redis://127.0.0.1:6379/11"  # this module's own database
DEBARRED = {"Shady Ltd"}
BIDS = [{"bidder": "Acme", "price": 90000, "quality": 9}, {"bidder": "Bolt", "price": 70000, "quality": 7}]


@activity("score_bid")
def score_bid(ctx: ActivityContext) -> dict[str, Any]:
    bid = ctx["bid"]
    return {"score": {"bidder": bid["bidder"], "points": round(bid["quality"] * 10 - bid["price"] / 10000)}}


@activity("check_winner")
def check_winner(ctx: ActivityContext) -> dict[str, Any]:
    if ctx["winner"] in DEBARRED:
        raise BpmnError("disqualified", f"{ctx['winner']} is debarred", {"debarred": ctx["winner"]})
    return {"vetted": True}


@pytest.fixture(scope="module")
def tender() -> Any:
    return load_process([HERE / "tender.bpmn", HERE / "tender_band.dmn"])


def waiting(instance: Any) -> list[tuple[str, str]]:
    return sorted((w["kind"], w["task_id"]) for w in instance.waiting_for)


def test_the_award_path_scores_every_bid_and_waits_for_a_person(tender: Any) -> None:
    engine = Engine("memory://")
    instance = engine.run(tender, {"bids": BIDS})
    assert instance.status == "waiting"
    assert waiting(instance) == [("event", "cancelled"), ("user_task", "confirm_award")]
    main = instance.main
    assert main.layer(Layer.PROCESS)["bids"] == BIDS
    assert main.resolve("scores") == [{"bidder": "Acme", "points": 81}, {"bidder": "Bolt", "points": 63}]
    assert (main.resolve("winner"), main.resolve("band"), main.resolve("vetted")) == ("Acme", "strong", True)
    done = engine.complete_user_task(instance.id, "confirm_award", {"award_confirmed": True})
    assert done.status == "completed"
    assert (done.main.resolve("outcome"), done.main.resolve("awarded_to")) == ("awarded", "Acme")
    assert LayeredContext.replay(done.main.tape) == done.main


@pytest.mark.parametrize("bids, data, outcome, keys", [
    ([{"bidder": "Weak", "price": 100000, "quality": 5}], None, "retender", {"band": "weak"}),
    ([{"bidder": "Shady Ltd", "price": 1, "quality": 10}], None, "disqualified",
     {"error_code": "disqualified", "error_message": "Shady Ltd is debarred", "debarred": "Shady Ltd"}),
    (BIDS, {"reason": "court order"}, "cancelled", {"reason": "court order", "band": "strong"}),
])
def test_the_other_ends(tender: Any, bids: list[Any], data: Any, outcome: str, keys: dict[str, Any]) -> None:
    engine = Engine("memory://")
    instance = engine.run(tender, {"bids": bids})
    if data is not None:
        instance = engine.send_event(instance, "tender_cancelled", data, kind="signal")
    assert (instance.status, instance.waiting_for) == ("completed", [])
    assert instance.main.resolve("outcome") == outcome
    assert {k: instance.main.resolve(k) for k in keys} == keys


@pytest.mark.parametrize("value, problem", [({"yes"}, "type set"), (b"yes", "type bytes"), (float("nan"), "nan")])
def test_an_answer_json_cannot_hold_is_invalid_answer_naming_task_and_key(tender: Any, value: Any, problem: str) -> None:
    engine = Engine("memory://")
    instance = engine.run(tender, {"bids": BIDS})
    before = len(instance.main.tape)
    with pytest.raises(InvalidAnswer) as caught:
        engine.complete_user_task(instance.id, "confirm_award", {"award_confirmed": value})
    message = str(caught.value)
    assert "'confirm_award'" in message and "'award_confirmed'" in message and problem in message, message
    assert caught.value.task_id == "confirm_award"
    again = engine.load(instance.id)  # nothing applied: the task still waits for a corrected answer
    assert waiting(again) == [("event", "cancelled"), ("user_task", "confirm_award")]
    assert len(again.main.tape) == before and "award_confirmed" not in again.main


@pytest.mark.parametrize("kind", ["sqlite", "redis"])
def test_a_stored_instance_loads_to_the_same_contexts_and_tape(tender: Any, tmp_path: Path, kind: str) -> None:
    with redis_scratch(REDIS, "o45") if kind == "redis" else _nothing() as prefix:
        url = f"{REDIS}?prefix={prefix}" if kind == "redis" else f"sqlite:///{tmp_path / 'tender.db'}"
        engine = Engine(url)
        waiting_one = engine.run(tender, {"bids": BIDS})
        loaded = Engine(url).load(waiting_one.id)  # another engine on the same store
        assert {n: c for n, c in loaded.contexts.items()} == waiting_one.contexts
        assert [e.to_dict() for e in loaded.main.tape] == [e.to_dict() for e in waiting_one.main.tape]
        done = Engine(url).complete_user_task(waiting_one.id, "confirm_award", {"award_confirmed": False})
        assert done.main.resolve("outcome") == "withheld"
        reloaded = engine.load(done.id)
        assert reloaded.status == "completed" and reloaded.main == done.main
        assert LayeredContext.replay(reloaded.main.tape) == reloaded.main


class _nothing:
    def __enter__(self) -> str:
        return ""

    def __exit__(self, *exc: object) -> None:
        return None


def test_a_script_reading_a_key_the_persons_answer_left_out_says_what_to_do(tender: Any) -> None:
    """The person confirms with an empty answer (the user task has no form to ask for
    ``award_confirmed``): the award script's NameError names the key, where to give it and the
    user task whose answer left it out, and the instance resumes once it is given."""
    engine = Engine("memory://")
    instance = engine.run(tender, {"bids": BIDS})
    failed = engine.complete_user_task(instance.id, "confirm_award", {})
    assert failed.status == "error" and failed.error is not None
    message = failed.error["message"]
    assert message.startswith("activity 'award' failed at line 1 of its script: NameError: name 'award_confirmed'")
    assert "give 'award_confirmed' a value before 'award'" in message, message
    assert "user task 'confirm_award'" in message, message
    fixed = engine.resume(engine.inject(instance.id, {"award_confirmed": True}).id)
    assert (fixed.status, fixed.main.resolve("outcome")) == ("completed", "awarded")


def test_rollback_then_the_rest_of_the_run_ends_as_the_first_run(tender: Any) -> None:
    """An operator's wrong inject while the award waits, rolled back to a snapshot taken before it:
    the award then ends with the same layers as a run that never had it, and the tape keeps both."""
    from engine import GovernanceService
    from engine.governance import RollbackArgs, SnapshotArgs

    engine = Engine("memory://")
    first = engine.complete_user_task(engine.run(tender, {"bids": BIDS}), "confirm_award", {"award_confirmed": True})
    instance = engine.run(tender, {"bids": BIDS})
    service = GovernanceService(engine)
    snap = service.snapshot(instance.id, SnapshotArgs(label="before the operator's change"))["snapshot_id"]
    engine.inject(instance.id, {"outcome": "forged", "awarded_to": "Bolt"})
    service.rollback(instance.id, RollbackArgs(snapshot_id=snap, reason="undo the operator's change"))
    again = engine.complete_user_task(instance.id, "confirm_award", {"award_confirmed": True})
    assert again.main.as_dict() == first.main.as_dict()
    forged = [e.seq for e in again.main.tape if str(e.kind) == "write" and "outcome" in e.keys]
    restored = [e.seq for e in again.main.tape if str(e.kind) == "restore"]
    assert len(forged) == 2 and len(restored) == 1 and forged[0] < restored[0] < forged[1]  # nothing deleted
    assert LayeredContext.replay(again.main.tape) == again.main
    at_snapshot = LayeredContext.replay(again.main.tape, until=int(snap.rsplit(":", 1)[1]))
    assert at_snapshot.get("outcome") is None and at_snapshot.resolve("band") == "strong"


def test_a_stale_instance_object_loses_to_the_first_answer_and_says_how_to_retry(tender: Any, tmp_path: Path) -> None:
    """Two engines (two processes of one application) on one sqlite store each hold the waiting
    instance; the second answer, on the stale object, is refused whole and says what an Engine user
    does: load it again (``engine.load``) or pass the id, which loads the stored version."""
    from context_layers.stores import VersionConflict

    url = f"sqlite:///{tmp_path / 'tender.db'}"
    first, second = Engine(url), Engine(url)
    instance_id = first.run(tender, {"bids": BIDS}).id
    held_one, held_two = first.load(instance_id), second.load(instance_id)
    assert first.complete_user_task(held_one, "confirm_award", {"award_confirmed": True}).status == "completed"
    with pytest.raises(VersionConflict) as caught:
        second.complete_user_task(held_two, "confirm_award", {"award_confirmed": False})
    assert f"engine.load({instance_id!r})" in str(caught.value), str(caught.value)
    stored = second.load(instance_id)
    assert (stored.status, stored.main.resolve("outcome")) == ("completed", "awarded")


def test_a_view_from_an_anchor_the_application_sets(tender: Any) -> None:
    """README: a view is what a model is shown "from an anchor on"; an anchor nobody set is refused
    saying how to set one, and one set while the award waits hides the scoring from the view only."""
    from context_layers import ContextKeyError, render

    engine = Engine("memory://")
    instance = engine.run(tender, {"bids": BIDS})
    with pytest.raises(ContextKeyError) as caught:
        instance.main.view(anchor="award_review")
    assert "ctx.anchor('award_review')" in str(caught.value), str(caught.value)
    instance.main.anchor("award_review", actor="tender_app")
    done = engine.complete_user_task(instance, "confirm_award", {"award_confirmed": True})
    shown = str(render(done.main.view(anchor="award_review"), format="json"))
    assert "awarded" in shown and "activity:score_bid" not in shown
    assert "activity:score_bid" in str(render(done.main, format="json"))
    assert LayeredContext.replay(done.main.tape) == done.main


def test_inject_into_a_context_the_instance_does_not_have_names_the_ones_it_has(tender: Any) -> None:
    from context_layers import ContextKeyError

    engine = Engine("memory://")
    instance = engine.run(tender, {"bids": BIDS})
    with pytest.raises(ContextKeyError) as caught:  # it was a bare KeyError('mian')
        engine.inject(instance.id, {"award_note": "checked"}, context="mian")
    assert "'mian'" in str(caught.value) and "contexts: main" in str(caught.value), str(caught.value)
    assert engine.load(instance.id).main.tape.__len__() == len(instance.main.tape)  # nothing written
    assert engine.inject(instance.id, {"award_note": "checked"}, context="main").main.resolve("award_note") == "checked"
