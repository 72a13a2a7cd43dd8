"""An insurer builds a life underwriting process from README.md and DESIGN.md alone.

The process (tests/outsider_uw41/underwriting.bpmn, its .layerflow.yaml and premium_band.dmn found
beside it): a business rule task decides the premium band, pricing and compliance run in parallel
and both write ``premium`` and ``conditions`` (the join settles ``premium`` by a policy rule and
``conditions`` by a ``union`` reducer), the underwriter answers a Camunda form, a cooling-off timer
and a medical-report message follow, and a sub-process ends in an error end event that a boundary
error event catches (declined) or ends normally (issued). Driven from outside: the ``layerflow``
commands (click's runner, in this process) and the Python API.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from context_layers import LayeredContext
from engine import Engine, load_process
from engine.cli import main

HERE = Path(__file__).resolve().parent / "outsider_uw41"
BPMN = HERE / "underwriting.bpmn"
APPLICANT = {"age": 45, "sum_insured": 300000}
T0 = "2030-01-01T00:00:00Z"          # the run of the underwriter's answer, by --now
LATER = "2030-01-01T03:00:00Z"       # past the two-hour cooling-off


def cli(store: str, *args: str, code: int | None = 0) -> Any:
    out = CliRunner().invoke(main, [*args, "--store", store, "--json"])
    if code is not None:
        assert out.exit_code == code, (args, out.stdout, out.stderr)
    return json.loads(out.stdout)


@pytest.fixture()
def store(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'runs.db'}"


def started(store: str) -> dict[str, Any]:
    return cli(store, "run", str(BPMN), "--data", json.dumps(APPLICANT), code=3)


def test_validate_finds_the_dmn_beside_the_bpmn(store: str) -> None:
    out = CliRunner().invoke(main, ["validate", str(BPMN)])
    assert out.exit_code == 0, out.output
    assert "premium_band.dmn" in out.output and "is valid" in out.output


def test_band_split_and_join_then_the_form(store: str) -> None:
    doc = started(store)
    assert doc["status"] == "waiting" and doc["error"] is None
    history = doc["layers"]["L3"]
    assert history["band"] == "C" and history["base_premium"] == 1500     # age >= 40 -> band C
    # premium: pricing 1650, compliance 1750 -> the policy rule for bands B/C gives 1750
    (conflict,) = doc["conflicts"]
    assert conflict["gateway_id"] == "join" and conflict["key"] == "premium"
    assert conflict["values"] == {"pricing": pytest.approx(1650), "compliance": 1750}
    assert conflict["resolution"]["resolver"] == "policy" and conflict["resolution"]["value"] == 1750
    assert history["premium"] == 1750
    # conditions: union, no conflict, base-less union keeps branch order and drops the duplicate
    assert history["conditions"] == ["annual review", "sanctions screening"]
    (wait,) = doc["waiting_for"]
    assert wait["kind"] == "user_task" and wait["task_id"] == "underwrite"
    fields = {f["id"]: f for f in wait["form"]["fields"]}
    assert fields["accept"]["required"] is True and fields["loading_pct"]["required"] is False
    assert (fields["loading_pct"]["min"], fields["loading_pct"]["max"], fields["loading_pct"]["default"]) == (0, 100, 0)
    assert set(doc) >= {"instance_id", "process_id", "status", "error", "layers", "tokens", "conflicts",
                        "compressions", "confirmations", "waiting_for", "tape_length"}
    assert doc["tokens"]["total"] == sum(doc["tokens"][f"L{i}"] for i in range(6))


def test_a_wrong_form_answer_is_refused_naming_task_and_field(store: str) -> None:
    iid = started(store)["instance_id"]
    doc = cli(store, "resume", iid, "--answer", 'underwrite={"accept": "yes"}', code=2)
    assert doc["error"]["kind"] == "invalid_answer" and doc["error"]["task_id"] == "underwrite"
    assert doc["error"]["problems"] == [{"field": "accept", "problem": '"yes" is not true or false (type boolean)'}]
    assert doc["error"]["instance_status"] == "waiting"
    doc = cli(store, "resume", iid, "--answer", 'underwrite={"accept": true, "loading_pct": 500}', code=2)
    assert doc["error"]["problems"][0]["field"] == "loading_pct"
    assert cli(store, "inspect", iid)["waiting_for"][0]["task_id"] == "underwrite"


def walk_to_the_message(store: str, tmp_path: Path, answer: dict[str, Any]) -> str:
    iid = started(store)["instance_id"]
    answers = tmp_path / "answers.json"
    answers.write_text(json.dumps({"user_tasks": {"underwrite": answer}}))
    doc = cli(store, "resume", iid, "--answers", str(answers), "--now", T0, code=3)
    (wait,) = doc["waiting_for"]
    assert wait["kind"] == "timer" and wait["task_id"] == "cooling_off"
    assert wait["due"].startswith("2030-01-01T02:00")                # PT2H from --now
    assert doc["layers"]["L3"]["loading_pct"] == int(answer.get("loading_pct", 0))   # "25" kept as 25
    assert doc["layers"]["L3"]["accept"] is True
    # not due yet: a message now is refused naming the timer it waits for
    early = cli(store, "send", iid, "medical_report", "--json-payload", "{}", code=2)
    assert "timer cooling_off" in early["error"]["message"]
    fired = cli(store, "timers", "--fire", "--now", LATER)
    assert [f["instance_id"] for f in fired["fired"]] == [iid] and fired["fired"][0]["status"] == "waiting"
    (wait,) = cli(store, "inspect", iid)["waiting_for"]
    assert (wait["kind"], wait["event"], wait["task_id"]) == ("event", "medical_report", "await_report")
    return iid


def test_issued_when_accepted_and_no_smoker(store: str, tmp_path: Path) -> None:
    iid = walk_to_the_message(store, tmp_path, {"accept": True, "loading_pct": "25"})
    typo = cli(store, "send", iid, "medical_reprot", "--json-payload", "{}", code=2)
    assert "medical_report" in typo["error"]["message"]
    doc = cli(store, "send", iid, "medical_report", "--json-payload", '{"bmi": 24, "smoker": false}')
    history = doc["layers"]["L3"]
    assert doc["status"] == "completed"
    assert history["final_premium"] == 2187.5 and history["policy_status"] == "issued"   # 1750 * 1.25
    assert history["event:await_report"]["keys"] == ["bmi", "smoker"]


def test_declined_through_the_error_boundary(store: str, tmp_path: Path) -> None:
    iid = walk_to_the_message(store, tmp_path, {"accept": True})
    doc = cli(store, "send", iid, "medical_report", "--json-payload", '{"bmi": 31, "smoker": true}')
    history = doc["layers"]["L3"]
    assert doc["status"] == "completed" and history["policy_status"] == "declined"
    assert history["event:declined"]["code"] == "DECLINED"
    assert "activity:issue" not in history
    joins = cli(store, "tape", iid, "--kind", "join")
    (join,) = [e for e in joins if e["context"] == "main"]
    assert join["data"]["gateway_id"] == "join" and join["data"]["branches"] == ["pricing", "compliance"]


def test_a_payload_changing_a_process_key_is_refused_whole(store: str, tmp_path: Path) -> None:
    iid = walk_to_the_message(store, tmp_path, {"accept": True})
    doc = cli(store, "send", iid, "medical_report", "--json-payload", '{"bmi": 24, "age": 30}', code=2)
    error = doc["error"]
    assert error["kind"] == "permission_denied" and "'age'" in error["message"]
    # the refusal names the catch event the payload was for, and what the sender can do
    assert error["task_id"] == "await_report" and "catch event 'await_report'" in error["message"]
    assert "send the payload without 'age'" in error["message"]
    assert doc["waiting_for"][0]["task_id"] == "await_report"
    assert "bmi" not in cli(store, "inspect", iid)["layers"]["L4"]
    denied = cli(store, "tape", iid, "--kind", "denied")
    assert [e["data"]["key"] for e in denied] == ["age"]


def test_rest_names_the_catch_event_of_a_refused_payload(store: str, tmp_path: Path) -> None:
    from fastapi.testclient import TestClient

    from engine.api import create_app

    iid = walk_to_the_message(store, tmp_path, {"accept": True})
    with TestClient(create_app(store, token="uw41"), headers={"Authorization": "Bearer uw41"}) as client:
        r = client.post(f"/api/instances/{iid}/events", json={"name": "medical_report", "payload": {"age": 30}})
        assert r.status_code == 403, r.text
        error = r.json()["error"]
        assert (error["kind"], error["key"], error["task_id"]) == ("permission_denied", "age", "await_report")
        r = client.post(f"/api/instances/{iid}/events", json={"name": "medical_report", "payload": {"smoker": False}})
        assert r.status_code == 200 and r.json()["status"] == "completed", r.text


def test_replay_until_rebuilds_the_band_before_the_split(store: str) -> None:
    iid = started(store)["instance_id"]
    events = cli(store, "tape", iid)
    split = next(e for e in events if e["context"] == "main" and (e.get("data") or {}).get("note") == "split")
    doc = cli(store, "replay", iid, "--until", str(split["seq"]))
    assert doc["until"] == split["seq"] and "premium" not in {**doc["layers"]["L3"], **doc["layers"]["L4"]}
    ctx = LayeredContext.replay([e for e in events if e["context"] == "main"], until=split["seq"])
    assert ctx.resolve("band") == "C"
    end = cli(store, "replay", iid, "--until", "9999")
    assert end["until_requested"] == 9999 and end["until"] == end["tape_end"]


def test_python_api_with_its_own_clock() -> None:
    now = [1_900_000_000.0]
    engine = Engine("memory://", clock=lambda: now[0])
    inst = engine.run(load_process([BPMN]), {"age": 30, "sum_insured": 100000})
    # band A: the policy rule does not apply and no model runs, so a person settles premium
    assert inst.context.resolve("band") == "A"
    (ask,) = inst.waiting_for
    assert (ask["kind"], ask["id"]) == ("confirmation", "join/premium")
    inst = engine.resume(inst, answers={"confirmations": {"join/premium": 650}})
    assert inst.context.resolve("premium") == 650
    inst = engine.complete_user_task(inst, "underwrite", {"accept": True})
    assert [w["task_id"] for w in inst.waiting_for] == ["cooling_off"]
    now[0] += 3 * 3600
    assert [t["task_id"] for t in engine.due_timers()] == ["cooling_off"]
    inst = engine.resume(inst.id)
    inst = engine.send_event(inst, "medical_report", {"bmi": 22, "smoker": False})
    assert inst.status == "completed" and inst.context.resolve("policy_status") == "issued"


@pytest.mark.parametrize("edit, expected", [
    (("underwriting.bpmn", '"PT2H"', '"PT2X"'), ["element 'cooling_off'", "timeDuration", '"PT2X"', "PT15M"]),
    (("underwriting.layerflow.yaml", "  reducers: {conditions: union}",
      "  mergeStrategy: BRANCH_PRIORITY\n  branchPriority: [complaince, pricing]"),
     ["underwriting.layerflow.yaml", "element 'join'", "branchPriority.0", "did you mean 'compliance'"]),
])
def test_mistakes_are_named_by_validate(tmp_path: Path, edit: tuple[str, str, str], expected: list[str]) -> None:
    for f in HERE.iterdir():
        shutil.copy(f, tmp_path / f.name)
    name, old, new = edit
    text = (tmp_path / name).read_text()
    assert old in text
    (tmp_path / name).write_text(text.replace(old, new))
    out = CliRunner().invoke(main, ["validate", str(tmp_path / "underwriting.bpmn")])
    assert out.exit_code == 2
    for part in expected:
        assert part in out.output


def test_branch_priority_without_its_strategy_is_warned(tmp_path: Path) -> None:
    """``branchPriority`` alone decides nothing (only ``mergeStrategy: BRANCH_PRIORITY`` reads it): the
    join put both conflicts to a person while ``validate`` called the process valid, no word of it."""
    for f in HERE.iterdir():
        shutil.copy(f, tmp_path / f.name)
    (tmp_path / "underwriting.layerflow.yaml").write_text("join:\n  branchPriority: [compliance, pricing]\n")
    out = CliRunner().invoke(main, ["validate", str(tmp_path / "underwriting.bpmn"), "--json"])
    assert out.exit_code == 0, out.output
    (problem,) = [p for p in json.loads(out.stdout)["problems"] if p["code"] == "branch_priority_unused"]
    assert (problem["element_id"], problem["field"], problem["severity"]) == ("join", "branchPriority", "warning")
    assert problem["file"].endswith("underwriting.layerflow.yaml")
    assert "mergeStrategy: BRANCH_PRIORITY" in problem["message"]
    # with the strategy named it decides, and validate is quiet about it
    (tmp_path / "underwriting.layerflow.yaml").write_text(
        "join:\n  mergeStrategy: BRANCH_PRIORITY\n  branchPriority: [compliance, pricing]\n")
    out = CliRunner().invoke(main, ["validate", str(tmp_path / "underwriting.bpmn"), "--json"])
    assert not [p for p in json.loads(out.stdout)["problems"] if p["code"] == "branch_priority_unused"]


def test_a_dmn_input_naming_an_absent_key_names_task_and_key(store: str) -> None:
    doc = cli(store, "run", str(BPMN), "--data", '{"agee": 45, "sum_insured": 300000}', code=1)
    assert doc["error"]["kind"] == "activity_failed" and doc["error"]["task_id"] == "band"
    assert "no key 'age'" in doc["error"]["message"] and "give 'age' a value" in doc["error"]["message"]
