"""Round 31 gaps: replay past the tape's end says the same in CLI and REST; due timers are due by
the clock of the instance that fires them; timer and event items of a multi-instance line say
which instance waits; a runtime config cannot change what the BPMN draws (``type``)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from engine import Engine, load_process

from engine_helpers import flow, write_elements
from test_due_timers import HOUR, Clock, timer_process

EXAMPLES = Path(__file__).resolve().parents[2] / "bpmn_examples"
TOKEN = "gaps31-token-0123456789abcdef"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


# ----------------------------------------------------------------------------- 1. replay past the end


def test_replay_past_the_tapes_end_gives_where_the_state_stands_in_cli_and_rest_alike(tmp_path: Path) -> None:
    """`until` is the position the state was rebuilt to, at most the tape's end, in both documents;
    `until_requested` is what was asked (null: the whole tape)."""
    from click.testing import CliRunner
    from fastapi.testclient import TestClient

    from engine.api import create_app
    from engine.cli import LOAN_SCENARIOS, main

    store = f"sqlite:///{tmp_path / 'replay.db'}"
    with TestClient(create_app(store, EXAMPLES, TOKEN)) as client:
        iid = client.post("/api/instances", json={"process_id": "loan_approval", "data": LOAN_SCENARIOS["fast"]},
                          headers=AUTH).json()["instance_id"]

        def rest(**params: Any) -> dict[str, Any]:
            reply = client.get(f"/api/instances/{iid}/replay", params=params, headers=AUTH)
            assert reply.status_code == 200, reply.text
            return reply.json()

        rest_past, rest_whole, rest_at_3 = rest(until=99999), rest(), rest(until=3)

    def cli(*args: str) -> Any:
        ran = CliRunner().invoke(main, ["replay", iid, *args, "--store", store])
        assert ran.exit_code == 0, ran.output
        return ran.stdout

    cli_past, cli_whole = json.loads(cli("--until", "99999", "--json")), json.loads(cli("--json"))
    cli_at_3 = json.loads(cli("3", "--json"))
    end = cli_whole["tape_end"]
    assert end > 3 and rest_whole["tape_last_seq"] == end
    for doc in (cli_past, rest_past):
        assert (doc["until"], doc["until_requested"], doc["tape_end"], doc["tape_last_seq"]) == (end, 99999, end, end)
    for doc in (cli_whole, rest_whole):
        assert (doc["until"], doc["until_requested"]) == (end, None)
    for doc in (cli_at_3, rest_at_3):
        assert (doc["until"], doc["until_requested"]) == (3, 3)
    assert rest_past["event"]["seq"] == end  # REST's event at `until`: the tape's last one
    assert cli_past["layers"] == cli_whole["layers"]
    text = cli("--until", "99999").splitlines()[0]
    assert text == f"context main of {iid} at #{end} (the tape ends at #{end}: this is its last state)"


# ----------------------------------------------------------------------------- 2. due by the instance's clock


@pytest.mark.parametrize("store_kind", ["sqlite", "memory"])
def test_a_timer_due_by_the_instances_clock_is_due_though_the_engine_clock_is_behind(
        tmp_path: Path, store_kind: str) -> None:
    """An engine ahead (`--now`, or a host whose clock runs fast) saved the instance after its timer's
    due time without running it (an inject): the instance's clock never runs behind that save, so a
    resume on an engine behind fires the timer, and ``due_timers`` (cron's `timers --fire`, the
    workers) lists it for that engine too."""
    from engine.store import open_store

    t0 = 1_800_000_000.0
    store = open_store(f"sqlite:///{tmp_path / 'timers.db'}" if store_kind == "sqlite" else "memory://")
    behind = Engine(store, clock=Clock(t0 + HOUR / 4))
    started = Engine(store, clock=Clock(t0))
    instance = started.run(started.start(load_process(timer_process(tmp_path)), {}))
    assert instance.status == "waiting" and behind.due_timers() == []
    ahead = Engine(store, clock=Clock(t0 + 2 * HOUR))
    ahead.inject(ahead.load(instance.id), {"note": "checked"})
    assert ahead.load(instance.id).status == "waiting"  # an inject runs nothing

    (item,) = behind.due_timers()  # the engine's clock says 15 minutes, the instance's 2 hours
    assert (item["instance_id"], item["task_id"], item["kind"]) == (instance.id, "an_hour", "timer")
    assert behind.load(instance.id).clock() >= t0 + 2 * HOUR
    done = behind.resume(behind.load(item["instance_id"]))
    assert done.status == "completed" and done.main.get("done") is True
    assert behind.due_timers() == []


def test_a_timer_not_due_by_the_instances_clock_is_not_listed_while_its_floor_is_ahead(tmp_path: Path) -> None:
    t0 = 1_800_000_000.0
    store = f"sqlite:///{tmp_path / 'timers.db'}"
    ahead = Engine(store, clock=Clock(t0 + 2 * HOUR))  # started ahead: due 3 hours after t0
    instance = ahead.run(ahead.start(load_process(timer_process(tmp_path)), {}))
    behind = Engine(store, clock=Clock(t0))
    assert behind.due_timers() == [] and ahead.due_timers() == []
    assert behind.resume(behind.load(instance.id)).status == "waiting"  # agrees: not due yet
    assert [i["instance_id"] for i in Engine(store, clock=Clock(t0 + 3 * HOUR)).due_timers()] == [instance.id]


# ----------------------------------------------------------------------------- 3. what timer and event items say


def multi_instance_waits(tmp_path: Path) -> Path:
    """Each voter's line of a parallel multi-instance sub-process waits for a timer, a message and
    a user task with a boundary timer."""
    sub = f'''<bpmn:subProcess id="per_voter"><bpmn:multiInstanceLoopCharacteristics>
      <bpmn:loopDataInputRef>voters</bpmn:loopDataInputRef><bpmn:inputDataItem id="voter"/>
      </bpmn:multiInstanceLoopCharacteristics>
      <bpmn:startEvent id="s_start"/><bpmn:parallelGateway id="s_split"/>
      <bpmn:intermediateCatchEvent id="wait"><bpmn:timerEventDefinition><bpmn:timeDuration>"PT1H"</bpmn:timeDuration>
        </bpmn:timerEventDefinition></bpmn:intermediateCatchEvent>
      <bpmn:intermediateCatchEvent id="docs"><bpmn:messageEventDefinition messageRef="m_docs"/>
        </bpmn:intermediateCatchEvent>
      <bpmn:userTask id="vote"/>
      <bpmn:boundaryEvent id="late" attachedToRef="vote"><bpmn:timerEventDefinition>
        <bpmn:timeDuration>"PT2H"</bpmn:timeDuration></bpmn:timerEventDefinition></bpmn:boundaryEvent>
      <bpmn:parallelGateway id="s_join"/><bpmn:endEvent id="s_end"/><bpmn:endEvent id="late_end"/>
      {flow("s_start", "s_split")}{flow("s_split", "wait")}{flow("s_split", "docs")}{flow("s_split", "vote")}
      {flow("wait", "s_join")}{flow("docs", "s_join")}{flow("vote", "s_join")}{flow("s_join", "s_end")}
      {flow("late", "late_end")}
    </bpmn:subProcess>'''
    return write_elements(tmp_path, "votes", ['<bpmn:startEvent id="start"/>', sub, '<bpmn:endEvent id="end"/>',
                                              flow("start", "per_voter"), flow("per_voter", "end")],
                          '<bpmn:message id="m_docs" name="documents"/>\n')


def test_timer_and_event_items_of_a_multi_instance_line_say_which_instance_waits(tmp_path: Path) -> None:
    """As a user task's item does (``instance`` from 1 and ``input``): the items of one ``task_id``
    are told apart by the instance they wait in, in ``waiting_for`` of the Python API, the CLI's
    ``--json`` and REST (one document: ``to_document``)."""
    engine = Engine(f"sqlite:///{tmp_path / 'votes.db'}")
    instance = engine.run(engine.start(load_process(multi_instance_waits(tmp_path)), {"voters": ["ann", "bob"]}))
    assert instance.status == "waiting"
    by_task: dict[str, list[dict[str, Any]]] = {}
    for item in instance.to_document()["waiting_for"]:
        by_task.setdefault(item["task_id"], []).append(item)
    assert sorted(by_task) == ["docs", "late", "vote", "wait"]
    for task_id, items in by_task.items():
        assert sorted((i["instance"], json.dumps(i["input"])) for i in items) == [
            (1, '{"voter": "ann"}'), (2, '{"voter": "bob"}')], task_id
    for item in by_task["wait"] + by_task["late"]:
        assert item["kind"] == "timer" and item["due"] and item["context"] != "main"
    for item in by_task["docs"]:
        assert (item["kind"], item["event"], item["event_kind"]) == ("event", "documents", "message")
        assert item["context"] != "main"  # the line's context, as a timer's item names it
    # the line's context is the same for all of one instance's items
    contexts = {(i["instance"], i["task_id"]): i.get("context") for items in by_task.values() for i in items}
    for n in (1, 2):
        assert contexts[(n, "wait")] and contexts[(n, "wait")].split("/")[1] == contexts[(n, "docs")].split("/")[1]
    # and saved as it was said: loaded back, the same items
    assert engine.load(instance.id).waiting_for == instance.waiting_for


def test_timer_and_event_items_outside_a_multi_instance_carry_no_instance(tmp_path: Path) -> None:
    path = write_elements(tmp_path, "plain", [
        '<bpmn:startEvent id="start"/><bpmn:parallelGateway id="split"/><bpmn:parallelGateway id="join"/>',
        '<bpmn:intermediateCatchEvent id="wait"><bpmn:timerEventDefinition><bpmn:timeDuration>"PT1H"'
        '</bpmn:timeDuration></bpmn:timerEventDefinition></bpmn:intermediateCatchEvent>',
        '<bpmn:intermediateCatchEvent id="docs"><bpmn:messageEventDefinition messageRef="m_docs"/>'
        '</bpmn:intermediateCatchEvent><bpmn:endEvent id="end"/>',
        flow("start", "split"), flow("split", "wait"), flow("split", "docs"), flow("wait", "join"),
        flow("docs", "join"), flow("join", "end")], '<bpmn:message id="m_docs" name="documents"/>\n')
    engine = Engine("memory://")
    instance = engine.run(engine.start(load_process(path), {}))
    items = {i["task_id"]: i for i in instance.waiting_for}
    assert set(items) == {"wait", "docs"}
    for item in items.values():
        assert "instance" not in item and "input" not in item
    assert items["wait"]["due"] and items["docs"]["event"] == "documents"
    assert (items["docs"]["context"], items["wait"]["context"]) == ("main/docs@2", "main/wait@2")  # each branch's


# ----------------------------------------------------------------------------- 4. runtime config `type`


@pytest.fixture(name="service")
def governance_service() -> Any:
    from engine.governance import GovernanceService

    return GovernanceService(Engine("memory://"), EXAMPLES)


def _waiting_loan(service: Any) -> str:
    from engine.cli import LOAN_SCENARIOS
    from engine.governance import StartArgs

    doc = service.start(StartArgs(process_id="loan_approval", data=LOAN_SCENARIOS["conflict"]))
    assert doc["status"] == "waiting", doc["status"]
    return str(doc["instance_id"])


@pytest.mark.parametrize("mode", ["merge", "replace"])
@pytest.mark.parametrize("element, value", [("risk_assessment", "scriptTask"), ("review_join", "XOR_SPLIT"),
                                            ("risk_assessment", "AND_JOIN")])
def test_a_runtime_config_that_changes_type_is_refused_naming_the_element_and_field(
        service: Any, element: str, value: str, mode: str) -> None:
    """``type`` says what the BPMN draws; the BPMN decides how an element runs, so a runtime change
    of it would do nothing: refused (ConfigError, REST 422 as any invalid config), nothing applied, nothing on the tape."""
    from engine.governance import ConfigArgs
    from context_layers.errors import ConfigError

    iid = _waiting_loan(service)
    before = service.load(iid)
    with pytest.raises(ConfigError) as err:
        service.config(iid, ConfigArgs(activity_id=element, mode=mode,
                                       config={"type": value, "preserveKeys": ["risk_level"]}))
    text = str(err.value)
    assert repr(element) in text and "type" in text and repr(value) in text and "BPMN" in text
    assert [(p["id"], p["field"]) for p in err.value.problems] == [(element, "type")]
    after = service.load(iid)
    assert after.version == before.version and len(after.main.tape) == len(before.main.tape)


def test_a_runtime_config_that_repeats_the_elements_type_is_taken(tmp_path: Path) -> None:
    """A config sent back as it was read (its ``type`` the element's own) is taken; ``replace``
    keeps the element's ``type`` as it keeps its handler."""
    import shutil

    from engine.governance import ConfigArgs, GovernanceService

    catalog = tmp_path / "catalog"
    shutil.copytree(EXAMPLES, catalog)
    config = catalog / "loan_approval.layerflow.yaml"
    config.write_text(config.read_text(encoding="utf-8").replace("review_join:\n", "review_join:\n  type: AND_JOIN\n"),
                      encoding="utf-8")
    service = GovernanceService(Engine("memory://"), catalog)
    iid = _waiting_loan(service)
    assert service.load(iid).process.config("review_join").type == "AND_JOIN"
    done = service.config(iid, ConfigArgs(activity_id="review_join", config={
        "type": "AND_JOIN", "gatewayId": "review_join", "humanConfirm": {"timeout": 600}}))
    assert done["config"]["humanConfirm"]["timeout"] == 600 and done["config"]["type"] == "AND_JOIN"
    replaced = service.config(iid, ConfigArgs(activity_id="review_join", mode="replace",
                                              config={"mergeStrategy": "LAST_WRITER_WINS"}))
    assert replaced["config"]["type"] == "AND_JOIN" and replaced["config"]["mergeStrategy"] == "LAST_WRITER_WINS"


def test_a_runtime_config_for_another_element_is_refused(service: Any) -> None:
    from context_layers.errors import ConfigError
    from engine.governance import ConfigArgs

    iid = _waiting_loan(service)
    with pytest.raises(ConfigError) as err:
        service.config(iid, ConfigArgs(activity_id="review_join", config={"gatewayId": "parallel_review",
                                                                          "humanConfirm": {"timeout": 600}}))
    assert [(p["id"], p["field"]) for p in err.value.problems] == [("review_join", "gatewayId")]
    assert "'parallel_review'" in str(err.value)


def test_rest_config_refuses_a_type_change_as_an_invalid_config(tmp_path: Path) -> None:
    from fastapi.testclient import TestClient

    from engine.api import create_app
    from engine.cli import LOAN_SCENARIOS

    with TestClient(create_app(f"sqlite:///{tmp_path / 'rest.db'}", EXAMPLES, TOKEN)) as client:
        iid = client.post("/api/instances", json={"process_id": "loan_approval", "data": LOAN_SCENARIOS["conflict"]},
                          headers=AUTH).json()["instance_id"]
        reply = client.post("/api/context-governance/config", headers=AUTH, json={
            "instance_id": iid, "activity_id": "risk_assessment", "config": {"type": "scriptTask"}})
    assert reply.status_code == 422, reply.text  # as every invalid config (``invalid_config``)
    assert reply.json()["error"]["kind"] == "invalid_config"
    text = json.dumps(reply.json())
    assert "risk_assessment" in text and "type" in text and "scriptTask" in text
