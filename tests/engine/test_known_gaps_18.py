"""Three gaps closed: an answer that can match nothing is bad input however it is given, a person's
resolution of a join conflict names the person, and a timeout's default is not a person's decision."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from engine import Engine, load_process
from engine.governance import InvalidAnswer

from engine_helpers import cli_in_a_tmp_store, flow, run_json, write_elements
from test_known_gaps_13 import VOTE, Clock, _answers, _vote

cli = cli_in_a_tmp_store  # the fixture "cli", here too

# a person fills in the application first; then finance and risk disagree at the join
FORM_FIRST = [e for e in VOTE if 'id="start_to_fork"' not in e] + [
    '<bpmn:userTask id="apply"/>', flow("start", "apply"), flow("apply", "fork")]


def _state(cli: Any, iid: str) -> tuple[int, str, list[Any]]:
    shown = run_json(cli, "inspect", iid, code=0)
    return shown["tape_length"], shown["status"], [c["answer"] for c in shown["confirmations"]]


# ----- 1. an answer that can match nothing: exit 2, named, nothing changed -----------------------------------

@pytest.mark.parametrize("given", ["--answer", "--answers"])
@pytest.mark.parametrize("key", ["merge/nokey", "nogateway/verdict", "nosuch"])
def test_resume_refuses_a_key_no_open_or_possible_confirmation_has(cli: Any, tmp_path: Path, given: str,
                                                                    key: str) -> None:
    """``merge`` waits for verdict and score now and is on no loop: it will ask nothing else."""
    waiting = run_json(cli, "run", str(_vote(tmp_path)), code=3)
    iid = waiting["instance_id"]
    before = _state(cli, iid)
    flag = ["--answer", f"{key}=reject"] if given == "--answer" else ["--answers", _answers(tmp_path, {key: "reject"})]
    doc = run_json(cli, "resume", iid, *flag, "--answer", "merge/verdict=reject", code=2)
    message = doc["error"]["message"]
    assert doc["error"]["kind"] == "invalid_answer" and repr(key) in message
    for matching in ("'merge/score'", "'merge/verdict'", "* for any"):
        assert matching in message, message
    assert _state(cli, iid) == before      # no answer applied, not even the good one


def test_keys_for_later_steps_are_still_taken_in_advance(cli: Any, tmp_path: Path) -> None:
    """Waiting at the form, the join's conflicts are still to come: run and resume take them."""
    path = write_elements(tmp_path, "form_first", FORM_FIRST)
    answers = _answers(tmp_path, {"merge/verdict": "reject", "merge/score": 7})
    waiting = run_json(cli, "run", str(path), "--answers", answers, code=3)
    assert [w["task_id"] for w in waiting["waiting_for"]] == ["apply"]
    done = run_json(cli, "resume", waiting["instance_id"], "--answer", 'apply={"name": "x"}',
                    "--answer", "merge/verdict=reject", "--answer", "merge/score=7", code=0)
    assert done["layers"]["L3"]["verdict"] == "reject" and done["layers"]["L3"]["score"] == 7


def test_an_element_that_is_no_user_task_is_refused_a_done_user_task_is_not(cli: Any, tmp_path: Path) -> None:
    path = write_elements(tmp_path, "form_first", FORM_FIRST)
    script = _answers(tmp_path, {}, "script.json")
    Path(script).write_text(json.dumps({"user_tasks": {"finance": {"verdict": "x"}}}), encoding="utf-8")
    doc = run_json(cli, "run", str(path), "--answers", script, code=2)
    assert "'finance'" in doc["error"]["message"] and "'apply'" in doc["error"]["message"]
    assert json.loads(cli("list", "--json").stdout) == []
    waiting = run_json(cli, "run", str(path), "--answer", 'apply={"name": "x"}', code=3)   # now at the join
    # a script gives the same answers to every resume: the done task's is no typo (as an answered
    # confirmation's id is not), the join's keys are taken
    done = run_json(cli, "resume", waiting["instance_id"], "--answer", 'apply={"name": "x"}',
                    "--answer", "merge/verdict=reject", "--answer", "merge/score=7", code=0)
    assert done["status"] == "completed"


def test_the_python_api_refuses_a_key_of_a_join_that_asked_all_it_will(tmp_path: Path) -> None:
    engine = Engine("memory://")
    instance = engine.run(load_process(_vote(tmp_path)), {})
    version, tape = instance.version, instance.tape_length()
    with pytest.raises(InvalidAnswer, match=r"'merge/nokey' can match no confirmation.*'merge/score'"):
        engine.resume(instance, answers={"confirmations": {"merge/verdict": "reject", "merge/nokey": 1}})
    again = engine.load(instance.id)
    assert (again.version, again.tape_length(), again.status) == (version, tape, "waiting")


# ----- an answer that is not an offered option: exit 2 naming the key, the value and the options -----------

@pytest.mark.parametrize("command", ["run", "resume"])
@pytest.mark.parametrize("given", ["--answer", "--answers"])
def test_a_value_not_offered_names_the_key_the_value_and_the_options(cli: Any, tmp_path: Path, command: str,
                                                                    given: str) -> None:
    path = str(_vote(tmp_path))
    flag = (["--answer", "merge/verdict=maybe"] if given == "--answer"
            else ["--answers", _answers(tmp_path, {"merge/verdict": "maybe"})])
    args = ["run", path] if command == "run" else ["resume", run_json(cli, "run", path, code=3)["instance_id"]]
    doc = run_json(cli, *args, *flag, code=2)
    message = doc["error"]["message"]
    assert doc["error"]["kind"] == "invalid_answer" and doc["status"] == "error"
    for word in ("'merge/verdict'", "'maybe'", '"approve"', '"reject"'):
        assert word in message, message
    assert all(c["answer"] is None for c in doc["confirmations"])


# ----- 2. who decided, when a person did; 3. a timeout's default is nobody's answer ------------------------

def _client(tmp_path: Path) -> Any:
    from fastapi.testclient import TestClient

    from engine.api import create_app

    catalog = tmp_path / "catalog"
    catalog.mkdir()
    _vote(catalog)
    return TestClient(create_app("memory://", catalog, token="gaps18"), headers={"Authorization": "Bearer gaps18"})


def _named(conflicts: list[dict[str, Any]], key: str) -> dict[str, Any]:
    return next(c for c in conflicts if c["key"] == key)["resolution"]


def test_rest_answers_name_the_person_in_the_resolution_the_log_and_the_tape(tmp_path: Path) -> None:
    client = _client(tmp_path)
    iid = client.post("/api/instances", json={"process_id": "vote"}).json()["instance_id"]
    client.post("/api/confirmations/merge/verdict", json={"value": "reject", "instance_id": iid, "user": "alice",
                                                          "reason": "too risky"})
    done = client.post(f"/api/instances/{iid}/resume",
                       json={"answers": {"confirmations": {"merge/score": 7}}, "user": "bob"}).json()
    assert done["status"] == "completed"
    verdict, score = _named(done["conflicts"], "verdict"), _named(done["conflicts"], "score")
    assert (verdict["resolver"], verdict["by"]) == ("human", "alice")
    assert verdict["reason"].startswith("a person (alice) chose") and verdict["reason"].endswith(": too risky")
    assert (score["by"], score["resolver"]) == ("bob", "human") and "(bob)" in score["reason"]
    merged = done["layers"]["L3"]["_mergedConflicts"]
    assert [c["resolution"] for c in merged] == [_named(done["conflicts"], c["key"]) for c in merged]
    tape = client.get(f"/api/instances/{iid}/tape", params={"kind": "human_decision"}).json()["events"]
    assert sorted(e["actor"] for e in tape) == ["alice", "bob"]


def test_a_named_person_is_named_and_an_unnamed_one_stays_a_person(cli: Any, tmp_path: Path) -> None:
    """The CLI signs nobody in: its answers stay a person's, unnamed (a login name would make the same
    run's document differ from machine to machine, and reach the model's prompt through the log)."""
    answers = _answers(tmp_path, {"merge/verdict": "reject", "merge/score": 7})
    doc = run_json(cli, "run", str(_vote(tmp_path)), "--answers", answers, code=0)
    assert all("by" not in c["resolution"] and c["resolution"]["reason"].startswith("a person chose")
               for c in doc["conflicts"])
    engine = Engine("memory://")
    instance = engine.run(load_process(_vote(tmp_path)), {}, answers={"confirmations": {"merge/verdict": "reject"}},
                          by="dave")
    instance = engine.answer_confirmation(instance, "merge/score", 3, actor="erin", by="erin")
    assert (_named(instance.conflicts, "verdict")["by"], _named(instance.conflicts, "score")["by"]) == ("dave", "erin")
    decisions = [e for e in instance.main.tape if e.data.get("note") == "human_decision"]
    assert sorted(e.actor for e in decisions) == ["dave", "erin"]


def test_a_timeouts_default_is_the_policys_and_says_nobody_answered(tmp_path: Path) -> None:
    clock = Clock()
    engine = Engine("memory://", clock=clock)
    config = "merge:\n  humanConfirm: {timeout: 60, default: needs_review}\n  conflictPolicy:\n    rankings: {score: [7, 3]}\n"
    instance = engine.run(load_process(_vote(tmp_path, config)), {})
    clock.now += 61
    instance = engine.resume(instance.id)
    assert instance.status == "completed", instance.error
    verdict = _named(instance.conflicts, "verdict")
    assert verdict["value"] == "needs_review" and verdict["resolver"] == "policy" and "by" not in verdict
    assert "nobody answered" in verdict["reason"] and "the timeout took the configured default" in verdict["reason"]
    assert not [e for e in instance.main.tape if e.data.get("note") == "human_decision"]
    # the resolution step on the tape says the timeout took it, not that someone answered
    steps = [e.data for e in instance.main.tape if e.data.get("note") == "resolution" and e.data["key"] == "verdict"]
    assert (steps[-1]["resolver"], steps[-1]["outcome"]) == ("policy", "timed_out")
    assert not [s for s in steps if s["outcome"] == "answered"]
