"""Gaps closed: REST ``resume`` of a completed instance names the answers it did not use, as
``Engine.resume`` (``instance.notices``) and the CLI (stderr) do; a join's ``humanConfirm`` options are
offered for a conflict only where their JSON type fits it, as its ``default`` is, and an answer that
picks an unfit one is refused naming the gateway, key, option and types. (The ``rediss://`` gap is in
tests/stores/test_redis_tls_15.py, the lapsed lease in tests/stores/test_lease_lapse_15.py.)"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from engine import Engine, load_process
from engine.governance import InvalidAnswer

from engine_helpers import cli_in_a_tmp_store, flow, run_json, write_elements
from engine_helpers import script_task as script
from test_known_gaps_14 import REVIEW  # a review a person answers, then a script that reads the answer

cli = cli_in_a_tmp_store  # the fixture "cli", here too

TOKEN = "gaps15"
AUTH = {"Authorization": f"Bearer {TOKEN}"}

# finance and risk disagree on a text (verdict) and on a number (score)
VOTE = [
    '<bpmn:startEvent id="start"/>',
    '<bpmn:parallelGateway id="fork"/>',
    script("finance", 'verdict = "approve"\nscore = 3'),
    script("risk", 'verdict = "reject"\nscore = 7'),
    '<bpmn:parallelGateway id="merge"/>',
    script("close", "closed = True"),
    '<bpmn:endEvent id="end"/>',
    flow("start", "fork"), flow("fork", "finance"), flow("fork", "risk"), flow("finance", "merge"),
    flow("risk", "merge"), flow("merge", "close"), flow("close", "end"),
]
# a text option and a number option for both conflicts, a special value, and a labelled one
OPTIONS = ("merge:\n  humanConfirm:\n    options: [needs_review, 5]\n"
           "    extraOptions:\n      - {label: half way, value: 5.5}\n      - {label: hold, value: on_hold}\n"
           "      - {label: send it up, value: $escalate}\n")


def _client(tmp_path: Path, elements: list[str], pid: str, config: str | None = None) -> Any:
    from fastapi.testclient import TestClient

    from engine.api import create_app

    catalog = tmp_path / "catalog"
    catalog.mkdir(exist_ok=True)
    write_elements(catalog, pid, elements)
    if config is not None:
        (catalog / f"{pid}.layerflow.yaml").write_text(config, encoding="utf-8")
    return TestClient(create_app("memory://", catalog, token=TOKEN))


# ----- 2. REST resume of a completed instance names the answers it did not use -------------------------

def test_rest_resume_of_a_completed_instance_lists_the_unused_answers_as_notices(cli: Any, tmp_path: Path) -> None:
    client = _client(tmp_path, REVIEW, "review_case")
    started = client.post("/api/instances", json={"process_id": "review_case",
                                                  "answers": {"user_tasks": {"review": {"decision": "approved"}}}},
                          headers=AUTH).json()
    assert started["status"] == "completed" and started["notices"] == []
    iid = started["instance_id"]
    body = {"answers": {"user_tasks": {"review": {"decision": "denied"}}, "confirmations": {"*": "x"}}}
    again = client.post(f"/api/instances/{iid}/resume", json=body, headers=AUTH)
    assert again.status_code == 200, again.text
    doc = again.json()
    assert (doc["status"], doc["version"], doc["tape_length"]) == ("completed", started["version"],
                                                                   started["tape_length"])
    # the notices Engine.resume gives: each answer given, in order
    assert len(doc["notices"]) == 2, doc["notices"]
    assert "'*' was not used" in doc["notices"][0] and "'review' was not used" in doc["notices"][1]
    assert all(f"instance {iid} is completed" in n for n in doc["notices"])
    # no answers: nothing to name
    plain = client.post(f"/api/instances/{iid}/resume", json={}, headers=AUTH).json()
    assert plain["notices"] == []
    # a plain GET of the document has no run to report on: the field is the resume's, not the instance's
    assert "notices" not in client.get(f"/api/instances/{iid}", headers=AUTH).json()
    # the CLI names the same answer on stderr
    done = run_json(cli, "run", str(write_elements(tmp_path, "review_case", REVIEW)), "--answer",
                    'review={"decision": "approved"}', code=0)
    result = cli("resume", done["instance_id"], "--answer", 'review={"decision": "denied"}', "--json")
    assert result.exit_code == 0 and "'review' was not used" in result.stderr


def test_rest_resume_of_a_waiting_instance_carries_an_empty_notices_list(tmp_path: Path) -> None:
    client = _client(tmp_path, REVIEW, "review_case")
    iid = client.post("/api/instances", json={"process_id": "review_case"}, headers=AUTH).json()["instance_id"]
    doc = client.post(f"/api/instances/{iid}/resume",
                      json={"answers": {"user_tasks": {"review": {"decision": "ok"}}}}, headers=AUTH).json()
    assert doc["status"] == "completed" and doc["notices"] == []
    # so does any reply of a request that ran an instance on: a user task's
    iid = client.post("/api/instances", json={"process_id": "review_case"}, headers=AUTH).json()["instance_id"]
    done = client.post(f"/api/instances/{iid}/user-tasks/review", json={"data": {"decision": "ok"}}, headers=AUTH)
    assert done.status_code == 200 and done.json()["notices"] == [], done.text


# ----- 3. humanConfirm options are offered only where their type fits the conflict -------------------------

def _vote(tmp_path: Path, config: str = OPTIONS) -> Path:
    path = write_elements(tmp_path, "vote", VOTE)
    (tmp_path / "vote.layerflow.yaml").write_text(config, encoding="utf-8")
    return path


def _confirmation(instance: Any, cid: str) -> dict[str, Any]:
    return next(c for c in instance.confirmations if c["id"] == cid)


def test_options_are_offered_only_for_a_conflict_of_their_type(tmp_path: Path) -> None:
    instance = Engine("memory://").run(load_process(_vote(tmp_path)), {})
    assert instance.status == "waiting"
    verdict = [o["value"] for o in _confirmation(instance, "merge/verdict")["options"]]
    score = [o["value"] for o in _confirmation(instance, "merge/score")["options"]]
    assert verdict == ["approve", "reject", "needs_review", "on_hold", "$escalate"]
    assert score == [3, 7, 5, 5.5, "$escalate"]   # 5.5 and 5 are numbers, as 3 and 7 are


def test_an_unfit_option_is_offered_nowhere_then_the_escalate_option_stays(tmp_path: Path) -> None:
    instance = Engine("memory://").run(load_process(_vote(tmp_path, "merge:\n  humanConfirm: {options: [[1, 2]]}\n")), {})
    for cid in ("merge/verdict", "merge/score"):
        assert [o["value"] for o in _confirmation(instance, cid)["options"]][-1] == "$escalate"
        assert [1, 2] not in [o["value"] for o in _confirmation(instance, cid)["options"]]


@pytest.mark.parametrize("answer", ["needs_review", "hold"])  # by value, and by the option's label
def test_an_answer_picking_an_unfit_option_is_invalid_naming_gateway_key_option_and_types(tmp_path: Path,
                                                                                        answer: str) -> None:
    engine = Engine("memory://")
    instance = engine.run(load_process(_vote(tmp_path)), {})
    version = instance.version
    with pytest.raises(InvalidAnswer) as caught:
        engine.resume(instance.id, answers={"confirmations": {"merge/verdict": "approve", "merge/score": answer}})
    message = str(caught.value)
    shown = 'option "needs_review"' if answer == "needs_review" else 'option "on_hold"' 
    assert "'merge'" in message and "'score'" in message and shown in message, message
    assert "a string" in message and "number" in message, message
    # all or nothing: not even the verdict's answer was kept
    again = engine.store.load(instance.id)
    assert again["version"] == version
    assert _confirmation(engine.resume(instance.id), "merge/verdict").get("answer") is None


def test_cli_and_rest_refuse_an_unfit_option_as_bad_input(cli: Any, tmp_path: Path) -> None:
    path = _vote(tmp_path)
    answers = tmp_path / "answers.json"
    answers.write_text(json.dumps({"confirmations": {"merge/verdict": "approve", "merge/score": "needs_review"}}))
    doc = run_json(cli, "run", str(path), "--answers", str(answers), code=2)
    assert doc["error"]["kind"] == "invalid_answer", doc["error"]
    assert "'score'" in doc["error"]["message"] and 'option "needs_review"' in doc["error"]["message"]
    # a fitting extra option is taken
    answers.write_text(json.dumps({"confirmations": {"merge/verdict": "needs_review", "merge/score": 5.5}}))
    done = run_json(cli, "run", str(path), "--answers", str(answers), code=0)
    assert done["layers"]["L3"]["score"] == 5.5 and done["layers"]["L3"]["verdict"] == "needs_review"

    client = _client(tmp_path, VOTE, "vote", OPTIONS)
    iid = client.post("/api/instances", json={"process_id": "vote"}, headers=AUTH).json()["instance_id"]
    refused = client.post(f"/api/instances/{iid}/resume",
                          json={"answers": {"confirmations": {"merge/score": "on_hold"}}}, headers=AUTH)
    assert refused.status_code == 400, refused.text
    error = refused.json()["error"]
    assert error["kind"] == "invalid_answer" and 'option "on_hold"' in error["message"] and "'score'" in error["message"]
