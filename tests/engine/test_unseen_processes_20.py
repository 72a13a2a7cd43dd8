"""Outsider round 20: two processes nobody here had seen, written from DESIGN.md and README.md only
(tests/engine/unseen20/):

building_permit (Camunda Modeler 7 export: camunda:formData, camunda:class, bpmndi): a start form;
  `Activity_intake` writes the case number (preserved) and three long site-visit logs; an inclusive
  split `Gateway_review_split` (conditions `floors > 2`, `occupancy == "commercial"`, default zoning)
  whose branches get `review_discipline` by contextInject; the reviews disagree on `review_outcome`
  and the inclusive join's policy ranking settles it (`conditions`); an embedded sub-process computes
  the fee from SYSTEM's `fee_per_floor` (and, when a waiver is asked, tries to set it: denied);
  `Activity_plan_review` (a user task with a Camunda form) loops back through `Gateway_plans`'s
  default flow, which bumps `plan_version`; `Activity_issue_permit` (handler) preserves `permit_id`
  and compresses (count_only the visit logs, extract_keys of the register's tool result) after it.

chargeback_dispute (bpmn.io / SpiffArena: spiffworkflow:activityConfig, instructionsForEndUser): a
  parallel split whose branches each hold a user task and a model activity (offline handlers), each
  branch with its own `evidence_source` (contextInject); an interrupting boundary timer on the
  merchant's task; the branches disagree on `dispute_verdict` and the join asks a person
  (humanConfirm, default `escalate_to_network`); a default flow closes for the merchant.

Expected before anything ran:
- `validate` accepts both (exit 0); a config field the schema lacks is an error naming the file,
  the element and the field (exit 2); a config entry for an element the process lacks is reported
  naming that id;
- `run --json` is one document with DESIGN's fields; a person's step leaves it `waiting` (exit 3)
  with `waiting_for` items; conflicts name the gateway, layer L4, the key, the base value and the
  values by branch id = the first element of each branch; the permit's is resolved by `policy`,
  the dispute's has `resolution: null` and a confirmation offering both values and the default;
- the answer (`--answer GATEWAY/KEY=V`, an `--answers` file) completes the dispute (exit 0), resolver
  `human`; an answer that is not an offered option is bad input (exit 2), nothing changed;
- the permit's loop goes round once per rejection (plan_version 1 -> 2) and issues after `true`;
  the compression after `Activity_issue_permit` keeps `permit_case` and `permit_id` unchanged,
  cuts the register result to `status` and `data.id`, and is listed in `compressions`;
- a SYSTEM key written by a script or by a handler is denied: the instance fails (exit 1,
  `error.task_id` the task), the `denied` event is on the tape, SYSTEM keeps its value;
- a condition reading a key the context lacks fails naming the gateway and the key (exit 1);
- an answers file naming no element of the process is bad input (exit 2) and nothing is stored;
- the boundary timer, once due, cancels the merchant's task and its path records no response;
- `replay` rebuilds what `inspect` shows; `LayeredContext.replay(tape) == ctx`; render is the same
  bytes for the same context, also after a reload from the store;
- REST (`layerflow serve`, one module-scoped server on the same store): inspect, resolve (the
  dispute's conflict), rollback to a snapshot; no token: 401.

Found: `tape --kind rollback` did not show a rollback's `--reason` (it was on a separate governance
note); a config file setting only `humanConfirm.timeout` dropped the BPMN's message, default and options.
Misread at first (README documents it): an answer given in advance to a looping user task is given on
each pass, up to 100 times; a rollback of a context whose branches are not yet joined is refused (409).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Iterator

import httpx
import local_http
import pytest

from test_contracts_cli import check_run_document

HERE = Path(__file__).resolve().parent / "unseen20"
PERMIT = HERE / "building_permit.bpmn"
DISPUTE = HERE / "chargeback_dispute.bpmn"
ROOT = Path(__file__).resolve().parents[2]
LAYERS = ["L0", "L1", "L2", "L3", "L4", "L5"]
TOKEN = "o20-token"
PERMIT_DATA = {"parcel_id": "P-88", "floors": 4, "occupancy": "commercial", "applicant": "Ada Byron"}
DISPUTE_DATA = {"dispute_id": 5521, "amount": 249.0, "merchant_window": "PT1H"}
BOTH_ANSWERED = {"user_tasks": {"merchant_contact": {"merchant_response": "signed delivery receipt"},
                                "cardholder_interview": {"cardholder_statement": "it was not me"}}}


def cli(*args: str, code: int | None = None) -> Any:
    """The CLI in this process (stdin an empty pipe, never a terminal)."""
    from click.testing import CliRunner

    from engine.cli import main
    result = CliRunner().invoke(main, list(args), input="", catch_exceptions=False)
    if code is not None:
        assert result.exit_code == code, (result.exit_code, result.stdout, result.stderr)
    return result


def doc(*args: str, code: int) -> dict[str, Any]:
    result = cli(*args, "--json", code=code)
    out = json.loads(result.stdout)
    assert isinstance(out, dict)
    return out


def copy_db(db: Path, folder: Path) -> str:
    """A copy of a store made once per module (with its WAL: the CLI ran in this process)."""
    for suffix in ("", "-wal", "-shm"):
        if Path(f"{db}{suffix}").exists():
            shutil.copy(f"{db}{suffix}", folder / f"runs.db{suffix}")
    return f"sqlite:///{folder / 'runs.db'}"


@pytest.fixture
def store(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'runs.db'}"


def data_keys(layer: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in layer.items() if ":" not in k and not k.startswith("_")}


def tape(store: str, iid: str, *extra: str) -> list[dict[str, Any]]:
    out = json.loads(cli("tape", iid, "--store", store, "--json", *extra, code=0).stdout)
    return out["events"] if isinstance(out, dict) else out


# ===== validate: both load; bad configs are named =============================================

@pytest.mark.parametrize("bpmn", [PERMIT, DISPUTE], ids=["permit", "dispute"])
def test_validate_accepts_both_modeler_exports(bpmn: Path) -> None:
    cli("validate", str(bpmn), code=0)


def _copy_permit(tmp_path: Path, config: str) -> Path:
    for f in ("building_permit.bpmn", "permit_handlers.py"):
        shutil.copy(HERE / f, tmp_path / f)
    (tmp_path / "building_permit.layerflow.yaml").write_text(config)
    return tmp_path / "building_permit.bpmn"


def test_a_config_field_the_schema_lacks_is_named_with_file_element_and_field(tmp_path: Path) -> None:
    bpmn = _copy_permit(tmp_path, "Activity_intake:\n  preserveKey: [permit_case]\n")
    result = cli("validate", str(bpmn), code=2)
    text = result.stdout + result.stderr
    assert "building_permit.layerflow.yaml" in text and "Activity_intake" in text and "preserveKey" in text
    run = cli("run", str(bpmn), "--data", json.dumps(PERMIT_DATA), "--store", f"sqlite:///{tmp_path / 'r.db'}",
              "--json", code=2)
    assert json.loads(run.stdout)["status"] == "error" and not (tmp_path / "r.db").exists()


def test_a_config_entry_for_a_misspelt_element_is_named(tmp_path: Path) -> None:
    bpmn = _copy_permit(tmp_path, "Activity_isue_permit:\n  handler: permit_handlers.py:issue_permit\n")
    result = cli("validate", str(bpmn))
    text = result.stdout + result.stderr
    assert "Activity_isue_permit" in text and "building_permit.layerflow.yaml" in text, text


# ===== the permit: inclusive split/join by policy, sub-process, loop, compression ===============

@pytest.fixture(scope="module")
def permit_db(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    db = tmp_path_factory.mktemp("permit") / "runs.db"
    first = doc("run", str(PERMIT), "--data", json.dumps(PERMIT_DATA), "--store", f"sqlite:///{db}", code=3)
    return db, first


@pytest.fixture
def permit(permit_db: tuple[Path, dict[str, Any]], tmp_path: Path) -> tuple[str, dict[str, Any]]:
    return copy_db(permit_db[0], tmp_path), permit_db[1]


def test_permit_waits_for_the_planner_with_the_policy_settled_review(permit: tuple[str, dict[str, Any]]) -> None:
    _, first = permit
    check_run_document(first)
    assert first["status"] == "waiting" and first["process_id"] == "building_permit"
    [wait] = first["waiting_for"]
    assert (wait["kind"], wait["task_id"]) == ("user_task", "Activity_plan_review")
    assert {f["id"] for f in wait["form"]["fields"]} == {"plans_ok", "planner"}
    layers = first["layers"]
    assert layers["L0"]["fee_per_floor"] == 250
    # the start form's default is start data too
    assert data_keys(layers["L1"]) == {**PERMIT_DATA, "waive_fee": False}
    seen = {**layers["L3"], **layers["L4"]}
    assert seen["fee"] == 1000 and seen["fee_checked"] is True and seen["permit_case"] == "BP-P-88"
    assert seen["review_outcome"] == "conditions"
    assert "zoning_notes" not in seen and "structural_notes" in seen and "fire_notes" in seen
    # contextInject reached each branch's activity
    assert seen["structural_notes"].endswith("structural engineer")
    assert seen["fire_notes"].endswith("fire marshal")
    outcome = [c for c in first["conflicts"] if c["key"] == "review_outcome"]
    assert len(outcome) == 1
    [c] = outcome
    assert c["gateway_id"] == "Gateway_review_join" and c["layer"] == "L4"
    assert c["base_value"] is None
    assert c["values"] == {"Activity_structural_review": "approved", "Activity_fire_review": "conditions"}
    assert c["resolution"]["resolver"] == "policy" and c["resolution"]["value"] == "conditions"
    assert first["confirmations"] == []


def test_an_answer_given_in_advance_goes_round_the_loop_until_the_cap(permit: tuple[str, dict[str, Any]]) -> None:
    # README: an answer is given each time its step comes back, at most 100 times in one resume
    store, first = permit
    result = cli("resume", first["instance_id"], "--answer", 'Activity_plan_review={"plans_ok": false}',
                 "--store", store, "--json", code=3)
    again = json.loads(result.stdout)
    check_run_document(again)
    assert again["layers"]["L3"]["plan_version"] == 101
    assert "100 times" in result.stderr and "Activity_plan_review" in result.stderr


def test_the_loop_goes_round_once_per_rejection_then_issues_and_compresses(permit: tuple[str, dict[str, Any]]) -> None:
    from engine import Engine

    store, first = permit
    iid = first["instance_id"]
    # one person's rejection, one round: the Python API completes one task
    instance = Engine(store).complete_user_task(iid, "Activity_plan_review", {"plans_ok": False})
    assert instance.status == "waiting" and instance.main.resolve("plan_version") == 2
    done = doc("resume", iid, "--answer", 'Activity_plan_review={"plans_ok": true, "planner": "Lin"}',
               "--store", store, code=0)
    check_run_document(done)
    assert done["status"] == "completed" and done["waiting_for"] == []
    history = done["layers"]["L3"]
    assert history["permit_case"] == "BP-P-88" and history["permit_id"] == "PRM-P-88"
    assert history["archived_as"] == "PRM-P-88/BP-P-88"
    versions = [e["value"] for e in tape(store, iid, "--key", "plan_version") if e.get("kind") == "write"]
    assert versions == [1, 2]
    [comp] = [c for c in done["compressions"] if c["activity_id"] == "Activity_issue_permit"]
    assert comp["triggers"] and comp["tokens_after"] < comp["tokens_before"]
    registry = history["tool_call_result_registry"]
    assert registry["status"] == "ok" and registry["data"]["id"] == "REG-P-88" and "raw" not in registry["data"]
    # the long visit logs are no longer HISTORY entries of their own (counted, or folded)
    assert not {"site_visit_log_1", "site_visit_log_2"} & set(history)
    assert history["summary:count:site_visit_log"]["count"] == 3
    # what inspect and replay show is what run ended with
    seen = doc("inspect", iid, "--store", store, code=0)
    assert seen["layers"] == done["layers"] and seen["tape_length"] == done["tape_length"]
    replayed = cli("replay", iid, "--store", store, "--json", code=0)
    assert json.loads(replayed.stdout)["layers"] == done["layers"]
    assert cli("replay", iid, "--store", store, "--json", code=0).stdout == replayed.stdout


def test_the_default_branch_alone_is_no_conflict_and_answers_in_advance_complete(store: str, tmp_path: Path) -> None:
    answers = tmp_path / "answers.json"
    answers.write_text(json.dumps({"user_tasks": {"Activity_plan_review": {"plans_ok": True}}}))
    data = {"parcel_id": "P-3", "floors": 1}
    done = doc("run", str(PERMIT), "--data", json.dumps(data), "--answers", str(answers), "--store", store, code=0)
    check_run_document(done)
    history = done["layers"]["L3"]
    # the compression after the permit folded the reviews; the tape keeps what zoning wrote
    assert "structural_notes" not in history and done["conflicts"] == []
    [zoning] = [e for e in tape(store, done["instance_id"], "--key", "zoning_notes") if e.get("kind") == "write"]
    assert zoning["value"].endswith("zoning officer")
    [fee] = [e for e in tape(store, done["instance_id"], "--key", "fee") if e.get("kind") == "write"]
    assert fee["value"] == 250
    assert done["layers"]["L1"]["occupancy"] == "residential"


def test_a_script_that_sets_a_system_key_is_denied_and_on_the_tape(store: str) -> None:
    data = {**PERMIT_DATA, "waive_fee": True}
    failed = doc("run", str(PERMIT), "--data", json.dumps(data), "--store", store, code=1)
    check_run_document(failed)
    assert failed["status"] == "error" and failed["error"]["task_id"] == "Activity_fee_waiver"
    assert "fee_per_floor" in failed["error"]["message"] and "L0" in failed["error"]["message"]
    assert failed["layers"]["L0"]["fee_per_floor"] == 250
    denied = tape(store, failed["instance_id"], "--kind", "denied")
    assert [e for e in denied if "fee_per_floor" in json.dumps(e)], denied


def test_a_condition_on_a_missing_key_names_the_gateway_and_the_key(tmp_path: Path) -> None:
    bpmn = _copy_permit(tmp_path, (HERE / "building_permit.layerflow.yaml").read_text())
    bpmn.write_text(bpmn.read_text().replace("floors &gt; 2", "storeys &gt; 2"))
    failed = doc("run", str(bpmn), "--data", json.dumps(PERMIT_DATA), "--store", f"sqlite:///{tmp_path / 'r.db'}",
                 code=1)
    check_run_document(failed)
    assert failed["error"]["task_id"] == "Gateway_review_split"
    assert "storeys" in failed["error"]["message"]


def test_an_answers_file_naming_no_element_is_bad_input_and_nothing_is_stored(tmp_path: Path) -> None:
    answers = tmp_path / "answers.json"
    answers.write_text(json.dumps({"user_tasks": {"Activity_plan_reveiw": {"plans_ok": True}}}))
    result = cli("run", str(PERMIT), "--data", json.dumps(PERMIT_DATA), "--answers", str(answers),
                 "--store", f"sqlite:///{tmp_path / 'r.db'}", code=2)
    assert "Activity_plan_reveiw" in result.stderr
    listed = cli("list", "--store", f"sqlite:///{tmp_path / 'r.db'}", "--json", code=0)
    assert json.loads(listed.stdout) in ([], {"instances": []})


# ===== the dispute: parallel user task + model activity per branch, a person settles ============

def _at_conflict(store: str, tmp_path: Path) -> dict[str, Any]:
    answers = tmp_path / "evidence.json"
    answers.write_text(json.dumps(BOTH_ANSWERED))
    return doc("run", str(DISPUTE), "--data", json.dumps(DISPUTE_DATA), "--answers", str(answers),
               "--store", store, code=3)


@pytest.fixture(scope="module")
def dispute_db(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    folder = tmp_path_factory.mktemp("dispute")
    return folder / "runs.db", _at_conflict(f"sqlite:///{folder / 'runs.db'}", folder)


@pytest.fixture
def dispute(dispute_db: tuple[Path, dict[str, Any]], tmp_path: Path) -> tuple[str, dict[str, Any]]:
    return copy_db(dispute_db[0], tmp_path), dispute_db[1]


def test_the_dispute_first_waits_for_both_people_and_the_timer(store: str) -> None:
    first = doc("run", str(DISPUTE), "--data", json.dumps(DISPUTE_DATA), "--store", store, code=3)
    check_run_document(first)
    kinds = sorted((w["kind"], w["task_id"]) for w in first["waiting_for"])
    assert ("user_task", "merchant_contact") in kinds and ("user_task", "cardholder_interview") in kinds
    assert [w for w in first["waiting_for"] if w["kind"] == "timer" and w.get("due")]
    merchant = doc("inspect", first["instance_id"], "--context", "merchant_contact", "--store", store, code=0)
    assert merchant["layers"]["L4"]["evidence_source"] == "merchant"
    assert doc("inspect", first["instance_id"], "--context", "cardholder_interview", "--store", store,
               code=0)["layers"]["L4"]["evidence_source"] == "cardholder"


def test_the_disagreement_is_one_conflict_put_to_a_person(dispute: tuple[str, dict[str, Any]]) -> None:
    _, waiting = dispute
    check_run_document(waiting)
    assert [(w["kind"]) for w in waiting["waiting_for"]] == ["confirmation"]
    [c] = waiting["conflicts"]
    assert c["gateway_id"] == "evidence_join" and c["key"] == "dispute_verdict" and c["layer"] == "L4"
    assert c["values"] == {"merchant_contact": "merchant_wins", "cardholder_interview": "cardholder_wins"}
    assert c["resolution"] is None and c["base_value"] is None
    [conf] = waiting["confirmations"]
    assert conf["answer"] is None and conf["timed_out"] is False
    assert "Merchant and cardholder evidence disagree." in conf["message"]
    offered = [o["value"] if isinstance(o, dict) else o for o in conf["options"]]
    assert {"merchant_wins", "cardholder_wins", "escalate_to_network"} <= set(offered)


@pytest.mark.parametrize("how", ["answer", "answers_file"])
def test_a_person_settles_the_dispute(dispute: tuple[str, dict[str, Any]], tmp_path: Path, how: str) -> None:
    store, waiting = dispute
    iid = waiting["instance_id"]
    if how == "answer":
        args = ["--answer", "evidence_join/dispute_verdict=cardholder_wins"]
    else:
        (tmp_path / "a.json").write_text(json.dumps({"confirmations": {"evidence_join/dispute_verdict":
                                                                       "cardholder_wins"}}))
        args = ["--answers", str(tmp_path / "a.json")]
    done = doc("resume", iid, *args, "--store", store, code=0)
    check_run_document(done)
    [c] = done["conflicts"]
    assert c["resolution"]["resolver"] == "human" and c["resolution"]["value"] == "cardholder_wins"
    history = done["layers"]["L3"]
    assert history["dispute_verdict"] == "cardholder_wins" and history["dispute_closed_as"] == "refunded"
    assert history["refund_amount"] == 249.0
    [conf] = done["confirmations"]
    assert conf["answer"] == "cardholder_wins"
    [logged] = history["_mergedConflicts"]
    assert logged["key"] == "dispute_verdict" and logged["resolution"]["resolver"] == "human"
    assert sorted(logged["conflictingValues"]) == ["cardholder_wins", "merchant_wins"]


def test_an_answer_that_is_no_option_is_bad_input_and_changes_nothing(dispute: tuple[str, dict[str, Any]],
                                                                      tmp_path: Path) -> None:
    store, waiting = dispute
    iid = waiting["instance_id"]
    (tmp_path / "a.json").write_text(json.dumps({"confirmations": {"evidence_join/dispute_verdict": "split_50_50"}}))
    result = cli("resume", iid, "--answers", str(tmp_path / "a.json"), "--store", store, code=2)
    assert "split_50_50" in result.stderr and "dispute_verdict" in result.stderr
    after = doc("inspect", iid, "--store", store, code=0)
    assert after["status"] == "waiting" and after["tape_length"] == waiting["tape_length"]
    assert after["layers"] == waiting["layers"]


def test_a_config_file_that_sets_one_humanconfirm_field_keeps_the_bpmns_others(tmp_path: Path) -> None:
    # README: the file wins field by field; a file that only lengthens the timeout keeps the join's
    # message, default and options from the BPMN (else its timeout would escalate instead of defaulting)
    for f in ("chargeback_dispute.bpmn", "chargeback_handlers.py", "chargeback_dispute.layerflow.yaml"):
        shutil.copy(HERE / f, tmp_path / f)
    with (tmp_path / "chargeback_dispute.layerflow.yaml").open("a") as config:
        config.write("\nevidence_join:\n  humanConfirm: {timeout: 600}\n")
    (tmp_path / "evidence.json").write_text(json.dumps(BOTH_ANSWERED))
    waiting = doc("run", str(tmp_path / "chargeback_dispute.bpmn"), "--data", json.dumps(DISPUTE_DATA),
                  "--answers", str(tmp_path / "evidence.json"), "--store", f"sqlite:///{tmp_path / 'r.db'}", code=3)
    [conf] = waiting["confirmations"]
    assert conf["timeout"] == 600 and conf["default"] == "escalate_to_network"
    assert conf["message"].startswith("Merchant and cardholder evidence disagree.")


def test_a_handler_that_returns_a_system_key_is_denied(store: str, tmp_path: Path) -> None:
    answers = tmp_path / "a.json"
    answers.write_text(json.dumps(BOTH_ANSWERED))
    failed = doc("run", str(DISPUTE), "--data", json.dumps({**DISPUTE_DATA, "try_override": True}),
                 "--answers", str(answers), "--store", store, code=1)
    check_run_document(failed)
    assert failed["error"]["task_id"] == "fraud_scoring" and "network_rules" in failed["error"]["message"]
    assert failed["layers"]["L0"]["network_rules"].startswith("Card network reason code 10.4")
    denied = tape(store, failed["instance_id"], "--kind", "denied")
    assert [e for e in denied if "network_rules" in json.dumps(e)], denied


def test_the_boundary_timer_cancels_the_merchants_task(store: str, tmp_path: Path) -> None:
    first = doc("run", str(DISPUTE), "--data", json.dumps({**DISPUTE_DATA, "merchant_window": "PT1S"}),
                "--answer", 'cardholder_interview={"cardholder_statement": "it was not me"}', "--store", store, code=3)
    assert [w["task_id"] for w in first["waiting_for"] if w["kind"] == "user_task"] == ["merchant_contact"]
    time.sleep(1.2)
    # no merchant evidence: both branches say cardholder_wins, no conflict, refunded
    done = doc("resume", first["instance_id"], "--store", store, code=0)
    history = done["layers"]["L3"]
    assert history["merchant_response"] == "no response" and history["dispute_closed_as"] == "refunded"
    assert done["conflicts"] == []
    assert "merchant_contact" not in [w["task_id"] for w in done["waiting_for"]]


def test_a_rollbacks_reason_is_found_by_kind_rollback(dispute: tuple[str, dict[str, Any]]) -> None:
    # `rollback --reason`: "why, for the audit trail on the tape"; `tape --kind rollback` finds DESIGN's
    # rollback, and the plain listing shows what each note decided
    from engine import Engine

    store, waiting = dispute
    iid = waiting["instance_id"]
    doc("resume", iid, "--answer", "evidence_join/dispute_verdict=merchant_wins", "--store", store, code=0)
    [split] = [e for e in tape(store, iid, "--kind", "snapshot") if e.get("actor") == "evidence_split"]
    cli("rollback", iid, split["data"]["snapshot_id"], "--layers", "L3", "--reason", "chargeback reopened by the network",
        "--store", store, code=0)
    assert [e for e in tape(store, iid, "--kind", "rollback") if "reopened by the network" in json.dumps(e)]
    listed = cli("tape", iid, "--kind", "rollback", "--store", store, code=0).stdout
    assert "chargeback reopened by the network" in listed, listed
    main = Engine(store).load(iid).main
    assert [e for e in main.tape.filter(kind="rollback") if "reopened by the network" in json.dumps(dict(e.data))]


# ===== the Python API: replay, render determinism =============================================

def test_python_api_replay_and_render_are_deterministic(tmp_path: Path) -> None:
    from context_layers import LayeredContext, render
    from engine import Engine, load_process

    url = f"sqlite:///{tmp_path / 'api.db'}"
    engine = Engine(url)
    instance = engine.run(engine.start(load_process(str(DISPUTE)), DISPUTE_DATA))
    assert instance.status == "waiting"
    instance = engine.resume(instance.id, answers={**BOTH_ANSWERED,
                                                   "confirmations": {"*": "escalate_to_network"}})
    assert instance.status == "completed"
    ctx = instance.main
    assert ctx.resolve("dispute_verdict") == "escalate_to_network"
    assert ctx.resolve("dispute_closed_as") == "represented"
    assert LayeredContext.replay(ctx.tape) == ctx
    again = Engine(url).load(instance.id).main
    for fmt in ("xml", "json", "plain"):
        assert render(ctx, format=fmt) == render(ctx, format=fmt) == render(again, format=fmt)
    xml = render(ctx, format="xml")
    text = "".join(m["content"] for m in xml)
    assert "Card network reason code 10.4" in text and "CB-5521" in text


# ===== REST: one server for the module =======================================================

def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str]]:
    folder = tmp_path_factory.mktemp("served")
    store = f"sqlite:///{folder / 'runs.db'}"
    port = _free_port()
    env = dict(os.environ, PYTHONPATH=str(ROOT), LAYERFLOW_API_TOKEN=TOKEN)
    proc = subprocess.Popen([sys.executable, "-m", "engine.cli", "serve", "--host", "127.0.0.1", "--port", str(port),
                             "--catalog", str(HERE), "--store", store], env=env, cwd=ROOT,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                if local_http.get(f"{url}/api/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read() if proc.stderr else ""
            time.sleep(0.1)
        yield url, store
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=10)


def test_rest_inspect_resolve_and_rollback(server: tuple[str, str]) -> None:
    url, store = server
    assert local_http.post(f"{url}/api/context-governance/inspect", json={"instance_id": "x"}).status_code == 401
    with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {TOKEN}"}, timeout=30) as api:
        started = api.post("/api/instances", json={"process_id": "chargeback_dispute", "data": DISPUTE_DATA})
        assert started.status_code in (200, 201), started.text
        iid = started.json()["instance_id"]
        for task, data in BOTH_ANSWERED["user_tasks"].items():
            answered = api.post(f"/api/instances/{iid}/user-tasks/{task}", json={"data": data})
            assert answered.status_code == 200, answered.text
        waiting = answered.json()
        check_run_document(waiting)
        assert [w["id"] for w in waiting["waiting_for"]] == ["evidence_join/dispute_verdict"]
        # the CLI sees what the server ran (one store)
        assert doc("inspect", iid, "--store", store, code=0)["tape_length"] == waiting["tape_length"]

        seen = api.post("/api/context-governance/inspect", json={"instance_id": iid})
        assert seen.status_code == 200, seen.text
        assert "case_ref" in seen.text

        [split] = [e for e in tape(store, iid, "--kind", "snapshot") if e.get("actor") == "evidence_split"]
        snap_id = split["data"]["snapshot_id"]
        # main waits for its branches' join: a rollback there is refused, naming them and what to do
        early = api.post("/api/context-governance/rollback", json={"instance_id": iid, "snapshot_id": snap_id})
        assert early.status_code == 409, early.text
        assert "merchant_contact" in early.text and "cardholder_interview" in early.text
        rolled = api.get(f"/api/instances/{iid}").json()
        assert rolled["tape_length"] == waiting["tape_length"]

        wrong = api.post("/api/context-governance/resolve", json={"instance_id": iid, "conflict_key": "dispute_verdict",
                                                                   "resolution": "split_50_50",
                                                                   "reason": "split the loss"})
        assert wrong.status_code == 400, wrong.text
        assert "split_50_50" in wrong.text
        assert api.get(f"/api/instances/{iid}").json()["tape_length"] == rolled["tape_length"]

        resolved = api.post("/api/context-governance/resolve", json={"instance_id": iid,
                                                                      "conflict_key": "dispute_verdict",
                                                                      "resolution": "merchant_wins",
                                                                      "reason": "courier proof checked"})
        assert resolved.status_code == 200, resolved.text
        got = api.get(f"/api/instances/{iid}").json()
        check_run_document(got)
        assert got["status"] == "completed"
        [c] = got["conflicts"]
        assert c["resolution"]["value"] == "merchant_wins" and c["resolution"]["resolver"] == "human"
        assert got["layers"]["L3"]["dispute_closed_as"] == "represented"
        # after the end, main goes back to the split's HISTORY: a restore event, nothing deleted
        back = api.post("/api/context-governance/rollback", json={"instance_id": iid, "snapshot_id": snap_id,
                                                                  "layers": ["L3"], "reason": "audit check"})
        assert back.status_code == 200, back.text
        after = api.get(f"/api/instances/{iid}").json()
        assert after["tape_length"] > got["tape_length"]
        assert "dispute_verdict" not in after["layers"]["L3"] and after["layers"]["L3"]["case_ref"] == "CB-5521"
        assert after["layers"]["L1"] == got["layers"]["L1"] and after["layers"]["L0"] == got["layers"]["L0"]
        assert [e for e in tape(store, iid, "--kind", "rollback") if "audit check" in json.dumps(e)]
