"""A claims team runs its own process in production shape, from DESIGN.md and the README alone.

The process (tests/outsider_ops/ops_claims.bpmn and its .layerflow.yaml): a model pre-screen ->
intake (a person) -> a model classification (outputSchema, tools) -> an exclusive gateway decided
by natural-language conditions -> a parallel fraud review (model) and coverage calculation (script)
that both write ``payout`` -> a join whose conflict the model resolves, escalating to a person ->
settle (a compression cliff) -> an adjuster review with a timer boundary -> a message wait.

It runs the ways the README offers: a real ``layerflow serve`` on 127.0.0.1 with ``--model`` and
LAYERFLOW_MODEL_* pointing at an OpenAI-compatible stub (tests/outsider_ops/claims_stub.py), a
Redis store shared by the server, the CLI and ``layerflow worker`` processes (one killed with
SIGKILL mid-activity). The CLI runs in this process (click's runner) where the process boundary
is not the point. Never a real model provider.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import traceback
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

ROOT = Path(__file__).resolve().parent.parent
OPS = Path(__file__).resolve().parent / "outsider_ops"
sys.path.insert(0, str(OPS))

from claims_stub import ClaimsStub  # noqa: E402

REDIS_URL = os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0")
TOKEN = "ops-team-token"
BPMN = str(OPS / "ops_claims.bpmn")
DESIGN_FIELDS = {"instance_id", "process_id", "status", "error", "layers", "tokens", "conflicts",
                 "compressions", "confirmations", "waiting_for", "tape_length"}


def redis_or_skip() -> None:
    import redis

    try:
        redis.Redis.from_url(REDIS_URL, socket_connect_timeout=2).ping()
    except redis.RedisError as exc:
        if os.environ.get("LAYERFLOW_REQUIRE_REDIS") == "1":
            pytest.fail(f"no Redis answers on {REDIS_URL}: {exc}")
        pytest.skip(f"no Redis answers on {REDIS_URL}: {exc}")


@pytest.fixture(scope="module")
def stub() -> Iterator[ClaimsStub]:
    with ClaimsStub() as s:
        yield s


STREAMS: list[str] = []  # the worker streams the tests made (removed with the store)


def new_stream() -> str:
    STREAMS.append(f"opsaudit-{uuid.uuid4().hex[:8]}:ready")
    return STREAMS[-1]


@pytest.fixture(scope="module")
def redis_store() -> Iterator[str]:
    redis_or_skip()
    import redis

    prefix = f"opsaudit-{uuid.uuid4().hex[:10]}"
    sep = "&" if "?" in REDIS_URL else "?"
    yield f"{REDIS_URL}{sep}prefix={prefix}"
    client = redis.Redis.from_url(REDIS_URL)
    keys = list(client.scan_iter(match=f"{prefix}*", count=1000))
    keys += [k for s in STREAMS for k in (s, f"{s}:dead") if client.exists(k)]
    if keys:
        client.delete(*keys)
    client.close()


def model_env(stub: ClaimsStub) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "LAYERFLOW_STORE"}
    env.update(PYTHONPATH=str(ROOT), LAYERFLOW_MODEL_API_BASE=stub.url, LAYERFLOW_MODEL_API_KEY="test",
               LAYERFLOW_RETRY_BASE_DELAY="0", LAYERFLOW_API_TOKEN=TOKEN)
    return env


def cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """``layerflow ARGS`` in this process (click's runner; stdin is no terminal)."""
    from click.testing import CliRunner

    from engine.cli import main

    with contextlib.chdir(ROOT):
        result = CliRunner(env={"LAYERFLOW_STORE": None, **(env or {})}).invoke(
            main, list(args), input="", prog_name="layerflow")
    stderr = result.stderr
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        stderr += "".join(traceback.format_exception(result.exception))
    return subprocess.CompletedProcess(["layerflow", *args], result.exit_code, result.stdout, stderr)


def cli_json(*args: str, env: dict[str, str] | None = None) -> tuple[int, dict[str, Any], str]:
    done = cli(*args, "--json", env=env)
    assert done.stdout.strip(), f"no JSON on stdout; stderr: {done.stderr}"
    return done.returncode, json.loads(done.stdout), done.stderr


def start_serve(args: list[str], env: dict[str, str]) -> tuple[subprocess.Popen[str], list[str]]:
    process = subprocess.Popen([sys.executable, "-m", "engine.cli", "serve", *args], env=env, cwd=ROOT,
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    return process, []


def wait_listening(process: subprocess.Popen[str]) -> tuple[str, list[str]]:
    """The URL ``serve`` announces, once uvicorn listens (stderr read line by line)."""
    assert process.stderr is not None
    seen: list[str] = []
    url = None
    for line in process.stderr:
        seen.append(line)
        found = re.search(r"serving .* on (http://\S+)", line)
        if found:
            url = found.group(1)
        if "Application startup complete" in line:
            break
    else:
        raise AssertionError("serve ended: " + "".join(seen))
    assert url is not None, "".join(seen)
    return url, seen


@pytest.fixture(scope="module")
def server(stub: ClaimsStub, redis_store: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[httpx.Client]:
    catalog = tmp_path_factory.mktemp("catalog")
    for f in OPS.glob("ops_*"):
        shutil.copy(f, catalog / f.name)
    process, _ = start_serve(["--host", "127.0.0.1", "--port", "0", "--catalog", str(catalog),
                              "--store", redis_store, "--model", "openai/stub", "--log-level", "info"],
                             model_env(stub))
    try:
        url, _ = wait_listening(process)
        with httpx.Client(base_url=url, timeout=60, headers={"Authorization": f"Bearer {TOKEN}"}) as client:
            yield client
    finally:
        process.terminate()
        process.wait(timeout=30)


# --------------------------------------------------------------------------- serve


def test_serve_port_zero_announces_the_port_it_listens_on(server: httpx.Client) -> None:
    # before: "serving ... on http://127.0.0.1:0": nobody could find the server
    assert not str(server.base_url).endswith(":0/") and not str(server.base_url).endswith(":0")
    response = server.get("/api/processes")
    assert response.status_code == 200
    assert [p["id"] for p in response.json()] == ["ops_claims"]


def test_serve_on_a_port_in_use_is_bad_input_naming_the_port(stub: ClaimsStub, tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        process = subprocess.run(
            [sys.executable, "-m", "engine.cli", "serve", "--port", str(port), "--catalog", str(OPS),
             "--store", f"sqlite:///{tmp_path / 'x.db'}", "--log-level", "warning"],
            env=model_env(stub), cwd=ROOT, capture_output=True, text=True, timeout=60)
    # before: "serving ... on http://127.0.0.1:PORT", uvicorn's traceback-less error, exit 3 ("waiting")
    assert process.returncode == 2, process.stderr
    assert f"127.0.0.1:{port}" in process.stderr and "in use" in process.stderr
    assert "serving" not in process.stderr


# --------------------------------------------------------------------------- the CLI


def test_validate_accepts_the_process() -> None:
    done = cli("validate", BPMN)
    assert done.returncode == 0, done.stderr + done.stdout


def test_cli_offline_run_document_and_answers(tmp_path: Path) -> None:
    store = f"sqlite:///{tmp_path / 'ops.db'}"
    code, doc, _ = cli_json("run", BPMN, "--data", '{"claim_no": "C-1", "claimed": 7300}', "--store", store)
    assert code == 3 and DESIGN_FIELDS <= set(doc)
    assert [w["task_id"] for w in doc["waiting_for"]] == ["intake"]
    assert doc["layers"]["L3"]["priority"] == "normal"          # the offline handler, no model
    iid = doc["instance_id"]
    code, doc, _ = cli_json("resume", iid, "--store", store, "--answer",
                            'intake={"incident": "pipe burst", "photos": 2}')
    assert code == 3
    assert [{k: v for k, v in w.items() if k != "due"} for w in doc["waiting_for"]] == [{"kind": "confirmation", "id": "checks_join/payout", "task_id": "checks_join",
                                   "key": "payout", "context": "main"}]
    (conflict,) = doc["conflicts"]
    assert conflict["values"] == {"fraud_review": 4200, "coverage_calc": 5000} and conflict["resolution"] is None
    code, doc, _ = cli_json("resume", iid, "--store", store, "--answer", "checks_join/payout=5000")
    assert code == 3 and doc["conflicts"][0]["resolution"]["resolver"] == "human"
    (compression,) = doc["compressions"]
    assert compression["activity_id"] == "settle" and "token_threshold" in compression["triggers"]
    assert compression["tokens_after"] < compression["tokens_before"]
    assert {w["kind"] for w in doc["waiting_for"]} == {"user_task", "timer"}
    # a joined branch's context, rebuilt from its tape alone, is the one stored
    seqs = re.findall(r"^main/fraud_review@\d+#(\d+)\t", cli("tape", iid, "--store", store).stdout, re.MULTILINE)
    code, branch, _ = cli_json("inspect", iid, "--context", "fraud_review", "--store", store)
    code2, replayed, _ = cli_json("replay", iid, "--context", "fraud_review", "--until", seqs[-1], "--store", store)
    assert code == code2 == 0 and json.dumps(replayed["layers"]) == json.dumps(branch["layers"])
    assert branch["layers"]["L3"]["payout"] == 4200


# --------------------------------------------------------------------------- REST + Redis + model


def test_rest_claim_with_model_timer_and_message(server: httpx.Client, stub: ClaimsStub, redis_store: str) -> None:
    response = server.post("/api/instances", json={"process_id": "ops_claims",
                                                   "data": {"claim_no": "C-10", "claimed": 7300}})
    assert response.status_code in (200, 201), response.text
    doc = response.json()
    iid, version = doc["instance_id"], doc["version"]
    assert doc["layers"]["L3"]["priority"] == "urgent"           # the model pre-screened it
    url = f"/api/instances/{iid}/user-tasks/intake"
    stale = server.post(url, json={"data": {"incident": "x"}, "expected_version": version - 1})
    assert stale.status_code == 409 and stale.json()["error"]["kind"] == "version_conflict"
    denied = server.post(url, json={"data": {"incident": "x", "claimed": 1}})
    assert denied.status_code == 403 and denied.json()["error"]["key"] == "claimed"
    after = server.get(f"/api/instances/{iid}").json()   # the refusal is on the tape, nothing else changed
    assert after["waiting_for"][0]["task_id"] == "intake" and "claimed" not in after["layers"]["L3"]
    assert after["layers"]["L1"]["claimed"] == 7300
    done = server.post(url, json={"data": {"incident": "flooded basement", "photos": 4},
                                  "expected_version": after["version"]})
    assert done.status_code == 200, done.text
    doc = done.json()
    assert doc["layers"]["L3"]["category"] == "water" and doc["layers"]["L3"]["severity"] == "high"
    (confirmation,) = [c for c in doc["confirmations"] if not c["answered"]]
    assert confirmation["suggested"] == 4200 and confirmation["suggested_by"] == "model"
    answer_url = "/api/confirmations/checks_join%2Fpayout"
    wrong = server.post(answer_url, json={"value": 777, "instance_id": iid})
    assert wrong.status_code == 400 and "777" in wrong.json()["error"]["message"]
    answered = server.post(answer_url, json={"value": 4200, "instance_id": iid})
    assert answered.status_code == 200, answered.text
    again = server.post(answer_url, json={"value": 5000, "instance_id": iid})
    assert again.status_code == 409 and again.json()["error"]["kind"] == "already_answered"
    doc = server.get(f"/api/instances/{iid}").json()
    assert doc["layers"]["L3"]["payout"] == 4200
    (timer,) = [w for w in doc["waiting_for"] if w["kind"] == "timer"]
    # the timer: `layerflow timers --fire` on the server's store, once it is due
    while cli_json("timers", "--store", redis_store)[1]["due"] == []:
        time.sleep(0.2)
    code, fired, _ = cli_json("timers", "--fire", "--store", redis_store)
    assert code == 0 and [f["instance_id"] for f in fired["fired"]] == [iid]
    doc = server.get(f"/api/instances/{iid}").json()
    assert doc["layers"]["L3"]["review_outcome"] == "auto-approved after deadline"
    (event,) = doc["waiting_for"]
    assert event["event"] == "payment_confirmed"
    # the message, by the CLI against the same store
    bad = cli("send", iid, "payment_done", "--json-payload", '{"ref": "P1"}', "--store", redis_store)
    assert bad.returncode == 2 and "payment_confirmed" in bad.stderr
    code, doc, _ = cli_json("send", iid, "payment_confirmed", "--json-payload", '{"ref": "P-77"}',
                            "--store", redis_store)
    assert code == 0 and doc["status"] == "completed"
    assert doc["layers"]["L3"]["status"] == "closed C-10 ref P-77"
    # inspect / tape / replay / rollback on the redis store
    code, inspected, _ = cli_json("inspect", iid, "--store", redis_store)
    assert code == 0 and inspected["status"] == "completed"
    tape = cli("tape", iid, "--kind", "conflict", "--store", redis_store)
    assert tape.returncode == 0 and "payout" in tape.stdout
    last = max(int(m) for m in re.findall(r"^main#(\d+)\t", cli("tape", iid, "--store", redis_store).stdout,
                                           re.MULTILINE))
    code, replayed, _ = cli_json("replay", iid, "--until", str(last), "--store", redis_store)
    assert code == 0 and json.dumps(replayed["layers"]) == json.dumps(inspected["layers"])
    snap = cli("snapshot", iid, "--store", redis_store).stdout.strip()
    rolled = cli("rollback", iid, "--snapshot", snap, "--layers", "L3", "--store", redis_store)
    assert rolled.returncode == 0, rolled.stderr


def test_rest_model_asks_a_person_through_human_confirm(server: httpx.Client, stub: ClaimsStub) -> None:
    doc = server.post("/api/instances", json={"process_id": "ops_claims",
                                              "data": {"claim_no": "ASK-1", "claimed": 7300}}).json()
    iid = doc["instance_id"]
    done = server.post(f"/api/instances/{iid}/user-tasks/intake", json={"data": {"incident": "wet floor"}})
    assert done.status_code == 200, done.text
    (waiting,) = done.json()["waiting_for"]
    assert waiting["kind"] == "confirmation" and waiting["task_id"] == "classify"
    listed = [c for c in server.get("/api/confirmations").json() if c.get("instance_id", iid) == iid
              and c["id"] == waiting["id"]]
    assert listed and listed[0]["message"] == "Is the water damage from a burst pipe?"
    answered = server.post(f"/api/confirmations/{waiting['id']}", json={"value": "yes", "instance_id": iid})
    assert answered.status_code == 200, answered.text
    doc = answered.json()
    assert doc["layers"]["L3"]["category"] == "water"
    assert [w["id"] for w in doc["waiting_for"]] == ["checks_join/payout"]
    tool_answer = [m for r in stub.requests if "ASK-1" in json.dumps(r) for m in r["messages"] if m["role"] == "tool"]
    assert tool_answer and json.loads(tool_answer[-1]["content"])["answer"] == "yes"


def test_workers_take_over_an_instance_whose_worker_was_killed(stub: ClaimsStub, redis_store: str) -> None:
    stream = new_stream()
    env = model_env(stub)
    code, submitted, _ = cli_json("submit", BPMN, "--data", '{"claim_no": "SLOW-1", "claimed": 7300}',
                                  "--store", redis_store, "--stream", stream)
    assert code == 0
    (iid,) = submitted["instance_ids"]
    asked = len(stub.requests)
    worker = [sys.executable, "-m", "engine.cli", "worker", "--store", redis_store, "--stream", stream,
              "--model", "openai/stub", "--idle-ms", "300", "--timer-interval", "0"]
    first = subprocess.Popen([*worker, "--consumer", "first"], env=env, cwd=ROOT,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        while not any("SLOW-1" in json.dumps(r) for r in stub.requests[asked:]):  # mid-activity
            assert first.poll() is None, "the first worker ended"
            time.sleep(0.05)
    finally:
        first.send_signal(signal.SIGKILL)
        first.wait(timeout=30)
    second = subprocess.run([*worker, "--consumer", "second", "--stop-after", "1", "--json"], env=env, cwd=ROOT,
                            capture_output=True, text=True, timeout=120)
    assert second.returncode == 0, second.stderr
    assert json.loads(second.stdout)["statuses"] == {"waiting": 1}
    code, doc, _ = cli_json("inspect", iid, "--store", redis_store)
    assert doc["layers"]["L3"]["priority"] == "urgent"
    assert [w["task_id"] for w in doc["waiting_for"]] == ["intake"]
    tape = cli("tape", iid, "--store", redis_store, "--activity", "prescreen").stdout
    assert len(re.findall(r"\tcomplete\t", tape)) == 1, tape


def test_model_fallbacks_when_the_model_fails_at_the_gateway_and_join(tmp_path: Path) -> None:
    with ClaimsStub(fail_on=("You route a business process", "You resolve a conflict")) as failing:
        code, doc, stderr = cli_json(
            "run", BPMN, "--data", '{"claim_no": "C-3", "claimed": 7300}', "--answer",
            'intake={"incident": "pipe burst", "photos": 2}', "--model", "openai/stub",
            "--store", f"sqlite:///{tmp_path / 'f.db'}", env=model_env(failing))
    assert code == 3, stderr
    fallbacks = {(f["element_id"], f["purpose"]) for f in doc["model_fallbacks"]}
    assert ("route", "condition") in fallbacks, doc["model_fallbacks"]
    # before: the join's conflict went to a person as if the model had never been asked
    (join,) = [f for f in doc["model_fallbacks"] if f["element_id"] == "checks_join"]
    assert join["purpose"] == "conflict_resolution" and join["key"] == "payout" and join["fallback"] == "human"
    assert all("stub is down" in (f["error"] or "") for f in doc["model_fallbacks"])
    # before: "...; without --model the activity's offline handler runs instead" on a gateway and a join
    assert not any("offline handler" in f["error"] for f in doc["model_fallbacks"]), doc["model_fallbacks"]
    plain = cli("inspect", doc["instance_id"], "--store", f"sqlite:///{tmp_path / 'f.db'}")
    summary = cli("resume", doc["instance_id"], "--store", f"sqlite:///{tmp_path / 'f.db'}")
    assert summary.returncode == 3, summary.stderr
    assert "model fallback at checks_join (conflict_resolution): a person is asked" in summary.stdout + summary.stderr
    assert plain.returncode == 0


def test_worker_log_says_why_an_instance_failed(redis_store: str, stub: ClaimsStub, tmp_path: Path) -> None:
    """A worker on another machine, where the process's handler file is not: the instance stops
    in error, and the worker's log says why and what to do (before: only "...: error")."""
    moved = tmp_path / "moved"
    moved.mkdir()
    for f in OPS.glob("ops_*"):
        shutil.copy(f, moved / f.name)
    stream = new_stream()
    code, submitted, _ = cli_json("submit", str(moved / "ops_claims.bpmn"), "--data",
                                  '{"claim_no": "M-1", "claimed": 10}', "--store", redis_store, "--stream", stream)
    assert code == 0
    (iid,) = submitted["instance_ids"]
    (moved / "ops_handlers.py").unlink()
    env = model_env(stub)
    done = subprocess.run([sys.executable, "-m", "engine.cli", "worker", "--store", redis_store, "--stream", stream,
                           "--stop-after", "1", "--timer-interval", "0"], env=env, cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert f"instance {iid} (ops_claims): error" in done.stderr
    assert "ops_handlers.py not found" in done.stderr and "at prescreen" in done.stderr
    assert f"layerflow resume {iid}" in done.stderr


def test_serve_help_names_the_redis_store() -> None:
    # before: "--store URL  memory://, sqlite:///FILE": a team with workers on Redis read that serve cannot share it
    done = cli("serve", "--help")
    assert done.returncode == 0 and "redis://HOST:PORT/DB" in done.stdout


def test_timers_fire_from_cron_exits_1_when_a_fired_instance_fails(tmp_path: Path) -> None:
    """`layerflow timers --fire` runs from cron: a timer whose path fails must not look like
    success (before: "ID  -> error", exit 0, no word of what failed)."""
    store = f"sqlite:///{tmp_path / 'cron.db'}"
    code, doc, _ = cli_json("run", str(OPS / "overdue_escalation.bpmn"), "--data", '{"claim_no": "T-1"}',
                            "--store", store)
    assert code == 3
    while cli_json("timers", "--store", store)[1]["due"] == []:
        time.sleep(0.1)
    fired = cli("timers", "--fire", "--store", store)
    assert fired.returncode == 1, fired.stdout + fired.stderr
    assert f"{doc['instance_id']}  -> error" in fired.stdout
    assert "escalate" in fired.stdout and "on_call" in fired.stdout
    assert f"layerflow resume {doc['instance_id']}" in fired.stdout + fired.stderr
    code, again, _ = cli_json("timers", "--fire", "--store", store)   # nothing due any more: nothing failed now
    assert code == 0 and again["fired"] == []
    code, inspected, _ = cli_json("inspect", doc["instance_id"], "--store", store)
    assert inspected["status"] == "error" and inspected["error"]["task_id"] == "escalate"


def test_timers_fire_json_names_the_error_of_a_fired_instance(tmp_path: Path) -> None:
    store = f"sqlite:///{tmp_path / 'cron.db'}"
    code, doc, _ = cli_json("run", str(OPS / "overdue_escalation.bpmn"), "--data", '{"claim_no": "T-2"}',
                            "--store", store)
    while cli_json("timers", "--store", store)[1]["due"] == []:
        time.sleep(0.1)
    code, fired, _ = cli_json("timers", "--fire", "--store", store)
    assert code == 1
    (item,) = fired["fired"]
    assert item["status"] == "error" and item["error"]["task_id"] == "escalate"
