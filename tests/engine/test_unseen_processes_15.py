"""Unseen processes, round 15: an IT change request (tests/engine/unseen15/change_request.bpmn) and a
data subject access request (data_access_request.bpmn), written by an outsider who read DESIGN.md and
the README only. Every expectation below was written down from those two before anything ran.

change_request: a model step rates the change (offline: a handler; knowledge from
`knowledge/change_policy/`); an inclusive gateway runs the reviews the change needs (security for a
production change, DBA for a migration; the peer review is its default, taken only when neither
holds) into an inclusive join whose `union` reducer merges `reviewed_by`; the change advisory board
votes in three parallel branches that disagree: `risk_level` is settled by a policy rule, `window` by
a policy ranking and `go_decision` by a person (`human_confirm`, one hour, default `no_go`); a go
waits for the implementer's report (a user task), a no-go rejects the change; the post-implementation
review writes a long report whose token threshold folds the older history, never a preserved key. A
non-interrupting timer event sub-process reminds the board after 30 minutes.

grant_review: the panels a grant application needs review it side by side (an inclusive gateway:
the finance panel, people, for a large budget; the ethics review for human subjects; the science
review, its default, otherwise); the ethics review's token threshold folds the screening notes in
its branch; the panels' scores meet at the inclusive join, where a policy rule with `confirm: true`
suggests the finance panel's and a person confirms it; the applicant may send an update at any time
(a non-interrupting message event sub-process).

data_access_request: a privacy officer verifies the requester (a Camunda form); three systems are
searched in parallel (reducers `sum`, `union`, `max`: no question); an inclusive gateway runs the
requested actions, and a legal hold (WORKING, by `data_layers`; counsel injects it) stops the
erasure. It runs behind `layerflow serve --port 0` on a Redis store."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from context_layers import Layer, LayeredContext
from engine import Engine, load_process
from engine.api import create_app

import test_unseen_processes_4
from engine_helpers import cli_in_a_tmp_store, redis_scratch, run_json
from test_unseen_processes import _check_document
from test_unseen_processes_13 import Clock, data_of  # a clock of the test's own; a layer's data keys, no records

HERE = Path(__file__).resolve().parent / "unseen15"
ROOT = Path(__file__).resolve().parents[2]
CHANGE = HERE / "change_request.bpmn"
DSAR = HERE / "data_access_request.bpmn"
GRANT = HERE / "grant_review.bpmn"
APPLICATION = {"application_id": "GR-9", "budget": 250000, "human_subjects": True}
REDIS = os.environ.get("LAYERFLOW_TEST_REDIS_UNSEEN15", "redis://127.0.0.1:6379/10")  # this module's own database
fake_model = test_unseen_processes_4.fake_model  # the deterministic fake model's fixture, shared
cli = cli_in_a_tmp_store  # the in-process CLI's fixture, shared

REQUEST = {"change_id": "CHG-2001", "title": "PG16 upgrade", "systems": ["payments-db"], "touches_prod": True,
           "has_migration": True}
PRESERVED = {"risk_score", "risk_level", "go_decision", "outcome"}


# ------------------------------------------------------------------ the CLI, step by step


def test_the_change_goes_through_reviews_board_and_implementation_step_by_step(cli: Any, tmp_path: Path) -> None:
    """run (3: the board's question and the reminder wait) -> the answer (3: the implementer) -> the
    report (0: the review, its compression). Then the tape, a replay before the compression, and a
    rollback to the compression's snapshot, all through the CLI."""
    store = f"sqlite:///{tmp_path / 'cr.db'}"
    doc = run_json(cli, "run", str(CHANGE), "--data", json.dumps(REQUEST), "--store", store, code=3)
    _check_document(doc, 3, "change_request")
    iid = doc["instance_id"]
    layers = doc["layers"]
    assert layers["L0"] == {"policy": "High risk production changes need a security review and a go of the "
                                      "change advisory board."}
    assert layers["L1"] == REQUEST
    hits = {k: v for k, v in layers["L2"].items()}
    assert hits and all(k.startswith("kb:change_policy/cab_rules.md#") for k in hits)
    assert all(h["source"].startswith("change_policy/") and 0 < h["confidence"] <= 1 for h in hits.values())
    # the model step's writes and the inclusive join's: security and DBA ran, the default (peer) did not
    assert data_of(layers["L3"]) == {
        "risk_score": 62, "impact_notes": layers["L3"]["impact_notes"], "reviewed_by": ["model", "sec", "dba"],
        "security_findings": "no secrets in the diff, TLS unchanged", "rollback_plan": "restore from the 02:00 snapshot"}
    assert "activity:peer_review" not in layers["L3"]
    # the board's join waits for a person: nothing of the votes is in the main context yet
    assert not {"risk_level", "go_decision", "window", "business_owner"} & set(layers["L3"])
    conflicts = {c["key"]: c for c in doc["conflicts"]}
    assert conflicts == {
        "go_decision": {"context": "main", "gateway_id": "cab_join", "layer": "L4", "key": "go_decision", "base_value": None,
                        "base_absent": True, "values": {"ops_vote": "go", "security_vote": "no_go"},
                        "resolution": None},
        "risk_level": {"context": "main", "gateway_id": "cab_join", "layer": "L4", "key": "risk_level", "base_value": None,
                       "base_absent": True, "values": {"ops_vote": "medium", "security_vote": "high"},
                       "resolution": {"value": "high", "resolver": "policy",
                                      "reason": "a risk score of 50 or more is high risk"}},
        "window": {"context": "main", "gateway_id": "cab_join", "layer": "L4", "key": "window", "base_value": None, "base_absent": True,
                   "values": {"ops_vote": "sat 02:00", "business_vote": "sun 02:00"},
                   "resolution": {"value": "sun 02:00", "resolver": "policy",
                                  "reason": conflicts["window"]["resolution"]["reason"]}}}
    [asked] = doc["confirmations"]
    assert (asked["id"], asked["answer"], asked["timed_out"], asked["default"]) == ("cab_join/go_decision", None,
                                                                                     False, "no_go")
    assert [o["value"] for o in asked["options"]] == ["go", "no_go", "$escalate"]
    assert [(w["kind"], w["task_id"]) for w in doc["waiting_for"]] == [("confirmation", "cab_join"),
                                                                       ("timer", "reminder_due")]
    assert doc["waiting_for"][0]["id"] == "cab_join/go_decision"

    doc = run_json(cli, "resume", iid, "--answer", "cab_join/go_decision=go", "--store", store, code=3)
    assert [(w["kind"], w["task_id"]) for w in doc["waiting_for"]] == [("user_task", "implement_change"),
                                                                       ("timer", "reminder_due")]
    assert doc["waiting_for"][0]["documentation"] == "Run the change in its window and report the outcome."
    merged = data_of(doc["layers"]["L3"])
    assert (merged["risk_level"], merged["go_decision"], merged["window"], merged["business_owner"]) == (
        "high", "go", "sun 02:00", "payments")
    log = {c["key"]: c["resolution"]["resolver"] for c in doc["layers"]["L4"]["_mergedConflicts"]}
    assert log == {"go_decision": "human", "risk_level": "policy", "window": "policy"}

    doc = run_json(cli, "resume", iid, "--answer", 'implement_change={"outcome": "success"}', "--store", store)
    _check_document(doc, 0, "change_request")
    history = doc["layers"]["L3"]
    assert history["change_status"] == "closed:success" and history["pir_report"].startswith("Finding 1: the sun")
    # the event sub-process's timer never came: cancelled with its scope, nothing of it merged
    assert "cab_reminded" not in history and "activity:remind_board" not in history
    [c] = doc["compressions"]
    assert (c["activity_id"], c["context"], c["triggers"][0]) == ("post_review", "main", "token_threshold")
    assert c["tokens_before"] > 300 and c["tokens_after"] < c["tokens_before"]
    assert c["snapshot_id"].startswith("snap:") and "impact_notes" in c["folded"]
    assert not PRESERVED & set(c["folded"]) and "pir_report" not in c["folded"]   # post_review is kept whole
    assert {k: history[k] for k in PRESERVED} == {"risk_score": 62, "risk_level": "high", "go_decision": "go",
                                                  "outcome": "success"}
    assert [m["key"] for m in history["_mergedConflicts"]] == ["go_decision", "risk_level", "window"]

    # the tape: both splits and joins, three conflicts, their resolutions, one person, one compression
    result = cli("tape", iid, "--store", store, "--json")
    tape = json.loads(result.stdout)
    notes = [e.get("data", {}).get("note") for e in tape if e["context"] == "main"]
    assert notes.count("split") == 3 and notes.count("conflict") == 3     # review_routing, cab_split, go_gateway
    assert notes.count("human_decision") == 1
    kinds = json.loads(cli("tape", iid, "--kind", "conflict", "--store", store, "--json").stdout)
    assert sorted(e["data"]["key"] for e in kinds) == ["go_decision", "risk_level", "window"]
    [folding] = json.loads(cli("tape", iid, "--kind", "compression", "--store", store, "--json").stdout)
    assert (folding["seq"], folding["actor"]) == (c["event_seq"], "post_review")

    before = run_json(cli, "replay", iid, "--until", str(c["event_seq"] - 1), "--store", store)
    assert set(c["folded"]) <= set(before["layers"]["L3"]) and "compaction:1" not in before["layers"]["L3"]
    now = run_json(cli, "replay", iid, "--store", store)
    assert now["layers"] == doc["layers"]

    rolled = cli("rollback", iid, "--snapshot", c["snapshot_id"], "--store", store, "--json")
    assert rolled.exit_code == 0, rolled.stderr
    after = run_json(cli, "inspect", iid, "--store", store)
    assert after["tape_length"] > doc["tape_length"] and "compaction:1" not in after["layers"]["L3"]
    assert after["layers"]["L3"]["impact_notes"] == before["layers"]["L3"]["impact_notes"]
    main = Engine(store).load(iid).main
    assert LayeredContext.replay(main.tape) == main


@pytest.mark.parametrize("answer, status, implemented", [("go", "closed:success", True), ("no_go", "rejected", False)])
def test_answers_given_in_advance_run_the_change_to_its_end_on_redis(cli: Any, answer: str, status: str,
                                                                     implemented: bool, tmp_path: Path) -> None:
    """`--answers FILE` keyed as DESIGN says (`GATEWAY/KEY` for the join's question, the user task's
    BPMN id) answers both people in one run, on a Redis store with a prefix of this test's own."""
    answers = tmp_path / "answers.json"
    answers.write_text(json.dumps({"user_tasks": {"implement_change": {"outcome": "success"}},
                                   "confirmations": {"cab_join/go_decision": answer}}))
    with redis_scratch(REDIS, "unseen15") as prefix:
        store = f"{REDIS}?prefix={prefix}"
        doc = run_json(cli, "run", str(CHANGE), "--data", json.dumps(REQUEST), "--answers", str(answers),
                       "--store", store)
        _check_document(doc, 0, "change_request")
        history = doc["layers"]["L3"]
        assert history["change_status"] == status and history["go_decision"] == answer
        assert ("activity:implement_change" in history or "activity:implement_change" in json.dumps(
            history.get("compaction:1", {}))) is implemented
        [asked] = doc["confirmations"]
        assert (asked["answer"], asked["timed_out"]) == (answer, False)
        again = run_json(cli, "inspect", doc["instance_id"], "--store", store)
        assert again["layers"] == doc["layers"] and again["status"] == "completed"


# ------------------------------------------------------------------ the clock: the reminder, then the timeout


def test_nobody_answers_the_board_is_reminded_then_the_default_rejects(tmp_path: Path) -> None:
    """The reminder fires at 30 minutes (its timer leaves `waiting_for`), the board's question times out
    at one hour on its default `no_go` (`timed_out`), the change is rejected, and what the reminder
    wrote is merged back into the main context."""
    clock = Clock(float(int(time.time())))
    engine = Engine(f"sqlite:///{tmp_path / 'clock.db'}", clock=clock)
    waiting = engine.run(load_process(CHANGE), REQUEST)
    due = {w["task_id"]: w["due"] for w in waiting.waiting_for}
    assert due == {"cab_join": time.strftime("%Y-%m-%dT%H:%M:%S+00:00", time.gmtime(clock.now + 3600)),
                   "reminder_due": time.strftime("%Y-%m-%dT%H:%M:%S+00:00", time.gmtime(clock.now + 1800))}
    clock.now += 1799
    assert len(engine.run(engine.load(waiting.id)).waiting_for) == 2
    clock.now += 1
    reminded = engine.run(engine.load(waiting.id))
    assert [w["id"] for w in reminded.waiting_for] == ["cab_join/go_decision"]
    # README: it ran in a context of its own, merged back once the board's branches have joined
    assert "cab_reminded" not in reminded.main.layer(Layer.HISTORY)
    assert [name for name, ctx in reminded.contexts.items() if ctx.get("cab_reminded", False)] == [
        name for name, info in reminded.branches.items() if info.get("branch_id") == "reminder_due"]
    clock.now += 1800
    done = engine.run(engine.load(waiting.id))
    assert done.status == "completed", done.error
    doc = done.to_document()
    assert [(c["id"], c["answer"], c["timed_out"]) for c in doc["confirmations"]] == [
        ("cab_join/go_decision", "no_go", True)]
    history = done.main.layer(Layer.HISTORY)
    assert (history["change_status"], history["go_decision"], history["cab_reminded"]) == ("rejected", "no_go", True)
    assert "activity:implement_change" not in history
    assert LayeredContext.replay(done.main.tape) == done.main


# ------------------------------------------------------------------ the model: the step and the board's conflicts


def _model_answer(request: dict[str, Any]) -> str:
    text = "\n".join(m["content"] for m in request["messages"])
    if '"final_value"' in text:
        body = json.loads(text[text.index("\n{", text.index("Resolve this conflict")) + 1:])
        return json.dumps({"final_value": {"risk_level": "high", "go_decision": "no_go"}[body["key"]],
                           "rationale": "security outranks operations", "escalate": False})
    return json.dumps({"risk_score": 45, "impact_notes": "a short outage of the payments database",
                       "reviewed_by": ["model"]})


def test_with_a_model_the_step_answers_and_the_model_settles_what_the_policy_leaves_open(cli: Any,
                                                                                        fake_model: Any) -> None:
    """`--model`: the `llm:` block is called, not the offline handler; with a risk score under 50 the
    rule for `risk_level` does not hold, so the model settles it and `go_decision` (DESIGN: policy,
    then the model, then a person); `window` keeps its policy ranking. No person is asked."""
    model = fake_model(_model_answer)
    request = {**REQUEST, "has_migration": False}
    doc = run_json(cli, "run", str(CHANGE), "--data", json.dumps(request), "--model", "fake/model",
                   "--store", "memory://")
    assert doc["status"] == "completed" and doc["confirmations"] == [] and doc["model_fallbacks"] == []
    resolvers = {c["key"]: (c["resolution"]["resolver"], c["resolution"]["value"]) for c in doc["conflicts"]}
    assert resolvers == {"go_decision": ("model", "no_go"), "risk_level": ("model", "high"),
                         "window": ("policy", "sun 02:00")}
    history = doc["layers"]["L3"]
    assert (history["risk_score"], history["impact_notes"], history["change_status"]) == (
        45, "a short outage of the payments database", "rejected")
    assert history["reviewed_by"] == ["model", "sec"]
    first, *asked = model.requests
    assert "CHG-2001" in first["messages"][0]["content"] and "kb:change_policy" in first["messages"][1]["content"]
    assert len(asked) == 2


def test_the_conflict_prompt_says_the_key_was_not_set_before_the_split(cli: Any, fake_model: Any) -> None:
    """DESIGN: the conflict prompt gives the model the key's base value. `go_decision` was not set
    before the board split; the person's question says so ("not set before the split"), `run --json`
    says `base_value: null, base_absent: true`, but the model was shown `{"$deleted": true}`, the
    very value its instructions use to delete a key: as if a branch had deleted it before."""
    model = fake_model(_model_answer)
    run_json(cli, "run", str(CHANGE), "--data", json.dumps(REQUEST), "--model", "fake/model", "--store", "memory://")
    bodies = []
    for request in model.requests[1:]:
        user = request["messages"][1]["content"]
        bodies.append(json.loads(user[user.index("\n") + 1:]))
    assert [b["key"] for b in bodies] == ["go_decision", "risk_level"]   # the model's score, 45: no rule holds
    for body in bodies:
        assert body["base_value"] is None and body["base_absent"] is True
        assert "$deleted" not in json.dumps(body)


# ------------------------------------------------------------------ an operator changes a vote the board is asked about


def _branch(instance: Any, branch_id: str) -> str:
    """The name of the context of branch ``branch_id`` (``main/ops_vote@14``)."""
    [name] = [n for n, info in instance.branches.items() if info["branch_id"] == branch_id]
    return name


def _waiting_board(tmp_path: Path) -> tuple[Engine, str]:
    engine = Engine(f"sqlite:///{tmp_path / 'board.db'}")
    waiting = engine.run(load_process(CHANGE), REQUEST)
    assert [w["kind"] for w in waiting.waiting_for] == ["confirmation", "timer"]
    return engine, waiting.id


@pytest.mark.parametrize("value", ["no_go", "hold"])
def test_a_vote_a_person_is_asked_about_cannot_be_changed_under_the_question(tmp_path: Path, value: str) -> None:
    """README: before a join, change a branch's context (`context`: its id). But a key the join already
    asks a person about (`cab_join/go_decision`, offered "go" and "no_go") changed in a branch left the
    question stale: the person's "go" was then applied to a conflict between "hold" and "no_go" (reason
    "a person chose "go" (from ops_vote)", which no branch held any more), or silently dropped when the
    branches came to agree, the instance completed and the answer recorded as given. The change is
    refused (409, naming the question and how to settle it), nothing written."""
    engine, iid = _waiting_board(tmp_path)
    from fastapi.testclient import TestClient

    client = TestClient(create_app(engine, HERE, "t0k"), headers={"Authorization": "Bearer t0k"})
    before = client.get(f"/api/instances/{iid}").json()
    refused = client.post("/api/context-governance/inject", json={"instance_id": iid, "context": "ops_vote",
                                                                  "key": "go_decision", "value": value})
    assert refused.status_code == 409, refused.text
    message = refused.json()["error"]["message"]
    assert "cab_join/go_decision" in message and "'go_decision'" in message
    after = client.get(f"/api/instances/{iid}").json()
    assert after["version"] == before["version"] and after["tape_length"] == before["tape_length"]
    # the same through the Python API and `resume --set --context`
    with pytest.raises(Exception, match="cab_join/go_decision"):
        engine.inject(iid, {"go_decision": value}, context=_branch(engine.load(iid), "ops_vote"))
    # a key nobody is asked about may still be changed in the branch, as the README says
    ok = client.post("/api/context-governance/inject", json={"instance_id": iid, "context": "business_vote",
                                                             "key": "business_owner", "value": "treasury"})
    assert ok.status_code == 200, ok.text
    answered = client.post("/api/confirmations/cab_join%2Fgo_decision", json={"value": "go", "instance_id": iid})
    assert answered.status_code == 200, answered.text
    history = answered.json()["layers"]["L3"]
    assert (history["go_decision"], history["business_owner"]) == ("go", "treasury")


def test_a_rollback_of_a_branch_that_would_change_the_asked_key_is_refused(tmp_path: Path) -> None:
    engine, iid = _waiting_board(tmp_path)
    instance = engine.load(iid)
    ops = instance.contexts[_branch(instance, "ops_vote")]
    [first] = [e.data["snapshot_id"] for e in ops.tape if str(getattr(e.kind, "value", e.kind)) == "begin"]   # before the vote
    from engine.governance import GovernanceService, RollbackArgs

    service = GovernanceService(engine, HERE)
    with pytest.raises(Exception, match="cab_join/go_decision"):
        service.rollback(iid, RollbackArgs(snapshot_id=first, context="ops_vote"))
    assert engine.load(iid).contexts[ops.name].resolve("go_decision") == "go"


# ------------------------------------------------------------------ the DSAR behind `layerflow serve` on Redis


@pytest.fixture()
def served() -> Iterator[tuple[str, str]]:
    """`layerflow serve --port 0` in a process of its own, on a Redis store with a prefix of its own;
    (its URL, the store)."""
    with redis_scratch(REDIS, "unseen15-serve") as prefix:
        store = f"{REDIS}?prefix={prefix}"
        env = {**os.environ, "PYTHONPATH": str(ROOT), "LAYERFLOW_API_TOKEN": "u15-token"}
        env.pop("LAYERFLOW_STORE", None)
        server = subprocess.Popen([sys.executable, "-m", "engine.cli", "serve", "--host", "127.0.0.1", "--port", "0",
                                   "--catalog", str(HERE), "--store", store], env=env, cwd=ROOT,
                                  stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        try:
            url = None
            deadline = time.monotonic() + 60
            assert server.stderr is not None
            while url is None:
                line = server.stderr.readline()
                assert line or server.poll() is None, "the server exited"
                assert time.monotonic() < deadline, "the server did not start"
                found = re.search(r"serving .* on (http://127\.0\.0\.1:\d+)", line)
                url = found.group(1) if found else None
            yield url, store
        finally:
            server.terminate()
            server.wait(timeout=30)


DSAR_DATA = {"request_id": "DSAR-77", "subject_email": "ana@example.org", "actions": ["export", "erase"],
             "legal_hold": False}


def test_counsel_puts_a_legal_hold_on_the_request_through_rest_and_only_the_export_runs(
        served: tuple[str, str], cli: Any) -> None:
    """REST on a server of its own, on Redis: start, inspect, inject the hold (WORKING, as
    `data_layers` put it), snapshot, lift it by mistake, roll back to the snapshot, answer the form; the
    searches merge by their reducers without a question, the inclusive gateway runs the export only.
    The CLI reads the same store."""
    url, store = served
    with httpx.Client(base_url=url, headers={"Authorization": "Bearer u15-token"}, timeout=60) as api:
        assert api.post("/api/instances", json={"process_id": "data_access_request", "data": DSAR_DATA},
                        headers={"Authorization": "Bearer wrong"}).status_code == 401
        started = api.post("/api/instances", json={"process_id": "data_access_request", "data": DSAR_DATA})
        assert started.status_code == 201, started.text
        doc = started.json()
        iid = doc["instance_id"]
        assert doc["status"] == "waiting" and doc["layers"]["L4"] == {"legal_hold": False}
        assert doc["layers"]["L1"] == {k: v for k, v in DSAR_DATA.items() if k != "legal_hold"}
        [wait] = doc["waiting_for"]
        assert wait["task_id"] == "verify_identity"
        assert [(f["id"], f["type"], f["required"]) for f in wait["form"]["fields"]] == [("id_verified", "boolean", True)]
        gov = lambda op, **body: api.post(f"/api/context-governance/{op}", json={"instance_id": iid, **body})  # noqa: E731
        seen = gov("inspect")
        assert seen.status_code == 200 and seen.json()["L4"]["keys"] == ["legal_hold"]
        assert gov("inject", key="legal_hold", value=True).json()["written"] == {"legal_hold": "L4"}
        snap = gov("snapshot").json()
        assert snap["layers"]["L4"] == ["legal_hold"]
        assert gov("inject", key="legal_hold", value=False).status_code == 200
        assert gov("inject", key="request_id", value="DSAR-78").status_code == 403      # PROCESS is append-only
        rolled = gov("rollback", snapshot_id=snap["snapshot_id"])
        assert rolled.status_code == 200, rolled.text
        assert api.get(f"/api/instances/{iid}").json()["layers"]["L4"] == {"legal_hold": True}
        bad = api.post(f"/api/instances/{iid}/user-tasks/verify_identity", json={"data": {"id_verified": "yes"}})
        assert bad.status_code == 400 and bad.json()["error"]["problems"][0]["field"] == "id_verified"
        done = api.post(f"/api/instances/{iid}/user-tasks/verify_identity", json={"data": {"id_verified": True}})
        assert done.status_code == 200, done.text
        final = done.json()
        assert final["status"] == "completed" and final["conflicts"] == []
        history = data_of(final["layers"]["L3"])
        assert history == {"legal_hold": True, "id_verified": True, "records_found": 10,
                           "systems_hit": ["crm", "billing", "support"], "retention_until": "2031-12-31",
                           "export_file": "DSAR-77.zip",
                           "response": "DSAR-77: 10 records in billing, crm, support; erased: none"}
        assert "activity:erase_data" not in final["layers"]["L3"]
        ops = [e["data"]["op"] for e in api.get(f"/api/instances/{iid}/tape", params={"kind": "inject"}).json()["events"]
               if e["data"].get("note") == "governance"]
        assert ops == ["inject", "inject"]
        [restore] = api.get(f"/api/instances/{iid}/tape", params={"kind": "rollback"}).json()["events"]
        assert restore["data"]["snapshot_id"] == snap["snapshot_id"]
    # the CLI, in this process, reads what the server wrote to Redis
    seen = run_json(cli, "inspect", iid, "--store", store)
    assert seen["layers"] == final["layers"] and seen["status"] == "completed"
    replayed = run_json(cli, "replay", iid, "--until", str(snap["seq"]), "--store", store)
    assert replayed["layers"]["L4"] == {"legal_hold": True} and replayed["layers"]["L3"] == {}


def test_the_cli_names_its_own_flag_when_it_refuses_a_rollback_under_open_branches(cli: Any, tmp_path: Path) -> None:
    """`layerflow rollback` of the main context while the board's branches wait at their join: exit 2,
    and the way out it names is the CLI's (`--context`), not the REST body's field (`context`: ...),
    as `resume --set` already says; a rollback of the vote the board is asked about is refused too."""
    store = f"sqlite:///{tmp_path / 'cli.db'}"
    doc = run_json(cli, "run", str(CHANGE), "--data", json.dumps(REQUEST), "--store", store, code=3)
    iid = doc["instance_id"]
    snap = cli("snapshot", iid, "--store", store).stdout.strip()
    refused = cli("rollback", iid, "--snapshot", snap, "--store", store)
    assert refused.exit_code == 2 and "open branches" in refused.stderr
    assert "--context" in refused.stderr and "(`context`:" not in refused.stderr, refused.stderr
    listed = cli("snapshot", iid, "--list", "--store", store).stdout
    [before_vote] = [line.split("\t")[0] for line in listed.splitlines() if line.endswith("before ops_vote")]
    refused = cli("rollback", iid, before_vote, "--context", "ops_vote", "--store", store, "--json")
    assert refused.exit_code == 2 and "cab_join/go_decision" in json.loads(refused.stdout)["error"]["message"]
    assert run_json(cli, "inspect", iid, "--store", store)["tape_length"] == doc["tape_length"] + 1   # the snapshot


# ------------------------------------------------------------------ the grant: panels, an update, a confirmed suggestion


def test_the_grant_panels_the_applicants_update_and_the_confirmed_score(cli: Any, tmp_path: Path) -> None:
    """run (3: the finance panel and the update message wait; the ethics branch compressed in its own
    context, the main context untouched) -> the update (3: filed in a context of its own) -> the panel's
    score (3: the join asks a person, suggesting the policy's 6) -> the confirmation (0: the award).
    The branch's fold of the screening notes is the one change of those entries, so the main context
    takes it (README: changed in one branch, take it); its preserved keys come through whole."""
    store = f"sqlite:///{tmp_path / 'grant.db'}"
    doc = run_json(cli, "run", str(GRANT), "--data", json.dumps(APPLICATION), "--store", store, code=3)
    iid = doc["instance_id"]
    assert [(w["kind"], w["task_id"]) for w in doc["waiting_for"]] == [("user_task", "finance_panel"),
                                                                       ("event", "update_received")]
    assert doc["waiting_for"][1]["event"] == "applicant_update"
    assert set(data_of(doc["layers"]["L3"])) == {"eligible", "screening_notes"}
    [c] = doc["compressions"]
    assert (c["activity_id"], c["context"]) == ("ethics_review", doc["compressions"][0]["context"])
    assert c["context"].startswith("main/ethics_review@") and c["triggers"][0] == "token_threshold"
    assert set(c["folded"]) == {"eligible", "screening_notes", "activity:screen_eligibility"}
    assert {k: v["status"] for k, v in doc["contexts"].items()} == {
        c["context"]: "open", c["context"].replace("ethics_review", "finance_panel"): "open"}

    doc = run_json(cli, "send", iid, "applicant_update", "--json-payload", '{"note": "new CV attached"}',
                   "--store", store, code=3)
    assert "updates_filed" not in doc["layers"]["L3"]           # merged once the panels have joined
    assert [w["task_id"] for w in doc["waiting_for"]] == ["finance_panel", "update_received"]

    doc = run_json(cli, "resume", iid, "--answer", 'finance_panel={"score": 6}', "--store", store, code=3)
    [asked] = doc["confirmations"]
    assert (asked["id"], asked["suggested"], asked["suggested_by"], asked["default"]) == ("panel_merge/score", 6,
                                                                                          "policy", 6)
    assert [o["value"] for o in asked["options"]] == [6, 8, "$escalate"]
    assert doc["conflicts"] == [{"gateway_id": "panel_merge", "layer": "L4", "key": "score", "base_value": None,
                                 "base_absent": True, "values": {"finance_panel": 6, "ethics_review": 8},
                                 "resolution": None, "context": "main"}]

    doc = run_json(cli, "resume", iid, "--answer", "panel_merge/score=6", "--store", store)
    history = doc["layers"]["L3"]
    assert data_of(history) == {"score": 6, "ethics_ok": True, "ethics_report": history["ethics_report"],
                                "note": "new CV attached", "updates_filed": "new CV attached", "award": 125000}
    assert doc["conflicts"][0]["resolution"] == {
        "value": 6, "resolver": "human", "reason": "a person confirmed the policy suggestion: the finance panel "
                                                   "scores large budgets"}
    assert history["compaction:1"]["snapshot_id"] == c["snapshot_id"] and "screening_notes" not in history
    assert {v["status"] for v in doc["contexts"].values()} == {"joined"}
    main = Engine(store).load(iid).main
    assert {"ethics_ok", "score"} <= set(main.preserved)
    assert LayeredContext.replay(main.tape) == main


def test_an_operator_undoes_the_branch_compression_and_overrules_the_suggestion_through_rest(tmp_path: Path) -> None:
    """REST: `evaluate` the ethics branch's compression (its preserved keys intact), `decompress` it,
    so the join keeps the screening notes whole; the score the person is asked about cannot be injected
    into a branch under the question; the answer (8, against the suggestion) decides the award."""
    from fastapi.testclient import TestClient

    client = TestClient(create_app(Engine(f"sqlite:///{tmp_path / 'rest.db'}"), HERE, "t0k"),
                        headers={"Authorization": "Bearer t0k"})
    iid = client.post("/api/instances", json={"process_id": "grant_review", "data": APPLICATION}).json()["instance_id"]
    gov = lambda op, **body: client.post(f"/api/context-governance/{op}", json={"instance_id": iid, **body})  # noqa: E731
    seen = gov("compress", action="evaluate", context="ethics_review").json()
    assert seen["preserved_intact"] is True and sorted(seen["checked_preserved"]) == ["ethics_ok", "score"]
    assert seen["tokens_after"] < seen["tokens_before"]
    undone = gov("compress", action="decompress", context="ethics_review").json()
    assert (undone["tokens_before"], undone["tokens_after"]) == (seen["tokens_after"], seen["tokens_before"])
    waiting = client.post(f"/api/instances/{iid}/user-tasks/finance_panel", json={"data": {"score": 6}}).json()
    assert [w["id"] for w in waiting["waiting_for"]] == ["panel_merge/score", "update_received"]
    refused = gov("inject", context="finance_panel", key="score", value=8)
    assert refused.status_code == 409 and "panel_merge/score" in refused.json()["error"]["message"]
    done = client.post(f"/api/instances/{iid}/resume", json={"answers": {"confirmations": {"panel_merge/score": 8}}})
    assert done.status_code == 200, done.text
    history = done.json()["layers"]["L3"]
    assert (history["score"], history["award"]) == (8, 250000)
    assert history["screening_notes"].startswith("Check 1:") and "compaction:1" not in history
    assert done.json()["conflicts"][0]["resolution"]["resolver"] == "human"


# ------------------------------------------------------------------ a model that is unsure or unusable; an operator's fixes


@pytest.mark.parametrize("reply, suggested, fallback", [
    (json.dumps({"final_value": "no_go", "rationale": "unsure, security objects", "escalate": True}), "no_go", False),
    ("I think go", None, True)])
def test_a_model_that_escalates_or_answers_no_json_leaves_the_question_to_a_person(
        cli: Any, fake_model: Any, tmp_path: Path, reply: str, suggested: str | None, fallback: bool) -> None:
    """DESIGN: policy, then the model, then `human_confirm`. An escalating model's value is the person's
    suggestion; a reply that is not JSON (retried once) leaves no suggestion and a `model_fallbacks`
    entry. `resume --yes` takes the suggestion, else the configured default: `no_go` either way, by the
    human step, its reason saying whose proposal `--yes` took."""
    def answer(request: dict[str, Any]) -> str:
        text = "\n".join(m["content"] for m in request["messages"])
        if '"final_value"' in text:
            return reply
        return json.dumps({"risk_score": 62, "impact_notes": "short", "reviewed_by": ["model"]})
    model = fake_model(answer)
    store = f"sqlite:///{tmp_path / 'model.db'}"
    doc = run_json(cli, "run", str(CHANGE), "--data", json.dumps(REQUEST), "--model", "fake/model", "--store", store,
                   code=3)
    [asked] = doc["confirmations"]
    assert (asked["id"], asked["suggested"]) == ("cab_join/go_decision", suggested)
    assert asked["suggested_by"] == ("model" if suggested else None)
    assert len(model.requests) == (3 if fallback else 2)          # the step, then one ask (two for a bad reply)
    assert [(f["element_id"], f["purpose"], f["fallback"], f["key"]) for f in doc["model_fallbacks"]] == (
        [("cab_join", "conflict_resolution", "human", "go_decision")] if fallback else [])
    done = run_json(cli, "resume", doc["instance_id"], "--yes", "--model", "fake/model", "--store", store)
    assert done["layers"]["L3"]["change_status"] == "rejected"
    [settled] = [c for c in done["conflicts"] if c["key"] == "go_decision"]
    assert settled["resolution"]["value"] == "no_go"
    assert settled["resolution"]["resolver"] == "human"


def test_an_operator_settles_the_board_and_preserves_the_window_at_runtime(tmp_path: Path) -> None:
    """REST: `resolve` refuses a value the question does not offer (400, naming the options), takes an
    offered one with a reason (the person's note on the tape); `config` adds `window` to post_review's
    preserveKeys while the instance runs, so its compression keeps the window whole."""
    from fastapi.testclient import TestClient

    client = TestClient(create_app(Engine(f"sqlite:///{tmp_path / 'ops.db'}"), HERE, "t0k"),
                        headers={"Authorization": "Bearer t0k"})
    iid = client.post("/api/instances", json={"process_id": "change_request", "data": REQUEST}).json()["instance_id"]
    gov = lambda op, **body: client.post(f"/api/context-governance/{op}", json={"instance_id": iid, **body})  # noqa: E731
    wrong = gov("resolve", conflict_key="cab_join/go_decision", resolution="hold", reason="wait a week")
    assert wrong.status_code == 400 and '"go", "no_go"' in wrong.json()["error"]["message"]
    settled = gov("resolve", conflict_key="go_decision", resolution="go", reason="window agreed with payments")
    assert settled.status_code == 200 and settled.json()["waiting_for"][0]["task_id"] == "implement_change"
    changed = gov("config", config={"activityId": "post_review", "preserveKeys": ["window"]})
    assert changed.status_code == 200 and "window" in changed.json()["config"]["preserveKeys"]
    done = client.post(f"/api/instances/{iid}/user-tasks/implement_change", json={"data": {"outcome": "success"}}).json()
    assert done["status"] == "completed" and done["layers"]["L3"]["window"] == "sun 02:00"
    [c] = done["compressions"]
    assert "window" not in c["folded"] and "business_owner" in c["folded"]
    notes = client.get(f"/api/instances/{iid}/tape", params={"kind": "human_decision"}).json()["events"]
    assert [(e["data"]["value"], e["data"]["reason"]) for e in notes] == [("go", "window agreed with payments")]


def test_a_missing_legal_hold_fails_the_request_and_resume_set_gives_it(cli: Any, tmp_path: Path) -> None:
    """An outsider who forgets the WORKING key the gateway reads: the inclusive gateway fails naming the
    key and the gateway (exit 1); `resume --set legal_hold=false` gives it and the erasure runs."""
    store = f"sqlite:///{tmp_path / 'dsar.db'}"
    data = {k: v for k, v in DSAR_DATA.items() if k != "legal_hold"} | {"actions": ["erase"]}
    failed = run_json(cli, "run", str(DSAR), "--data", json.dumps(data), "--answer", 'verify_identity={"id_verified": true}',
                      "--store", store, code=1)
    assert failed["error"]["task_id"] == "actions_split" and "'legal_hold'" in failed["error"]["message"]
    done = run_json(cli, "resume", failed["instance_id"], "--set", "legal_hold=false", "--store", store)
    history = data_of(done["layers"]["L3"])
    assert history["erased_systems"] == ["billing", "crm", "support"] and "export_file" not in history
    assert history["response"] == "DSAR-77: 10 records in billing, crm, support; erased: billing, crm, support"


@pytest.mark.parametrize("activity", ["cab_join", "post_review", "ops_vote", "review_routing"])
def test_rest_and_the_cli_find_the_same_events_of_an_activity_or_gateway(cli: Any, tmp_path: Path,
                                                                        activity: str) -> None:
    """README: `GET /api/instances/{id}/tape` filters "as `layerflow tape`". An auditor asking what
    happened at the board's join got, from REST, the join's conflicts and resolutions but not the
    person's decision (`human_decision`, confirmation `cab_join/go_decision`) nor the split's
    snapshot the join merged against, which `layerflow tape --activity cab_join` lists; and a
    mistyped id got an empty list without the note the CLI gives."""
    from fastapi.testclient import TestClient

    store = f"sqlite:///{tmp_path / 'audit.db'}"
    client = TestClient(create_app(Engine(store), HERE, "t0k"), headers={"Authorization": "Bearer t0k"})
    iid = client.post("/api/instances", json={"process_id": "change_request", "data": REQUEST}).json()["instance_id"]
    client.post("/api/confirmations/cab_join%2Fgo_decision", json={"value": "go", "instance_id": iid})
    client.post(f"/api/instances/{iid}/user-tasks/implement_change", json={"data": {"outcome": "success"}})
    rest = client.get(f"/api/instances/{iid}/tape", params={"activity": activity}).json()
    listed = json.loads(cli("tape", iid, "--activity", activity, "--store", store, "--json").stdout)
    assert [(e["context"], e["seq"]) for e in rest["events"]] == [(e["context"], e["seq"]) for e in listed]
    if activity == "cab_join":
        assert [e["data"]["confirmation_id"] for e in rest["events"]
                if e.get("data", {}).get("note") == "human_decision"] == ["cab_join/go_decision"]
    typo = client.get(f"/api/instances/{iid}/tape", params={"activity": activity + "x"}).json()
    assert typo["events"] == [] and repr(activity + "x") in typo["note"] and activity in typo["activities"]
