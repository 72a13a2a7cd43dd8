"""Gaps closed in round 22.

(a) An event-based gateway waiting on a timer, a message and a signal listed its three waits in
    ``waiting_for`` under one ``id`` (the gateway's task), and only the message and signal items
    named their catch event (``event_id``); the timer's named it as ``task_id`` only. Each branch's
    item now has an ``id`` of its own (the task of its catch event, which runs when it wins), its
    ``event_id`` and the ``gateway_id`` it races at; ``kind`` and ``task_id`` are as before (the
    message's and signal's ``task_id`` the gateway, the timer's its timer event). A conditional branch
    was not listed at all; it is now, as the others are.
(b) A conditional event (intermediate, boundary, an event sub-process's start) whose condition reads a
    name nothing in the process sets waited silently for ever. ``validate`` warns now
    (``condition_name_never_set``), naming the file, the event, the name and what to do; a warning,
    as the name may come from --data, a message's payload or REST.
(c) A command refused as bad input (exit 2) after it found its instance (``resume`` with a bad answers
    file, an ``--answer`` that names nothing, a ``--set`` the layer rules refuse; ``send`` of an event
    nobody waits for; ``cancel``) gave ``--json`` a document with empty layers and nothing in
    ``waiting_for``, while the instance still waited. It now gives the instance as it is (nothing of
    the refused command applied): its layers and ``waiting_for``, with the refusal in ``error`` and the
    instance's real status in ``error.instance_status`` (``instance_error``: an instance's own error).
    ``status`` stays ``"error"``: the contract pairs a non-null ``error`` with it
    (tests/engine/test_cli_contract_12.py), and a script reading ``status`` alone must see the refusal.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from engine import Engine, load_process
from engine.validate import validate_process
from engine import spiff

from engine_helpers import cli_in_a_tmp_store, run_json

cli = cli_in_a_tmp_store

HERE = Path(__file__).parent
RACE = HERE / "unseen2" / "approval_race.bpmn"  # Gateway_0race: message approval, signal veto, timer P3D


# ----- (a) each branch of an event-based gateway is its own waiting_for item ------------------------------------

def _branch_tasks(instance: Any) -> dict[str, str]:
    """BPMN id -> task id of the gateway's branches (their catch events' tasks)."""
    gateway = next(t for t in instance.workflow.get_tasks() if spiff.bpmn_id_of(t) == "Gateway_0race")
    return {spiff.bpmn_id_of(c): str(c.id) for c in gateway.children}


def test_each_branch_of_an_event_based_gateway_waits_under_its_own_id() -> None:
    engine = Engine(store="memory://")
    instance = engine.run(engine.start(load_process([RACE]), {}))
    branches = _branch_tasks(instance)
    items = {w["event_id"]: w for w in instance.waiting_for}
    assert set(items) == {"Event_0late", "Activity_0approval", "Event_0veto"}, instance.waiting_for
    assert len({w["id"] for w in instance.waiting_for}) == 3
    for event_id, item in items.items():
        assert item["id"] == branches[event_id] and item["gateway_id"] == "Gateway_0race"
    # kinds and task ids as before: the timer's its event, the message's and signal's the gateway
    assert (items["Event_0late"]["kind"], items["Event_0late"]["task_id"]) == ("timer", "Event_0late")
    assert [(items[e]["kind"], items[e]["event_kind"], items[e]["task_id"]) for e in ("Activity_0approval", "Event_0veto")] \
        == [("event", "message", "Gateway_0race"), ("event", "signal", "Gateway_0race")]
    done = engine.send_event(instance, "veto", None, kind="signal")
    assert done.status == "completed" and done.waiting_for == []


def test_the_run_document_lists_each_branch_with_its_event(cli: Any) -> None:
    doc = run_json(cli, "run", str(RACE), code=3)
    assert sorted((w["kind"], w["event_id"], w["gateway_id"]) for w in doc["waiting_for"]) == [
        ("event", "Activity_0approval", "Gateway_0race"), ("event", "Event_0veto", "Gateway_0race"),
        ("timer", "Event_0late", "Gateway_0race")]
    assert len({w["id"] for w in doc["waiting_for"]}) == 3
    shown = run_json(cli, "inspect", doc["instance_id"])
    assert shown["waiting_for"] == doc["waiting_for"]


def test_a_conditional_branch_of_an_event_based_gateway_is_listed_beside_its_message() -> None:
    """It was not listed at all: the gateway's task waited for the message, and a waiting task
    that catches a message was not looked at again for its conditions."""
    engine = Engine(store="memory://")
    instance = engine.run(engine.start(load_process([HERE / "gaps22" / "cond_race.bpmn"]), {}))
    assert sorted((w["event_kind"], w["event_id"], w["gateway_id"], w["task_id"]) for w in instance.waiting_for) == [
        ("conditional", "restocked", "gw", "gw"), ("message", "ok_in", "gw", "gw")]
    assert next(w for w in instance.waiting_for if w["event_kind"] == "conditional")["condition"] == "stock > 5"
    assert len({w["id"] for w in instance.waiting_for}) == 2


# ----- (b) validate warns of a condition that reads a name nothing sets --------------------------------------------

UNSET = HERE / "gaps22" / "cond_unset.bpmn"


def _never_set(paths: list[Path], config: Path | None = None) -> list[Any]:
    return [p for p in validate_process(paths, config).problems if p.code == "condition_name_never_set"]


def test_a_condition_reading_a_name_nothing_sets_is_a_warning_naming_it() -> None:
    found = _never_set([UNSET])
    assert sorted((p.element_id, p.severity, p.field) for p in found) == [
        ("cancel_start", "warning", "condition"), ("restocked", "warning", "condition")]
    by_id = {p.element_id: p for p in found}
    restocked = by_id["restocked"]
    assert restocked.file and restocked.file.endswith("cond_unset.bpmn") and restocked.line
    assert "'restock_count'" in restocked.message and "--set restock_count=VALUE" in restocked.message
    assert "'x'" not in restocked.message and "'len'" not in restocked.message  # bound, a builtin
    assert "'customer_cancelled'" in by_id["cancel_start"].message
    assert validate_process([UNSET]).ok  # a warning: the data may come from outside


@pytest.mark.parametrize("where", ["config", "form", "formless user task"])
def test_a_name_a_config_or_a_form_sets_is_no_warning(tmp_path: Path, where: str) -> None:
    """A formless user task may set any key (the person's answer), as in realworld/conditional_event_subprocess."""
    text = UNSET.read_text()
    config = None
    if where == "config":
        config = tmp_path / "cond_unset.config.yaml"
        config.write_text("prep:\n  llm:\n    outputKeys: [restock_count, customer_cancelled]\n")
    elif where == "formless user task":
        text = text.replace('<bpmn:scriptTask id="prep" name="Count the level">',
                            '<bpmn:userTask id="ask"/><bpmn:scriptTask id="prep" name="Count the level">')
    else:
        text = text.replace('<bpmn:scriptTask id="prep" name="Count the level">', '<bpmn:userTask id="ask" '
                            'xmlns:camunda="http://camunda.org/schema/1.0/bpmn"><bpmn:extensionElements>'
                            '<camunda:formData><camunda:formField id="restock_count" type="long"/><camunda:formField '
                            'id="customer_cancelled" type="boolean"/></camunda:formData></bpmn:extensionElements>'
                            '</bpmn:userTask><bpmn:scriptTask id="prep" name="Count the level">')
    path = tmp_path / "cond_unset.bpmn"
    path.write_text(text)
    assert _never_set([path], config) == []


@pytest.mark.parametrize("path", [HERE / "gaps22" / "cond_race.bpmn", HERE / "realworld" / "conditional_event_subprocess.bpmn"],
                         ids=lambda p: p.name)
def test_processes_that_set_the_names_their_conditions_read_give_no_such_warning(path: Path) -> None:
    assert _never_set([path]) == []


# ----- (c) a refused command's --json document tells the instance's real state -----------------------------------

EXAMPLES = HERE.parents[1] / "bpmn_examples"


@pytest.fixture()
def waiting(cli: Any) -> dict[str, Any]:
    """An instance of parallel_user_task waiting for its review (PROCESS holds ``title``)."""
    return run_json(cli, "run", str(EXAMPLES / "parallel_user_task.bpmn"), "--data", '{"title": "Q3"}', code=3)


def _refused_as_it_is(doc: dict[str, Any], waiting: dict[str, Any], kind: str) -> None:
    assert doc["status"] == "error" and doc["instance_id"] == waiting["instance_id"], doc
    assert doc["layers"] == waiting["layers"] and doc["waiting_for"] == waiting["waiting_for"]
    assert doc["tape_length"] == waiting["tape_length"]
    assert doc["error"]["kind"] == kind and doc["error"]["instance_status"] == "waiting", doc["error"]
    assert "instance_error" not in doc["error"]


@pytest.mark.parametrize("answers, kind, said", [
    ("{bad", "bad_input", "not valid JSON"),
    ({"user_tasks": {"nosuch": {"x": 1}}}, "invalid_answer", "'nosuch'"),
    ({"oops": {}}, "bad_input", "unknown section 'oops'"),
])
def test_resume_refused_for_its_answers_file_shows_the_waiting_instance(
        cli: Any, waiting: dict[str, Any], tmp_path: Path, answers: Any, kind: str, said: str) -> None:
    path = tmp_path / "answers.json"
    path.write_text(answers if isinstance(answers, str) else json.dumps(answers))
    doc = run_json(cli, "resume", waiting["instance_id"], "--answers", str(path), code=2)
    _refused_as_it_is(doc, waiting, kind)
    assert said in doc["error"]["message"] and str(path) in doc["error"]["message"]


def test_resume_refused_midway_shows_the_instance_as_it_was_before(cli: Any, waiting: dict[str, Any]) -> None:
    """An --answer that names nothing, refused after the --set was written: the document shows no --set."""
    doc = run_json(cli, "resume", waiting["instance_id"], "--context", "review", "--set", "note=x",
                   "--answer", 'nosuch={"a": 1}', code=2)
    _refused_as_it_is(doc, waiting, "bad_input")
    assert "'nosuch'" in doc["error"]["message"] and "note" not in json.dumps(doc["contexts"])


def test_an_answer_the_form_refuses_shows_the_instance_still_waiting(cli: Any, waiting: dict[str, Any]) -> None:
    bad = run_json(cli, "resume", waiting["instance_id"], "--answer", 'review={"title": "U"}', code=2)
    assert bad["error"]["instance_status"] == "waiting" and bad["error"]["kind"] == "invalid_answer"
    assert [w["task_id"] for w in bad["waiting_for"]] == ["review"] and bad["layers"]["L1"] == {"title": "Q3"}


def test_send_refused_shows_the_waiting_instance(cli: Any, waiting: dict[str, Any]) -> None:
    doc = run_json(cli, "send", waiting["instance_id"], "nobody_waits", code=2)
    _refused_as_it_is(doc, waiting, "invalid_state")
    assert "'nobody_waits'" in doc["error"]["message"]


def test_a_refused_resume_of_a_failed_instance_keeps_its_own_error(cli: Any, tmp_path: Path) -> None:
    failed = run_json(cli, "run", str(EXAMPLES / "parallel_user_task.bpmn"), "--data", '{"title": "Q3"}',
                      "--answer", 'review={"approved": true}', code=1)
    (tmp_path / "a.json").write_text("[1]")
    doc = run_json(cli, "resume", failed["instance_id"], "--answers", str(tmp_path / "a.json"), code=2)
    assert doc["status"] == "error" and doc["error"]["kind"] == "bad_input"
    assert doc["error"]["instance_error"] == failed["error"] and doc["layers"] == failed["layers"]


def test_a_command_run_before_leaves_no_instance_to_a_later_refusal(cli: Any, waiting: dict[str, Any]) -> None:
    """The instance a command acted on is its own: a later command refused before it finds one gives
    the empty document, not the earlier command's instance."""
    assert cli("send", waiting["instance_id"], "nobody_waits").exit_code == 2  # without --json
    doc = run_json(cli, "resume", "no-such-instance", code=2)
    assert doc["instance_id"] is None or doc["instance_id"] == "no-such-instance"
    assert doc["status"] == "error" and doc["layers"]["L1"] == {} and doc["error"]["kind"] == "not_found"
