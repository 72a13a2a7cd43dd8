"""A payments company runs card chargeback disputes (tests/outsider_chargeback51/) from README.md and
DESIGN.md alone, through the Python API and the CLI.

The dispute: a model step (its offline handler stands in for the model) and the scheme's rule step both
decide ``liability`` in parallel; the join's conflictPolicy puts a large dispute to a person. The merchant
is asked for evidence and an event-based gateway races the ``merchant_evidence`` message against a
ten-day deadline. An analyst reviews the evidence under an SLA: a non-interrupting reminder after four
hours, an interrupting escalation after two days. The shared fee calculation (fee51.bpmn, a call activity
whose ioSpecification gives back only ``fee``) may end with the error ``fee_disputed``, which a boundary
event on the call catches; the issuer may reject the representment (a BpmnError and its boundary event).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from context_layers.errors import ProcessError
from engine import Engine, load_process
from engine.governance import InstanceStateError

ROOT = Path(__file__).resolve().parent.parent
HERE = ROOT / "tests" / "outsider_chargeback51"
FILES = [str(HERE / "chargeback51.bpmn"), str(HERE / "fee51.bpmn")]
T0 = 1_800_000_000.0  # 2027-01-15T08:00:00Z
HOUR = 3600.0
SMALL = {"dispute_id": "CB-100", "amount": 100, "reason_code": "goods", "three_ds": True}
LARGE = {"dispute_id": "CB-900", "amount": 900, "reason_code": "fraud", "three_ds": False}


class Clock:
    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def world() -> tuple[Engine, Clock]:
    clock = Clock()
    return Engine("memory://", clock=clock), clock


def at_analyst(engine: Engine, data: dict[str, Any], evidence: dict[str, Any]) -> Any:
    """A dispute whose merchant sent its evidence: it waits for the analyst (and the SLA timers)."""
    inst = engine.run(engine.start(load_process(FILES), data),
                      answers={"confirmations": {"assess_join/liability": "merchant"}})
    assert inst.status == "waiting", inst.error
    inst = engine.send_event(inst.id, "merchant_evidence", evidence)
    assert {w["task_id"] for w in inst.waiting_for} == {"analyst_review", "sla_reminder", "sla_breach"}
    return inst


def history(inst: Any) -> dict[str, Any]:
    return dict(inst.main.layer(3))


# ----- the shared fee calculation ends with an error: the boundary event on the call takes over ----------


def test_a_fee_process_that_fails_before_computing_a_fee_takes_the_boundary_path(world: Any) -> None:
    """The fee process has no schedule for a split liability and ends at its error end event before it
    sets ``fee``. BPMN (and Camunda, Flowable) say the caller's error boundary event catches it and the
    dispute goes on to the manual fee review; the called process's data output is not given back, as
    the call did not complete. (It failed the instance: "the called process set none of them. Set them
    in the called process", advice that is wrong for a process that ended with an error.)"""
    engine, _ = world
    inst = at_analyst(engine, SMALL, {"signed_receipt": True})
    inst = engine.resume(inst.id, answers={"user_tasks": {"analyst_review": {"decision": "split_liability"}}})
    assert inst.status == "completed", inst.error
    assert inst.main.resolve("fee_status") == "manual review"
    assert inst.main.get("fee") is None
    done = history(inst)
    assert done["event:fee_failed"]["code"] == "fee_disputed"
    assert "outcome" not in done  # the representment was never submitted


def test_a_fee_the_waiver_review_disputes_is_not_given_back_as_the_calls_output(world: Any) -> None:
    """A large dispute's fee is computed, then the merchant's waiver review disputes it and the fee
    process ends with ``fee_disputed``. The call did not complete: the fee it computed on the way is no
    output of it (SpiffWorkflow 3.2 gives the boundary path none, Camunda 8 propagates no variable of an
    interrupted call), and HISTORY must not record the call as completed with that output."""
    engine, _ = world
    inst = at_analyst(engine, dict(SMALL, amount=2000), {"signed_receipt": True})
    inst = engine.resume(inst.id, answers={"user_tasks": {"analyst_review": {"decision": "represent"}}})
    assert [w["task_id"] for w in inst.waiting_for] == ["approve_waiver"]
    inst = engine.resume(inst.id, answers={"user_tasks": {"approve_waiver": {"waiver": "disputed"}}})
    assert inst.status == "completed", inst.error
    assert inst.main.resolve("fee_status") == "manual review"
    done = history(inst)
    assert "fee" not in done, done.get("activity:calc_fee")
    assert done.get("activity:calc_fee", {}).get("status") != "completed"
    scope = [info for info in inst.branches.values() if info["branch_id"] == "calc_fee"]
    assert [info["status"] for info in scope] == ["cancelled"]


@pytest.mark.parametrize("data", [{"decision": "split_liability", "amount": 100},
                                  {"decision": "represent", "amount": 2000}], ids=["before_fee", "after_fee"])
def test_a_fee_error_caught_around_the_call_stops_the_sub_process_it_runs_in(world: Any, data: Any) -> None:
    """The same error caught one level up, by the boundary event of the ``settle`` sub-process the call
    runs in: ``settle`` is interrupted as the error is caught, so its ``book`` step after the call never
    runs (SpiffWorkflow 3.2 booked the fee, then ran the boundary path too) and no fee comes back."""
    engine, _ = world
    files = [str(HERE / "settlement51.bpmn"), str(HERE / "fee51.bpmn")]
    inst = engine.run(engine.start(load_process(files), dict(data, liability="merchant")))
    if inst.status == "waiting":
        inst = engine.resume(inst.id, answers={"user_tasks": {"approve_waiver": {"waiver": "disputed"}}})
    assert inst.status == "completed", inst.error
    assert inst.main.resolve("settlement") == "held"
    assert inst.main.get("fee") is None and inst.main.get("booked") is None
    assert not [e for c in inst.contexts.values() for e in c.tape if e.activity == "book"]


def test_a_fee_call_that_completes_gives_back_its_fee_only(world: Any) -> None:
    engine, _ = world
    inst = at_analyst(engine, SMALL, {"signed_receipt": True})
    inst = engine.resume(inst.id, answers={"user_tasks": {"analyst_review": {"decision": "represent"}}})
    assert inst.status == "completed", inst.error
    done = history(inst)
    assert done["fee"] == 16.0  # the merchant is liable: 15 + 1 % of 100
    assert "base_fee" not in done and "waiver" not in done
    assert done["activity:calc_fee"]["status"] == "completed"
    assert done["outcome"] == "represented"


# ----- the merchant's deadline, the analyst's SLA ------------------------------------------------------------


def test_evidence_after_the_merchant_deadline_is_refused_naming_the_deadline(world: Any) -> None:
    engine, clock = world
    inst = engine.run(engine.start(load_process(FILES), SMALL))
    assert {w["task_id"] for w in inst.waiting_for} == {"merchant_deadline", "await_evidence"}
    clock.now += 10 * 24 * HOUR + 1
    with pytest.raises(InstanceStateError, match="merchant_deadline"):
        engine.send_event(inst.id, "merchant_evidence", {"signed_receipt": True})
    inst = engine.load(inst.id)
    assert inst.status == "completed"
    assert inst.main.resolve("outcome") == "won_by_default"
    assert inst.main.get("evidence") is None


def test_the_sla_reminder_fires_once_and_the_breach_takes_the_task_from_the_analyst(world: Any) -> None:
    engine, clock = world
    inst = at_analyst(engine, SMALL, {"signed_receipt": True})
    clock.now += 5 * HOUR
    inst = engine.resume(inst.id)
    clock.now += 5 * HOUR
    inst = engine.resume(inst.id)
    reminders = [e for e in inst.main.tape if e.kind == "begin" and e.activity == "remind_analyst"]
    assert len(reminders) == 1
    assert {w["task_id"] for w in inst.waiting_for} == {"analyst_review", "sla_breach"}
    clock.now += 2 * 24 * HOUR
    with pytest.raises(InstanceStateError, match="sla_breach"):
        engine.complete_user_task(inst.id, "analyst_review", {"decision": "accept"})
    inst = engine.load(inst.id)
    assert inst.status == "completed", inst.error
    done = history(inst)
    assert done["escalated"] is True and done["reminder_sent"] is True
    assert "activity:analyst_review" not in done


# ----- the CLI, one process per step, as operators and cron run it ----------------------------------------


def layerflow(store: str, *args: str) -> tuple[int, Any, str]:
    out = subprocess.run([sys.executable, "-m", "engine.cli", *args, "--store", store], cwd=ROOT,
                         env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT), "HOME": str(ROOT)},
                         capture_output=True, text=True, timeout=120)
    doc = json.loads(out.stdout) if "--json" in args else out.stdout
    return out.returncode, doc, out.stderr


def test_a_large_dispute_through_the_cli_with_save_and_resume_at_each_wait(tmp_path: Path) -> None:
    store = f"sqlite:///{tmp_path / 'disputes.db'}"
    answers = tmp_path / "answers.json"
    answers.write_text(json.dumps({"confirmations": {"assess_join/liability": "issuer"}}))
    code, doc, _ = layerflow(store, "run", *FILES, "--data", json.dumps(LARGE), "--answers", str(answers), "--json")
    assert code == 3, doc
    iid = doc["instance_id"]
    (conflict,) = doc["conflicts"]
    assert conflict["values"] == {"model_liability": "merchant", "rule_liability": "issuer"}
    assert conflict["resolution"]["resolver"] == "human" and conflict["resolution"]["value"] == "issuer"
    assert [m["name"] for m in doc["messages_out"]] == ["evidence_requested"]
    assert doc["messages_out"][0]["payload"] == {"dispute_id": "CB-900", "liability": "issuer"}

    code, doc, _ = layerflow(store, "send", iid, "merchant_evidence", "--json-payload",
                             '{"signed_receipt": false, "tracking": "TRK-9"}', "--json")
    assert code == 3, doc
    assert doc["layers"]["L3"]["evidence"] == {"signed_receipt": False, "tracking": "TRK-9"}

    code, doc, err = layerflow(store, "resume", iid, "--answer", 'analyst_review={"decision": "represent"}', "--json")
    assert code == 0, err
    done: Callable[[str], Any] = doc["layers"]["L3"].get
    assert done("outcome") == "written_off" and done("rejection") == "missing receipt"
    assert done("fee") == 9.0 and done("liability") == "issuer"
    assert done("activity:submit_to_issuer")["caught_by"] == ["issuer_rejects"]

    code, tape, _ = layerflow(store, "tape", iid, "--kind", "human_decision", "--json")
    assert code == 0 and len(tape) == 1
    code, before, _ = layerflow(store, "replay", iid, "--until", str(tape[0]["seq"]), "--json")
    assert code == 0
    assert "evidence" not in before["layers"]["L3"] and "liability" not in before["layers"]["L3"]


def test_a_step_that_reads_what_a_rollback_took_away_names_the_rollback(tmp_path: Path) -> None:
    """An operator rolls the dispute back to the snapshot from before the merchant's evidence came; the
    process stays at the analyst (README: "the process does not go back with it ... a later step that
    reads such a key fails naming it, and `layerflow resume ID --set KEY=VALUE` gives it back"). The
    failure must say the rollback took ``evidence`` away, not send the operator looking for a start-data
    key or a form field the analyst left out: the message that brought it will never come again."""
    store = f"sqlite:///{tmp_path / 'disputes.db'}"
    engine = Engine(store)
    inst = engine.run(engine.start(load_process(FILES), SMALL))
    inst = engine.send_event(inst.id, "merchant_evidence", {"signed_receipt": True})
    code, out, err = layerflow(store, "rollback", inst.id, "before evidence_in", "--json")
    assert code == 0, err
    assert "evidence" not in out["layers"]["L3"]
    code, doc, _ = layerflow(store, "resume", inst.id, "--answer", 'analyst_review={"decision": "represent"}', "--json")
    assert code == 1 and doc["error"]["task_id"] == "submit_to_issuer"
    message = doc["error"]["message"]
    assert "NameError" in message and "'evidence'" in message
    assert "rollback" in message and out["snapshot_id"] in message and f"event {out['event_seq']}" in message
    assert "--set evidence=" in message
    assert "the start data" not in message and "answer it there" not in message


def variant(tmp_path: Path, old: str, new: str) -> list[str]:
    """The dispute process with one text replaced, beside its config, handlers and the fee process."""
    for name in ("chargeback51.layerflow.yaml", "chargeback51_handlers.py", "fee51.bpmn"):
        shutil.copy(HERE / name, tmp_path / name)
    text = (HERE / "chargeback51.bpmn").read_text()
    assert text.count(old) == 1
    (tmp_path / "chargeback51.bpmn").write_text(text.replace(old, new))
    return [str(tmp_path / "chargeback51.bpmn"), str(tmp_path / "fee51.bpmn")]


def test_a_reminder_cycle_written_as_a_timeduration_is_refused_not_fired_once(tmp_path: Path) -> None:
    """The modeler's timer type was left at Duration and the SLA team typed the cycle they meant,
    three reminders four hours apart. SpiffWorkflow's duration parser skips what it cannot read before
    the time part and reads "R3/PT4H" as PT4H: one reminder, silently. Refused, naming the timer and
    the timeCycle to write; so is any other text that is no duration ("P1XT4H" read as four hours)."""
    files = variant(tmp_path, '<bpmn:timeDuration>"PT4H"</bpmn:timeDuration>',
                    '<bpmn:timeDuration>"R3/PT4H"</bpmn:timeDuration>')
    with pytest.raises(ProcessError) as refused:
        load_process(files)
    message = str(refused.value)
    assert "sla_reminder" in message and "timeCycle" in message and '"PT4H"' in message
    files = variant(tmp_path, '<bpmn:timeDuration>"PT4H"</bpmn:timeDuration>',
                    '<bpmn:timeDuration>"P1XT4H"</bpmn:timeDuration>')
    with pytest.raises(ProcessError, match="sla_reminder"):
        load_process(files)


def test_a_reminder_delay_from_the_context_that_is_a_cycle_stops_the_dispute_naming_the_timer(
        tmp_path: Path) -> None:
    files = variant(tmp_path, '<bpmn:timeDuration>"PT4H"</bpmn:timeDuration>',
                    "<bpmn:timeDuration>reminder_after</bpmn:timeDuration>")
    engine = Engine("memory://")
    inst = engine.run(engine.start(load_process(files), dict(SMALL, reminder_after="R3/PT4H")))
    inst = engine.send_event(inst.id, "merchant_evidence", {"signed_receipt": True})
    assert inst.status == "error"
    assert inst.error["task_id"] == "sla_reminder"
    assert "R3/PT4H" in inst.error["message"] and "timeCycle" in inst.error["message"]
