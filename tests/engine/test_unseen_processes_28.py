"""Outsider round 28: three processes nobody here had seen, written from DESIGN.md and README.md only
(tests/engine/unseen28/), driven through the CLI, the Python API, a real `layerflow serve` on Redis
(database 8) and a worker.

scholarship_award: a foundation's scholarship round. A parallel split into three reviews of different
  kinds (the academic review: a Python handler from a file beside the BPMN; the financial need: a model
  activity, `llm:` block, run by its offline handler as no model is given; the interview: a user task)
  that each write `recommendation`: a real conflict at the join, put to the programme officer
  (`humanConfirm`, default `waitlist`, two days). `reviewer_notes` is reduced by `append`. The award
  step preserves the decision and folds HISTORY on `compressMessageThreshold` with a `count_only` rule
  over the activity records.

instrument_calibration: a lab instrument's calibration. A loop back through an XOR with a counter kept
  in WORKING (`data_layers`): measure, adjust, measure again, at most `max_attempts` rounds, else
  quarantine (the XOR's default flow); the technician's sign-off has an interrupting boundary timer
  (PT4H) that pages the lab lead; a non-interrupting message event sub-process logs a manufacturer's
  recall notice whenever it comes.

deposit_return + damage_assessment (two files): a tenancy's deposit. A call activity with its own data
  mapping (`camunda:in`/`camunda:out`) runs the landlord's damage desk, which decides repair or replace
  by an XOR; only what the `out` mappings name comes back to the deposit.

Expected before anything ran: as README and DESIGN say (JSON shapes, exit codes, statuses, waiting_for
items, tape events, merge records).

Found: an answer to a confirmation through REST (`POST /api/confirmations/{id}`, and `resolve`) runs the
instance on, but its reply had no `"notices"`, which README promises on "every REST reply of a request
that ran an instance". After the officer escalated and an administrator settled the join by a runtime
`config` rule (as the escalation's message says to), the resume's notices said the config file had
changed since the instance started and told to apply the change through the API just used: a runtime
change was compared with the file as if the file had been edited. Misread at first (the engine is right): a start-data key kept in WORKING
(`data_layers`) is listed in the first activity's record `keys` (the record lists what WORKING hands on
with the activity, as a branch's `contextInject`), while `inspect` names who wrote it; an XOR's
`_branch_id` stays in HISTORY after the branch (DESIGN: WORKING of the branch, moved at activity end); a
typo in the context key of `GATEWAY/KEY` is no bad input (a join may meet any key): stderr names it.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest

from engine import Engine, load_process
from engine.governance import ConfigArgs, GovernanceService, InstanceStateError

from engine_helpers import cli_in_a_tmp_store, redis_scratch, run_json, wait_until_served
from test_contracts_cli import check_run_document

cli = cli_in_a_tmp_store  # the fixture "cli", here too

HERE = Path(__file__).resolve().parent / "unseen28"
ROOT = Path(__file__).resolve().parents[2]
SCHOLARSHIP = HERE / "scholarship_award.bpmn"
CALIBRATION = HERE / "instrument_calibration.bpmn"
DEPOSIT, DAMAGE = HERE / "deposit_return.bpmn", HERE / "damage_assessment.bpmn"
REDIS_DB8 = "redis://127.0.0.1:6379/8"   # this round's database on the shared Redis
TOKEN = "outsider-28"
T0 = 1_800_000_000.0

# academic: award (gpa 3.8); need: waitlist (income 40000); the panel answers award
APPLICANT = {"applicant_no": 4411, "gpa": 3.8, "household_income": 40000}
PANEL = {"interview_score": 8, "recommendation": "award", "reviewer_notes": ["panel: strong interview"]}
INSTRUMENT = {"asset_tag": "BAL-07", "readings": [0.9, 0.4, 0.08], "tolerance": 0.1, "max_attempts": 3,
              "attempt": 0}
ITEMS = [{"name": "sofa", "repair": 180, "replace": 900}, {"name": "carpet", "repair": 420, "replace": 600}]
TENANCY = {"tenancy_ref": "T-3301", "deposit": 1500, "tenancy_months": 36}


class Clock:
    """The engine's clock (``Engine(clock=...)``), moved by the test."""

    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> float:
        return self.now


def _data_keys(layer: dict[str, Any]) -> dict[str, Any]:
    """A layer's data keys: no records, no engine bookkeeping."""
    return {k: v for k, v in layer.items()
            if not k.startswith(("_", "activity:", "event:", "compaction:", "summary:"))}


# ===== the scholarship round: three kinds of review, one conflict, the officer decides ==============

def test_three_reviews_disagree_on_the_recommendation_and_the_officer_decides(cli: Any) -> None:
    doc = run_json(cli, "run", str(SCHOLARSHIP), "--data", json.dumps(APPLICANT), code=3)
    check_run_document(doc)
    iid = doc["instance_id"]
    [panel] = doc["waiting_for"]
    assert (panel["kind"], panel["task_id"], panel["documentation"]) == (
        "user_task", "interview_panel", "Interview the applicant; give a score from 1 to 10 and your recommendation.")
    assert {c["branch_id"]: c["status"] for c in doc["contexts"].values()} == {
        "academic_review": "open", "need_assessment": "open", "interview_panel": "open"}

    asked = run_json(cli, "resume", iid, "--answer", f"interview_panel={json.dumps(PANEL)}", code=3)
    [item] = asked["waiting_for"]
    assert (item["kind"], item["id"], item["task_id"], item["key"]) == (
        "confirmation", "review_join/recommendation", "review_join", "recommendation")
    assert "due" in item   # a two-day timeout
    [conflict] = asked["conflicts"]
    assert conflict == {"gateway_id": "review_join", "layer": "L4", "key": "recommendation", "base_value": None,
                        "values": {"academic_review": "award", "need_assessment": "waitlist",
                                   "interview_panel": "award"},
                        "resolution": None, "context": "main", "base_absent": True}
    [question] = asked["confirmations"]
    assert question["message"].startswith("The reviews disagree on the recommendation")
    assert [o["value"] for o in question["options"]] == ["award", "waitlist", "$escalate"]
    assert (question["default"], question["timeout"], question["answer"], question["timed_out"]) == (
        "waitlist", 172800.0, None, False)
    assert asked["layers"]["L3"].get("recommendation") is None   # a waiting join has changed nothing yet

    done = run_json(cli, "resume", iid, "--answer", "review_join/recommendation=award", "--by", "officer.kim")
    check_run_document(done)
    assert done["status"] == "completed" and done["waiting_for"] == []
    resolution = done["conflicts"][0]["resolution"]
    assert (resolution["value"], resolution["resolver"], resolution["by"]) == ("award", "human", "officer.kim")
    history = done["layers"]["L3"]
    [merged] = history["_mergedConflicts"]
    assert (merged["gatewayId"], merged["key"], merged["conflictingValues"], merged["sourceBranches"]) == (
        "review_join", "recommendation", ["award", "waitlist"],
        ["academic_review", "need_assessment", "interview_panel"])
    assert (history["recommendation"], history["award_amount"], history["notified"]) == (
        "award", 6000, "award letter SCH-4411")
    assert (history["application_ref"], history["interview_score"]) == ("SCH-4411", 8)   # preserved keys

    # the compression after decide_award: a cliff on the number of HISTORY entries, the activity
    # records counted (the last one kept), what no rule kept folded into one compaction record
    [cliff] = done["compressions"]
    assert cliff["activity_id"] == "decide_award" and "message_threshold" in cliff["triggers"]
    assert cliff["tokens_after"] < cliff["tokens_before"] and cliff["snapshot_id"] == "snap:main:19"
    counter = history["summary:count:activity:*"]
    assert (counter["count"], counter["kept"]) == (5, ["activity:decide_award"])
    assert "activity:academic_review" not in history and "reviewer_notes" in history["compaction:1"]["covers"]

    # the join's merge (append reducer) and the decision, as the tape has them and replay rebuilds them
    [join] = run_json(cli, "tape", iid, "--kind", "join")  # type: ignore[misc]
    assert join["data"]["branches"] == ["academic_review", "need_assessment", "interview_panel"]
    at_join = run_json(cli, "replay", iid, "--until", str(join["seq"]))
    assert at_join["layers"]["L3"]["reviewer_notes"] == [
        "academic: gpa 3.8 -> award", "need: medium -> waitlist", "panel: strong interview"]
    assert at_join["layers"]["L3"]["recommendation"] == "award" and at_join["tape_end"] > join["seq"]
    [decision] = run_json(cli, "tape", iid, "--kind", "human_decision")  # type: ignore[misc]
    assert (decision["actor"], decision["data"]["value"]) == ("officer.kim", "award")
    events: Any = run_json(cli, "tape", iid)
    assert len(events) == done["tape_length"]


def test_answers_given_in_advance_run_the_round_to_its_end_in_one_command(cli: Any, tmp_path: Path) -> None:
    answers = tmp_path / "answers.json"
    answers.write_text(json.dumps({"user_tasks": {"interview_panel": dict(PANEL, recommendation="decline")},
                                   "confirmations": {"review_join/recommendation": "waitlist"}}))
    doc = run_json(cli, "run", str(SCHOLARSHIP), "--data", json.dumps(APPLICANT), "--answers", str(answers))
    assert doc["status"] == "completed"
    [conflict] = doc["conflicts"]
    assert conflict["values"]["interview_panel"] == "decline" and conflict["resolution"]["value"] == "waitlist"
    assert (doc["layers"]["L3"]["award_amount"], doc["layers"]["L3"]["notified"]) == (0, "regret letter SCH-4411")
    # a typo in the join's id can match no confirmation: bad input, nothing run
    answers.write_text(json.dumps({"confirmations": {"revew_join/recommendation": "award"}}))
    refused = cli("run", str(SCHOLARSHIP), "--data", json.dumps(APPLICANT), "--answers", str(answers), "--json")
    assert refused.exit_code == 2, refused.stdout
    error = json.loads(refused.stdout)["error"]
    assert error["kind"] == "invalid_answer" and "'review_join'" in error["message"]
    # a typo in the context key may be any key the join meets: the run goes on, and stderr names it
    answers.write_text(json.dumps({"confirmations": {"review_join/recomendation": "award"}}))
    unused = cli("run", str(SCHOLARSHIP), "--data", json.dumps(APPLICANT), "--answers", str(answers), "--json")
    assert unused.exit_code == 3 and "'review_join/recomendation' matches no confirmation" in unused.stderr


def test_nobody_answers_within_two_days_and_the_default_waitlists_the_applicant() -> None:
    clock = Clock()
    engine = Engine("memory://", clock=clock)
    waiting = engine.run(load_process(SCHOLARSHIP), APPLICANT)
    asked = engine.complete_user_task(waiting, "interview_panel", PANEL)
    assert [w["id"] for w in asked.waiting_for] == ["review_join/recommendation"]
    clock.now += 86400
    assert engine.resume(asked.id).status == "waiting"
    clock.now += 86400 + 1
    done = engine.resume(asked.id)
    assert done.status == "completed", done.error
    assert (done.main.resolve("recommendation"), done.main.resolve("award_amount")) == ("waitlist", 0)
    [conflict] = done.conflicts
    assert conflict["resolution"]["resolver"] == "policy" and "172800s" in conflict["resolution"]["reason"]
    assert done.confirmations[0]["timed_out"] is True


def test_an_escalated_recommendation_is_settled_by_a_runtime_rule_and_no_file_change_is_reported() -> None:
    """The officer escalates; an administrator gives the join a policy rule through the governance
    `config` operation (README: an escalation is final, settled by runtime config, then a resume).
    The resume takes the rule; the config file beside the process did not change, so no notice says
    it did (and none tells to apply through the API the change just applied through it)."""
    engine = Engine("memory://")
    waiting = engine.run(load_process(SCHOLARSHIP), APPLICANT)
    asked = engine.complete_user_task(waiting, "interview_panel", PANEL)
    failed = engine.answer_confirmation(asked, "review_join/recommendation", "$escalate")
    assert failed.status == "error" and failed.error["kind"] == "merge_conflict"
    rule = {"key": "recommendation", "value": "award", "reason": "two of three reviews recommend it"}
    GovernanceService(engine).config(failed.id, ConfigArgs(activity_id="review_join",
                                                          config={"conflictPolicy": {"rules": [rule]}}))
    done = engine.resume(failed.id)
    assert done.status == "completed", done.error
    resolution = done.conflicts[0]["resolution"]
    assert (resolution["value"], resolution["resolver"]) == ("award", "policy")
    assert done.notices == [], done.notices


def test_a_file_edit_of_an_element_changed_at_runtime_is_still_named_against_the_start(tmp_path: Path) -> None:
    for name in ("scholarship_award.bpmn", "scholarship_award.layerflow.yaml", "scholarship_handlers.py"):
        (tmp_path / name).write_text((HERE / name).read_text())
    engine = Engine("memory://")
    waiting = engine.run(load_process(tmp_path / "scholarship_award.bpmn"), APPLICANT)
    GovernanceService(engine).config(waiting.id, ConfigArgs(activity_id="review_join",
                                                           config={"humanConfirm": {"default": "decline"}}))
    config = tmp_path / "scholarship_award.layerflow.yaml"
    config.write_text(config.read_text().replace("timeout: 172800", "timeout: 600"))
    still = engine.resume(waiting.id)
    [notice] = still.notices
    # the file's one change, against the config the join started with; the runtime change is no file change
    assert "element 'review_join': humanConfirm.timeout 172800 -> 600. The instance keeps" in notice, notice


# ===== the calibration: a counted loop, a recall notice, an overdue sign-off ======================

def test_three_rounds_a_recall_notice_and_an_overdue_signoff_page_the_lab_lead(cli: Any) -> None:
    doc = run_json(cli, "run", str(CALIBRATION), "--data", json.dumps(INSTRUMENT), code=3)
    check_run_document(doc)
    iid = doc["instance_id"]
    assert [(w["kind"], w["task_id"]) for w in doc["waiting_for"]] == [
        ("user_task", "technician_signoff"), ("timer", "signoff_overdue"), ("event", "recall_notice_in")]
    assert doc["waiting_for"][2]["event"] == "recall_notice" and doc["waiting_for"][2]["event_kind"] == "message"
    history = doc["layers"]["L3"]
    assert (history["attempt"], history["drift"]) == (3, 0.08)
    assert history["adjustments"] == ["round 1: drift 0.90", "round 2: drift 0.40"]
    assert [k for k in history if k.startswith("activity:measure_drift")] == [
        "activity:measure_drift", "activity:measure_drift#2", "activity:measure_drift#3"]
    assert "attempt" not in doc["layers"]["L1"]   # data_layers: WORKING, so the loop may count

    recalled = run_json(cli, "send", iid, "recall_notice", "--json-payload", '{"bulletin": "RB-2026-12"}', code=3)
    history = recalled["layers"]["L3"]
    assert history["recall_logged"] == "recall RB-2026-12 for BAL-07"
    assert history["event:recall_notice_in"]["keys"] == ["bulletin"]
    # non-interrupting: the sign-off and its timer still wait, and so does the next recall notice
    assert [w["task_id"] for w in recalled["waiting_for"]] == ["technician_signoff", "signoff_overdue",
                                                               "recall_notice_in"]
    assert [c["status"] for c in recalled["contexts"].values()] == ["joined"]

    late = cli("resume", iid, "--now", "2099-01-01T09:00:00Z", "--answer",
               'technician_signoff={"signed_by": "t.okafor"}', "--json")
    assert late.exit_code == 0, late.stderr
    assert "'technician_signoff': the given answer was not used" in late.stderr
    done = json.loads(late.stdout)
    assert done["status"] == "completed" and done["waiting_for"] == []
    history = done["layers"]["L3"]
    assert (history["certificate_status"], history["paged"]) == ("escalated", "lab lead for CAL-BAL-07")
    assert "signed_by" not in history and "activity:issue_certificate" not in history


def test_a_signoff_in_time_issues_the_certificate_and_one_after_the_timer_is_refused() -> None:
    clock = Clock()
    engine = Engine("memory://", clock=clock)
    process = load_process(CALIBRATION)
    first = engine.run(process, dict(INSTRUMENT, readings=[0.05]))
    clock.now += 3600
    signed = engine.complete_user_task(first, "technician_signoff", {"signed_by": "t.okafor"})
    assert signed.status == "completed" and signed.main.resolve("certificate_status") == "issued"
    assert signed.main.resolve("attempt") == 1 and signed.main.resolve("adjustments") == []

    second = engine.run(process, dict(INSTRUMENT, readings=[0.05], asset_tag="BAL-08"))
    clock.now += 4 * 3600 + 1
    with pytest.raises(InstanceStateError, match="signoff_overdue"):
        engine.complete_user_task(second.id, "technician_signoff", {"signed_by": "t.okafor"})
    paged = engine.load(second.id)
    assert paged.status == "completed" and paged.main.resolve("certificate_status") == "escalated"

    never = engine.run(process, dict(INSTRUMENT, readings=[0.5, 0.4, 0.3], asset_tag="BAL-09"))
    assert never.status == "completed" and never.main.resolve("certificate_status") == "quarantined"
    assert never.main.resolve("attempt") == 3   # the counter stopped the loop, not the readings


# ===== the deposit: a call activity that maps its data in and out ===============================

def test_the_damage_desk_repairs_and_only_its_mapped_outputs_come_back(cli: Any, tmp_path: Path) -> None:
    answers = tmp_path / "answers.json"
    answers.write_text(json.dumps({"user_tasks": {"moveout_inspection": {"damaged_items": ITEMS}}}))
    doc = run_json(cli, "run", str(DEPOSIT), str(DAMAGE), "--data", json.dumps(TENANCY), "--answers", str(answers))
    check_run_document(doc)
    history = doc["layers"]["L3"]
    # 36 months of wear take 30% off the replacement price: repairs (600) are cheaper than 1050
    assert _data_keys(history) == {"damaged_items": ITEMS, "deduction": 600, "damage_decisions":
                                   ["repair sofa", "repair carpet"], "refund": 900,
                                   "settlement": {"tenant": 900, "landlord": 600}}
    assert history["activity:assess_damage"]["keys"] == ["deduction", "damage_decisions"]
    [scope] = doc["contexts"]
    assert doc["contexts"][scope]["status"] == "joined" and doc["contexts"][scope]["branch_id"] == "assess_damage"
    # the called process's own steps are on its scope's tape; its working keys stayed there
    inside: Any = run_json(cli, "tape", doc["instance_id"], "--context", scope, "--kind", "write")
    written = {e["key"] for e in inside}
    assert {"items", "months_of_wear", "repair_cost", "replace_cost", "damage_total", "decisions"} <= written
    scope_doc = run_json(cli, "inspect", doc["instance_id"], "--context", scope)
    assert scope_doc["layers"]["L3"]["repair_cost"] == 600

    # a short tenancy and dear repairs: the desk replaces, and the deduction is capped at the deposit
    dear = [{"name": "oven", "repair": 1400, "replace": 1500}, {"name": "door", "repair": 300, "replace": 250}]
    answers.write_text(json.dumps({"user_tasks": {"moveout_inspection": {"damaged_items": dear}}}))
    capped = run_json(cli, "run", str(DEPOSIT), str(DAMAGE), "--data", json.dumps(dict(TENANCY, tenancy_months=6)),
                      "--answers", str(answers))
    history = capped["layers"]["L3"]
    assert history["damage_decisions"] == ["replace oven", "replace door"]
    assert history["settlement"] == {"tenant": 0, "landlord": 1500} and history["deduction"] == 1500


# ===== a real server on Redis database 8, and a worker ==========================================

@pytest.fixture(scope="module", autouse=True, name="server")
def boot_a_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, subprocess.Popen[bytes], Path]]:
    """``layerflow serve --port 0`` with the catalog unseen28/ on database 8 under a prefix of this
    module's own, started as the module's first test starts (it boots beside the CLI tests); the
    REST test waits for it. Only the server's own process group is stopped."""
    with redis_scratch(REDIS_DB8, "outsider28") as prefix:
        store = f"{REDIS_DB8}?prefix={prefix}"
        log = tmp_path_factory.mktemp("serve") / "serve.err"
        with log.open("w") as err:
            proc = subprocess.Popen([sys.executable, "-m", "engine.cli", "serve", "--host", "127.0.0.1", "--port",
                                     "0", "--catalog", str(HERE), "--store", store],
                                    env=dict(os.environ, PYTHONPATH=str(ROOT), LAYERFLOW_API_TOKEN=TOKEN),
                                    cwd=ROOT, stdout=subprocess.DEVNULL, stderr=err, start_new_session=True)
        try:
            yield store, proc, log
        finally:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(timeout=10)


@contextmanager
def _serving(server: tuple[str, subprocess.Popen[bytes], Path]) -> Iterator[httpx.Client]:
    """A client of the module's server, once it answers; it carries the token."""
    _, proc, log = server
    with httpx.Client(base_url=wait_until_served(log, proc), headers={"Authorization": f"Bearer {TOKEN}"},
                      timeout=60) as api:
        yield api


@pytest.fixture(name="store")
def redis_store() -> Iterator[str]:
    """Database 8 under a prefix of the test's own (its keys removed afterwards)."""
    with redis_scratch(REDIS_DB8, "outsider28") as prefix:
        yield f"{REDIS_DB8}?prefix={prefix}"


def test_rest_the_panel_answers_the_officer_decides_and_a_recall_is_sent(
        server: tuple[str, subprocess.Popen[bytes], Path], cli: Any) -> None:
    store = server[0]
    with _serving(server) as api:
        assert {p["id"] for p in api.get("/api/processes").json()} >= {"scholarship_award", "instrument_calibration"}
        started = api.post("/api/instances", json={"process_id": "scholarship_award", "data": dict(
            APPLICANT, applicant_no=4412, gpa=3.2, household_income=20000)})
        assert started.status_code == 201, started.text
        iid = started.json()["instance_id"]
        assert started.json()["notices"] == []
        reviewed = api.post(f"/api/instances/{iid}/user-tasks/interview_panel",
                            json={"data": dict(PANEL, interview_score=6, recommendation="waitlist")})
        assert reviewed.status_code == 200, reviewed.text
        assert reviewed.json()["completed_user_task"]["task_id"] == "interview_panel"
        [asked] = api.get("/api/confirmations").json()
        assert (asked["id"], asked["instance_id"], asked["default"]) == ("review_join/recommendation", iid, "waitlist")
        labels = {o["value"]: o["label"] for o in asked["options"]}
        assert set(labels) == {"decline", "award", "waitlist", "$escalate"}   # three reviews, three values
        # the officer answers by the option's label, which stands for its value
        answered = api.post("/api/confirmations/review_join/recommendation",
                            json={"value": labels["waitlist"], "user": "officer.kim"})
        assert answered.status_code == 200, answered.text
        doc = answered.json()
        assert doc["status"] == "completed" and doc["layers"]["L3"]["notified"] == "regret letter SCH-4412"
        assert doc["conflicts"][0]["resolution"]["by"] == "officer.kim"
        assert doc["notices"] == []   # README: every reply of a request that ran an instance adds them
        again = api.post("/api/confirmations/review_join/recommendation", json={"value": "award"})
        assert again.status_code == 409 and again.json()["error"]["kind"] == "already_answered", again.text

        calibrating = api.post("/api/instances", json={"process_id": "instrument_calibration", "data": INSTRUMENT})
        cid = calibrating.json()["instance_id"]
        assert [w["task_id"] for w in calibrating.json()["waiting_for"]][0] == "technician_signoff"
        sent = api.post(f"/api/instances/{cid}/events", json={"name": "recall_notice",
                                                                "payload": {"bulletin": "RB-7"}})
        assert sent.status_code == 200, sent.text
        assert sent.json()["layers"]["L3"]["recall_logged"] == "recall RB-7 for BAL-07" and sent.json()["notices"] == []
        refused = api.post(f"/api/instances/{cid}/events", json={"name": "calibration_done", "payload": {}})
        assert refused.status_code == 409 and "recall_notice" in refused.text
    # the CLI reads what the server ran: one store
    assert run_json(cli, "inspect", iid, "--store", store)["status"] == "completed"


def test_a_worker_on_database_8_runs_a_submitted_deposit_to_the_inspection(store: str, cli: Any) -> None:
    stream = store.rsplit("=", 1)[1] + "ready"   # the stream of this test's own (no ':' in it)
    submitted = run_json(cli, "submit", str(DEPOSIT), str(DAMAGE), "--data", json.dumps(TENANCY), "--store", store,
                         "--stream", stream)
    [iid] = submitted["instance_ids"]
    ran = run_json(cli, "worker", "--store", store, "--stream", stream, "--stop-after", "1", "--timer-interval", "0")
    assert (ran["ran"], ran["statuses"]) == (1, {"waiting": 1})
    doc = run_json(cli, "inspect", iid, "--store", store)
    assert [w["task_id"] for w in doc["waiting_for"]] == ["moveout_inspection"]
    done = run_json(cli, "resume", iid, "--store", store, "--answer",
                    f"moveout_inspection={json.dumps({'damaged_items': ITEMS})}")
    assert done["layers"]["L3"]["settlement"] == {"tenant": 900, "landlord": 600}
