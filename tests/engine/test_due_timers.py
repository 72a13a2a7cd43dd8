"""Due timers of waiting instances: ``Engine.due_timers`` and ``layerflow timers [--fire]``.

Nothing fires a timer by itself; a run or resume after its due time does. These find the
instances whose time has come (from record heads) and resume them, as cron would."""

from __future__ import annotations

import json
import time
from pathlib import Path

from click.testing import CliRunner

from engine import Engine, load_process
from engine.cli import main

from engine_helpers import chain_bpmn, script_task

HOUR = 3600.0


class Clock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def timer_process(tmp_path: Path, pid: str = "wait_an_hour", duration: str = "PT1H") -> Path:
    path = tmp_path / f"{pid}.bpmn"
    path.write_text(chain_bpmn(pid, [
        f'<bpmn:intermediateCatchEvent id="an_hour"><bpmn:timerEventDefinition><bpmn:timeDuration>"{duration}"'
        "</bpmn:timeDuration></bpmn:timerEventDefinition></bpmn:intermediateCatchEvent>",
        script_task("after", "done = True")]), encoding="utf-8")
    return path


def person_process(tmp_path: Path) -> Path:
    path = tmp_path / "person.bpmn"
    path.write_text(chain_bpmn("person", ['<bpmn:userTask id="review"/>']), encoding="utf-8")
    return path


def test_due_timers_lists_what_is_due_by_the_engine_clock_and_resume_fires_it(tmp_path: Path) -> None:
    clock = Clock(float(int(time.time())))
    engine = Engine(f"sqlite:///{tmp_path / 'timers.db'}", clock=clock)
    first = engine.run(engine.start(load_process(timer_process(tmp_path)), {}))
    clock.now += HOUR / 2
    second = engine.run(engine.start(load_process(timer_process(tmp_path)), {}))
    person = engine.run(engine.start(load_process(person_process(tmp_path)), {}))
    assert first.status == second.status == person.status == "waiting"
    assert engine.due_timers() == []  # waiting, not due
    clock.now += HOUR / 2
    (only,) = engine.due_timers()
    assert (only["instance_id"], only["task_id"], only["kind"]) == (first.id, "an_hour", "timer")
    assert only["version"] == first.version
    clock.now += HOUR
    due = engine.due_timers()
    assert [d["instance_id"] for d in due] == [first.id, second.id]  # earliest first; the person's not
    for item in due:
        done = engine.resume(engine.load(item["instance_id"]))
        assert done.status == "completed" and done.main.get("done") is True
    assert engine.due_timers() == []


def test_layerflow_timers_lists_and_fires_due_timers(tmp_path: Path, monkeypatch) -> None:
    store = f"sqlite:///{tmp_path / 'cli.db'}"
    monkeypatch.setenv("LAYERFLOW_STORE", store)
    # the CLI reads the wall clock (as SpiffWorkflow's timers do): a one-second timer, waited out
    engine = Engine(store)
    late = engine.run(engine.start(load_process(timer_process(tmp_path, "soon", "PT1S")), {}))
    fresh = engine.run(engine.start(load_process(timer_process(tmp_path, "fresh")), {}))
    assert late.status == fresh.status == "waiting"
    time.sleep(1.2)
    runner = CliRunner()
    listed = runner.invoke(main, ["timers", "--json"], catch_exceptions=False)
    assert listed.exit_code == 0, listed.output
    doc = json.loads(listed.stdout)
    assert [d["instance_id"] for d in doc["due"]] == [late.id] and doc["fired"] == []
    fired = runner.invoke(main, ["timers", "--fire", "--json"], catch_exceptions=False)
    assert fired.exit_code == 0, fired.output
    assert json.loads(fired.stdout)["fired"] == [{"instance_id": late.id, "status": "completed",
                                                  "version": Engine(store).load(late.id).version}]
    assert Engine(store).load(late.id).main.get("done") is True
    assert Engine(store).load(fresh.id).status == "waiting"  # not due: left alone
    quiet = runner.invoke(main, ["timers"], catch_exceptions=False)
    assert quiet.exit_code == 0 and quiet.stdout == "" and "no timer is due" in quiet.stderr


def test_layerflow_timers_skips_an_instance_another_process_holds(tmp_path: Path, monkeypatch) -> None:
    from context_layers.stores import open_store

    store = f"sqlite:///{tmp_path / 'held.db'}"
    monkeypatch.setenv("LAYERFLOW_STORE", store)
    engine = Engine(store)
    late = engine.run(engine.start(load_process(timer_process(tmp_path, "soon", "PT1S")), {}))
    time.sleep(1.2)
    raw = open_store(store)
    assert raw.acquire_lease(late.id, "worker-7", 60)
    fired = CliRunner().invoke(main, ["timers", "--fire", "--json"], catch_exceptions=False)
    assert json.loads(fired.stdout)["fired"] == [{"instance_id": late.id, "skipped": "held by worker-7"}]
    assert Engine(store).load(late.id).status == "waiting"


def test_an_engine_takes_a_context_layers_store_as_it_is(tmp_path: Path) -> None:
    """A ``context_layers.stores`` store (what workers share) is wrapped in the engine's record
    view; it used to be taken as one and failed at the first load."""
    from context_layers.stores import open_store

    raw = open_store(f"sqlite:///{tmp_path / 'raw.db'}")
    engine = Engine(raw)
    instance = engine.run(engine.start(load_process(person_process(tmp_path)), {}))
    assert engine.load(instance.id).status == "waiting" and engine.store.list()[0]["id"] == instance.id


def _in_a_sub_process(tmp_path: Path, timer: str) -> Path:
    path = tmp_path / "in_sub.bpmn"
    path.write_text(chain_bpmn("in_sub", [
        '<bpmn:subProcess id="sub"><bpmn:startEvent id="s0"/>'
        f'<bpmn:intermediateCatchEvent id="wait"><bpmn:timerEventDefinition>{timer}</bpmn:timerEventDefinition>'
        '</bpmn:intermediateCatchEvent><bpmn:endEvent id="s1"/>'
        '<bpmn:sequenceFlow id="s_a" sourceRef="s0" targetRef="wait"/>'
        '<bpmn:sequenceFlow id="s_b" sourceRef="wait" targetRef="s1"/></bpmn:subProcess>',
        script_task("after", "done = True")]), encoding="utf-8")
    return path


def test_timers_fire_by_the_engine_clock_only_even_behind_the_wall_clock(tmp_path: Path) -> None:
    """SpiffWorkflow checks its duration and date timers against the wall clock: under an engine
    whose clock is a year behind, a timer due in an hour of that clock fired at once."""
    clock = Clock(time.time() - 365 * 24 * HOUR)
    engine = Engine(f"sqlite:///{tmp_path / 'timers.db'}", clock=clock)
    for path in (timer_process(tmp_path), _in_a_sub_process(tmp_path, '<bpmn:timeDuration>"PT1H"</bpmn:timeDuration>')):
        instance = engine.run(engine.start(load_process(path), {}))
        assert instance.status == "waiting" and instance.main.get("done") is None
        instance = engine.resume(engine.load(instance.id))
        assert instance.status == "waiting", "not due yet by the engine's clock"
    clock.now += HOUR
    for item in engine.due_timers():
        assert engine.resume(engine.load(item["instance_id"])).main.get("done") is True


def test_a_timer_in_a_sub_process_is_listed_once(tmp_path: Path) -> None:
    """SpiffWorkflow's task iterator goes down into a running sub-process, and the sub-processes
    were searched again: every timer in one was listed twice in ``waiting_for``."""
    engine = Engine("memory://")
    instance = engine.run(engine.start(load_process(_in_a_sub_process(tmp_path, '<bpmn:timeDuration>"PT1H"'
                                                                                 '</bpmn:timeDuration>')), {}))
    assert [(w["kind"], w["task_id"]) for w in instance.waiting_for] == [("timer", "wait")]


def test_a_confirmation_timeout_is_due_like_a_timer_and_firing_takes_the_default(tmp_path: Path,
                                                                                monkeypatch) -> None:
    """A join's human_confirm with a timeout (the loan demo's: 300 s, default pending_dual_approval):
    its waiting item carries ``due``, the store's timer index lists the instance, ``due_timers``
    lists the confirmation once the timeout has run out, and resuming then takes the default. Before,
    nothing listed it: only a ``resume`` someone happened to run applied the timeout."""
    from context_layers.stores import open_store

    from engine_helpers import LOAN, LOAN_CONFLICT

    clock = Clock(float(int(time.time())))
    url = f"sqlite:///{tmp_path / 'confirm.db'}"
    engine = Engine(url, clock=clock)
    instance = engine.run(engine.start(load_process(LOAN), LOAN_CONFLICT))
    assert instance.status == "waiting"
    [item] = instance.waiting_for
    [asked] = instance.confirmations
    assert item["kind"] == "confirmation" and item["due"] == \
        time.strftime("%Y-%m-%dT%H:%M:%S+00:00", time.gmtime(asked["deadline"]))
    assert engine.due_timers() == []
    assert [s["instance_id"] for s in open_store(url).due_instances(asked["deadline"])] == [instance.id]
    clock.now += 301
    [due] = engine.due_timers()
    assert (due["kind"], due["id"], due["instance_id"]) == ("confirmation", "review_join/approval_status", instance.id)
    done = engine.resume(engine.load(instance.id))
    assert done.status == "completed"
    assert done.confirmations[0]["timed_out"] is True
    assert done.main.resolve("approval_status") == "pending_dual_approval"
    assert engine.due_timers() == []

    # the CLI, on the wall clock: `layerflow timers` names it, `--fire` applies the default
    config = tmp_path / "loan.layerflow.yaml"
    config.write_text((LOAN.parent / "loan_approval.layerflow.yaml").read_text().replace("timeout: 300", "timeout: 1"))
    store = f"sqlite:///{tmp_path / 'cli.db'}"
    monkeypatch.setenv("LAYERFLOW_STORE", store)
    waiting = Engine(store).run(Engine(store).start(load_process(LOAN, config=config), LOAN_CONFLICT))
    assert waiting.status == "waiting"
    time.sleep(1.2)
    runner = CliRunner()
    listed = runner.invoke(main, ["timers"], catch_exceptions=False)
    assert f"{waiting.id}  confirmation review_join/approval_status times out  due " in listed.stdout
    fired = runner.invoke(main, ["timers", "--fire", "--json"], catch_exceptions=False)
    assert fired.exit_code == 0, fired.output
    assert [(f["instance_id"], f["status"]) for f in json.loads(fired.stdout)["fired"]] == [(waiting.id, "completed")]
    assert Engine(store).load(waiting.id).main.resolve("approval_status") == "pending_dual_approval"
