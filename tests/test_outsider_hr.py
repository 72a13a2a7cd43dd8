"""An HR team integrates layerflow into its onboarding system, from README.md and DESIGN.md alone.

The processes (tests/outsider_hr/): ``employee_onboarding`` (onboarding.bpmn) opens the file, asks every
manager of the hire for an approval (a parallel multi-instance user task collecting ``approvals``),
profiles the role in a model step (offline: its handler stands in for the model, under an
``outputSchema``), then IT and facilities prepare in parallel and both decide ``start_date``,
``equipment`` and ``badge_level``: at the join ``equipment`` is a ``union`` reducer, ``badge_level`` a
policy rule and ``start_date`` a person's ``human_confirm``. The signed contract arrives as a message;
the orientation is held, or a three-day boundary timer escalates it. ``hiring_request`` (hiring.bpmn)
calls it through a call activity.

Each door is driven as a user would: the Python API, the CLI (click's runner, in this process), a real
``layerflow serve`` over HTTP and ``layerflow submit`` / ``worker`` on Redis DB 14; the outcome must be
the same through every one.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import subprocess
import traceback
from collections.abc import Iterator, Mapping
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import httpx
import pytest

ROOT = Path(__file__).resolve().parent.parent
HR = Path(__file__).resolve().parent / "outsider_hr"
ONBOARDING = str(HR / "onboarding.bpmn")
HIRING = str(HR / "hiring.bpmn")
REDIS = "redis://127.0.0.1:6379/14"

HIRE = {"employee_id": "E-100", "title": "Senior Accountant", "managers": ["ann", "bob"]}
APPROVE = {"approval": {"approved": True}}
ANSWERS = {"user_tasks": {"manager_approval": APPROVE},
           "confirmations": {"provision_join/start_date": "2026-02-09"}}
CONTRACT = {"signed_on": "2026-01-20"}
DESIGN_FIELDS = {
    "instance_id": str, "process_id": str, "status": str, "error": (dict, type(None)),
    "layers": dict, "tokens": dict, "conflicts": list, "compressions": list,
    "confirmations": list, "waiting_for": list, "tape_length": int,
}
LAYERS = ["L0", "L1", "L2", "L3", "L4", "L5"]


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    """``layerflow ARGS`` in this process, stdin no terminal (as in a script)."""
    from click.testing import CliRunner

    from engine.cli import main

    with contextlib.chdir(ROOT):
        result = CliRunner(env={"LAYERFLOW_STORE": None}).invoke(main, list(args), input="", prog_name="layerflow")
    stderr = result.stderr
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        stderr += "".join(traceback.format_exception(result.exception))
    return subprocess.CompletedProcess(["layerflow", *args], result.exit_code, result.stdout, stderr)


def cli_json(*args: str) -> tuple[int, dict[str, Any], str]:
    done = cli(*args, "--json")
    assert done.stdout.strip(), f"no JSON on stdout; stderr: {done.stderr}"
    return done.returncode, json.loads(done.stdout), done.stderr  # json.loads: exactly one document


def check_design_shape(doc: Mapping[str, Any]) -> None:
    for name, kind in DESIGN_FIELDS.items():
        assert isinstance(doc[name], kind), (name, doc[name])
    assert doc["status"] in ("completed", "waiting", "error")
    assert list(doc["layers"]) == LAYERS
    assert set(doc["tokens"]) == {*LAYERS, "total"}
    assert doc["tokens"]["total"] == sum(doc["tokens"][name] for name in LAYERS)
    for conflict in doc["conflicts"]:
        assert {"gateway_id", "layer", "key", "base_value", "values", "resolution"} <= set(conflict)
        if conflict["resolution"] is not None:
            assert conflict["resolution"]["resolver"] in ("policy", "model", "human", "strategy")
    for item in doc["waiting_for"]:
        assert {"kind", "id", "task_id"} <= set(item)
    for confirmation in doc["confirmations"]:
        assert {"id", "type", "message", "options", "answer", "timed_out"} <= set(confirmation)


def essence(doc: Mapping[str, Any]) -> tuple[Any, ...]:
    """What the HR team relies on, whichever door ran the instance."""
    data = {k: v for k, v in doc["layers"]["L3"].items() if ":" not in k and not k.startswith("_")}
    conflicts = sorted((c["key"], c["resolution"]["value"], c["resolution"]["resolver"]) for c in doc["conflicts"])
    return doc["status"], doc["layers"]["L1"], data, conflicts


EXPECTED_DATA = {
    "onboarding_status": "approvals", "approver_count": 2, "approvals": [{"approved": True}] * 2,
    "role_level": "senior", "profile_summary": "Senior Accountant approved by 2 managers",
    "start_date": "2026-02-09", "equipment": ["laptop", "headset", "desk"], "badge_level": "restricted",
    "it_ticket": "IT-E-100", "desk": "4.12", "contract": CONTRACT, "held": True,
    "onboarding_outcome": "onboarded E-100 on 2026-02-09",
}
EXPECTED_CONFLICTS = [("badge_level", "restricted", "policy"), ("start_date", "2026-02-09", "human")]


def write_json(path: Path, value: Any) -> str:
    path.write_text(json.dumps(value))
    return str(path)


@pytest.fixture
def store(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'hr.db'}"


def in_days(days: int) -> str:
    return (datetime.now(timezone.utc) + timedelta(days=days)).strftime("%Y-%m-%dT%H:%M:%SZ")


# ===== the CLI, step by step =====================================================================

def test_validate_accepts_both_processes() -> None:
    assert cli("validate", ONBOARDING).returncode == 0
    done = cli("validate", HIRING, ONBOARDING)
    assert done.returncode == 0, done.stdout + done.stderr


def test_cli_walkthrough_every_step_and_every_reading_command(store: str, tmp_path: Path) -> None:
    code, doc, _ = cli_json("run", ONBOARDING, "--data", json.dumps(HIRE), "--store", store)
    check_design_shape(doc)
    assert code == 3 and doc["status"] == "waiting"
    voters = [(w["task_id"], w["instance"], w["input"]) for w in doc["waiting_for"]]
    assert voters == [("manager_approval", 1, {"manager": "ann"}), ("manager_approval", 2, {"manager": "bob"})]
    iid = doc["instance_id"]

    # one manager at a time, by the item's id; then the other by the BPMN id
    ann = doc["waiting_for"][0]["id"]
    code, doc, _ = cli_json("resume", iid, "--store", store, "--answer", f"{ann}={json.dumps(APPROVE)}")
    assert code == 3 and [w["instance"] for w in doc["waiting_for"]] == [2]
    code, doc, _ = cli_json("resume", iid, "--store", store, "--answer", f"manager_approval={json.dumps(APPROVE)}")
    check_design_shape(doc)
    assert code == 3 and [w["id"] for w in doc["waiting_for"]] == ["provision_join/start_date"]
    by_key = {c["key"]: c for c in doc["conflicts"]}
    assert by_key["badge_level"]["resolution"]["resolver"] == "policy"
    assert by_key["start_date"]["resolution"] is None
    assert by_key["start_date"]["values"] == {"it_setup": "2026-02-02", "facilities_setup": "2026-02-09"}
    assert "equipment" not in by_key  # the union reducer settles it
    [asked] = doc["confirmations"]
    assert {o["value"] for o in asked["options"]} == {"2026-02-02", "2026-02-09", "$escalate"}

    answers = write_json(tmp_path / "answers.json", {"confirmations": {"provision_join/start_date": "2026-02-09"}})
    code, doc, _ = cli_json("resume", iid, "--store", store, "--answers", answers)
    assert code == 3 and [w["kind"] for w in doc["waiting_for"]] == ["event"]
    done = cli("send", iid, "contract_signed", "--store", store, "--json-payload", json.dumps(CONTRACT))
    assert done.returncode == 3, done.stderr
    code, doc, _ = cli_json("resume", iid, "--store", store, "--answer", 'orientation={"held": true}')
    check_design_shape(doc)
    assert code == 0 and essence(doc) == ("completed", HIRE, EXPECTED_DATA, EXPECTED_CONFLICTS)

    # reading commands
    tape = cli("tape", iid, "--store", store, "--kind", "conflict")
    assert tape.returncode == 0 and "badge_level" in tape.stdout and "start_date" in tape.stdout
    code, decisions, _ = cli_json("tape", iid, "--store", store, "--kind", "human_decision")
    assert [(e["data"]["confirmation_id"], e["data"]["value"]) for e in decisions] == [
        ("provision_join/start_date", "2026-02-09")]
    inspected = cli("inspect", iid, "--store", store, "--layer", "L3")
    assert inspected.returncode == 0 and "start_date" in inspected.stdout
    [split] = json.loads(cli("tape", iid, "--store", store, "--kind", "split", "--json").stdout)
    code, before, _ = cli_json("replay", iid, "--store", store, "--until", str(split["seq"]))
    assert code == 0 and "start_date" not in before["layers"]["L3"] and before["layers"]["L3"]["role_level"] == "senior"
    listed = json.loads(cli("list", "--store", store, "--json").stdout)
    assert [(i["instance_id"], i["status"]) for i in listed] == [(iid, "completed")]

    # a resume of the completed instance uses none of its answers, and says so
    done = cli("resume", iid, "--store", store, "--answer", 'orientation={"held": true}')
    assert done.returncode == 0 and "'orientation' was not used" in done.stderr


def test_timer_boundary_escalates_the_orientation_from_the_cli(store: str) -> None:
    code, doc, _ = cli_json("run", ONBOARDING, "--data", json.dumps(HIRE), "--store", store,
                            "--answer", f"manager_approval={json.dumps(APPROVE)}",
                            "--answer", "provision_join/start_date=2026-02-02")
    iid = doc["instance_id"]
    code, doc, _ = cli_json("send", iid, "contract_signed", "--store", store, "--json-payload", json.dumps(CONTRACT))
    assert code == 3 and {w["kind"] for w in doc["waiting_for"]} == {"user_task", "timer"}
    code, doc, _ = cli_json("resume", iid, "--store", store, "--now", in_days(4))
    assert code == 0 and doc["status"] == "completed"
    assert doc["layers"]["L3"]["onboarding_outcome"] == "orientation overdue for E-100"


def test_snapshot_rollback_and_cancel(store: str) -> None:
    code, doc, _ = cli_json("run", ONBOARDING, "--data", json.dumps(HIRE), "--store", store,
                            "--answer", f"manager_approval={json.dumps(APPROVE)}")
    iid = doc["instance_id"]
    snap = cli("snapshot", iid, "--store", store).stdout.strip()
    # the join waits for a person: main has open branches, so a rollback of main is refused, naming them
    code, refused, _ = cli_json("rollback", iid, "--store", store, "--snapshot", snap, "--layers", "L3")
    assert code == 2 and refused["status"] == "error" and "it_setup" in refused["error"]["message"]
    # refused once it found the instance: the document shows the instance as it is, as resume's does
    assert refused["error"]["instance_status"] == "waiting"
    assert [w["id"] for w in refused["waiting_for"]] == ["provision_join/start_date"]
    assert refused["layers"]["L1"] == HIRE and refused["tape_length"] > 0
    cli("resume", iid, "--store", store, "--answer", "provision_join/start_date=2026-02-02")
    snap = cli("snapshot", iid, "--store", store).stdout.strip()
    code, rolled, _ = cli_json("rollback", iid, "--store", store, "--snapshot", snap, "--layers", "L3")
    assert code == 0 and rolled["snapshot_id"] == snap and rolled["restored_layers"] == ["L3"]
    code, cancelled, _ = cli_json("cancel", iid, "--store", store, "--reason", "candidate withdrew")
    assert code == 0 and cancelled["cancelled"]["reason"] == "candidate withdrew"
    done = cli("send", iid, "contract_signed", "--store", store, "--json-payload", json.dumps(CONTRACT))
    assert done.returncode == 2 and "cancelled" in done.stderr


# ===== plausible mistakes ========================================================================

@pytest.fixture
def at_the_join(store: str) -> str:
    code, doc, _ = cli_json("run", ONBOARDING, "--data", json.dumps(HIRE), "--store", store,
                            "--answer", f"manager_approval={json.dumps(APPROVE)}")
    assert code == 3 and doc["waiting_for"][0]["id"] == "provision_join/start_date"
    return str(doc["instance_id"])


@pytest.mark.parametrize("answer, named", [
    ("provision_joinn/start_date=2026-02-09", "'provision_joinn/start_date' can match no confirmation"),
    ("provision_join/start_dat=2026-02-09", "'provision_join/start_dat' can match no confirmation"),
    ("provision_join/start_date=2026-03-01", "'2026-03-01' for confirmation 'provision_join/start_date' is not "
                                             "one of the offered option values"),
])
def test_a_wrong_answer_is_bad_input_naming_it(at_the_join: str, store: str, answer: str, named: str) -> None:
    code, doc, _ = cli_json("resume", at_the_join, "--store", store, "--answer", answer)
    assert code == 2 and doc["status"] == "error" and named in doc["error"]["message"]
    assert doc["error"]["instance_status"] == "waiting"
    assert "provision_join/start_date" in doc["error"]["message"]  # what would match
    assert [w["id"] for w in doc["waiting_for"]] == ["provision_join/start_date"]  # nothing applied


def test_an_answers_file_with_a_misspelt_section_is_refused(at_the_join: str, store: str, tmp_path: Path) -> None:
    bad = write_json(tmp_path / "a.json", {"user_task": {"orientation": {"held": True}}})
    code, doc, _ = cli_json("resume", at_the_join, "--store", store, "--answers", bad)
    assert code == 2 and "'user_task'" in doc["error"]["message"] and "user_tasks" in doc["error"]["message"]


def test_an_answer_for_a_conflict_the_policy_settled_says_so(store: str) -> None:
    """badge_level meets a conflict at provision_join, settled by the policy rule: an answer given for it
    in advance is not used, and stderr must say why, not claim the join met no conflict there."""
    done = cli("run", ONBOARDING, "--data", json.dumps(HIRE), "--store", store,
               "--answer", f"manager_approval={json.dumps(APPROVE)}",
               "--answer", "provision_join/start_date=2026-02-02", "--answer", "provision_join/badge_level=standard")
    assert done.returncode == 3, done.stderr
    line = next(line for line in done.stderr.splitlines() if "'provision_join/badge_level'" in line)
    assert "met no conflict" not in line
    assert "policy" in line and "new hires start restricted" in line and "not used" in line


def test_the_python_api_names_an_unused_answer_as_the_cli_does() -> None:
    """`instance.notices` (REST's `notices`) say what the CLI's stderr says of an answer no step used."""
    from engine import Engine, load_process

    instance = Engine("memory://").run(load_process(ONBOARDING), HIRE, answers={
        "user_tasks": {"manager_approval": APPROVE},
        "confirmations": {"provision_join/start_date": "2026-02-02", "provision_join/badge_level": "standard"}})
    assert instance.status == "waiting"
    [notice] = [n for n in instance.notices if "'provision_join/badge_level'" in n]
    assert "settled its conflict on 'badge_level' by policy" in notice and "not used" in notice


@pytest.mark.parametrize("edit, named", [
    (("reducers:", "reducer:"), "field 'reducer': unknown field; did you mean 'reducers'?"),
    (("{equipment: union}", "{equipment: unoin}"), "field 'reducers.equipment'"),
    (("value: restricted", "vaule: restricted"), "field 'conflictPolicy.rules.0.vaule'"),
    (("provision_join:", "provision_joins:"), "element 'provision_joins'"),
])
def test_a_config_typo_names_file_element_and_field(tmp_path: Path, edit: tuple[str, str], named: str) -> None:
    for name in ("onboarding.bpmn", "hr_handlers.py"):
        shutil.copy(HR / name, tmp_path / name)
    text = (HR / "onboarding.layerflow.yaml").read_text()
    assert edit[0] in text
    (tmp_path / "onboarding.layerflow.yaml").write_text(text.replace(edit[0], edit[1], 1))
    done = cli("validate", str(tmp_path / "onboarding.bpmn"))
    assert done.returncode == 2 and named in done.stdout + done.stderr
    assert "onboarding.layerflow.yaml" in done.stdout + done.stderr
    done = cli("run", str(tmp_path / "onboarding.bpmn"), "--data", json.dumps(HIRE), "--store",
               f"sqlite:///{tmp_path / 'x.db'}")
    assert done.returncode == 2 and named in done.stderr and not (tmp_path / "x.db").exists()


# ===== the model step ============================================================================

def test_the_offline_stand_in_of_a_model_step_is_held_to_its_output_schema(tmp_path: Path) -> None:
    """The handler that stands in for the model offline answers what the model would: an answer its
    llm.outputSchema refuses fails the step, naming the task and the field, nothing of it written."""
    from engine import Engine, load_process

    for name in ("onboarding.bpmn", "onboarding.layerflow.yaml"):
        shutil.copy(HR / name, tmp_path / name)
    (tmp_path / "hr_handlers.py").write_text(
        "def role_profile(ctx):\n    return {'role_level': 'intern', 'profile_summary': 'x'}\n")
    engine = Engine("memory://")
    instance = engine.run(load_process(tmp_path / "onboarding.bpmn"), {**HIRE, "managers": ["ann"]})
    instance = engine.complete_user_task(instance, "manager_approval", APPROVE)
    assert instance.status == "error"
    assert instance.error is not None and instance.error["task_id"] == "role_profile"
    message = instance.error["message"]
    assert "outputSchema" in message and "/role_level" in message and "intern" in message
    assert "role_level" not in instance.main.layer(3) and "role_level" not in instance.main.layer(4)


def test_the_model_step_with_the_deterministic_fake_is_checked_and_asked_again(monkeypatch: pytest.MonkeyPatch
                                                                              ) -> None:
    import types

    import engine.llm
    from engine import Engine, load_process

    replies = [json.dumps({"role_level": "intern", "profile_summary": "x"}),
               json.dumps({"role_level": "lead", "profile_summary": "Leads the accounting team"})]
    sent: list[dict[str, Any]] = []

    def completion(**kwargs: Any) -> dict[str, Any]:
        if "Profile the new role" in json.dumps(kwargs["messages"]):
            sent.append(kwargs)
            content = replies.pop(0)
        else:  # the join's conflict on start_date: the model leaves it to the person
            content = json.dumps({"final_value": "2026-02-02", "rationale": "HR decides", "escalate": True})
        return {"choices": [{"index": 0, "finish_reason": "stop",
                             "message": {"role": "assistant", "content": content}}],
                "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15}}

    monkeypatch.setattr(engine.llm, "load_litellm", lambda: types.SimpleNamespace(completion=completion))
    eng = Engine("memory://", model="fake/model")
    instance = eng.run(load_process(ONBOARDING), {**HIRE, "managers": ["ann"]}, answers={
        "user_tasks": {"manager_approval": APPROVE}, "confirmations": {"provision_join/start_date": "2026-02-02"}})
    assert instance.status == "waiting", instance.error
    assert len(sent) == 2 and "/role_level" in json.dumps(sent[1]["messages"][-1])  # told what is wrong
    assert instance.main.resolve("role_level") == "lead"


# ===== the same outcome through every door =======================================================

def test_python_api_and_call_activity_give_the_cli_outcome(store: str) -> None:
    from engine import Engine, load_process

    clock = [datetime(2026, 1, 5, 9, tzinfo=timezone.utc).timestamp()]
    engine = Engine(store, clock=lambda: clock[0])
    process = load_process([HIRING, ONBOARDING])
    instance = engine.run(process, HIRE)
    assert [w["task_id"] for w in instance.waiting_for] == ["manager_approval"] * 2
    first = engine.complete_user_task(instance, "manager_approval", APPROVE)
    assert first.completed_user_task["instance"] == 1
    instance = engine.complete_user_task(first, "manager_approval", APPROVE)
    instance = engine.resume(instance, answers={"confirmations": {"provision_join/start_date": "2026-02-09"}})
    instance = engine.send_event(instance, "contract_signed", CONTRACT)
    instance = engine.complete_user_task(instance, "orientation", {"held": True})
    assert instance.status == "completed", instance.error
    code, doc, _ = cli_json("inspect", instance.id, "--store", store)
    status, facts, data, conflicts = essence(doc)
    assert data.pop("offer_status") == "accepted"
    assert data.pop("request_status") == "closed: onboarded E-100 on 2026-02-09"
    assert (status, facts, data, conflicts) == ("completed", HIRE, EXPECTED_DATA, EXPECTED_CONFLICTS)


@pytest.fixture
def server(tmp_path: Path) -> Iterator[httpx.Client]:
    from tests.test_outsider_claims import serving

    with serving(HR, tmp_path / "served.db") as client:
        yield client


def test_rest_gives_the_cli_outcome_and_names_mistakes(server: httpx.Client) -> None:
    import local_http

    assert {p["id"] for p in server.get("/api/processes").json()} == {"employee_onboarding", "hiring_request"}
    wrong = local_http.post(f"{server.base_url}/api/instances", json={"process_id": "employee_onboarding"},
                            headers={"Authorization": "Bearer not-the-token"})
    assert wrong.status_code == 401 and wrong.json()["error"]["kind"] == "unauthorized"

    started = server.post("/api/instances", json={"process_id": "employee_onboarding", "data": HIRE})
    assert started.status_code == 201
    iid = started.json()["instance_id"]
    for _ in HIRE["managers"]:
        done = server.post(f"/api/instances/{iid}/user-tasks/manager_approval", json={"data": APPROVE})
        assert done.status_code == 200
    doc = done.json()
    check_design_shape(doc)
    assert [w["id"] for w in doc["waiting_for"]] == ["provision_join/start_date"]

    refused = server.post("/api/context-governance/resolve", json={
        "instance_id": iid, "conflict_key": "provision_join/start_date", "resolution": "2026-03-01", "reason": "HR"})
    assert refused.status_code == 400 and "not one of the offered option values" in refused.json()["error"]["message"]
    unknown = server.post("/api/context-governance/resolve", json={
        "instance_id": iid, "conflict_key": "provision_join/start_dat", "resolution": "2026-02-09", "reason": "HR"})
    assert unknown.status_code == 404 and "provision_join/start_date" in unknown.json()["error"]["message"]
    typo = server.post("/api/context-governance/config", json={
        "instance_id": iid, "config": {"activityId": "orientation", "preservKeys": ["start_date"]}})
    assert typo.status_code == 422 and "did you mean 'preserveKeys'" in typo.json()["error"]["message"]
    resolved = server.post("/api/context-governance/resolve", json={
        "instance_id": iid, "conflict_key": "provision_join/start_date", "resolution": "2026-02-09", "reason": "HR"})
    assert resolved.status_code == 200
    inspected = server.post("/api/context-governance/inspect", json={"instance_id": iid})
    assert inspected.status_code == 200 and inspected.json()["L3"]["key_count"] > 0
    assert server.post(f"/api/instances/{iid}/events", json={"name": "contract_signd"}).status_code == 409
    assert server.post(f"/api/instances/{iid}/events",
                       json={"name": "contract_signed", "payload": CONTRACT}).status_code == 200
    done = server.post(f"/api/instances/{iid}/user-tasks/orientation", json={"data": {"held": True}})
    doc = done.json()
    check_design_shape(doc)
    assert essence(doc) == ("completed", HIRE, {**EXPECTED_DATA}, EXPECTED_CONFLICTS)
    answered = server.post("/api/instances", json={"process_id": "employee_onboarding", "data": HIRE, "answers": {
        "user_tasks": {"manager_approval": APPROVE}, "confirmations": {"provision_join/badge_level": "standard"}}})
    assert answered.status_code == 201 and [w["id"] for w in answered.json()["waiting_for"]] == [
        "provision_join/start_date"]
    assert any("'provision_join/badge_level'" in n and "by policy" in n for n in answered.json()["notices"])
    again = server.post(f"/api/instances/{iid}/resume", json={"answers": {"user_tasks": {"orientation": {}}}})
    assert again.status_code == 200 and again.json()["version"] == doc["version"]
    assert any("not used" in n for n in again.json()["notices"])
    assert server.post(f"/api/instances/{iid}/cancel", json={"reason": "late"}).status_code == 409


def test_redis_workers_give_the_cli_outcome(tmp_path: Path) -> None:
    from tests.engine.engine_helpers import redis_scratch

    with redis_scratch(REDIS, "outsider39") as prefix:
        store = f"{REDIS}?prefix={prefix}"
        stream = f"{prefix}ready"
        code, submitted, _ = cli_json("submit", ONBOARDING, "--data", json.dumps(HIRE), "--store", store,
                                      "--stream", stream)
        assert code == 0
        [iid] = submitted["instance_ids"]
        code, stats, _ = cli_json("worker", "--store", store, "--stream", stream, "--stop-after", "1",
                                  "--timer-interval", "0")
        assert code == 0 and stats["statuses"] == {"waiting": 1}
        answers = write_json(tmp_path / "answers.json", ANSWERS)
        code, doc, _ = cli_json("resume", iid, "--store", store, "--answers", answers)
        assert code == 3 and [w["kind"] for w in doc["waiting_for"]] == ["event"]
        code, doc, _ = cli_json("send", iid, "contract_signed", "--store", store, "--json-payload", json.dumps(CONTRACT))
        code, doc, _ = cli_json("resume", iid, "--store", store, "--answer", 'orientation={"held": true}')
        check_design_shape(doc)
        assert essence(doc) == ("completed", HIRE, EXPECTED_DATA, EXPECTED_CONFLICTS)
