"""The CLI called as someone who only read DESIGN.md and the README would call it: a review
with two reviewers writing one key, a claim that waits for an adjuster, and the variants of
`inspect`, `tape`, `replay` and `rollback` such a caller tries first."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result

from engine.cli import main

_DEFS = ('<?xml version="1.0" encoding="UTF-8"?>\n<bpmn:definitions xmlns:bpmn='
         '"http://www.omg.org/spec/BPMN/20100524/MODEL" id="d" targetNamespace="x">\n{}\n</bpmn:definitions>\n')

REVIEW = _DEFS.format("""<bpmn:process id="doc_review" isExecutable="true">
  <bpmn:startEvent id="start"><bpmn:outgoing>f1</bpmn:outgoing></bpmn:startEvent>
  <bpmn:parallelGateway id="split"><bpmn:incoming>f1</bpmn:incoming><bpmn:outgoing>f2</bpmn:outgoing><bpmn:outgoing>f3</bpmn:outgoing></bpmn:parallelGateway>
  <bpmn:scriptTask id="legal_review"><bpmn:incoming>f2</bpmn:incoming><bpmn:outgoing>f4</bpmn:outgoing><bpmn:script>verdict = "approve"</bpmn:script></bpmn:scriptTask>
  <bpmn:scriptTask id="tech_review"><bpmn:incoming>f3</bpmn:incoming><bpmn:outgoing>f5</bpmn:outgoing><bpmn:script>verdict = "reject"</bpmn:script></bpmn:scriptTask>
  <bpmn:parallelGateway id="merge"><bpmn:incoming>f4</bpmn:incoming><bpmn:incoming>f5</bpmn:incoming><bpmn:outgoing>f6</bpmn:outgoing></bpmn:parallelGateway>
  <bpmn:endEvent id="end"><bpmn:incoming>f6</bpmn:incoming></bpmn:endEvent>
  <bpmn:sequenceFlow id="f1" sourceRef="start" targetRef="split"/>
  <bpmn:sequenceFlow id="f2" sourceRef="split" targetRef="legal_review"/>
  <bpmn:sequenceFlow id="f3" sourceRef="split" targetRef="tech_review"/>
  <bpmn:sequenceFlow id="f4" sourceRef="legal_review" targetRef="merge"/>
  <bpmn:sequenceFlow id="f5" sourceRef="tech_review" targetRef="merge"/>
  <bpmn:sequenceFlow id="f6" sourceRef="merge" targetRef="end"/>
</bpmn:process>""")

CLAIMS = _DEFS.format("""<bpmn:process id="claims_triage" isExecutable="true">
  <bpmn:startEvent id="start"><bpmn:outgoing>f1</bpmn:outgoing></bpmn:startEvent>
  <bpmn:exclusiveGateway id="triage" default="f_std"><bpmn:incoming>f1</bpmn:incoming><bpmn:outgoing>f_fast</bpmn:outgoing><bpmn:outgoing>f_std</bpmn:outgoing></bpmn:exclusiveGateway>
  <bpmn:scriptTask id="fast_track"><bpmn:incoming>f_fast</bpmn:incoming><bpmn:outgoing>f2</bpmn:outgoing><bpmn:script>route = "fast"</bpmn:script></bpmn:scriptTask>
  <bpmn:userTask id="adjuster_review"><bpmn:incoming>f_std</bpmn:incoming><bpmn:outgoing>f3</bpmn:outgoing></bpmn:userTask>
  <bpmn:exclusiveGateway id="xmerge"><bpmn:incoming>f2</bpmn:incoming><bpmn:incoming>f3</bpmn:incoming><bpmn:outgoing>f4</bpmn:outgoing></bpmn:exclusiveGateway>
  <bpmn:endEvent id="end"><bpmn:incoming>f4</bpmn:incoming></bpmn:endEvent>
  <bpmn:sequenceFlow id="f1" sourceRef="start" targetRef="triage"/>
  <bpmn:sequenceFlow id="f_fast" sourceRef="triage" targetRef="fast_track"><bpmn:conditionExpression>amount &lt; 1000</bpmn:conditionExpression></bpmn:sequenceFlow>
  <bpmn:sequenceFlow id="f_std" sourceRef="triage" targetRef="adjuster_review"/>
  <bpmn:sequenceFlow id="f2" sourceRef="fast_track" targetRef="xmerge"/>
  <bpmn:sequenceFlow id="f3" sourceRef="adjuster_review" targetRef="xmerge"/>
  <bpmn:sequenceFlow id="f4" sourceRef="xmerge" targetRef="end"/>
</bpmn:process>""")


@pytest.fixture
def lf(tmp_path: Path):
    runner = CliRunner()
    store = f"sqlite:///{tmp_path / 'outsider.db'}"

    def invoke(*args: str, code: int | None = None) -> Result:
        result = runner.invoke(main, [*args, "--store", store], catch_exceptions=False)
        if code is not None:
            assert result.exit_code == code, (result.stdout, result.stderr)
        return result
    return invoke


def _doc(result: Result) -> Any:
    return json.loads(result.stdout)


@pytest.fixture
def review(lf, tmp_path: Path) -> str:
    """Waiting at `merge`: the reviewers disagree on `verdict`."""
    path = tmp_path / "review.bpmn"
    path.write_text(REVIEW)
    doc = _doc(lf("run", str(path), "--json", code=3))
    assert [w["id"] for w in doc["waiting_for"]] == ["merge/verdict"]
    return str(doc["instance_id"])


@pytest.fixture
def claim(lf, tmp_path: Path) -> str:
    """Completed through the default branch: the adjuster answered in advance."""
    path, answers = tmp_path / "claims.bpmn", tmp_path / "answers.json"
    path.write_text(CLAIMS)
    answers.write_text(json.dumps({"user_tasks": {"adjuster_review": {"decision": "pay"}}}))
    doc = _doc(lf("run", str(path), "--data", '{"amount": 5000}', "--answers", str(answers), "--json", code=0))
    return str(doc["instance_id"])


def test_inspect_layer_shows_only_that_layer(lf, review) -> None:
    lf("resume", review, "--answer", "merge/verdict=reject", code=0)
    plain = lf("inspect", review, "--layer", "L3", code=0).stdout
    assert "verdict" in plain and "_mergedConflicts" not in plain  # that one is in L4
    doc = _doc(lf("inspect", review, "--layer", "L3", "--layer", "HISTORY", "--json", code=0))
    assert list(doc["layers"]) == ["L3"] and doc["layers"]["L3"]["verdict"] == "reject"
    assert sum(v for k, v in doc["tokens"].items() if k != "total") == doc["tokens"]["total"]
    assert list(_doc(lf("inspect", review, "--layer", "L3,L4", "--json", code=0))["layers"]) == ["L3", "L4"]
    bad = lf("inspect", review, "--layer", "L9", "--json", code=2)
    assert "L9" in _doc(bad)["error"]["message"]


@pytest.mark.parametrize(("kind", "found"), [
    ("rollback", "restore"), ("move", "complete"), ("config", None), ("resolutions", "resolution"),
    ("conflicts", "conflict"), ("human", "human_decision"), ("merge", "join"), ("compression", None)])
def test_tape_kind_takes_the_names_design_gives_events(lf, review, kind, found) -> None:
    lf("resume", review, "--answer", "merge/verdict=approve", code=0)
    snap = [e for e in _doc(lf("tape", review, "--kind", "snapshot", "--json", code=0))][0]["data"]["snapshot_id"]
    lf("rollback", review, "--snapshot", snap, "--layers", "L4", code=0)
    result = lf("tape", review, "--kind", kind, "--json", code=0)
    events = _doc(result)
    if found is None:
        assert events == [] and kind in result.stderr
    else:
        assert events and all(found in (e["kind"], e["data"].get("note")) for e in events)


def test_tape_activity_finds_the_split_of_a_gateway(lf, review, claim) -> None:
    for iid, gateway in ((review, "split"), (claim, "triage")):
        events = _doc(lf("tape", iid, "--activity", gateway, "--json", code=0))
        notes = {e["data"].get("note") or e["kind"] for e in events}
        assert {"snapshot", "split"} <= notes, notes
    lf("resume", review, "--answer", "merge/verdict=reject", code=0)
    notes = {e["data"].get("note") for e in _doc(lf("tape", review, "--activity", "merge", "--json", code=0))}
    assert {"conflict", "human_decision", "resolution", "join"} <= notes, notes


def test_plain_tape_shows_the_snapshot_ids_rollback_takes(lf, claim) -> None:
    lines = lf("tape", claim, "--kind", "snapshot", code=0).stdout.splitlines()
    assert lines and all("snap:" in line for line in lines), lines
    snap = next(word for word in lines[0].split() if word.startswith("snap:"))
    lf("rollback", claim, snap, "--layer", "L3", code=0)  # positional snapshot, --layer as --layers
    restore = lf("tape", claim, "--kind", "restore", code=0).stdout
    assert snap in restore


def test_replay_takes_the_sequence_number_as_an_argument_too(lf, review) -> None:
    by_option = _doc(lf("replay", review, "--until", "3", "--json", code=0))
    assert _doc(lf("replay", review, "3", "--json", code=0)) == by_option
    assert "--until" in lf("replay", review, "3", "--until", "4", code=2).stderr


@pytest.mark.parametrize("key", ["merge/nokey"])
def test_an_answer_that_matches_no_confirmation_is_named_on_stderr(lf, tmp_path: Path, key) -> None:
    """A key the process may still ask (its join 'merge' exists); keys that can match nothing
    ('nogateway/verdict', 'no-such-confirmation') are bad input: tests/engine/test_known_gaps_13.py."""
    path, answers = tmp_path / "review.bpmn", tmp_path / "answers.json"
    path.write_text(REVIEW)
    answers.write_text(json.dumps({"confirmations": {key: "approve"}}))
    result = lf("run", str(path), "--answers", str(answers), "--json", code=3)
    doc = _doc(result)
    assert [w["id"] for w in doc["waiting_for"]] == ["merge/verdict"]
    assert key in result.stderr and "merge/verdict" in result.stderr
    # round 18 changed this deliberately: on resume the join waits for its questions now and is on no
    # loop, so it asks nothing else: the key can match nothing any more, bad input (exit 2)
    resumed = lf("resume", doc["instance_id"], "--answers", str(answers), code=2)
    assert key in resumed.stderr and "'merge/verdict'" in resumed.stderr


def test_a_user_task_answer_is_not_called_an_unused_confirmation(lf, tmp_path: Path) -> None:
    path = tmp_path / "claims.bpmn"
    path.write_text(CLAIMS)
    result = lf("run", str(path), "--data", '{"amount": 5000}', "--answer", 'adjuster_review={"decision": "pay"}',
                "--json", code=0)
    assert "not used" not in result.stderr


def test_list_json_names_each_instance_as_run_json_does(lf, claim) -> None:
    rows = _doc(lf("list", "--json", code=0))
    assert [r["instance_id"] for r in rows] == [claim] and rows[0]["id"] == claim


FAILING = _DEFS.format("""<bpmn:process id="calc" isExecutable="true">
  <bpmn:startEvent id="start"><bpmn:outgoing>f1</bpmn:outgoing></bpmn:startEvent>
  <bpmn:scriptTask id="compute"><bpmn:incoming>f1</bpmn:incoming><bpmn:outgoing>f2</bpmn:outgoing><bpmn:script>ratio = total / count</bpmn:script></bpmn:scriptTask>
  <bpmn:endEvent id="end"><bpmn:incoming>f2</bpmn:incoming></bpmn:endEvent>
  <bpmn:sequenceFlow id="f1" sourceRef="start" targetRef="compute"/>
  <bpmn:sequenceFlow id="f2" sourceRef="compute" targetRef="end"/>
</bpmn:process>""")


def test_a_failed_script_is_fixed_with_set_and_resumed(lf, tmp_path: Path) -> None:
    path = tmp_path / "calc.bpmn"
    path.write_text(FAILING)
    failed = _doc(lf("run", str(path), "--data", '{"total": 10, "count": 0}', "--json", code=1))
    assert failed["error"]["task_id"] == "compute" and "ZeroDivisionError" in failed["error"]["message"]
    iid = failed["instance_id"]
    plain = lf("resume", iid, code=1).stdout  # retried: fails the same way, and says what to do
    assert "ZeroDivisionError" in plain and f"layerflow resume {iid}" in plain and "--set KEY=VALUE" in plain
    refused = _doc(lf("resume", iid, "--set", "count=2", "--json", code=2))  # count is a PROCESS key
    assert refused["error"]["key"] == "count" and f"layerflow cancel {iid}" in refused["error"]["message"]
    assert _doc(lf("inspect", iid, "--json", code=0))["status"] == "error"  # nothing changed
    missing = _doc(lf("run", str(path), "--data", '{"total": 10}', "--json", code=1))
    done = _doc(lf("resume", missing["instance_id"], "--set", "count=4", "--json", code=0))
    assert done["status"] == "completed" and done["layers"]["L3"]["ratio"] == 2.5


def test_resume_answers_a_user_task_by_its_waiting_for_id(lf, tmp_path: Path) -> None:
    path, answers = tmp_path / "claims.bpmn", tmp_path / "answers.json"
    path.write_text(CLAIMS)
    waiting = _doc(lf("run", str(path), "--data", '{"amount": 5000}', "--json", code=3))
    [item] = waiting["waiting_for"]
    assert item["kind"] == "user_task" and item["task_id"] == "adjuster_review"
    answers.write_text(json.dumps({"user_tasks": {item["id"]: {"decision": "deny"}}}))
    done = _doc(lf("resume", waiting["instance_id"], "--answers", str(answers), "--json", code=0))
    assert done["layers"]["L3"]["decision"] == "deny" and done["waiting_for"] == []
    answers.write_text(json.dumps({"user_tasks": {"not-waiting": {"decision": "deny"}}}))
    again = _doc(lf("run", str(path), "--data", '{"amount": 5000}', "--json", code=3))
    refused = _doc(lf("resume", again["instance_id"], "--answers", str(answers), "--json", code=2))
    assert "not-waiting" in refused["error"]["message"]


def test_tape_json_names_the_key_each_write_changed(lf, review) -> None:
    writes = _doc(lf("tape", review, "--kind", "write", "--json", code=0))
    assert {(e["branch"], e["layer"], e["key"], e["value"]) for e in writes} == {
        ("legal_review", "L4", "verdict", "approve"), ("tech_review", "L4", "verdict", "reject")}
    assert all(e["changes"] == [[4, "verdict", e["value"]]] for e in writes)


@pytest.mark.parametrize("args", [
    ("run", "x.bpmn", "--bogus"), ("run",), ("replay", "abc", "--until", "x"), ("inspect",),
    ("tape", "abc", "--since", "soon"), ("rollback",)])
def test_a_usage_error_with_json_is_still_one_document(lf, args) -> None:
    result = lf(*args, "--json", code=2)
    doc = _doc(result)
    assert doc["status"] == "error" and doc["error"]["kind"] == "bad_input" and doc["error"]["message"]
    assert "Usage:" in result.stderr
