"""Gaps closed in round 21.

(a) A second answer to a confirmation a person answered: REST gave 409 ``already_answered`` with a
    message naming the answer and who gave it, but not when, nor where to read the decision, nor
    what to do, and no fields; ``layerflow resume --answer`` took it without a word as "kept for a
    later step" (exit 3), or "not used" on a completed instance (exit 0). Now both refuse it
    (``AnsweredAlready``, as ``AnsweredByTimeout`` refuses a late answer to a timeout): REST 409 and
    CLI exit 2 with the same message and fields (``confirmation_id``, ``gateway_id``, ``key``,
    ``answer``, ``answered_by``, ``answered_at``, ``tape_seq``, ``given``), the tape command that
    shows the decision, and what to do (inject or rollback; a new instance once completed). The
    same answer again passes (a script's answers file reused); an answer the join may still ask
    for (it lies on a loop) is kept for that round, as before.
(b) The tape's ``config_change`` record gave the element's config before (``previous``) and after
    (``config``) with the fields at their defaults left out, so a reader could not tell what a field
    was before it changed (``compressTokenThreshold`` absent: unset, or never shown?), and gave
    ``previous: null`` for an element without a config of its own. Both are complete now, every
    field in the same shape (``ActivityExtensionConfig.dump_full``), on the tape (``layerflow tape
    --json``, REST ``GET .../tape``) and in the REST answer; ``change`` stays what the request set.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from context_layers import ActivityExtensionConfig
from engine.api import create_app

from engine_helpers import cli_in_a_tmp_store, run_json
from governance_helpers import NOTES, make_catalog

cli = cli_in_a_tmp_store

TOKEN = "gaps21"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
GOV = "/api/context-governance"


@pytest.fixture()
def api(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, cli: Any) -> TestClient:
    """The REST API on a sqlite store, which the ``cli`` fixture's commands use too (set after it)."""
    store = f"sqlite:///{tmp_path / 'gaps21.db'}"
    monkeypatch.setenv("LAYERFLOW_STORE", store)
    return TestClient(create_app(store, make_catalog(tmp_path), TOKEN), headers=AUTH)


# ----- (b) config_change: previous and config complete, in one shape ------------------------------------------

DEFAULTS = ActivityExtensionConfig().dump_full() if hasattr(ActivityExtensionConfig, "dump_full") else {}


def _config_changes(api: TestClient, cli: Any, iid: str) -> list[dict[str, Any]]:
    """The config_change records as `layerflow tape --json` gives them, checked equal to REST's."""
    listed = cli("tape", iid, "--kind", "config_change", "--json")
    assert listed.exit_code == 0, listed.stderr
    on_cli = [e["data"] for e in json.loads(listed.stdout)]
    rest = api.get(f"/api/instances/{iid}/tape", params={"kind": "config_change"})
    assert rest.status_code == 200, rest.text
    assert [e["data"] for e in rest.json()["events"]] == on_cli
    return on_cli


def test_a_config_changes_record_shows_every_field_before_and_after(api: TestClient, cli: Any) -> None:
    iid = api.post("/api/instances", json={"process_id": "notes_review", "data": NOTES}).json()["instance_id"]
    first = api.post(f"{GOV}/config", json={"instance_id": iid, "activity_id": "finish",
                                            "config": {"compressTokenThreshold": 4000}, "reason": "tighter"})
    assert first.status_code == 200, first.text
    second = api.post(f"{GOV}/config", json={"instance_id": iid, "activity_id": "finish",
                                             "config": {"preserveKeys": ["outcome"], "compressTokenThreshold": 900}})
    assert second.status_code == 200, second.text
    one, two = _config_changes(api, cli, iid)
    # `finish` had no config of its own: before the first change every field had its default, and says so
    assert one["previous"] == DEFAULTS and DEFAULTS["compressTokenThreshold"] is None
    assert one["config"] == {**DEFAULTS, "compressTokenThreshold": 4000}
    assert one["change"] == {"compressTokenThreshold": 4000}  # what the request set, as before
    # the second change shows what the first left, field by field, in the same shape as the new value
    assert two["previous"] == one["config"]
    assert set(two["previous"]) == set(two["config"]) == set(DEFAULTS)
    assert (two["previous"]["compressTokenThreshold"], two["config"]["compressTokenThreshold"]) == (4000, 900)
    assert (two["previous"]["preserveKeys"], two["config"]["preserveKeys"]) == ([], ["outcome"])
    assert two["previous"]["mergeStrategy"] == two["config"]["mergeStrategy"] == "MERGE_WITH_CONFLICT_DETECT"
    # each field once: those the seed lets a config write in either place are given at the top level
    assert "preserveKeys" not in two["config"]["contextStrategy"]
    # the REST answer gives what the tape keeps
    assert {k: second.json()[k] for k in ("config", "previous")} == {"config": two["config"],
                                                                     "previous": two["previous"]}


def test_a_full_config_reads_back_as_the_same_config() -> None:
    """dump_full is a complete description: validated again, it is the config it came from."""
    cfg = ActivityExtensionConfig.model_validate({"preserveKeys": ["a"], "compressTokenThreshold": 50,
                                                  "humanConfirm": {"timeout": 60, "default": "x"},
                                                  "contextStrategy": {"compressTargetRatio": 0.3}})
    full = cfg.dump_full()
    assert ActivityExtensionConfig.model_validate(full).dump_full() == full
    assert full["humanConfirm"]["timeout"] == 60 and full["contextStrategy"]["compressTargetRatio"] == 0.3
    assert full["reducers"] == {} and full["redact"] is True


# ----- (c) what a poller of a running instance sees --------------------------------------------------------------

def test_a_run_saves_running_after_each_activity_so_a_poller_waits_for_a_status_at_rest(tmp_path: Path) -> None:
    """The cause of the two-workers test's failures under load (test_unseen_processes_16): it polled
    `GET /api/instances/{id}` until the status was no longer "waiting" and took that as the outcome,
    but a run saves after every activity (``Engine(save="activity")``, the default: a crash loses at
    most the running one), with status "running" and an empty ``waiting_for`` (what the run started
    from is answered or fired; what it will wait for is known when it stops). A poll that lands between the fired timer's first activity and the end of the run
    sees that checkpoint; the busier the machine, the wider that window. The engine is right (the
    checkpoint is what a crash resumes from); a poller waits for a status at rest."""
    from engine import Engine, load_process
    from engine.worker import AT_REST

    from engine_helpers import chain_bpmn, script_task

    path = tmp_path / "cooling.bpmn"
    path.write_text(chain_bpmn("cooling", [
        '<bpmn:intermediateCatchEvent id="cooling_off"><bpmn:timerEventDefinition><bpmn:timeDuration>"PT2S"'
        "</bpmn:timeDuration></bpmn:timerEventDefinition></bpmn:intermediateCatchEvent>",
        script_task("apply_offer", "offer_applied = True"), '<bpmn:serviceTask id="close_case"/>']), encoding="utf-8")
    now = [1_700_000_000.0]
    seen: list[tuple[str, list[str]]] = []

    def close_case(actx: Any) -> dict[str, Any]:
        stored = engine.load(iid)  # what another reader (REST, `inspect`) gets while the run goes on
        seen.append((stored.status, [w["task_id"] for w in stored.waiting_for]))
        return {"closed": True}

    engine = Engine(f"sqlite:///{tmp_path / 'cooling.db'}", handlers={"close_case": close_case},
                    clock=lambda: now[0])
    iid = engine.run(load_process(path), {}).id
    now[0] += 3  # the timer is due
    done = engine.resume(iid)
    assert done.status == "completed" and engine.load(iid).status in AT_REST
    assert seen == [("running", [])]  # mid-run: no outcome yet, not "waiting", and waiting for nothing
    assert "running" not in AT_REST


# ----- (a) a second answer: the same advice and fields on REST and the CLI --------------------------------------

PO = Path(__file__).resolve().parent / "unseen16" / "purchase_order.bpmn"
ORDER = {"po_id": "PO-501", "vendor": "Nimbus CRM", "item": "CRM licences", "amount": 80000,
         "budget_remaining": 120000, "new_vendor": True, "personal_data": True}
ASKED = "review_join/risk_rating"
FIELDS = ("instance_id", "confirmation_id", "gateway_id", "key", "answer", "answered_by", "answered_at", "tape_seq",
          "given")


def _answered_by_olga(cli: Any) -> str:
    """A purchase order whose join asked who rates the risk, answered 'medium' by olga (it completes)."""
    iid = run_json(cli, "run", str(PO), "--data", json.dumps(ORDER), code=3)["instance_id"]
    assert run_json(cli, "resume", iid, "--answer", f"{ASKED}=medium", "--by", "olga")["status"] == "completed"
    return iid


def _assert_advice(error: dict[str, Any], iid: str) -> None:
    message = error["message"]
    assert error["kind"] == "already_answered", error
    assert "was already answered \"medium\" by olga at " + error["answered_at_iso"] in message, message
    assert '"high" was not applied' in message, message
    assert f"`layerflow tape {iid} --kind human_decision`" in message, message            # where to read it
    assert f"GET /api/instances/{iid}/tape?kind=human_decision" in message, message
    assert f"`layerflow rollback {iid} SNAPSHOT_ID`" in message and "start a new instance" in message  # what to do
    assert {k: error[k] for k in FIELDS} == {
        "instance_id": iid, "confirmation_id": ASKED, "gateway_id": "review_join", "key": "risk_rating",
        "answer": "medium", "answered_by": "olga", "answered_at": error["answered_at"], "tape_seq": error["tape_seq"],
        "given": "high"}
    # epoch seconds, as the confirmation holds it (round 23), and the ISO text beside it
    assert isinstance(error["answered_at"], float) and error["answered_at_iso"].endswith("+00:00")
    assert isinstance(error["tape_seq"], int)


def test_a_second_answer_gets_the_same_advice_and_fields_on_rest_and_the_cli(api: TestClient, cli: Any) -> None:
    iid = _answered_by_olga(cli)
    rest = api.post(f"/api/confirmations/{ASKED}", json={"instance_id": iid, "value": "high", "user": "piet"})
    assert rest.status_code == 409, rest.text
    error = rest.json()["error"]
    _assert_advice(error, iid)
    [decision] = json.loads(cli("tape", iid, "--kind", "human_decision", "--json").stdout)  # the advice holds
    assert (decision["seq"], decision["actor"], decision["data"]["value"]) == (error["tape_seq"], "olga", "medium")
    resolved = api.post(f"{GOV}/resolve", json={"instance_id": iid, "conflict_key": "risk_rating",
                                                "resolution": "high", "reason": "second opinion"})
    assert resolved.status_code == 409 and resolved.json()["error"] == error, resolved.text
    # the CLI: exit 2, the same message on stderr, the same fields in --json's error
    said = cli("resume", iid, "--answer", f"{ASKED}=high")
    assert said.exit_code == 2 and said.stderr.strip() == f"layerflow: {error['message']}", said.stderr
    doc = run_json(cli, "resume", iid, "--answer", f"{ASKED}=high", code=2)
    assert doc["error"]["message"] == error["message"] and doc["instance_id"] == iid
    assert {k: doc["error"][k] for k in FIELDS} == {k: error[k] for k in FIELDS}
    # nothing changed, and the same answer again (a script's answers file reused) is no second answer
    again = cli("resume", iid, "--answer", f"{ASKED}=medium")
    assert again.exit_code == 0 and "not used" in again.stderr
    assert run_json(cli, "inspect", iid)["layers"]["L3"]["risk_rating"] == "medium"


def test_a_second_answer_while_the_instance_waits_says_inject_or_rollback(tmp_path: Path) -> None:
    """Engine.answer_confirmation on a waiting instance (a person's review after the join): the
    advice is to write the value (`resume --set`, REST inject) or roll back; the first answer's
    time is the engine's clock."""
    from engine import Engine, load_process
    from engine.governance import AnsweredAlready

    from test_known_gaps_16 import _go

    clock = [1_700_000_000.0]
    engine = Engine("memory://", clock=lambda: clock[0])
    instance = engine.run(load_process(_go(tmp_path)), {})
    engine.answer_confirmation(instance.id, "merge/risk_level", "high", actor="ann", by="ann", run=False)
    with pytest.raises(AnsweredAlready) as caught:
        engine.answer_confirmation(instance.id, "merge/risk_level", "low")
    err = caught.value
    assert (err.kind, err.answered_by, err.answered_at, err.answer, err.given) == (
        "already_answered", "ann", 1_700_000_000.0, "high", "low")
    assert err.answered_at_iso == "2023-11-14T22:13:20+00:00"
    assert f"layerflow resume {instance.id} --set risk_level=VALUE" in str(err), str(err)
    assert "POST /api/context-governance/inject" in str(err) and "rollback" in str(err)


def test_an_answer_for_the_next_round_of_a_loop_is_kept_for_it(tmp_path: Path) -> None:
    """A join on a loop asks again under the same id: an answers file's other value for it, given
    while the instance waits elsewhere in the loop, may be the next round's answer, not a second
    one: it is not refused (kept, as before). A join on no loop asks once: refused."""
    from engine import Engine, load_process
    from engine.governance import AnsweredAlready
    from engine.runtime import may_ask_again

    from engine_helpers import flow, write_elements
    from test_known_gaps_16 import _go

    loop = write_elements(tmp_path, "loop", [
        '<bpmn:startEvent id="start"/>', '<bpmn:parallelGateway id="split"/>',
        '<bpmn:scriptTask id="a"><bpmn:script>level = "a"</bpmn:script></bpmn:scriptTask>',
        '<bpmn:scriptTask id="b"><bpmn:script>level = "b"</bpmn:script></bpmn:scriptTask>',
        '<bpmn:parallelGateway id="merge"/>', '<bpmn:userTask id="review"/>', '<bpmn:exclusiveGateway id="again"/>',
        '<bpmn:endEvent id="end"/>',
        flow("start", "split"), flow("split", "a"), flow("split", "b"), flow("a", "merge"), flow("b", "merge"),
        flow("merge", "review"), flow("review", "again"), flow("again", "split", "redo == True"),
        flow("again", "end", "redo == False")])
    (tmp_path / "loop.layerflow.yaml").write_text("merge:\n  humanConfirm: {timeout: 600}\n", encoding="utf-8")
    engine = Engine("memory://")
    instance = engine.run(load_process(loop), {}, answers={"confirmations": {"merge/level": "b"}})
    assert [w["task_id"] for w in instance.waiting_for] == ["review"], instance.waiting_for
    [asked] = [c for c in instance.confirmations if c["id"] == "merge/level"]
    assert may_ask_again(instance, asked)
    kept = engine.resume(instance.id, answers={"confirmations": {"merge/level": "a"}})
    assert kept.status == "waiting" and kept.main.resolve("level") == "b"
    # the join of test_known_gaps_16 (a person reviews after it, no loop): asked once, refused
    once = engine.run(load_process(_go(tmp_path)), {}, answers={"confirmations": {
        "merge/risk_level": "high", "merge/go_decision": "go", "merge/score": 5}})
    assert [w["task_id"] for w in once.waiting_for] == ["review"], once.waiting_for
    assert not may_ask_again(once, next(c for c in once.confirmations if c["id"] == "merge/risk_level"))
    with pytest.raises(AnsweredAlready, match='was already answered "high"'):
        engine.resume(once.id, answers={"confirmations": {"merge/risk_level": "low"}})


# ----- (d) the CLI's clock: --now on resume and timers -----------------------------------------------------------

def test_a_cli_user_fires_a_three_day_timer_with_now(cli: Any, tmp_path: Path) -> None:
    from datetime import datetime, timedelta

    from test_due_timers import timer_process

    started = run_json(cli, "run", str(timer_process(tmp_path, "wait_three_days", "P3D")), code=3)
    iid, [wait] = started["instance_id"], started["waiting_for"]
    due = datetime.fromisoformat(wait["due"])
    assert (wait["kind"], wait["task_id"]) == ("timer", "an_hour")
    assert run_json(cli, "timers")["due"] == []                                    # the wall clock: not due
    later = (due + timedelta(seconds=1)).isoformat()
    listed = run_json(cli, "timers", "--now", later)
    assert [(d["instance_id"], d["task_id"]) for d in listed["due"]] == [(iid, "an_hour")] and listed["fired"] == []
    early = run_json(cli, "resume", iid, "--now", (due - timedelta(hours=1)).isoformat(), code=3)
    assert early["status"] == "waiting" and early["waiting_for"] == started["waiting_for"]
    done = run_json(cli, "resume", iid, "--now", later)
    assert done["status"] == "completed" and done["layers"]["L3"]["done"] is True
    # timers --fire --now: the same, from cron or by hand
    other = run_json(cli, "run", str(timer_process(tmp_path, "wait_three_days", "P3D")), code=3)["instance_id"]
    fired = run_json(cli, "timers", "--fire", "--now", (due + timedelta(days=1)).isoformat())
    assert [(f["instance_id"], f["status"]) for f in fired["fired"]] == [(other, "completed")]


@pytest.mark.parametrize("now, said", [
    ("in three days", "is no ISO 8601 time"),
    ("2099-01-05T09:00:00", "has no time zone"),
    ("2001-01-05T09:00:00Z", "is in the past"),
])
def test_now_that_names_no_moment_ahead_is_refused(cli: Any, tmp_path: Path, now: str, said: str) -> None:
    from test_due_timers import timer_process

    iid = run_json(cli, "run", str(timer_process(tmp_path)), code=3)["instance_id"]
    for command in (("resume", iid), ("timers",)):
        result = cli(*command, "--now", now)
        assert result.exit_code == 2 and f"--now {now!r} {said}" in result.stderr, (command, result.stderr)
    assert run_json(cli, "inspect", iid)["status"] == "waiting"
