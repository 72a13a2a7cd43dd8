"""Unseen processes, round 7: small processes of tests/engine/unseen7 that use Camunda 7's
camunda:inputOutput and Camunda 8's zeebe:ioMapping under the layer rules, call activities' camunda:in
/ camunda:out in parallel branches, confirmations whose timeout is due like a timer (fired by
`layerflow timers --fire` and by a worker on Redis), start forms and messages that leave an instance,
and a Camunda Modeler file run through the CLI, the REST API and a worker. Every expectation was
worked out by hand from DESIGN.md and the README first."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import uuid
from datetime import datetime, timezone
from pathlib import Path
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import httpx
import pytest

from context_layers import LayeredContext
from engine import Engine
from engine.api import create_app

from engine_helpers import cli_in_a_tmp_store  # noqa: F401 - the "cli" fixture
from engine_helpers import redis_scratch, run_json
from governance_helpers import TOKEN, ServerThread
from test_unseen_processes_5 import records

HERE = Path(__file__).resolve().parent / "unseen7"
ROOT = Path(__file__).resolve().parents[2]
AUTH = {"Authorization": f"Bearer {TOKEN}"}
GOV = "/api/context-governance"
REDIS = os.environ.get("LAYERFLOW_TEST_REDIS_UNSEEN7", "redis://127.0.0.1:6379/14")  # this module's own database


def data_keys(layer: dict[str, Any]) -> dict[str, Any]:
    """A layer's data keys: no activity, event or engine records."""
    return {k: v for k, v in records(layer).items() if not k.startswith(("event:", "_", "compaction:"))}


def copied(tmp_path: Path, name: str, config: str | None = None) -> Path:
    """The unseen7 process ``name`` copied into ``tmp_path``, with ``config`` as its config file."""
    path = tmp_path / f"{name}.bpmn"
    shutil.copy(HERE / f"{name}.bpmn", path)
    if config is not None:
        (tmp_path / f"{name}.layerflow.yaml").write_text(config, encoding="utf-8")
    return path


# ------------------------------------------------------------------ camunda:inputOutput under the layer rules

INVOICE = {"invoice": {"net": 500, "number": "INV-1"}}


def test_invoice_inputs_and_outputs_run_around_the_script(cli: Any) -> None:
    """README: a parameter naming a path runs (`${invoice.net}`: invoice['net']), `${20}` is a number,
    Camunda 7's text without `${}` a string; the inputs before the script, the output after it; with no
    task-local scope every mapping is a write of the task (WORKING, then HISTORY)."""
    assert cli("validate", str(HERE / "invoice_tax.bpmn")).exit_code == 0
    doc = run_json(cli, "run", str(HERE / "invoice_tax.bpmn"), "--data", json.dumps(INVOICE))
    assert doc["status"] == "completed" and doc["error"] is None
    assert doc["layers"]["L1"] == INVOICE
    assert data_keys(doc["layers"]["L3"]) == {
        "net": 500, "rate": 20, "currency": "EUR", "tax": 100, "note": "tax of INV-1 in EUR", "invoice_tax": 100,
        "booked": {"number": "INV-1", "gross": 600}}
    assert doc["layers"]["L3"]["activity:compute_tax"]["keys"] == ["net", "rate", "currency", "tax", "note",
                                                                   "invoice_tax"]
    # each mapping's write is on the tape, by the task, and the tape rebuilds the context
    iid = doc["instance_id"]
    writes = json.loads(cli("tape", iid, "--kind", "write", "--activity", "compute_tax", "--json").stdout)
    assert [e["key"] for e in writes if e["key"] in ("net", "rate", "currency", "invoice_tax")] == [
        "net", "rate", "currency", "invoice_tax"]
    instance = Engine(os.environ["LAYERFLOW_STORE"]).load(iid)
    assert LayeredContext.replay(instance.main.tape) == instance.main


def test_an_input_the_system_layer_fixes_is_refused_by_validate_and_at_the_task(cli: Any, tmp_path: Path) -> None:
    """A call activity's mapping into a SYSTEM key is refused by validate (README), as a DMN result variable
    is: so is a task's camunda:inputParameter, whose write is denied at the task just the same."""
    path = copied(tmp_path, "invoice_tax", "system:\n  currency: USD\n")
    checked = cli("validate", str(path))
    said = checked.stdout + checked.stderr
    assert checked.exit_code == 2, said
    line = next(x for x in said.splitlines() if "'currency'" in x)
    assert "'compute_tax'" in line and "camunda:inputParameter" in line and "SYSTEM" in line, line
    # `run` checks the process as it loads it: refused before any instance exists
    doc = run_json(cli, "run", str(path), "--data", json.dumps(INVOICE), code=2)
    assert doc["instance_id"] is None and doc["error"]["kind"] == "invalid_process"
    assert "'currency'" in doc["error"]["message"] and "'compute_tax'" in doc["error"]["message"]


def test_an_input_into_a_process_key_is_refused_when_it_changes_it(cli: Any) -> None:
    """PROCESS is append-only: a mapping that writes the value the start data gave is no change; another
    value is refused, naming the mapping and how to let activities change the key."""
    same = run_json(cli, "run", str(HERE / "invoice_tax.bpmn"), "--data", json.dumps({**INVOICE, "rate": 20}))
    assert same["status"] == "completed" and same["layers"]["L1"]["rate"] == 20
    doc = run_json(cli, "run", str(HERE / "invoice_tax.bpmn"), "--data", json.dumps({**INVOICE, "rate": 19}), code=1)
    assert doc["error"]["kind"] == "permission_denied"
    message = doc["error"]["message"]
    assert "camunda:inputParameter 'rate' of 'compute_tax'" in message and "data_layers" in message


# ------------------------------------------------------------------ an event's output mappings, messages out

PAYMENT = {"invoice_no": "INV-9", "invoice_total": 300}
PAID = {"amount": 300, "payer": {"iban": "DE00 1234"}}


def test_payment_event_mappings_run_as_the_events_fire_and_the_receipt_leaves(cli: Any) -> None:
    """README: a start event's output mappings run at the start (a FEEL context written as JSON is a
    literal), a message catch event's after the payload went into the context (a key the payload lacks
    gives null in FEEL); a message nothing in the instance catches leaves it, in `messages_out`."""
    assert cli("validate", str(HERE / "payment_wait.bpmn")).exit_code == 0
    doc = run_json(cli, "run", str(HERE / "payment_wait.bpmn"), "--data", json.dumps(PAYMENT), code=3)
    assert [(w["kind"], w["task_id"], w["event"]) for w in doc["waiting_for"]] == [
        ("event", "payment_in", "payment_received")]
    assert data_keys(doc["layers"]["L3"]) == {"currency": "EUR", "notice": {"channel": "email", "reminders": 0}}
    paid = run_json(cli, "send", doc["instance_id"], "payment_received", "--json-payload", json.dumps(PAID))
    assert paid["status"] == "completed"
    assert data_keys(paid["layers"]["L3"]) == {
        "currency": "EUR", "notice": {"channel": "email", "reminders": 0}, **PAID, "paid_amount": 300,
        "payer_iban": "DE00 1234", "payer_reference": None, "balance": 0, "settled": True}
    assert paid["layers"]["L3"]["event:payment_in"]["keys"] == ["amount", "payer"]
    assert [(m["name"], m["kind"], m["element_id"], m["payload"]) for m in paid["messages_out"]] == [
        ("receipt_issued", "message", "receipt_out", {"invoice_no": "INV-9", "balance": 0, "currency": "EUR"})]


def test_a_message_whose_output_mapping_the_layer_rules_refuse_is_refused_whole(cli: Any) -> None:
    """README: a message key the layer rules refuse is refused whole (exit 2) and recorded on the tape;
    nothing else changes and the instance still waits. The catch event's output mappings are part of
    catching it: one that would change a PROCESS key is refused the same way, before anything is
    delivered (the instance failed at the catch event with the message used up: nothing waited for a
    corrected one, and a retry failed the same way)."""
    doc = run_json(cli, "run", str(HERE / "payment_wait.bpmn"), "--data", json.dumps({**PAYMENT, "paid_amount": 0}),
                   code=3)
    iid = doc["instance_id"]
    sent = cli("send", iid, "payment_received", "--json-payload", json.dumps(PAID))
    assert sent.exit_code == 2, (sent.stdout, sent.stderr)
    assert "'paid_amount'" in sent.stderr and "zeebe:output" in sent.stderr and "payment_in" in sent.stderr, sent.stderr
    after = run_json(cli, "inspect", iid)
    assert after["status"] == "waiting" and after["waiting_for"] == doc["waiting_for"]
    assert after["layers"]["L3"] == doc["layers"]["L3"] and after["layers"]["L4"] == {}
    denied = json.loads(cli("tape", iid, "--kind", "denied", "--json").stdout)
    assert [e["data"]["key"] for e in denied] == ["paid_amount"]
    # a message the mapping can take (the same amount the process holds) goes through
    fine = run_json(cli, "send", iid, "payment_received", "--json-payload", json.dumps({**PAID, "amount": 0}))
    assert fine["status"] == "completed" and fine["layers"]["L3"]["balance"] == 300


# ------------------------------------------------------------------ parallel branches mapping one target

ORDER = {"order": {"total": 400, "lines": ["a", "b"]}}


def _due_listed(cli: Any, iid: str) -> dict[str, Any]:
    """`layerflow timers --json`'s item for ``iid``, polled until its confirmation is due (its timeout
    is one second: the test waits for the clock, it asserts nothing about how long that took)."""
    deadline = time.monotonic() + 30
    while True:
        doc = json.loads(cli("timers", "--json").stdout)
        mine = [d for d in doc["due"] if d["instance_id"] == iid]
        if mine:
            return mine[0]
        assert time.monotonic() < deadline, doc
        time.sleep(0.2)


def test_branches_mapping_one_target_differently_conflict_and_the_timeout_settles_it(cli: Any) -> None:
    """DESIGN: a key changed differently in two branches is a conflict. Both branches' zeebe:input map
    `=order.total` to `amount` (the same value: no conflict); their zeebe:output map different values
    to `region_verdict` (a conflict, in HISTORY where the finished tasks' writes are). The join's
    humanConfirm has a timeout: the waiting item carries `due`, `layerflow timers` lists it once due,
    and `--fire` applies the default."""
    doc = run_json(cli, "run", str(HERE / "region_check.bpmn"), "--data", json.dumps(ORDER), code=3)
    iid = doc["instance_id"]
    assert doc["conflicts"] == [{"gateway_id": "fan_in", "layer": "L4", "key": "region_verdict", "base_value": None,
                                 "base_absent": True, "values": {"eu_check": "ok", "us_check": "hold"},
                                 "resolution": None, "context": "main"}]
    (item,) = doc["waiting_for"]
    assert (item["kind"], item["id"], item["task_id"]) == ("confirmation", "fan_in/region_verdict", "fan_in")
    (asked,) = doc["confirmations"]
    assert (asked["timeout"], asked["default"]) == (1.0, "hold")
    assert item["due"] == datetime.fromtimestamp(asked["deadline"], timezone.utc).isoformat()
    listed = _due_listed(cli, iid)
    assert (listed["kind"], listed["id"], listed["due"]) == ("confirmation", "fan_in/region_verdict", item["due"])
    assert "confirmation fan_in/region_verdict times out" in cli("timers").stdout
    fired = json.loads(cli("timers", "--fire", "--json").stdout)
    assert [(f["instance_id"], f["status"]) for f in fired["fired"] if f["instance_id"] == iid] == [(iid, "completed")]
    done = run_json(cli, "inspect", iid)
    assert done["status"] == "completed" and done["waiting_for"] == []
    (conflict,) = done["conflicts"]
    assert conflict["resolution"]["value"] == "hold" and "default" in conflict["resolution"]["reason"]
    assert done["confirmations"][0]["timed_out"] is True
    assert data_keys(done["layers"]["L3"]) == {"amount": 400, "lines": ["a", "b"], "verdict": "ok", "eu_lines": 2,
                                               "region_verdict": "hold", "us_default": "hold", "us_seen": 400,
                                               "shipped": False}
    timed = json.loads(cli("tape", iid, "--kind", "confirmation_timed_out", "--json").stdout)
    assert [(e["data"]["action"], e["data"]["value"]) for e in timed] == [("default", "hold")]
    # the join's snapshot and the tape rebuild the main context as it is
    instance = Engine(os.environ["LAYERFLOW_STORE"]).load(iid)
    assert LayeredContext.replay(instance.main.tape) == instance.main
    assert json.loads(cli("timers", "--json").stdout)["due"] == []


def test_an_answer_before_the_deadline_decides(cli: Any, tmp_path: Path) -> None:
    path = copied(tmp_path, "region_check", "fan_in:\n  humanConfirm: {timeout: 3600, default: hold}\n")
    doc = run_json(cli, "run", str(path), "--data", json.dumps(ORDER), code=3)
    done = run_json(cli, "resume", doc["instance_id"], "--answer", "fan_in/region_verdict=ok")
    assert done["status"] == "completed" and done["layers"]["L3"]["shipped"] is True
    assert done["conflicts"][0]["resolution"]["resolver"] == "human"
    assert done["confirmations"][0]["timed_out"] is False


@pytest.fixture
def redis_store() -> Iterator[tuple[str, str]]:
    with redis_scratch(REDIS, "unseen7") as prefix:
        yield f"{REDIS}?prefix={prefix}", f"{prefix}:ready"


def _worker(store: str, stream: str) -> subprocess.Popen[bytes]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("LAYERFLOW_STORE", None)
    return subprocess.Popen([sys.executable, "-m", "engine.cli", "worker", "--store", store, "--stream", stream,
                             "--timer-interval", "0.2", "--consumer", f"u7-{uuid.uuid4().hex[:6]}"],
                            env=env, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            stdin=subprocess.DEVNULL)


def _until(engine: Engine, iid: str, status: str, worker: subprocess.Popen[bytes]) -> Any:
    deadline = time.monotonic() + 40
    while True:
        instance = engine.load(iid)
        if instance.status == status:
            return instance
        assert worker.poll() is None, "the worker ended"
        assert time.monotonic() < deadline, f"{iid} is {instance.status}, not {status}"
        time.sleep(0.1)


def test_a_worker_on_redis_fires_the_due_confirmation(cli: Any, redis_store: tuple[str, str]) -> None:
    """README ("Many workers"): workers fire due timers themselves; a confirmation's timeout is due the same
    way. Submitted to Redis, the instance waits for the join, then times out to the default."""
    store, stream = redis_store
    submitted = json.loads(cli("submit", str(HERE / "region_check.bpmn"), "--data", json.dumps(ORDER),
                               "--store", store, "--stream", stream, "--json").stdout)
    (iid,) = submitted["instance_ids"]
    worker = _worker(store, stream)
    try:
        engine = Engine(store)
        done = _until(engine, iid, "completed", worker)
    finally:
        worker.send_signal(signal.SIGTERM)
        worker.wait(timeout=30)
    doc = done.to_document()
    assert doc["conflicts"][0]["resolution"]["value"] == "hold" and doc["confirmations"][0]["timed_out"] is True
    assert data_keys(doc["layers"]["L3"])["shipped"] is False


# ------------------------------------------------------------------ call activities in parallel branches

APPLICANTS = {"main_applicant": {"name": "Ann", "years": 4}, "co_applicant": {"name": "Bob", "years": 7}}


def test_a_multi_instance_call_in_one_branch_maps_each_call_and_meets_the_other_branch(cli: Any) -> None:
    """Each call of a multi-instance call activity runs in a scope of its own (README): its `in` target
    (`person`) and what the called process sets (`rating`) stay there, only the output item comes back
    into `scores`; the other branch's camunda:inputOutput runs beside it; the join meets no conflict."""
    data = {"applicants": [{"years": 3}, {"years": 5}], "panel": {"size": 2}}
    doc = run_json(cli, "run", str(HERE / "panel_scoring.bpmn"), "--data", json.dumps(data))
    assert doc["status"] == "completed" and doc["conflicts"] == []
    assert data_keys(doc["layers"]["L3"]) == {"scores": [30, 50], "panel_size": 2, "note": "panel of 2 for 2 applicants",
                                              "audit_note": "panel of 2 for 2 applicants", "best": 50}


def test_two_parallel_calls_give_back_only_their_out_mappings_as_camunda_does(cli: Any) -> None:
    """Two parallel branches call one process with camunda:in / camunda:out: each call runs in a
    scope of its own (README), as Camunda gives each call its variables, and only its out mappings
    (`main_score`, `co_score`) come back: the join finds no conflict on the called process's own
    variables (`person`, `score`), which stay in the calls' scopes. Before, it waited for a person
    on both."""
    doc = run_json(cli, "run", str(HERE / "dual_scoring.bpmn"), "--data", json.dumps(APPLICANTS))
    assert doc["status"] == "completed" and doc["conflicts"] == []
    history = doc["layers"]["L3"]
    assert {k: history[k] for k in ("main_score", "co_score", "total_score")} == {
        "main_score": 34, "co_score": 37, "total_score": 71}
    assert "person" not in history and "score" not in history


# ------------------------------------------------------------------ a Camunda Modeler file on every interface

CLAIM = {"employee": "Kim", "amount": 250}
REVIEW = {"approved": True, "comment": "fine"}


@contextmanager
def serving(store: str, folder: Path) -> Iterator[str]:
    """``layerflow serve --port 0 --catalog unseen7`` on ``store``; its URL, read from the line it prints."""
    env = {k: v for k, v in os.environ.items() if k not in ("LAYERFLOW_API_TOKEN", "LAYERFLOW_MODEL", "LAYERFLOW_STORE")}
    env["PYTHONPATH"] = str(ROOT)
    env["LAYERFLOW_API_TOKEN"] = TOKEN
    log = folder / "serve.err"
    with log.open("w") as err:
        proc = subprocess.Popen([sys.executable, "-m", "engine.cli", "serve", "--host", "127.0.0.1", "--port", "0",
                                 "--catalog", str(HERE), "--store", store, "--log-level", "warning"],
                                cwd=folder, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err)
    try:
        url = None
        deadline = time.monotonic() + 60
        while url is None:
            assert proc.poll() is None, f"layerflow serve exited: {log.read_text()}"
            assert time.monotonic() < deadline, f"layerflow serve named no address: {log.read_text()}"
            found = re.search(r"serving .* on (http://127\.0\.0\.1:\d+)", log.read_text())
            url = found.group(1) if found else None
            time.sleep(0.05)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=5)


def _answers(doc: dict[str, Any]) -> dict[str, Any]:
    """What every interface must agree on: the layers, the messages that left, the conflicts. Not the
    tape positions: the REST API notes who started the instance (`started`, actor `api`), one event
    more, so a branch's `_snapshot_id` (`snap:main:SEQ`) and a message's `seq` name other positions."""
    layers = {name: {k: v for k, v in layer.items() if k != "_snapshot_id"} for name, layer in doc["layers"].items()}
    return {"status": doc["status"], "layers": layers, "conflicts": doc["conflicts"],
            "messages_out": [{k: v for k, v in m.items() if k != "seq"} for m in doc["messages_out"]],
            "process_id": doc["process_id"]}


def test_a_camunda_modeler_claim_gives_the_same_answers_on_the_cli_rest_and_a_worker(
        cli: Any, tmp_path: Path, redis_store: tuple[str, str]) -> None:
    """A Camunda 7 Modeler file (camunda namespace, a start form, a user task's formData,
    camunda:inputOutput, a Python condition, a diagram) run end to end: by `layerflow run` + `resume`,
    through a real `layerflow serve` (start form, a refused start, the user task), and by a worker on
    Redis (`submit`, then `resume` on the worker's store). Each gives the same answers."""
    assert cli("validate", str(HERE / "expense_claim.bpmn")).exit_code == 0
    first = run_json(cli, "run", str(HERE / "expense_claim.bpmn"), "--data", json.dumps(CLAIM), code=3)
    (item,) = first["waiting_for"]
    assert (item["kind"], item["task_id"]) == ("user_task", "manager_review")
    assert [(f["id"], f["type"], f["required"]) for f in item["form"]["fields"]] == [
        ("approved", "boolean", True), ("comment", "string", False)]
    assert first["layers"]["L1"] == {**CLAIM, "category": "travel"}  # the start form's default
    refused = cli("resume", first["instance_id"], "--answer", "manager_review=" + json.dumps({"approved": "yes"}))
    assert refused.exit_code == 2 and "approved" in refused.stderr
    by_cli = run_json(cli, "resume", first["instance_id"], "--answer", "manager_review=" + json.dumps(REVIEW))
    assert by_cli["status"] == "completed"
    assert data_keys(by_cli["layers"]["L3"]) == {"claimed": 250, "threshold": 100, "over": True,
                                                 "needs_approval": True, "approved": True, "comment": "fine",
                                                 "payout": 250}
    assert [(m["name"], m["payload"]) for m in by_cli["messages_out"]] == [
        ("expense_paid", {"employee": "Kim", "payout": 250})]
    small = run_json(cli, "run", str(HERE / "expense_claim.bpmn"), "--data", json.dumps({"employee": "Lu", "amount": 40}))
    assert small["status"] == "completed" and small["layers"]["L3"]["comment"] == "under the threshold"

    with serving(f"sqlite:///{tmp_path / 'rest.db'}", tmp_path) as url, \
            httpx.Client(base_url=url, headers=AUTH, timeout=60) as c:
        form = c.get("/api/processes/expense_claim").json()["start_form"]
        assert form["event_id"] == "claim_in"
        assert [(f["id"], f["required"], f["default"]) for f in form["fields"]] == [
            ("employee", True, None), ("amount", True, None), ("category", False, "travel")]
        bad = c.post("/api/instances", json={"process_id": "expense_claim", "data": {"amount": 0}})
        assert bad.status_code == 400, bad.text
        assert bad.json()["error"]["problems"] == [{"field": "employee", "problem": "is required and missing"},
                                                   {"field": "amount", "problem": "0 is below the minimum 1"}]
        started = c.post("/api/instances", json={"process_id": "expense_claim", "data": CLAIM})
        assert started.status_code == 201 and started.json()["status"] == "waiting"
        rid = started.json()["instance_id"]
        done = c.post(f"/api/instances/{rid}/user-tasks/manager_review", json={"data": REVIEW})
        assert done.status_code == 200, done.text
        by_rest = c.get(f"/api/instances/{rid}").json()

    store, stream = redis_store
    submitted = json.loads(cli("submit", str(HERE / "expense_claim.bpmn"), "--data", json.dumps(CLAIM),
                               "--store", store, "--stream", stream, "--json").stdout)
    (wid,) = submitted["instance_ids"]
    worker = _worker(store, stream)
    try:
        _until(Engine(store), wid, "waiting", worker)
    finally:
        worker.send_signal(signal.SIGTERM)
        worker.wait(timeout=30)
    by_worker = run_json(cli, "resume", wid, "--store", store, "--answer", "manager_review=" + json.dumps(REVIEW))

    assert _answers(by_rest) == _answers(by_cli)
    assert _answers(by_worker) == _answers(by_cli)


# ------------------------------------------------------------------ compression of what mappings wrote


def test_a_preserved_mapping_target_survives_the_cliff_and_rest_undoes_it(tmp_path: Path) -> None:
    """DESIGN: preserveKeys always survive unchanged; every compression takes a snapshot first and can be
    undone. The output parameter `invoice_tax` is preserved by its task; the cliff after `book` folds the
    rest of compute_tax's writes (its inputs included: writes like any other) and keeps `book` whole."""
    copied(tmp_path, "invoice_tax", "compute_tax:\n  preserveKeys: [invoice_tax]\nbook:\n  compressTokenThreshold: 40\n")
    with ServerThread(create_app(f"sqlite:///{tmp_path / 'c.db'}", tmp_path, TOKEN)) as server, \
            httpx.Client(base_url=server.url, headers=AUTH, timeout=60) as c:
        doc = c.post("/api/instances", json={"process_id": "invoice_tax", "data": INVOICE}).json()
        assert doc["status"] == "completed", doc["error"]
        (comp,) = doc["compressions"]
        assert comp["activity_id"] == "book" and "token_threshold" in comp["triggers"]
        assert comp["folded"] == ["net", "rate", "currency", "tax", "note", "activity:compute_tax"]
        history = doc["layers"]["L3"]
        assert history["invoice_tax"] == 100 and history["booked"] == {"number": "INV-1", "gross": 600}
        assert history["compaction:1"]["covers"] == ["activity:compute_tax"]
        assert not {"net", "rate", "currency", "tax", "note"} & set(history)
        iid = doc["instance_id"]
        judged = c.post(f"{GOV}/compress", json={"instance_id": iid, "action": "evaluate"}).json()
        assert judged["snapshot_id"] == comp["snapshot_id"] and judged["preserved_intact"] is True
        undone = c.post(f"{GOV}/compress", json={"instance_id": iid, "action": "decompress"})
        assert undone.status_code == 200, undone.text
        back = c.get(f"/api/instances/{iid}").json()["layers"]["L3"]
        assert data_keys(back) == {"net": 500, "rate": 20, "currency": "EUR", "tax": 100, "note": "tax of INV-1 in EUR",
                                   "invoice_tax": 100, "booked": {"number": "INV-1", "gross": 600}}


def test_a_due_confirmation_takes_a_late_answer_until_its_timeout_rule_ran(cli: Any) -> None:
    """README: a due confirmation nothing has timed out yet still takes a person's answer; once `--fire`
    applied the rule, a later answer is refused (exit 2, naming the join, the key and the timeout) and
    nothing of it is applied."""
    late = run_json(cli, "run", str(HERE / "region_check.bpmn"), "--data", json.dumps(ORDER), code=3)
    _due_listed(cli, late["instance_id"])
    answered = run_json(cli, "resume", late["instance_id"], "--answer", "fan_in/region_verdict=ok")
    assert answered["status"] == "completed" and answered["layers"]["L3"]["region_verdict"] == "ok"
    assert answered["confirmations"][0]["timed_out"] is False

    fired = run_json(cli, "run", str(HERE / "region_check.bpmn"), "--data", json.dumps(ORDER), code=3)
    _due_listed(cli, fired["instance_id"])
    assert cli("timers", "--fire").exit_code == 0
    after = cli("resume", fired["instance_id"], "--answer", "fan_in/region_verdict=ok")
    assert after.exit_code == 2, after.stderr
    assert "'fan_in'" in after.stderr and "'region_verdict'" in after.stderr and "settled by its timeout" in after.stderr
    assert run_json(cli, "inspect", fired["instance_id"])["layers"]["L3"]["region_verdict"] == "hold"


# ------------------------------------------------------------------ mappings per instance, on a person's task

LINES = {"lines": [{"price": 2, "qty": 3}, {"price": 5, "qty": 1}]}


def test_mappings_on_each_instance_and_around_a_persons_task(cli: Any) -> None:
    """README: each instance of a multi-instance activity maps its own input (`=line.price` from its own
    item), and its output item is collected; a user task's input parameter is in the context (and the
    waiting item's data) while it waits, its output parameter runs after the person's answer; a Camunda 7
    input naming a variable that is not set stops the run with an error naming the task and the mapping."""
    doc = run_json(cli, "run", str(HERE / "order_lines.bpmn"), "--data", json.dumps(LINES), code=3)
    assert data_keys(doc["layers"]["L3"])["subtotals"] == [6, 5]
    (item,) = doc["waiting_for"]
    assert item["task_id"] == "check" and item["data"] == {"to_check": [6, 5]}
    done = run_json(cli, "resume", doc["instance_id"], "--answer", "check=" + json.dumps({"reviewer": "ann"}), code=1)
    assert done["layers"]["L3"]["checked_by"] == "ann" and done["layers"]["L3"]["to_check"] == [6, 5]
    error = done["error"]
    assert error["task_id"] == "missing" and "camunda:inputParameter 'x' of 'missing'" in error["message"]
    assert "not set" in error["message"] and "nowhere" in error["message"]


@pytest.mark.parametrize(("name", "system", "element", "field"), [
    ("payment_wait", "currency", "invoice_sent", "zeebe:output"),     # a start event's output, as it fires
    ("payment_wait", "paid_amount", "payment_in", "zeebe:output"),    # a message catch event's
    ("region_check", "region_verdict", "eu_check", "zeebe:output"),   # a task's, after its work
])
def test_validate_names_each_mapping_into_a_system_key(cli: Any, tmp_path: Path, name: str, system: str,
                                                       element: str, field: str) -> None:
    path = copied(tmp_path, name, f"system:\n  {system}: fixed\n")
    checked = cli("validate", str(path))
    said = checked.stdout + checked.stderr
    assert checked.exit_code == 2, said
    line = next(x for x in said.splitlines() if f"'{element}'" in x and f"'{system}'" in x)
    assert field in line and "SYSTEM" in line and "name another target" in line, line


def test_validate_leaves_a_mapping_of_a_system_key_to_itself_alone(cli: Any, tmp_path: Path) -> None:
    """A zeebe:input of a variable to itself (`=amount` to amount) writes nothing: no refusal."""
    path = copied(tmp_path, "region_check", "system:\n  amount: 5\n")
    text = path.read_text(encoding="utf-8").replace('source="=order.total" target="amount"',
                                                    'source="=amount" target="amount"')
    path.write_text(text, encoding="utf-8")
    assert cli("validate", str(path)).exit_code == 0


def test_rest_refuses_the_message_whose_output_mapping_is_denied_with_403(tmp_path: Path) -> None:
    from fastapi.testclient import TestClient

    copied(tmp_path, "payment_wait")
    with TestClient(create_app(f"sqlite:///{tmp_path / 'r.db'}", tmp_path, TOKEN)) as c:
        doc = c.post("/api/instances", headers=AUTH, json={"process_id": "payment_wait",
                                                           "data": {**PAYMENT, "paid_amount": 0}}).json()
        iid = doc["instance_id"]
        sent = c.post(f"/api/instances/{iid}/events", headers=AUTH, json={"name": "payment_received", "payload": PAID})
        assert sent.status_code == 403, sent.text
        assert "'paid_amount'" in sent.json()["error"]["message"] and "zeebe:output" in sent.json()["error"]["message"]
        now = c.get(f"/api/instances/{iid}", headers=AUTH).json()
        assert now["status"] == "waiting" and now["layers"]["L3"] == doc["layers"]["L3"]
