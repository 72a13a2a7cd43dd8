"""A newcomer builds a motor insurance claim from the README and drives it through REST and the CLI.

tests/engine/claims_o43/motor_claim.bpmn: the first notice of loss (a user task with a Camunda form)
-> triage (an ``llm:`` step whose offline handler is the deterministic stand-in for the model) -> an
inclusive split to fraud_check / coverage_check / medical_review (1-3 branches by condition) -> the
inclusive join, where the branches disagree on ``decision`` (settled by the policy's ranking) and on
``payout_amount`` (asked of a person, answered over REST) -> the adjuster's user task (a form, a 48 h
interrupting timer) -> the payment script, which fails on a foreign IBAN until it is corrected
(REST ``inject`` then ``resume``, or ``layerflow resume --set``).

Every step goes through a real ``layerflow serve`` as a client would; the CLI (click's runner, in this
process, on the same sqlite store) is asked the same about the same instance, and both must agree: the
fields, the messages, exit code 2 where REST answers 4xx.
"""

from __future__ import annotations

import json
import shutil
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import httpx
import pytest
from click.testing import CliRunner

import local_http
from engine.cli import main

HERE = Path(__file__).resolve().parent / "claims_o43"
BPMN = HERE / "motor_claim.bpmn"
TOKEN = "o43-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
START = {"deductible": 500, "iban": "FR7630006000011234567890189"}
FNOL = {"claim_id": "C-43", "estimated_damage": 30000, "injury": True, "description": "paid the garage in cash"}
BAD_FNOL = {"claim_id": 43, "estimated_damage": "lots", "injry": True}
ADJUSTER = {"approved": True, "final_payout": 29500, "adjuster_note": "coverage figure"}


def cli(store: str, *args: str) -> tuple[int, Any, str]:
    out = CliRunner().invoke(main, [*args, "--store", store, "--json"])
    return out.exit_code, json.loads(out.stdout), out.stderr


class Api:
    def __init__(self, url: str) -> None:
        self.url = url

    def get(self, path: str, **params: Any) -> httpx.Response:
        return local_http.get(self.url + path, headers=AUTH, params=params)

    def post(self, path: str, body: Any = None) -> httpx.Response:
        return local_http.post(self.url + path, headers=AUTH, json=body if body is not None else {})

    def start(self, answers: dict[str, Any] | None = None) -> dict[str, Any]:
        started = self.post("/api/instances", {"process_id": "motor_claim", "data": START,
                                               **({"answers": answers} if answers else {})})
        assert started.status_code == 201, started.text
        return dict(started.json())


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Any:
    db = tmp_path_factory.mktemp("claims_o43") / "runs.db"
    with local_http.serving(HERE, db, TOKEN) as url:
        yield Api(url), f"sqlite:///{db}"


@pytest.fixture(scope="module")
def story(served: tuple[Api, str]) -> dict[str, Any]:
    """One claim from its first notice to its payment, every answer over REST, the mistakes first."""
    api, store = served
    seen: dict[str, Any] = {"started": api.start()}
    iid = seen["id"] = seen["started"]["instance_id"]
    seen["bad_fnol"] = api.post(f"/api/instances/{iid}/user-tasks/fnol", {"data": BAD_FNOL})
    seen["bad_fnol_cli"] = cli(store, "resume", iid, "--answer", "fnol=" + json.dumps(BAD_FNOL))
    seen["fnol"] = api.post(f"/api/instances/{iid}/user-tasks/fnol", {"data": FNOL, "user": "ann"})
    seen["fnol_again"] = api.post(f"/api/instances/{iid}/user-tasks/fnol", {"data": FNOL})
    version = seen["fnol"].json()["version"]
    confirm = "/api/confirmations/review_join/payout_amount"
    seen["stale"] = api.post(confirm, {"value": 29500, "instance_id": iid, "expected_version": version - 1})
    seen["not_offered"] = api.post(confirm, {"value": 12345, "instance_id": iid})
    seen["answered"] = api.post(confirm, {"value": 29500, "instance_id": iid, "expected_version": version,
                                          "user": "carol"})
    seen["answered_again"] = api.post(confirm, {"value": 0, "instance_id": iid})
    seen["answered_again_cli"] = cli(store, "resume", iid, "--answer", "review_join/payout_amount=0")
    seen["bad_adjuster"] = api.post(f"/api/instances/{iid}/user-tasks/adjuster",
                                    {"data": {"approved": "yes", "final_payout": -5, "adjustr_note": "x"}})
    seen["adjuster_missing"] = api.post(f"/api/instances/{iid}/user-tasks/adjuster", {"data": {"final_payout": 1}})
    seen["adjuster"] = api.post(f"/api/instances/{iid}/user-tasks/adjuster", {"data": ADJUSTER, "user": "dave"})
    seen["inject_process_key"] = api.post("/api/context-governance/inject",
                                          {"instance_id": iid, "key": "deductible", "value": 0})
    seen["set_process_key_cli"] = cli(store, "resume", iid, "--set", "deductible=0")
    seen["inject"] = api.post("/api/context-governance/inject", {"instance_id": iid, "key": "iban",
                                                                 "value": "DE89370400440532013000",
                                                                 "reason": "the holder's German account"})
    seen["done"] = api.post(f"/api/instances/{iid}/resume")
    return seen


def test_a_misspelt_form_field_is_refused_naming_the_field_it_reads_like(story: dict[str, Any]) -> None:
    """`injry` beside an omitted `injury` was taken as extra data: the form's default (no injury) stood in
    for it and the medical review was skipped without a word. Refused now, REST and CLI alike."""
    refused = story["bad_fnol"]
    assert refused.status_code == 400, refused.text
    error = refused.json()["error"]
    assert error["kind"] == "invalid_answer" and error["task_id"] == "fnol"
    problems = {p["field"]: p["problem"] for p in error["problems"]}
    assert set(problems) == {"claim_id", "estimated_damage", "injry"}
    assert "reads like 'injury'" in problems["injry"] and "default false" in problems["injry"]
    assert "send the value as 'injury'" in problems["injry"]
    code, doc, _ = story["bad_fnol_cli"]
    assert code == 2 and doc["error"]["kind"] == "invalid_answer"
    assert doc["error"]["problems"] == error["problems"]
    assert doc["error"]["message"] == "--answer: " + error["message"]
    assert doc["waiting_for"][0]["task_id"] == "fnol" and doc["error"]["instance_status"] == "waiting"


def test_the_adjusters_bad_answers_name_each_field(story: dict[str, Any]) -> None:
    bad = story["bad_adjuster"].json()["error"]
    assert story["bad_adjuster"].status_code == 400
    assert {p["field"] for p in bad["problems"]} == {"approved", "final_payout", "adjustr_note"}
    missing = story["adjuster_missing"].json()["error"]
    assert [p["field"] for p in missing["problems"]] == ["approved"]
    assert missing["problems"][0]["problem"] == "is required and missing"


def test_the_join_settles_decision_by_policy_and_payout_by_the_person(story: dict[str, Any]) -> None:
    waiting = story["fnol"].json()
    assert [w["id"] for w in waiting["waiting_for"]] == ["review_join/payout_amount"]
    conflicts = {c["key"]: c for c in waiting["conflicts"]}
    branches = {"fraud_check", "coverage_check", "medical_review"}
    assert set(conflicts["decision"]["values"]) == branches == set(conflicts["payout_amount"]["values"])
    assert conflicts["decision"]["resolution"]["resolver"] == "policy"
    assert conflicts["decision"]["resolution"]["value"] == "refer"
    assert conflicts["payout_amount"]["resolution"] is None
    assert conflicts["payout_amount"]["values"] == {"fraud_check": 0, "coverage_check": 29500, "medical_review": 32000}
    done = story["done"].json()
    log = {c["key"]: c for c in done["layers"]["L3"]["_mergedConflicts"]}
    assert log["payout_amount"]["resolution"]["by"] == "carol" and done["layers"]["L3"]["payout_amount"] == 29500
    assert done["layers"]["L3"]["decision"] == "refer"


def test_stale_versions_and_second_answers_are_refused_alike(story: dict[str, Any]) -> None:
    assert story["stale"].status_code == 409 and story["stale"].json()["error"]["kind"] == "version_conflict"
    assert story["not_offered"].status_code == 400
    assert "not one of the offered option values" in story["not_offered"].json()["error"]["message"]
    again = story["answered_again"]
    assert again.status_code == 409
    rest = again.json()["error"]
    code, doc, _ = story["answered_again_cli"]
    assert code == 2
    for field in ("kind", "message", "answer", "answered_by", "answered_at", "tape_seq", "given", "confirmation_id"):
        assert doc["error"][field] == rest[field], field
    assert rest["answered_by"] == "carol" and rest["given"] == 0


def test_a_second_answer_to_a_done_user_task_says_it_is_done(story: dict[str, Any]) -> None:
    again = story["fnol_again"]
    assert again.status_code == 409
    assert "user task 'fnol' is done" in again.json()["error"]["message"]


def test_a_process_key_refused_to_an_operator_says_what_to_do_over_rest_as_on_the_cli(story: dict[str, Any]) -> None:
    """REST inject of a start-data key said only "write a different key to WORKING"; the CLI's --set
    added how to go on. Both say it now, in the same words."""
    refused = story["inject_process_key"]
    assert refused.status_code == 403
    rest = refused.json()["error"]
    iid = story["id"]
    assert f"fixed for the life of instance {iid}" in rest["message"]
    assert f"layerflow cancel {iid}" in rest["message"] and f"POST /api/instances/{iid}/cancel" in rest["message"]
    assert "data_layers: {deductible: WORKING}" in rest["message"]
    code, doc, _ = story["set_process_key_cli"]
    assert code == 2 and doc["error"]["message"] == "--set: " + rest["message"]


def test_the_failed_payment_is_fixed_by_inject_and_resume(story: dict[str, Any]) -> None:
    failed = story["adjuster"].json()
    assert failed["status"] == "error"
    assert failed["error"]["task_id"] == "payment" and "not a German account" in failed["error"]["message"]
    assert story["inject"].json()["written"] == {"iban": "L3"}
    done = story["done"].json()
    assert done["status"] == "completed" and done["error"] is None
    assert done["layers"]["L3"]["payment_ref"] == "PAY-C-43-29500"


def test_rest_and_cli_give_the_same_document(story: dict[str, Any], served: tuple[Api, str]) -> None:
    api, store = served
    rest = api.get(f"/api/instances/{story['id']}").json()
    code, doc, _ = cli(store, "inspect", story["id"])
    assert code == 0
    for field in ("instance_id", "process_id", "status", "error", "layers", "tokens", "conflicts", "compressions",
                  "confirmations", "waiting_for", "tape_length", "version"):
        assert doc[field] == rest[field], field


@pytest.mark.parametrize("query", [
    {"kind": "conflict"}, {"kind": "resolution"}, {"kind": "human_decision"}, {"kind": "split"},
    {"kind": "denied"}, {"activity": "payment"}, {"activity": "review_join"}, {"key": "payout_amount"},
    {"branch": "medical_review"}, {"context": "fraud_check"}, {"since": "5", "limit": "4"},
    {"kind": "bogus"}, {"activity": "paymnt"}, {"key": "payout_amnt"},
])
def test_tape_filters_agree(story: dict[str, Any], served: tuple[Api, str], query: dict[str, str]) -> None:
    api, store = served
    rest = api.get(f"/api/instances/{story['id']}/tape", **query).json()
    args = [a for k, v in query.items() for a in (f"--{k}", v)]
    code, events, stderr = cli(store, "tape", story["id"], *args)
    assert code == 0
    assert [(e["context"], e["seq"], e["kind"]) for e in events] == \
           [(e["context"], e["seq"], e["kind"]) for e in rest["events"]]
    if "note" in rest:  # a filter that finds nothing says why, on stderr as in the answer
        assert not events and rest["note"] in stderr
    else:
        assert events, query


def _layer_maps(replayed: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """REST replay's console shape (`keys`: [{key, value, ...}]) as the CLI's key: value maps."""
    return {name: {k["key"]: k["value"] for k in layer["keys"]} for name, layer in replayed["layers"].items()}


def test_replay_agrees_at_every_kind_of_seq(story: dict[str, Any], served: tuple[Api, str]) -> None:
    api, store = served
    end = api.get(f"/api/instances/{story['id']}/replay").json()["tape_end"]
    for until in (0, 1, end // 2, end, end + 1000):
        rest = api.get(f"/api/instances/{story['id']}/replay", until=until).json()
        code, doc, _ = cli(store, "replay", story["id"], "--until", str(until))
        assert code == 0
        assert (doc["until"], doc["until_requested"], doc["tape_end"]) == (min(until, end), until, end)
        assert (rest["until"], rest["until_requested"], rest["tape_end"]) == (min(until, end), until, end)
        assert _layer_maps(rest) == doc["layers"], until
    assert _layer_maps(rest)["L3"]["payment_ref"] == "PAY-C-43-29500"
    assert doc["layers"] == {k: v for k, v in api.get(f"/api/instances/{story['id']}").json()["layers"].items()}
    below = api.get(f"/api/instances/{story['id']}/replay", until=-1)
    code, doc, _ = cli(store, "replay", story["id"], "--until", "-1")
    assert below.status_code == 422 and code == 2


def test_rollback_mistakes_are_refused_alike(story: dict[str, Any], served: tuple[Api, str]) -> None:
    """A branch snapshot from before the join, and a snapshot id that is none of the instance's: the
    same refusal from REST as from the CLI, the latter with the snapshots to choose from (REST said
    only where to look them up)."""
    api, store = served
    iid = story["id"]
    code, listed, _ = cli(store, "snapshot", iid, "--list")
    branch = next(s["snapshot_id"] for s in listed["snapshots"] if s["label"] == "before fraud_check")
    split = next(s["snapshot_id"] for s in listed["snapshots"] if s["label"] == "split:review_split")
    said = []
    for sid, status, kind in ((branch, 409, "invalid_state"), ("snap:main:9999", 404, "not_found")):
        refused = api.post("/api/context-governance/rollback", {"instance_id": iid, "snapshot_id": sid})
        assert refused.status_code == status, refused.text
        rest = refused.json()["error"]
        code, doc, _ = cli(store, "rollback", iid, sid)
        assert code == 2 and doc["error"]["kind"] == rest["kind"] == kind
        assert doc["error"]["message"] in (rest["message"], "rollback: " + rest["message"])
        said.append(rest["message"])
    assert "already merged into 'main' at 'review_join'" in said[0] and f"the split's, {split!r}" in said[0]
    assert rest["recent_snapshots"] == doc["error"]["recent_snapshots"] and rest["snapshot_id"] == "snap:main:9999"
    assert "recent snapshots: snap:" in rest["message"]


def test_a_cli_set_fixes_the_payment_too(served: tuple[Api, str]) -> None:
    api, store = served
    started = api.start({"user_tasks": {"fnol": FNOL, "adjuster": ADJUSTER},
                         "confirmations": {"review_join/payout_amount": 32000}})
    assert started["status"] == "error" and started["error"]["task_id"] == "payment"
    code, doc, _ = cli(store, "resume", started["instance_id"], "--set", "iban=DE89370400440532013000")
    assert code == 0 and doc["status"] == "completed"
    assert doc["layers"]["L3"]["payment_ref"] == "PAY-C-43-29500"
    after = api.get(f"/api/instances/{started['instance_id']}").json()
    assert after["status"] == "completed" and after["layers"] == doc["layers"]


def test_the_adjusters_timer_escalates_and_a_late_answer_is_refused(served: tuple[Api, str]) -> None:
    api, store = served
    waiting = api.start({"user_tasks": {"fnol": {**FNOL, "description": "hit a tree", "injury": False}}})
    # 30,000 and no injury: the fraud and coverage checks, no medical review; both pay out the same? no:
    # fraud pays the estimate, coverage less the deductible, so a person is asked; the answers gave none
    assert waiting["status"] == "waiting" and [w["id"] for w in waiting["waiting_for"]] == ["review_join/payout_amount"]
    waiting = api.post("/api/confirmations/review_join/payout_amount",
                       {"value": 29500, "instance_id": waiting["instance_id"]}).json()
    timer = next(w for w in waiting["waiting_for"] if w["kind"] == "timer")
    assert timer["task_id"] == "adjuster_late"
    due = datetime.fromisoformat(timer["due"])
    assert timedelta(hours=47, minutes=59) < due - datetime.now(timezone.utc) <= timedelta(hours=48)
    later = (due + timedelta(minutes=1)).astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    code, doc, _ = cli(store, "resume", waiting["instance_id"], "--now", later)
    assert code == 0 and doc["status"] == "completed" and doc["layers"]["L3"]["escalated"] is True
    late = api.post(f"/api/instances/{waiting['instance_id']}/user-tasks/adjuster", {"data": ADJUSTER})
    assert late.status_code == 409 and late.json()["error"]["kind"] == "invalid_state"
    # it said only "it waits for no user task (nothing)"
    assert ("user task 'adjuster' was cancelled before it was answered: its boundary event 'adjuster_late' fired "
            "first") in late.json()["error"]["message"]


def test_a_user_task_id_that_names_no_user_task_says_so(served: tuple[Api, str], story: dict[str, Any]) -> None:
    """A typo of the task's id, or a script task's id, was refused only as "does not wait for it", as if
    it might later: it now says the process has no such user task, and which one was likely meant."""
    api, store = served
    iid = api.start({"user_tasks": {"fnol": FNOL}, "confirmations": {"review_join/payout_amount": 0}})["instance_id"]
    typo = api.post(f"/api/instances/{iid}/user-tasks/adjustr", {"data": ADJUSTER})
    assert typo.status_code == 404  # an id the process lacks is a wrong address (it was 409, a state)
    message = typo.json()["error"]["message"]
    assert "'adjustr' names no element of process 'motor_claim'; did you mean 'adjuster'?" in message
    assert "its user tasks: 'fnol', 'adjuster'" in message
    script = api.post(f"/api/instances/{iid}/user-tasks/payment", {"data": {}})
    assert script.status_code == 409
    assert "'payment' is the script task of process 'motor_claim', not a user task" in script.json()["error"]["message"]
    assert api.get(f"/api/instances/{iid}").json()["waiting_for"][0]["task_id"] == "adjuster"


def test_cancel_another_instance_then_list_it_by_status(served: tuple[Api, str]) -> None:
    api, store = served
    other = api.start({"user_tasks": {"fnol": FNOL}})["instance_id"]
    cancelled = api.post(f"/api/instances/{other}/cancel", {"reason": "duplicate of C-43"})
    assert cancelled.status_code == 200 and cancelled.json()["status"] == "cancelled"
    again = api.post(f"/api/instances/{other}/cancel", {"reason": "again"})
    code, doc, _ = cli(store, "cancel", other, "--reason", "again")
    assert again.status_code == 409 and code == 2
    assert doc["error"]["message"] == again.json()["error"]["message"]
    answer = api.post("/api/confirmations/review_join/payout_amount", {"value": 0, "instance_id": other})
    assert answer.status_code == 409 and "duplicate of C-43" in answer.json()["error"]["message"]
    # `layerflow list --status` as GET /api/instances?status= (the CLI had no filter)
    rest = api.get("/api/instances", status="cancelled").json()
    code, rows, _ = cli(store, "list", "--status", "cancelled")
    assert code == 0 and rows == rest and [r["instance_id"] for r in rows] == [other]
    code, _, stderr = cli(store, "list", "--status", "canceled")
    assert code == 2 and api.get("/api/instances", status="canceled").status_code == 422


def test_config_mistakes_are_named_before_anything_runs(tmp_path: Path, served: tuple[Api, str]) -> None:
    for name in ("motor_claim.bpmn", "claim_handlers.py"):
        shutil.copy(HERE / name, tmp_path / name)
    (tmp_path / "motor_claim.layerflow.yaml").write_text(
        "triage:\n  handler: claim_handlers.py:triage\n  preserveKey: [claim_category]\n"
        "review_join:\n  humanConfirm: {timout: 60}\nfraud_chek:\n  preserveKeys: [fraud_score]\n")
    out = CliRunner().invoke(main, ["validate", str(tmp_path / "motor_claim.bpmn")])
    assert out.exit_code == 2
    assert "field 'preserveKey': unknown field; did you mean 'preserveKeys'?" in out.output
    assert "field 'humanConfirm.timout': unknown field; did you mean 'timeout'?" in out.output
    assert "'fraud_chek': config for an id that does not exist in process 'motor_claim' (did you mean " \
           "'fraud_check'?)" in out.output
    api, _ = served
    iid = api.start()["instance_id"]
    typo = api.post("/api/context-governance/config", {"instance_id": iid, "config": {
        "activityId": "review_join", "humanConfirm": {"timout": 60}}})
    assert typo.status_code == 422 and "did you mean 'timeout'" in typo.json()["error"]["message"]
    nowhere = api.post("/api/context-governance/config", {"instance_id": iid, "config": {
        "activityId": "review_jion", "humanConfirm": {"timeout": 60}}})
    assert nowhere.status_code == 404 and "no element 'review_jion'" in nowhere.json()["error"]["message"]


def test_an_answer_for_a_step_not_reached_is_named_unused_not_kept(served: tuple[Api, str]) -> None:
    """The adjuster's answer given while the claim waits at its first notice: stderr said "it is kept for
    a later step", yet the resume that later reached the adjuster waited for it again (an answer is used
    only by the resume it is given to). The run now says it was not used, CLI and REST alike."""
    api, store = served
    iid = api.start()["instance_id"]
    out = CliRunner().invoke(main, ["resume", iid, "--answer", "adjuster=" + json.dumps(ADJUSTER), "--store", store])
    assert out.exit_code == 3
    assert "kept for a later step" not in out.stderr
    unused = ("answer 'adjuster' was not used: this run did not reach user task 'adjuster' (it waits at: fnol); "
              "an answer is used only by the run or resume it is given to, not kept for a later one")
    assert unused in out.stderr, out.stderr
    rest = api.post(f"/api/instances/{iid}/resume", {"answers": {"user_tasks": {"adjuster": ADJUSTER}}}).json()
    assert [n[:len(unused)] for n in rest["notices"]] == [unused]
    # given with the answer that reaches it, it is used, and nothing is said
    both = api.post(f"/api/instances/{iid}/resume", {"answers": {
        "user_tasks": {"fnol": {**FNOL, "injury": False, "description": "hit a tree"}, "adjuster": ADJUSTER},
        "confirmations": {"review_join/payout_amount": 29500}}}).json()
    assert both["notices"] == [] and both["status"] == "error" and both["error"]["task_id"] == "payment"


def test_a_confirmation_takes_resolves_name_for_the_value(served: tuple[Api, str]) -> None:
    """`resolve` takes a confirmation's `value` (and `answer`) for its `resolution`; the other way round,
    `{"resolution": ...}` to POST /api/confirmations/{id} was refused with "did you mean 'reason'?"."""
    api, _ = served
    iid = api.start({"user_tasks": {"fnol": FNOL}})["instance_id"]
    answered = api.post("/api/confirmations/review_join/payout_amount", {"resolution": 32000, "instance_id": iid})
    assert answered.status_code == 200, answered.text
    conflicts = {c["key"]: c for c in answered.json()["conflicts"]}
    assert conflicts["payout_amount"]["resolution"]["value"] == 32000
    both = api.post("/api/confirmations/review_join/payout_amount", {"value": 1, "resolution": 2, "instance_id": iid})
    assert both.status_code == 422


def test_changes_while_the_join_waits_are_refused_alike(served: tuple[Api, str]) -> None:
    """While the join waits for the person: the main context has open branches, and the branch holds
    the value the question shows; REST and the CLI refuse both with the same message."""
    api, store = served
    iid = api.start({"user_tasks": {"fnol": FNOL}})["instance_id"]
    code, listed, _ = cli(store, "snapshot", iid, "--list")
    before = next(s["snapshot_id"] for s in listed["snapshots"] if s["label"] == "before triage")
    rest = api.post("/api/context-governance/rollback", {"instance_id": iid, "snapshot_id": before})
    code, doc, _ = cli(store, "rollback", iid, before)
    assert rest.status_code == 409 and code == 2
    assert "has open branches (coverage_check, fraud_check, medical_review)" in rest.json()["error"]["message"]
    assert doc["error"]["message"] == rest.json()["error"]["message"].replace("(`context`:", "(`--context`:")
    rest = api.post("/api/context-governance/inject", {"instance_id": iid, "key": "payout_amount", "value": 1,
                                                       "context": "fraud_check"})
    code, doc, _ = cli(store, "resume", iid, "--set", "payout_amount=1", "--context", "fraud_check")
    assert rest.status_code == 409 and code == 2
    assert "is what join 'review_join' asks a person about" in rest.json()["error"]["message"]
    assert doc["error"]["message"] == "--set: " + rest.json()["error"]["message"]
