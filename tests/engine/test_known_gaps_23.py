"""Gaps closed in round 23.

(a) A second answer's 409 (``already_answered``) gave ``answered_at`` (and a late answer's
    ``timed_out_at``) as ISO text, while the confirmation itself (``run --json``'s
    ``confirmations``, the record the store keeps) holds ``answered_at`` and ``timed_out_at`` in
    epoch seconds, as ``created`` and ``deadline``, the form README gives a confirmation's times
    (``deadline``, epoch seconds, beside ``due``, the same moment in ISO 8601 UTC). The refusal now
    gives them in that form, the same numbers the confirmation holds, and adds the ISO text beside
    them (``answered_at_iso``, ``timed_out_at_iso``, written as ``due`` is), which its message quotes.
(b) An instance left in ``error`` with a model activity open (a person answered the model's
    human_confirm, then the model call failed) rolled back to a snapshot taken before that activity
    began kept the activity open on the context rolled back: the conversation went on from what the
    model had been shown before the rollback, and a ``cancel`` afterwards put back (the activity's
    begin snapshot) what the rollback had taken away. Rolled back to a snapshot inside the activity,
    the activity's record later listed keys it wrote after that snapshot, which the rollback removed.
    Now a rollback to before the activity ends it first (an ``abort`` on the tape naming the
    rollback; its conversation dropped), so ``resume`` runs it again from the context rolled back;
    one to inside keeps it open and its conversation, and the activity's own keys go back with it.
(c) SpiffWorkflow 3.2 never fires a conditional catch event that is a branch of an event-based
    gateway (its condition is never evaluated), yet ``run`` told the user to ``resume --set KEY=VALUE``
    to release it. The waiting item now says ``never_fires``, the summary says it will not fire and
    what decides instead, and ``validate`` warns (``conditional_branch_never_fires``) naming the
    gateway, the event and what to model instead.
"""

from __future__ import annotations

import json
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from context_layers import Layer, LayeredContext
from engine import Engine, load_process
from engine.api import create_app
from engine.governance import AnswerArgs, AnsweredAlready, AnsweredByTimeout, GovernanceService
from engine.validate import validate_process

from engine_helpers import cli_in_a_tmp_store, run_json, script_task, write_process
from governance_helpers import make_catalog
from stub_llm import Reply, StubLLM

cli = cli_in_a_tmp_store

HERE = Path(__file__).parent
TOKEN = "gaps23"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
GOV = "/api/context-governance"


def _iso(seconds: float) -> str:
    """A moment as ``due`` gives it (README: ISO 8601 UTC)."""
    return datetime.fromtimestamp(seconds, timezone.utc).isoformat()


@pytest.fixture()
def api(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, cli: Any) -> TestClient:
    """The REST API on the sqlite store the ``cli`` fixture's commands use too."""
    store = f"sqlite:///{tmp_path / 'gaps23.db'}"
    monkeypatch.setenv("LAYERFLOW_STORE", store)
    return TestClient(create_app(store, make_catalog(tmp_path), TOKEN), headers=AUTH)


# ----- (a) a second answer gives the confirmation's times in the confirmation's form ----------------------------

PO = HERE / "unseen16" / "purchase_order.bpmn"
ORDER = {"po_id": "PO-523", "vendor": "Nimbus CRM", "item": "CRM licences", "amount": 80000,
         "budget_remaining": 120000, "new_vendor": True, "personal_data": True}
ASKED = "review_join/risk_rating"


def test_a_second_answers_answered_at_is_the_confirmations_own(api: TestClient, cli: Any) -> None:
    iid = run_json(cli, "run", str(PO), "--data", json.dumps(ORDER), code=3)["instance_id"]
    done = run_json(cli, "resume", iid, "--answer", f"{ASKED}=medium", "--by", "olga")
    [held] = [c for c in done["confirmations"] if c["id"] == ASKED]
    assert isinstance(held["answered_at"], float) and isinstance(held["created"], float)  # epoch seconds
    rest = api.post(f"/api/confirmations/{ASKED}", json={"instance_id": iid, "value": "high", "user": "piet"})
    assert rest.status_code == 409, rest.text
    error = rest.json()["error"]
    assert error["answered_at"] == held["answered_at"], error                 # one form: the confirmation's
    assert error["answered_at_iso"] == _iso(held["answered_at"]), error        # and the ISO text, as `due`
    assert f"by olga at {error['answered_at_iso']};" in error["message"], error["message"]
    shown = run_json(cli, "inspect", iid)
    assert [c["answered_at"] for c in shown["confirmations"] if c["id"] == ASKED] == [error["answered_at"]]
    refused = run_json(cli, "resume", iid, "--answer", f"{ASKED}=high", code=2)["error"]
    assert (refused["answered_at"], refused["answered_at_iso"]) == (error["answered_at"], error["answered_at_iso"])


def test_the_engines_clock_gives_answered_at_and_timed_out_at_in_epoch_seconds(tmp_path: Path) -> None:
    from test_known_gaps_16 import _go, _timed_out

    clock = [1_700_000_000.0]
    engine = Engine("memory://", clock=lambda: clock[0])
    instance = engine.run(load_process(_go(tmp_path)), {})
    clock[0] += 5
    engine.answer_confirmation(instance.id, "merge/risk_level", "high", actor="ann", by="ann", run=False)
    with pytest.raises(AnsweredAlready) as caught:
        engine.answer_confirmation(instance.id, "merge/risk_level", "low")
    said = caught.value.to_dict()
    [entry] = [c for c in engine.load(instance.id).confirmations if c["id"] == "merge/risk_level"]
    assert said["answered_at"] == entry["answered_at"] == 1_700_000_005.0
    assert said["answered_at_iso"] == "2023-11-14T22:13:25+00:00"

    later = tmp_path / "late"
    later.mkdir()
    engine, _, iid = _timed_out(later)
    with pytest.raises(AnsweredByTimeout) as caught:
        engine.answer_confirmation(iid, "merge/risk_level", "high")
    said = caught.value.to_dict()
    [entry] = [c for c in engine.load(iid).confirmations if c["id"] == "merge/risk_level"]
    assert said["timed_out_at"] == entry["timed_out_at"] and isinstance(said["timed_out_at"], float)
    assert said["timed_out_at_iso"] == _iso(entry["timed_out_at"]) and said["timed_out_at_iso"] in said["message"]
    assert isinstance(said["answered_at"], float) and said["answered_at_iso"] == _iso(said["answered_at"])


# ----- (b) rollback of an instance in error with its model activity open ----------------------------------------

MODEL = "openai/stub-model"
NOTES = "Market notes: the regional bakery sector grew with stable margins."
PROCESS = [script_task("gather", "risk_score = 42"), script_task("research", f"market_notes = {NOTES!r}"),
           '<bpmn:task id="review" name="Review the application"/>', script_task("archive", "archived = decision")]
CONFIG = ("review:\n  llm:\n    tools: true\n    instructions: Decide on the application.\n"
          "    outputKeys: [decision]\n    maxRetries: 1\n    timeout: 5\n")
ASK = {"type": "review", "message": "Keep the notes?", "options": [{"label": "keep", "value": "keep"},
                                                                    {"label": "undo", "value": "undo"}]}
DECISION = {"decision": "approve"}


def _tool_reply(name: str, arguments: dict[str, Any]) -> Reply:
    return Reply(body=json.dumps({
        "id": "chatcmpl-23", "object": "chat.completion", "created": 1700000000, "model": "stub-model",
        "choices": [{"index": 0, "finish_reason": "tool_calls", "message": {"role": "assistant", "content": None,
                     "tool_calls": [{"id": "call_1", "type": "function",
                                     "function": {"name": name, "arguments": json.dumps(arguments)}}]}}],
        "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15}}))


@pytest.fixture()
def stub(monkeypatch: pytest.MonkeyPatch) -> Any:
    monkeypatch.setenv("LAYERFLOW_MODEL_API_KEY", "test-key")
    monkeypatch.setenv("LAYERFLOW_RETRY_BASE_DELAY", "0.01")
    with StubLLM() as server:
        monkeypatch.setenv("LAYERFLOW_MODEL_API_BASE", server.url)
        yield server


def _failed_after_the_answer(tmp_path: Path, stub: Any, store: str) -> tuple[Engine, str]:
    """An instance in error at ``review``: the model asked a person, who answered; then it failed."""
    engine = Engine(store, model=MODEL)
    stub.push(_tool_reply("human_confirm", ASK))
    instance = engine.run_process(load_process(write_process(tmp_path, "review23", PROCESS, CONFIG)), {})
    assert instance.status == "waiting", instance.error
    stub.push(*[Reply.error(500, "upstream down")] * 2)
    failed = GovernanceService(engine).answer("model:1", AnswerArgs(value="undo", reason="no"))
    assert failed["status"] == "error" and failed["error"]["task_id"] == "review", failed
    held = engine.load(instance.id)
    assert held.main.current_activity == "review" and held.suspended
    return engine, instance.id


def _begin_of(engine: Engine, iid: str, activity: str) -> dict[str, Any]:
    return next(e for e in engine.load(iid).main.tape if e.kind == "begin" and e.activity == activity).data


def _rollback(how: str, api: TestClient | None, cli: Any, iid: str, snapshot_id: str, *, ended: bool) -> None:
    if how == "cli":
        said = cli("rollback", iid, snapshot_id, "--reason", "back to before the notes")
        assert said.exit_code == 0, said.stderr
        said_so = "activity review was open and began after that snapshot: it ended" in said.stdout
        assert said_so is ended, said.stdout
    else:
        assert api is not None
        done = api.post(f"{GOV}/rollback", json={"instance_id": iid, "snapshot_id": snapshot_id,
                                                 "reason": "back to before the notes"})
        assert done.status_code == 200, done.text
        assert done.json().get("activity_ended") == ("review" if ended else None), done.json()


@pytest.mark.parametrize("how", ["cli", "rest"])
def test_a_rollback_to_before_the_open_activity_ends_it_and_resume_runs_it_again(
        tmp_path: Path, stub: Any, api: TestClient, cli: Any, how: str, monkeypatch: pytest.MonkeyPatch) -> None:
    import os
    engine, iid = _failed_after_the_answer(tmp_path, stub, os.environ["LAYERFLOW_STORE"])
    before = _begin_of(engine, iid, "research")["snapshot_id"]  # taken as `research` began
    _rollback(how, api, cli, iid, before, ended=True)
    rolled = engine.load(iid)
    ctx = rolled.main
    assert rolled.status == "error" and ctx.current_activity is None and not rolled.suspended
    assert "market_notes" not in ctx and "activity:research" not in ctx.layer(Layer.HISTORY)
    # the tape says the activity ended, and why, before the restore
    [abort] = [e for e in ctx.tape if e.kind == "abort" and e.activity == "review"]
    restore = next(e for e in ctx.tape if e.kind == "restore" and e.seq > abort.seq)
    assert before in abort.data["reason"] and "rollback" in abort.data["reason"], abort.data
    assert restore.data["snapshot_id"] == before
    [note] = [e for e in ctx.tape if e.data.get("op") == "rollback"]
    assert note.data["activity_ended"] == "review", note.data
    assert LayeredContext.replay(list(ctx.tape)) == ctx  # the tape alone rebuilds it
    # resume runs it again from the context rolled back: a new conversation, without the notes
    stub.push(Reply.json(DECISION))
    done = engine.resume(iid).to_document()
    assert done["status"] == "completed", done["error"]
    request = stub.requests[-1]["messages"]
    assert not any(m["role"] == "tool" for m in request) and NOTES not in json.dumps(request)
    assert done["layers"]["L3"]["decision"] == "approve" and "market_notes" not in done["layers"]["L3"]
    assert done["layers"]["L3"]["activity:review"]["keys"] == ["decision"]


def test_cancel_after_a_rollback_to_before_the_activity_keeps_the_rollback(tmp_path: Path, stub: Any) -> None:
    store = f"sqlite:///{tmp_path / 'c.db'}"
    engine, iid = _failed_after_the_answer(tmp_path, stub, store)
    from engine.governance import RollbackArgs
    GovernanceService(engine).rollback(iid, RollbackArgs(snapshot_id=_begin_of(engine, iid, "research")["snapshot_id"]))
    cancelled = engine.cancel(iid, reason="handled by phone")
    assert cancelled.status == "cancelled" and "market_notes" not in cancelled.main  # not put back


@pytest.mark.parametrize("how", ["cli", "rest"])
def test_a_rollback_inside_the_open_activity_keeps_it_and_its_conversation(
        tmp_path: Path, stub: Any, api: TestClient, cli: Any, how: str) -> None:
    import os
    engine, iid = _failed_after_the_answer(tmp_path, stub, os.environ["LAYERFLOW_STORE"])
    inside = run_json(cli, "snapshot", iid, "--label", "inside review")["snapshot_id"]
    injected = api.post(f"{GOV}/inject", json={"instance_id": iid, "key": "scratch", "value": "half"})
    assert injected.status_code == 200, injected.text
    _rollback(how, api, cli, iid, inside, ended=False)
    rolled = engine.load(iid)
    assert rolled.main.current_activity == "review" and rolled.suspended and "scratch" not in rolled.main
    assert "market_notes" in rolled.main  # taken while review was open: before it, nothing changes
    [note] = [e for e in rolled.main.tape if e.data.get("op") == "rollback"]
    assert note.data["activity_open"] == "review" and "activity_ended" not in note.data, note.data
    assert not [e for e in rolled.main.tape if e.kind == "abort"]
    rebuilt = LayeredContext.replay(list(rolled.main.tape))
    assert rebuilt == rolled.main and rebuilt.activity_writes == rolled.main.activity_writes == ()
    stub.push(Reply.json(DECISION))
    done = engine.resume(iid).to_document()
    assert done["status"] == "completed", done["error"]
    told = [json.loads(m["content"]) for m in stub.requests[-1]["messages"] if m["role"] == "tool"]
    assert told[-1]["answer"] == "undo"  # the conversation went on: the person's answer given to the model
    record = done["layers"]["L3"]["activity:review"]
    assert record["keys"] == ["decision"], record  # not the key the rollback took away
    assert "scratch" not in done["layers"]["L3"]


def test_a_rollback_to_before_an_activity_whose_question_waits_is_refused(
        tmp_path: Path, stub: Any, api: TestClient) -> None:
    import os
    engine = Engine(os.environ["LAYERFLOW_STORE"], model=MODEL)
    stub.push(_tool_reply("human_confirm", ASK))
    iid = engine.run_process(load_process(write_process(tmp_path, "review23", PROCESS, CONFIG)), {}).id
    before = _begin_of(engine, iid, "research")["snapshot_id"]
    length = len(engine.load(iid).main.tape)
    refused = api.post(f"{GOV}/rollback", json={"instance_id": iid, "snapshot_id": before})
    assert refused.status_code == 409, refused.text
    message = refused.json()["error"]["message"]
    assert "'review'" in message and "'model:1'" in message and before in message and "Answer it first" in message
    held = engine.load(iid)
    assert held.status == "waiting" and held.main.current_activity == "review" and len(held.main.tape) == length
    stub.push(Reply.json(DECISION))  # answered, the activity goes on as before
    assert GovernanceService(engine).answer("model:1", AnswerArgs(value="keep"))["status"] == "completed"


# ----- (c) a conditional branch of an event-based gateway never fires under SpiffWorkflow 3.2 ------------------

RACE = HERE / "gaps22" / "cond_race.bpmn"  # gw: message ok (ok_in) | conditional stock > 5 (restocked)


def test_the_run_does_not_tell_to_set_a_key_for_a_branch_that_never_fires(cli: Any) -> None:
    said = cli("run", str(RACE))
    assert said.exit_code == 3, said.stderr
    [line] = [x for x in said.stdout.splitlines() if "restocked" in x]
    assert "--set" not in line, line
    assert "never fires" in line and "'gw'" in line and "'stock > 5'" in line and "SpiffWorkflow 3.2" in line, line
    assert "layerflow send" in said.stdout  # the message branch still says how to release it
    doc = run_json(cli, "run", str(RACE), code=3)
    [branch] = [w for w in doc["waiting_for"] if w.get("event_kind") == "conditional"]
    assert branch["never_fires"] is True and branch["event_id"] == "restocked" and branch["gateway_id"] == "gw"
    [message] = [w for w in doc["waiting_for"] if w.get("event_kind") == "message"]
    assert "never_fires" not in message
    # as it says: a --set that makes the condition hold does not release it
    after = run_json(cli, "resume", doc["instance_id"], "--set", "stock=10", code=3)
    assert [w["event_id"] for w in after["waiting_for"] if w.get("never_fires")] == ["restocked"]


def test_a_standalone_conditional_event_still_says_resume_set(cli: Any) -> None:
    doc = run_json(cli, "run", str(HERE / "gaps22" / "cond_unset.bpmn"), code=3)
    [item] = [w for w in doc["waiting_for"] if w.get("event_kind") == "conditional"]
    assert "never_fires" not in item
    said = cli("run", str(HERE / "gaps22" / "cond_unset.bpmn"))
    [line] = [x for x in said.stdout.splitlines() if "waiting at restocked" in x]
    assert "--set KEY=VALUE" in line and "never fires" not in line, said.stdout


def test_validate_warns_of_a_conditional_branch_of_an_event_based_gateway() -> None:
    report = validate_process([RACE])
    found = [p for p in report.problems if p.code == "conditional_branch_never_fires"]
    assert [(p.element_id, p.severity, p.field) for p in found] == [("restocked", "warning", None)], found
    [problem] = found
    assert problem.file and problem.file.endswith("cond_race.bpmn") and problem.line
    assert "'gw'" in problem.message and "'stock > 5'" in problem.message and "SpiffWorkflow 3.2" in problem.message
    assert "boundary event" in problem.message  # what to model instead
    assert report.ok  # a warning: the other branches still run
    assert not [p for p in validate_process([HERE / "gaps22" / "cond_unset.bpmn"]).problems
                if p.code == "conditional_branch_never_fires"]
