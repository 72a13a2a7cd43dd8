"""Round 37 gaps: `run --json` / `resume --json` carry the instance's `version` as the other documents
do; a user task's `waiting_for` item names its `context` as a confirmation's does; a misspelt `--answer`
id gets the nearest id; a `*` answer nothing took is named; an answer given twice is shown in JSON;
`rollback` takes any unique snapshot label; a start whose answer is refused creates nothing; a runtime
`conflictPolicy.rankings` change merges key by key; a snapshot of a merged branch is refused."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import local_http
import pytest

from context_layers import ActivityExtensionConfig
from engine import Engine, FormAnswerInvalid, load_process
from engine.api import create_app

from engine_helpers import EXAMPLES, ROOT, cli_in_a_tmp_store, run_json
from governance_helpers import TOKEN, ServerThread

cli = cli_in_a_tmp_store  # the "cli" fixture: the CLI in this process, on the test's own sqlite store

FORMS = Path(__file__).resolve().parent / "fixtures" / "forms"
PARALLEL = EXAMPLES / "parallel_user_task.bpmn"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
GOV = "/api/context-governance"
REVIEW = '{"approved": true, "reviewer": "ann"}'
CONFLICT = "review_join/approval_status"


@pytest.fixture(scope="module")
def catalog(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A catalog of the parallel review example, the Camunda form example and the loan example."""
    folder = tmp_path_factory.mktemp("catalog37")
    shutil.copy(PARALLEL, folder)
    shutil.copy(FORMS / "camunda_approval.bpmn", folder)
    for name in ("loan_approval.bpmn", "loan_approval.layerflow.yaml", "loan_handlers.py", "knowledge"):
        (folder / name).symlink_to(EXAMPLES / name)
    return folder


@pytest.fixture
def api(catalog: Path, tmp_path: Path) -> Iterator[tuple[str, str]]:
    """A real HTTP server on a sqlite store of the test's own: (base URL, store URL)."""
    store = f"sqlite:///{tmp_path / 'rest.db'}"
    with ServerThread(create_app(store, catalog, TOKEN)) as server:
        yield server.url, store


def post(url: str, path: str, body: dict[str, Any]) -> Any:
    return local_http.post(url + path, headers=AUTH, json=body)


def loan_conflict(cli: Any) -> dict[str, Any]:
    """The loan demo waiting for a person on the conflict at its review join."""
    return run_json(cli, "demo", "loan", "--scenario", "conflict", code=3)


# ----------------------------------------------------------------------------- 1. version


def test_run_and_resume_json_carry_the_version_the_other_documents_carry(tmp_path: Path) -> None:
    """`inspect --json`, `rollback --json` and REST's documents carry the instance's `version`
    (`expected_version` of the next change); `run --json` and `resume --json` left it out."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "LAYERFLOW_STORE": f"sqlite:///{tmp_path / 'v.db'}"}

    def layerflow(*args: str, code: int) -> dict[str, Any]:
        done = subprocess.run([sys.executable, "-m", "engine.cli", *args, "--json"], capture_output=True, text=True,
                              env=env, cwd=ROOT, timeout=120)
        assert done.returncode == code, done.stderr
        doc: dict[str, Any] = json.loads(done.stdout)
        return doc

    started = layerflow("run", str(PARALLEL), "--data", '{"title": "Q3"}', code=3)
    iid = started["instance_id"]
    assert started["version"] == layerflow("inspect", iid, code=0)["version"]
    refused = layerflow("resume", iid, "--answer", "review={}", "--answer", "review=[]", code=2)
    assert refused["version"] == started["version"]  # the instance as it is: nothing of the command applied
    done = layerflow("resume", iid, "--answer", f"review={REVIEW}", code=0)
    assert done["version"] > started["version"] and done["version"] == layerflow("inspect", iid, code=0)["version"]
    assert layerflow("run", str(tmp_path / "missing.bpmn"), code=2)["version"] is None  # no instance: none


# ----------------------------------------------------------------------------- 2. a user task's context


def test_a_user_tasks_waiting_item_names_its_context_cli_rest_and_python(cli: Any, api: tuple[str, str]) -> None:
    url, _ = api
    instance = Engine("memory://").run(load_process(PARALLEL), {"title": "Q3"})
    (item,) = instance.waiting_for
    assert item["context"] == "main/review@6" and item["context"] in instance.contexts  # the branch it waits in
    by_cli = run_json(cli, "run", str(PARALLEL), "--data", '{"title": "Q3"}', code=3)
    assert [w["context"] for w in by_cli["waiting_for"]] == ["main/review@6"]
    by_rest = post(url, "/api/instances", {"process_id": "parallel_user_task", "data": {"title": "Q3"}})
    assert by_rest.status_code == 201, by_rest.text
    (waits,) = by_rest.json()["waiting_for"]  # a REST start notes itself first: the split comes later
    assert by_rest.json()["contexts"][waits["context"]]["branch_id"] == "review"
    plain = post(url, "/api/instances", {"process_id": "invoice_approval"}).json()
    assert [w["context"] for w in plain["waiting_for"]] == ["main"]  # on the process's own flow
    schema = local_http.get(f"{url}/openapi.json").json()["components"]["schemas"]["WaitingItem"]
    assert "user task" in schema["properties"]["context"]["description"]


# ----------------------------------------------------------------------------- 3. did you mean


def test_a_misspelt_answer_id_is_named_with_the_nearest_id(cli: Any, tmp_path: Path) -> None:
    iid = loan_conflict(cli)["instance_id"]
    typo = cli("resume", iid, "--answer", "review_join/aproval_status=pending_dual_approval")
    assert typo.exit_code == 2 and f"did you mean {CONFLICT!r}?" in typo.stderr, typo.stderr
    doc = run_json(cli, "run", str(PARALLEL), "--data", '{"title": "Q3"}', code=3)
    task = cli("resume", doc["instance_id"], "--answer", f"reveiw={REVIEW}")
    assert task.exit_code == 2 and "did you mean 'review'?" in task.stderr, task.stderr
    plain = cli("resume", doc["instance_id"], "--answer", "reveiw=true")
    assert plain.exit_code == 2 and "did you mean 'review'?" in plain.stderr, plain.stderr
    answers = tmp_path / "answers.json"
    answers.write_text(json.dumps({"user_tasks": {"reveiw": json.loads(REVIEW)}}))
    filed = cli("resume", doc["instance_id"], "--answers", str(answers))
    assert filed.exit_code == 2 and "did you mean 'review'?" in filed.stderr, filed.stderr
    with pytest.raises(Exception, match="did you mean 'review'"):
        Engine("memory://").run(load_process(PARALLEL), {"title": "Q3"}, answers={"user_tasks": {"reveiw": {}}})


# ----------------------------------------------------------------------------- 4. a '*' nothing took


def test_a_star_answer_no_confirmation_took_is_named(cli: Any, api: tuple[str, str]) -> None:
    doc = run_json(cli, "run", str(PARALLEL), "--data", '{"title": "Q3"}', code=3)
    unused = cli("resume", doc["instance_id"], "--answer", "*=true")
    assert unused.exit_code == 3
    assert "answer '*' was not used" in unused.stderr and "no confirmation" in unused.stderr, unused.stderr
    taken = cli("resume", loan_conflict(cli)["instance_id"], "--answer", "*=pending_dual_approval")
    assert taken.exit_code == 0 and "'*'" not in taken.stderr, taken.stderr
    url, _ = api
    started = post(url, "/api/instances", {"process_id": "parallel_user_task", "data": {"title": "Q3"}}).json()
    resumed = post(url, f"/api/instances/{started['instance_id']}/resume", {"answers": {"confirmations": {"*": True}}})
    assert resumed.status_code == 200 and any("'*'" in n for n in resumed.json()["notices"]), resumed.text
    # `resume --json` carries them as REST's reply does (a script reads stdout, not stderr's prose)
    as_json = cli("resume", doc["instance_id"], "--answer", "*=true", "--json")
    assert as_json.exit_code == 3 and any("'*'" in n for n in json.loads(as_json.stdout)["notices"]), as_json.stdout


# ----------------------------------------------------------------------------- 5. JSON in messages


def test_an_answer_given_twice_is_shown_as_json(cli: Any) -> None:
    """"already answered True" showed Python's spelling of both answers; the message shows what a person
    writes, JSON, as the options' list beside it does."""
    iid = loan_conflict(cli)["instance_id"]
    assert cli("resume", iid, "--answer", f"{CONFLICT}=pending_dual_approval").exit_code == 0
    again = cli("resume", iid, "--answer", f"{CONFLICT}=true")
    assert again.exit_code == 2, again.stderr
    assert 'already answered "pending_dual_approval"' in again.stderr and "the answer true was" in again.stderr


# ----------------------------------------------------------------------------- 6. rollback by label


def test_rollback_takes_any_unique_label_and_refuses_an_ambiguous_one(cli: Any, api: tuple[str, str]) -> None:
    iid = run_json(cli, "run", str(PARALLEL), "--data", '{"title": "Q3"}', code=3)["instance_id"]
    ctx = "main/review@6"
    first = run_json(cli, "snapshot", iid, "--context", ctx, "--label", "checkpoint")["snapshot_id"]
    assert cli("resume", iid, "--set", "note=x", "--context", ctx).exit_code == 3
    back = run_json(cli, "rollback", iid, "checkpoint")
    assert back["snapshot_id"] == first and "note" not in back["layers"]["L4"]
    begun = run_json(cli, "rollback", iid, "before estimate")  # the label `snapshot --list` shows a begin's
    assert begun["snapshot_id"] != first and begun["context"] == "main/estimate@6"
    second = run_json(cli, "snapshot", iid, "--context", ctx, "--label", "checkpoint")["snapshot_id"]
    twice = run_json(cli, "rollback", iid, "checkpoint", code=2)["error"]
    assert first in twice["message"] and second in twice["message"] and "label" in twice["message"], twice
    url, _ = api
    started = post(url, "/api/instances", {"process_id": "parallel_user_task", "data": {"title": "Q3"}}).json()
    taken = post(url, f"{GOV}/snapshot", {"instance_id": started["instance_id"], "context": "review", "label": "mine"})
    assert taken.status_code == 200, taken.text
    rolled = post(url, f"{GOV}/rollback", {"instance_id": started["instance_id"], "snapshot_id": "mine"})
    assert rolled.status_code == 200 and rolled.json()["snapshot_id"] == taken.json()["snapshot_id"], rolled.text


# ----------------------------------------------------------------------------- 7. a refused start


def test_a_start_whose_answer_the_form_refuses_creates_nothing(cli: Any, api: tuple[str, str], tmp_path: Path) -> None:
    url, store = api
    bad = {"user_tasks": {"approve_invoice": {"amount": 0, "approved": True}}}
    for _ in range(2):  # a client that retries
        refused = post(url, "/api/instances", {"process_id": "invoice_approval", "answers": bad})
        assert refused.status_code == 400 and refused.json()["error"]["kind"] == "invalid_answer", refused.text
        assert "amount" in refused.json()["error"]["message"] and "was not created" in refused.json()["error"]["message"]
        assert "instance_id" not in refused.json()["error"]  # it names no instance: none exists
    assert local_http.get(f"{url}/api/instances", headers=AUTH).json() == []
    good = post(url, "/api/instances", {"process_id": "invoice_approval",
                                        "answers": {"user_tasks": {"approve_invoice": {"amount": 5}}}})
    assert good.status_code == 201 and good.json()["status"] == "completed" and good.json()["version"] >= 1

    form = FORMS / "camunda_approval.bpmn"
    by_cli = run_json(cli, "run", str(form), "--answer", 'approve_invoice={"amount": 0}', code=2)
    assert by_cli["instance_id"] is None and by_cli["error"]["kind"] == "invalid_answer", by_cli
    assert by_cli["process_id"] == "invoice_approval" and "amount" in by_cli["error"]["message"]
    assert run_json(cli, "list") == []

    engine = Engine(f"sqlite:///{tmp_path / 'py.db'}")
    with pytest.raises(FormAnswerInvalid):
        engine.run(load_process(form), {}, answers=bad)
    assert engine.store.list() == []


# ----------------------------------------------------------------------------- 8. rankings merge by key


def test_a_rankings_change_for_one_key_keeps_the_other_keys() -> None:
    current = ActivityExtensionConfig.model_validate({"conflictPolicy": {
        "rankings": {"approval_status": ["rejected", "approved"], "risk_level": ["high", "low"]},
        "policyText": "be careful"}, "humanConfirm": {"defaults": {"a": 1, "b": 2}}})
    change = ActivityExtensionConfig.model_validate({"conflictPolicy": {"rankings": {"risk_level": ["low", "high"]}},
                                                     "humanConfirm": {"defaults": {"b": 3}}})
    merged = current.merged_with(change)
    assert merged.conflict_policy is not None and merged.human_confirm is not None
    assert merged.conflict_policy.rankings == {"approval_status": ["rejected", "approved"], "risk_level": ["low", "high"]}
    assert merged.conflict_policy.policy_text == "be careful"
    assert merged.human_confirm.defaults == {"a": 1, "b": 3}


def test_a_runtime_rankings_change_for_one_key_keeps_the_others_over_rest(api: tuple[str, str]) -> None:
    url, _ = api
    iid = post(url, "/api/instances", {"process_id": "loan_approval", "data": {
        "amount": 120000, "applicant_id": "APP001", "purpose": "p", "industry": "gambling"}}).json()["instance_id"]
    first = post(url, f"{GOV}/config", {"instance_id": iid, "activity_id": "review_join", "config": {
        "conflictPolicy": {"rankings": {"a": [1, 2], "b": ["x", "y"]}}}})
    assert first.status_code == 200, first.text
    second = post(url, f"{GOV}/config", {"instance_id": iid, "activity_id": "review_join", "config": {
        "conflictPolicy": {"rankings": {"b": ["y", "x"]}}}})
    assert second.status_code == 200, second.text
    rankings = second.json()["config"]["conflictPolicy"]["rankings"]
    assert rankings["a"] == [1, 2] and rankings["b"] == ["y", "x"]


# ----------------------------------------------------------------------------- 9. snapshot of a merged branch


def test_a_snapshot_of_a_merged_branch_is_refused_saying_why(cli: Any, api: tuple[str, str]) -> None:
    iid = run_json(cli, "run", str(PARALLEL), "--data", '{"title": "Q3"}', code=3)["instance_id"]
    before = run_json(cli, "inspect", iid)["version"]
    run_json(cli, "resume", iid, "--answer", f"review={REVIEW}")
    version = run_json(cli, "inspect", iid)["version"]
    assert version > before
    refused = run_json(cli, "snapshot", iid, "--context", "estimate", code=2)["error"]
    assert "merged" in refused["message"] and "rollback" in refused["message"] and "'main'" in refused["message"]
    assert run_json(cli, "inspect", iid)["version"] == version  # nothing written
    url, _ = api
    waiting = post(url, "/api/instances", {"process_id": "parallel_user_task", "data": {"title": "Q3"}}).json()
    done = post(url, f"/api/instances/{waiting['instance_id']}/user-tasks/review", {"data": json.loads(REVIEW)})
    assert done.status_code == 200, done.text
    by_rest = post(url, f"{GOV}/snapshot", {"instance_id": waiting["instance_id"], "context": "estimate"})
    assert by_rest.status_code == 409 and "merged" in by_rest.json()["error"]["message"], by_rest.text
