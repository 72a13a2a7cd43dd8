"""A resume whose answers are refused is refused whole: the stored instance stays as it was.

Answers may drive several steps in one resume (a user task, then the confirmation of the join
it leads to). When one of them is refused (not an offered option, data the layer rules refuse),
the steps the others drove before it used to be saved already: the 400 named the confirmation,
but the user task was done and the instance had moved on, a request half-applied. Now nothing of
the request is stored (same version, contexts, tapes, waiting items) -- through the Python API,
REST and ``layerflow resume`` alike, on a sqlite and a Redis store -- except the refusal note a
refused answer to a step that waited when the request came always leaves (README: "the refusal
on the tape"). A valid set of answers still drives every step in one resume.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from engine import AnswerWriteDenied, Engine, load_process
from engine.governance import InvalidAnswer
from engine.api import create_app
from engine_helpers import flow, redis_scratch, script_task, write_elements
from engine_helpers import cli_in_a_tmp_store  # noqa: F401 - the "cli" fixture
from tape_helpers import instance_doc

REDIS = os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/13")
TOKEN = "resume-refused-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}

# a user task, then a join of two branches that disagree: its human_confirm confirmation exists
# only once the user task is done
VOTE = [
    '<bpmn:startEvent id="start"/>', '<bpmn:userTask id="ask" name="Ask"/>', '<bpmn:parallelGateway id="fork"/>',
    script_task("a", "decision = 'approve'"), script_task("b", "decision = 'reject'"),
    '<bpmn:parallelGateway id="join"/>', script_task("after", "outcome = [asked, decision]"),
    '<bpmn:endEvent id="end"/>',
    flow("start", "ask"), flow("ask", "fork"), flow("fork", "a"), flow("fork", "b"), flow("a", "join"),
    flow("b", "join"), flow("join", "after"), flow("after", "end"),
]
# a user task beside a confirmation: both wait at once
BESIDE = [
    '<bpmn:startEvent id="start"/>', '<bpmn:parallelGateway id="fork"/>', '<bpmn:userTask id="ask" name="Ask"/>',
    '<bpmn:parallelGateway id="inner_fork"/>', script_task("a", "decision = 'approve'"),
    script_task("b", "decision = 'reject'"), '<bpmn:parallelGateway id="inner_join"/>',
    '<bpmn:parallelGateway id="join"/>', script_task("after", "outcome = [asked, decision]"),
    '<bpmn:endEvent id="end"/>',
    flow("start", "fork"), flow("fork", "ask"), flow("ask", "join"), flow("fork", "inner_fork"),
    flow("inner_fork", "a"), flow("inner_fork", "b"), flow("a", "inner_join"), flow("b", "inner_join"),
    flow("inner_join", "join"), flow("join", "after"), flow("after", "end"),
]
GOOD = {"user_tasks": {"ask": {"asked": True}}, "confirmations": {"join/decision": "reject"}}
BAD_CONFIRMATION = {"user_tasks": {"ask": {"asked": True}}, "confirmations": {"join/decision": "maybe"}}


def _write(folder: Path, pid: str, elements: list[str], join: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = write_elements(folder, pid, elements)
    (folder / f"{pid}.layerflow.yaml").write_text(f"{join}:\n  humanConfirm: {{timeout: 600}}\n", encoding="utf-8")
    return path


def _stored(engine: Engine, iid: str) -> tuple[int, dict[str, Any]]:
    loaded = engine.load(iid)
    return loaded.version, instance_doc(loaded)


@pytest.fixture(params=["sqlite", "redis"])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'refused.db'}"
        return
    with redis_scratch(REDIS, "resume-refused") as prefix:
        yield f"{REDIS}?prefix={prefix}"


def test_a_refused_confirmation_answer_keeps_the_user_task_answer_out_of_the_store(tmp_path: Path,
                                                                                   store_url: str) -> None:
    engine = Engine(store_url)
    instance = engine.run(engine.start(load_process(_write(tmp_path, "vote", VOTE, "join")), {"case": 1}))
    assert [w["task_id"] for w in instance.waiting_for] == ["ask"]
    version, before = _stored(engine, instance.id)
    loaded = engine.load(instance.id)
    with pytest.raises(InvalidAnswer, match=r"'maybe' for confirmation 'join/decision'"):
        engine.resume(loaded, answers=BAD_CONFIRMATION)
    assert _stored(engine, instance.id) == (version, before)  # not one write: same version, same tapes
    # the caller's instance is as it was too, and takes the corrected answers in one resume
    assert loaded.version == version and instance_doc(loaded) == before
    done = engine.resume(loaded, answers=GOOD)
    assert done.status == "completed" and done.main.resolve("outcome") == [True, "reject"]
    assert engine.load(instance.id).status == "completed"


def test_a_refused_answer_of_an_instance_in_error_keeps_its_error(tmp_path: Path) -> None:
    """The retry of a failed activity is part of the request: refused, the instance is still in error."""
    elements = [script_task("prep", "ok = fixed") if e == '<bpmn:userTask id="ask" name="Ask"/>' else e
                for e in VOTE]
    elements = [e.replace('"ask"', '"prep"').replace("asked", "ok") for e in elements]
    engine = Engine(f"sqlite:///{tmp_path / 'error.db'}")
    instance = engine.run(engine.start(load_process(_write(tmp_path, "vote", elements, "join")), {"case": 1}))
    assert instance.status == "error", instance.waiting_for
    engine.inject(instance, {"fixed": True})  # the fix: a request of its own, saved
    version, before = _stored(engine, instance.id)
    with pytest.raises(InvalidAnswer, match="'maybe'"):
        engine.resume(engine.load(instance.id), answers={"confirmations": {"join/decision": "maybe"}})
    assert _stored(engine, instance.id) == (version, before)
    assert engine.load(instance.id).status == "error"
    done = engine.resume(engine.load(instance.id), answers={"confirmations": {"join/decision": "approve"}})
    assert done.status == "completed" and done.main.resolve("outcome") == [True, "approve"]


def test_rest_resume_refused_leaves_the_instance_as_it_was(tmp_path: Path) -> None:
    catalog = tmp_path / "catalog"
    _write(catalog, "vote", VOTE, "join")
    with TestClient(create_app("memory://", catalog, TOKEN)) as client:
        started = client.post("/api/instances", json={"process_id": "vote", "data": {"case": 1}}, headers=AUTH).json()
        iid = started["instance_id"]
        tape = client.get(f"/api/instances/{iid}/tape", headers=AUTH).json()
        refused = client.post(f"/api/instances/{iid}/resume", headers=AUTH,
                              json={"answers": BAD_CONFIRMATION, "expected_version": started["version"]})
        assert refused.status_code == 400, refused.text
        assert refused.json()["error"]["kind"] == "invalid_answer"
        assert "join/decision" in refused.json()["error"]["message"]
        after = client.get(f"/api/instances/{iid}", headers=AUTH).json()
        assert after == client.get(f"/api/instances/{iid}", headers=AUTH).json()
        assert (after["version"], after["waiting_for"], after["layers"], after["tape_length"]) == (
            started["version"], started["waiting_for"], started["layers"], started["tape_length"])
        assert client.get(f"/api/instances/{iid}/tape", headers=AUTH).json() == tape
        # the same version still takes the corrected answers: the user task, then the confirmation
        done = client.post(f"/api/instances/{iid}/resume", headers=AUTH,
                           json={"answers": GOOD, "expected_version": started["version"]}).json()
        assert done["status"] == "completed" and done["layers"]["L3"]["outcome"] == [True, "reject"]


def test_rest_resume_refused_user_task_keeps_the_confirmation_beside_it_open(tmp_path: Path) -> None:
    """A valid answer to the confirmation, a refused one to the user task beside it: the confirmation
    stays open; the only trace of the request is the refusal note of the user task's answer."""
    catalog = tmp_path / "catalog"
    _write(catalog, "beside", BESIDE, "inner_join")
    with TestClient(create_app("memory://", catalog, TOKEN)) as client:
        started = client.post("/api/instances", json={"process_id": "beside", "data": {"case": 1}},
                              headers=AUTH).json()
        iid = started["instance_id"]
        assert sorted(w["task_id"] for w in started["waiting_for"]) == ["ask", "inner_join"]
        tape = client.get(f"/api/instances/{iid}/tape", headers=AUTH).json()["events"]
        answers = {"user_tasks": {"ask": {"asked": True, "_mergedConflicts": []}},
                   "confirmations": {"inner_join/decision": "reject"}}
        refused = client.post(f"/api/instances/{iid}/resume", headers=AUTH, json={"answers": answers})
        assert refused.status_code == 403 and "_mergedConflicts" in refused.json()["error"]["message"], refused.text
        after = client.get(f"/api/instances/{iid}", headers=AUTH).json()
        assert after["waiting_for"] == started["waiting_for"] and after["layers"] == started["layers"]
        assert after["confirmations"] == started["confirmations"]
        assert not any(c.get("answered") for c in after["confirmations"])
        events = client.get(f"/api/instances/{iid}/tape", headers=AUTH).json()["events"]
        assert events[:len(tape)] == tape
        assert [e["data"].get("note") for e in events[len(tape):]] == ["answer_refused"]


def test_cli_resume_refused_writes_nothing_of_the_answers_before_it(cli: Any, tmp_path: Path) -> None:
    path = _write(tmp_path / "p", "vote", VOTE, "join")
    started = cli("run", str(path), "--data", '{"case": 1}', "--json")
    assert started.exit_code == 3, started.stdout
    iid = json.loads(started.stdout)["instance_id"]
    engine = Engine(os.environ["LAYERFLOW_STORE"])
    version, before = _stored(engine, iid)
    refused = cli("resume", iid, "--answer", 'ask={"asked": true}', "--answer", "join/decision=maybe", "--json")
    assert refused.exit_code == 2, refused.stdout
    doc = json.loads(refused.stdout)
    assert doc["error"]["kind"] == "invalid_answer" and "join/decision" in doc["error"]["message"]
    assert [w["task_id"] for w in doc["waiting_for"]] == ["ask"]  # what the instance is, not what was tried
    assert _stored(engine, iid) == (version, before)
    done = cli("resume", iid, "--answer", 'ask={"asked": true}', "--answer", "join/decision=reject", "--json")
    assert done.exit_code == 0 and json.loads(done.stdout)["layers"]["L3"]["outcome"] == [True, "reject"]


def test_cli_resume_refused_user_task_leaves_the_open_confirmation_it_answered_open(cli: Any, tmp_path: Path) -> None:
    """`layerflow resume` answers an open confirmation first (its own step): refused later in the same
    command, that answer is not kept either."""
    path = _write(tmp_path / "p", "beside", BESIDE, "inner_join")
    iid = json.loads(cli("run", str(path), "--data", '{"case": 1}', "--json").stdout)["instance_id"]
    engine = Engine(os.environ["LAYERFLOW_STORE"])
    before = engine.load(iid)
    refused = cli("resume", iid, "--answer", "inner_join/decision=reject",
                  "--answer", 'ask={"asked": true, "_mergedConflicts": []}', "--json")
    assert refused.exit_code == 2, refused.stdout
    after = engine.load(iid)
    assert after.waiting_for == before.waiting_for and after.confirmations == before.confirmations
    assert {n: c.as_dict() for n, c in after.contexts.items()} == {n: c.as_dict() for n, c in before.contexts.items()}
    added = {n: [e.data.get("note") for e in after.contexts[n].tape[len(c.tape):]] for n, c in before.contexts.items()}
    # the refusal note of the answer (in the context of the user task's branch), as a refused answer always leaves
    assert sorted(notes for notes in added.values() if notes) == [["answer_refused"]], added


def test_a_refused_user_task_answer_after_a_step_leaves_no_note(tmp_path: Path) -> None:
    """The refused step did not wait when the request came: the instance is as before, no note."""
    elements = [*VOTE[:-8], '<bpmn:userTask id="check" name="Check"/>', *VOTE[-8:]]
    elements = [e for e in elements if e != flow("after", "end")] + [flow("after", "check"), flow("check", "end")]
    engine = Engine(f"sqlite:///{tmp_path / 'after.db'}")
    instance = engine.run(engine.start(load_process(_write(tmp_path, "vote", elements, "join")), {"case": 1}))
    version, before = _stored(engine, instance.id)
    answers = {**GOOD, "user_tasks": {**GOOD["user_tasks"], "check": {"_branch_id": "x"}}}
    with pytest.raises(AnswerWriteDenied, match="'check'"):
        engine.resume(engine.load(instance.id), answers=answers)
    assert _stored(engine, instance.id) == (version, before)
