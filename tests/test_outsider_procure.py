"""A procurement team and an incident-response team adopt layerflow from DESIGN.md and the README.

Two processes of their own, in tests/outsider_procure/:

- purchase_order.bpmn (+ budget_check.bpmn, called): a script prices the request, a call activity
  checks the budget against SYSTEM's budgets, a service task reserves the funds and throws the BPMN
  error ``ledger_locked`` while the ledger is locked (an error boundary event and a retry path back
  to it), legal (a person) and finance (a handler) review in parallel and both decide ``po_status``
  (a policy rule suggests ``needs_cfo`` and asks a person; ``review_notes`` is an ``append`` reducer),
  the PO is sent and an event-based gateway waits for the supplier's message or 48 hours.
- incident_response.bpmn: a model step (offline: its handler stands in for the model) triages the
  alert from the runbooks, an inclusive gateway pages on-call and/or security (both write
  ``notified``: a person decides), a sub-process isolates the host and collects bulky logs, and the
  post-mortem's config compresses HISTORY (extract_keys, summarize; preserved keys survive).

Driven as a user would: the CLI (click's runner, in this process: stdin is no terminal, as in a
script), the REST API on a real HTTP server, and the public Python names.

Found on the way (each test below says what it was): a misspelt join key given to the resume that
reaches the join went unnamed (CLI stderr, REST notices); a refused `rollback`/`snapshot --json` printed
an empty document, not the instance; a query template's key the context lacks emptied the retrieval
unseen; `tape` had no `--limit`; an escalated join named no CLI way to settle it; a policy rule that
could not be evaluated left no trace in the resolution the ranking made.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import traceback
from pathlib import Path
from typing import Any

import local_http as http
import pytest

ROOT = Path(__file__).resolve().parent.parent
HERE = Path(__file__).resolve().parent / "outsider_procure"
PO = [str(HERE / "purchase_order.bpmn"), str(HERE / "budget_check.bpmn")]
INCIDENT = str(HERE / "incident_response.bpmn")
REQUEST = {"request_id": "R-1", "quantity": 30, "unit_price": 500, "cost_centre": "CC-100", "supplier": "ACME",
           "ledger_locked_times": 1}
ALERT = {"alert_id": "A-7", "host": "web-3", "alert_text": "suspicious login on production host web-3"}
LEGAL = '{"po_status": "changes_requested", "review_notes": ["legal: framework agreement missing"]}'
DOCUMENT = {"instance_id": str, "process_id": str, "status": str, "error": (dict, type(None)), "layers": dict,
            "tokens": dict, "conflicts": list, "compressions": list, "confirmations": list, "waiting_for": list,
            "tape_length": int}
LAYERS = ["L0", "L1", "L2", "L3", "L4", "L5"]


def cli(*args: str) -> tuple[int, dict[str, Any], str]:
    """``layerflow ARGS --json`` in this process; an exception the command lets out is on stderr."""
    from click.testing import CliRunner

    from engine.cli import main

    with contextlib.chdir(ROOT):
        result = CliRunner(env={"LAYERFLOW_STORE": None}).invoke(main, [*args, "--json"], input="",
                                                                  prog_name="layerflow")
    stderr = result.stderr
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        stderr += "".join(traceback.format_exception(result.exception))
    assert "Traceback (most recent call last)" not in stderr, stderr
    assert result.stdout.strip(), f"--json printed nothing; stderr: {stderr}"
    return result.exit_code, json.loads(result.stdout), stderr


def check_document(doc: dict[str, Any]) -> None:
    """DESIGN.md's `run --json` shape: every field, of its type; layers and tokens per layer."""
    for name, kind in DOCUMENT.items():
        assert isinstance(doc[name], kind), (name, doc[name])
    assert doc["status"] in ("completed", "waiting", "error")
    assert list(doc["layers"]) == LAYERS
    assert set(doc["tokens"]) == {*LAYERS, "total"} and doc["tokens"]["total"] == sum(doc["tokens"][n] for n in LAYERS)
    for conflict in doc["conflicts"]:
        assert {"gateway_id", "layer", "key", "base_value", "values", "resolution"} <= set(conflict)
    for item in doc["compressions"]:
        assert {"activity_id", "triggers", "tokens_before", "tokens_after", "snapshot_id"} <= set(item)
    for item in doc["confirmations"]:
        assert {"id", "type", "message", "options", "answer", "timed_out"} <= set(item)
    for item in doc["waiting_for"]:
        assert item["kind"] in ("user_task", "confirmation", "timer", "event") and {"id", "task_id"} <= set(item)


@pytest.fixture
def store(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'procure.db'}"


def start_po(store: str, data: dict[str, Any] | None = None) -> str:
    code, doc, err = cli("run", *PO, "--data", json.dumps(data or REQUEST), "--store", store)
    assert code == 3 and doc["status"] == "waiting", (doc, err)
    return str(doc["instance_id"])


# ------------------------------------------------------------------ answers that go unused


def test_a_misspelt_join_key_given_to_the_resume_that_reaches_the_join_is_named_unused(store: str) -> None:
    """`--answer reviews_join/po_stauts=...` given to the resume that answers legal and so reaches the
    join: the join asks about po_status, never po_stauts. The README promises that a key of a join that
    never met that context key is named on stderr at the end; stderr said only "it is kept for a later
    step", and the run ended waiting with the misspelt answer silently dropped."""
    iid = start_po(store)
    code, doc, err = cli("resume", iid, "--store", store, "--answer", f"legal_review={LEGAL}",
                         "--answer", "reviews_join/po_stauts=needs_cfo")
    assert code == 3 and [w["id"] for w in doc["waiting_for"]] == ["reviews_join/po_status"], (doc, err)
    assert "join 'reviews_join' met no conflict on 'po_stauts'" in err, err
    assert "'reviews_join/po_status'" in err.split("po_stauts'", 2)[-1], err   # what it did ask


def test_rest_resume_names_a_misspelt_join_key_in_its_notices(tmp_path: Path) -> None:
    """REST's notices are "what stderr would say": a resume whose answers file names a join's
    context key the join never met answered 200 with `"notices": []`, the answer dropped unseen."""
    from engine import create_app
    from tests.engine.governance_helpers import ServerThread

    catalog = tmp_path / "catalog"
    shutil.copytree(HERE, catalog)
    headers = {"Authorization": "Bearer t0k"}
    with ServerThread(create_app(f"sqlite:///{tmp_path / 'rest.db'}", catalog, token="t0k")) as server:
        started = http.post(f"{server.url}/api/instances", headers=headers,
                            json={"process_id": "purchase_order", "data": REQUEST})
        assert started.status_code == 201, started.text
        iid = started.json()["instance_id"]
        answers = {"user_tasks": {"legal_review": json.loads(LEGAL)},
                   "confirmations": {"reviews_join/po_stauts": "needs_cfo"}}
        resumed = http.post(f"{server.url}/api/instances/{iid}/resume", headers=headers, json={"answers": answers})
        assert resumed.status_code == 200, resumed.text
        doc = resumed.json()
        assert [w["id"] for w in doc["waiting_for"]] == ["reviews_join/po_status"]
        assert any("met no conflict on 'po_stauts'" in n for n in doc["notices"]), doc["notices"]


# ------------------------------------------------------------------ refusals of a found instance


@pytest.mark.parametrize(("args", "kind"), [
    (["rollback", "{iid}", "snap:main:999"], "not_found"),             # a snapshot id mistyped
    (["rollback", "{iid}", "{snap}"], "invalid_state"),                # main while its branches are open
    (["rollback", "{iid}", "{snap}", "--layers", "L1"], "bad_input"),  # PROCESS never rolls back
    (["snapshot", "{iid}", "--context", "legal_reveiw"], "not_found"),
])
def test_a_refused_rollback_or_snapshot_shows_the_instance_as_it_is(store: str, args: list[str], kind: str) -> None:
    """README: a command refused as bad input (exit 2) once it found its instance gives the instance as
    it is (its layers, `waiting_for`, `instance_status`), nothing of the command applied. `rollback`
    and `snapshot` printed the empty document of a failure before any instance exists: no layers,
    `"waiting_for": []`, `"status": "error"` with no `instance_status`, so a script read a purchase
    order that waits for legal's review as one that had failed and waits for nothing."""
    iid = start_po(store)
    _, before, _ = cli("inspect", iid, "--store", store)
    [split] = [s for s in cli("snapshot", iid, "--list", "--store", store)[1]["snapshots"]
               if s["label"] == "split:reviews"]
    given = [a.format(iid=iid, snap=split["snapshot_id"]) for a in args]
    code, doc, err = cli(*given, "--store", store)
    assert code == 2 and doc["status"] == "error" and doc["error"]["kind"] == kind, (doc, err)
    assert doc["error"]["instance_status"] == "waiting", doc["error"]
    assert doc["instance_id"] == iid and doc["layers"] == before["layers"]
    assert [w["task_id"] for w in doc["waiting_for"]] == ["legal_review"]
    assert doc["tape_length"] == before["tape_length"]                 # nothing applied


# ------------------------------------------------------------------ the purchase order, end to end


def test_both_processes_validate() -> None:
    for files in (PO, [INCIDENT]):
        code, report, err = cli("validate", *files)
        assert code == 0 and report["ok"] is True, (report, err)
        assert [p for p in report["problems"] if p["severity"] == "error"] == []


def test_purchase_order_through_the_cli(store: str) -> None:
    code, doc, err = cli("run", *PO, "--data", json.dumps(REQUEST), "--store", store)
    assert code == 3, (doc, err)
    check_document(doc)
    iid = doc["instance_id"]
    assert doc["process_id"] == "purchase_order" and doc["error"] is None
    assert [(w["kind"], w["task_id"]) for w in doc["waiting_for"]] == [("user_task", "legal_review")]
    history = doc["layers"]["L3"]
    # the ledger was locked once: the error boundary caught it, the retry path counted, the second try reserved
    assert history["activity:reserve_funds"]["status"] == "error_thrown"
    assert history["activity:reserve_funds"]["caught_by"] == ["ledger_locked"]
    assert history["error_code"] == "ledger_locked" and history["locked_by"] == "month_end_close"
    assert history["activity:reserve_funds#2"]["status"] == "completed"
    assert history["reserve_attempts"] == 1 and history["reservation_id"] == "RES-R-1" and history["reserved"] == 15000
    # the called process read SYSTEM's budgets and wrote into the caller's context
    assert history["budget_left"] == 35000 and history["budget_ok"] is True
    assert doc["layers"]["L1"] == {k: REQUEST[k] for k in sorted(REQUEST)}

    code, doc, err = cli("resume", iid, "--store", store, "--answer", f"legal_review={LEGAL}")
    assert code == 3, (doc, err)
    check_document(doc)
    [conflict] = doc["conflicts"]
    assert conflict["gateway_id"] == "reviews_join" and conflict["key"] == "po_status" and conflict["layer"] == "L4"
    assert conflict["values"] == {"legal_review": "changes_requested", "finance_review": "approved"}
    assert conflict["base_value"] is None and conflict["base_absent"] is True and conflict["resolution"] is None
    [question] = doc["confirmations"]
    assert question["id"] == "reviews_join/po_status" and question["suggested"] == "needs_cfo"
    assert [o["value"] for o in question["options"]] == ["changes_requested", "approved", "needs_cfo", "$escalate"]
    assert [w["id"] for w in doc["waiting_for"]] == ["reviews_join/po_status"]
    assert "po_status" not in doc["layers"]["L3"]          # a join waiting for a person has changed nothing yet

    code, doc, err = cli("resume", iid, "--store", store, "--answer", "reviews_join/po_status=needs_cfo", "--by", "carol")
    assert code == 3, (doc, err)
    [conflict] = doc["conflicts"]
    assert conflict["resolution"]["value"] == "needs_cfo" and conflict["resolution"]["resolver"] == "human"
    history = doc["layers"]["L3"]
    assert history["po_status"] == "needs_cfo" and history["po_number"] == "PO-R-1"
    assert history["review_notes"] == ["legal: framework agreement missing", "finance: checked against budget"]
    assert "review_type" not in history and "review_type" not in doc["layers"]["L4"]   # injected, left: gone
    [logged] = history["_mergedConflicts"]
    assert logged["resolution"]["by"] == "carol" and logged["sourceBranches"] == ["legal_review", "finance_review"]
    assert sorted(w["kind"] for w in doc["waiting_for"]) == ["event", "timer"]
    assert {w["gateway_id"] for w in doc["waiting_for"]} == {"await_supplier"}

    code, doc, err = cli("send", iid, "supplier_ack", "--json-payload", '{"delivery_date": "2026-12-20"}',
                         "--store", store)
    assert code == 0 and doc["status"] == "completed" and doc["waiting_for"] == [], (doc, err)
    assert doc["layers"]["L3"]["po_state"] == "acknowledged" and doc["layers"]["L3"]["delivery_date"] == "2026-12-20"

    # the tape rebuilds the context: replay without --until is the context now, byte for byte
    _, inspected, _ = cli("inspect", iid, "--store", store)
    _, replayed, _ = cli("replay", iid, "--store", store)
    assert replayed["layers"] == inspected["layers"] == doc["layers"]
    assert inspected["tape_length"] == doc["tape_length"] and "reservation_id" in inspected["preserved"]
    _, events, _ = cli("tape", iid, "--store", store, "--kind", "conflict")
    assert [e["data"]["key"] for e in events] == ["po_status"]
    [split] = [e for e in cli("tape", iid, "--store", store, "--kind", "split")[1]]
    _, before, _ = cli("replay", iid, "--store", store, "--until", str(split["seq"]))
    assert "po_status" not in before["layers"]["L3"] and before["layers"]["L3"]["reservation_id"] == "RES-R-1"
    from context_layers import LayeredContext

    _, whole, _ = cli("tape", iid, "--store", store)
    assert LayeredContext.replay(whole, name="legal_review").layer(3)["po_status"] == "changes_requested"


def test_a_silent_supplier_takes_the_timer_branch_and_nobody_answering_takes_the_default(store: str) -> None:
    iid = start_po(store, {**REQUEST, "ledger_locked_times": 0})
    code, doc, err = cli("resume", iid, "--store", store, "--answer", f"legal_review={LEGAL}")
    assert code == 3 and doc["waiting_for"][0]["kind"] == "confirmation", (doc, err)
    deadline = doc["waiting_for"][0]["due"]
    # three days on: the confirmation timed out first (the configured default), then the 48 h timer
    from datetime import datetime, timedelta

    later = datetime.fromisoformat(deadline) + timedelta(days=3)
    code, doc, err = cli("resume", iid, "--store", store, "--now", later.isoformat())
    assert code == 3 and [w["kind"] for w in doc["waiting_for"]] == ["timer", "event"], (doc, err)
    [timer] = [w for w in doc["waiting_for"] if w["kind"] == "timer"]
    # counted from that resume's NOW (the clock runs on from there at the wall clock's pace)
    assert abs((datetime.fromisoformat(timer["due"]) - (later + timedelta(hours=48))).total_seconds()) < 5
    code, doc, err = cli("resume", iid, "--store", store, "--now", (later + timedelta(hours=49)).isoformat())
    assert code == 0 and doc["status"] == "completed", (doc, err)
    [conflict] = doc["conflicts"]
    assert conflict["resolution"]["value"] == "needs_cfo" and conflict["resolution"]["resolver"] == "policy"
    assert "no answer within 3600s" in conflict["resolution"]["reason"]
    assert doc["confirmations"][0]["timed_out"] is True
    assert doc["layers"]["L3"]["po_state"] == "chased" and "delivery_date" not in doc["layers"]["L3"]
    code, doc, err = cli("send", iid, "supplier_ack", "--json-payload", "{}", "--store", store)
    assert code == 2 and doc["error"]["instance_status"] == "completed", (doc, err)


# ------------------------------------------------------------------ what a user gets wrong


@pytest.mark.parametrize(("edit", "field", "element", "says"), [
    (("mergeStrategy:", "mergeStrategey:"), "mergeStrategey", "reviews_join", "did you mean 'mergeStrategy'"),
    (("{timeout: 3600", "{timout: 3600"), "humanConfirm.timout", "reviews_join", "did you mean 'timeout'"),
    (("\nfinance_review:", "\nfinance_reveiw:"), None, "finance_reveiw", "did you mean 'finance_review'"),
    (("append}", "appendd}"), "reducers.review_notes", "reviews_join", "'append', 'union'"),
    (("- id: legal_review", "- id: legal_reveiw"), "branches.0.id", "reviews", "did you mean 'legal_review'"),
    (("py:reserve_funds", "py:reserve_fund"), "handler", "reserve_funds", "did you mean 'reserve_funds'"),
    (("[rejected, changes_requested, approved]", "rejected"), "conflictPolicy.rankings.po_status", "reviews_join",
     "Input should be a valid list"),
])
def test_config_typos_are_named_with_file_line_element_and_field(tmp_path: Path, edit: tuple[str, str],
                                                               field: str | None, element: str, says: str) -> None:
    shutil.copytree(HERE, tmp_path / "p")
    config = tmp_path / "p" / "purchase_order.layerflow.yaml"
    text = config.read_text()
    assert edit[0] in text
    config.write_text(text.replace(edit[0], edit[1], 1))
    code, report, err = cli("validate", str(tmp_path / "p" / "purchase_order.bpmn"),
                            str(tmp_path / "p" / "budget_check.bpmn"))
    assert code == 2 and report["ok"] is False, (report, err)
    [problem] = [p for p in report["problems"] if p["severity"] == "error"]
    assert problem["file"].endswith("purchase_order.layerflow.yaml") and isinstance(problem["line"], int)
    assert problem["element_id"] == element and says in problem["text"], problem
    if field is not None:
        assert problem["field"] == field, problem
    # run refuses it the same way: nothing starts, no store is made
    db = tmp_path / "none.db"
    code, doc, err = cli("run", str(tmp_path / "p" / "purchase_order.bpmn"), str(tmp_path / "p" / "budget_check.bpmn"),
                         "--data", json.dumps(REQUEST), "--store", f"sqlite:///{db}")
    assert code == 2 and doc["instance_id"] is None and says in doc["error"]["message"], (doc, err)
    assert not db.exists()


@pytest.mark.parametrize(("answers", "says"), [
    ({"user_tasks": {"legal_reveiw": {"po_status": "x"}}}, "user_tasks names 'legal_reveiw'"),
    ({"user_tasks": {"legal_review": "approved"}}, "must be an object of the task's fields"),
    ({"usertasks": {"legal_review": {}}}, "did you mean 'user_tasks'"),
    ({"confirmations": {"review_join/po_status": "needs_cfo"}}, "can match no confirmation"),
    ([{"legal_review": {}}], "must hold an object"),
])
def test_answers_of_the_wrong_shape_are_refused_before_anything_runs(tmp_path: Path, store: str,
                                                                     answers: Any, says: str) -> None:
    path = tmp_path / "answers.json"
    path.write_text(json.dumps(answers))
    code, doc, err = cli("run", *PO, "--data", json.dumps(REQUEST), "--answers", str(path), "--store", store)
    assert code == 2 and doc["instance_id"] is None and says in doc["error"]["message"], (doc, err)
    assert str(path) in doc["error"]["message"]


def test_answers_a_resume_refuses_leave_the_instance_as_it_was(store: str) -> None:
    iid = start_po(store)
    code, doc, err = cli("resume", iid, "--store", store, "--answer", "legal_review=approved")
    assert code == 2 and "answer it with a JSON object" in doc["error"]["message"], (doc, err)
    code, doc, err = cli("resume", iid, "--store", store, "--answer", f"legal_review={LEGAL}")
    assert code == 3
    length = doc["tape_length"]
    code, doc, err = cli("resume", iid, "--store", store, "--answer", "reviews_join/po_status=maybe")
    assert code == 2 and doc["error"]["kind"] == "invalid_answer" and '"needs_cfo"' in doc["error"]["message"]
    assert doc["error"]["instance_status"] == "waiting" and doc["waiting_for"][0]["id"] == "reviews_join/po_status"
    code, doc, err = cli("send", iid, "supplier_akc", "--json-payload", "{}", "--store", store)
    assert code == 2 and "does not wait for message 'supplier_akc'" in doc["error"]["message"]
    code, doc, err = cli("resume", iid, "--store", store, "--set", "quantity=31")
    assert code == 2 and "has open branches (finance_review, legal_review)" in doc["error"]["message"]
    code, doc, err = cli("resume", iid, "--store", store, "--set", "quantity=31", "--context", "legal_review")
    assert code == 2 and "PROCESS keys (the start data) are fixed" in doc["error"]["message"], (doc, err)
    assert cli("inspect", iid, "--store", store)[1]["tape_length"] >= length
    assert cli("inspect", iid, "--store", store)[1]["layers"]["L1"]["quantity"] == 30


# ------------------------------------------------------------------ the incident response


def test_incident_response_through_the_cli(store: str) -> None:
    code, doc, err = cli("run", INCIDENT, "--data", json.dumps(ALERT), "--store", store)
    assert code == 3, (doc, err)
    # critical and security: the inclusive gateway took both conditional flows, not the default
    assert sorted(c["branch_id"] for c in doc["contexts"].values()) == ["notify_security", "page_oncall"]
    [conflict] = doc["conflicts"]
    assert conflict["key"] == "notified" and conflict["values"] == {"page_oncall": "oncall", "notify_security": "security"}
    iid = doc["instance_id"]
    code, doc, err = cli("resume", iid, "--store", store, "--answer", "notify_join/notified=security")
    assert code == 0 and doc["status"] == "completed", (doc, err)
    check_document(doc)
    history = doc["layers"]["L3"]
    # the model step (its offline handler) and the preserved keys survive the post-mortem's compression
    assert (history["severity"], history["category"]) == ("critical", "security")
    assert history["isolation"] == {"host": "web-3", "status": "isolated"}
    assert history["postmortem"] == "critical security incident on web-3: contained (isolated)"
    [compression] = doc["compressions"]
    assert compression["activity_id"] == "postmortem" and "token_threshold" in compression["triggers"]
    assert compression["tokens_after"] < compression["tokens_before"]
    assert doc["tokens"]["L3"] < 400 < compression["tokens_before"]
    record = history[compression["compaction_key"]]
    assert record["kept"] == [f"tool_call_result_{n}: data.id: LOG-{n}; status: ok" for n in range(3)]
    assert not any(k.startswith("tool_call_result") for k in history)
    assert "paged" not in history and "tool_call_result_0" in compression["folded"]
    assert {r["pattern"]: r["entries"] for r in compression["rules"]} == {"tool_call_result": 3, "reasoning_chain": 1}
    # the tape holds what the compression folded: replay to the snapshot it took, and roll HISTORY back to it
    seq = int(compression["snapshot_id"].rsplit(":", 1)[1])
    _, before, _ = cli("replay", iid, "--store", store, "--until", str(seq))
    assert before["layers"]["L3"]["paged"] == ["oncall-sre", "secops"]           # the union reducer
    assert before["layers"]["L3"]["tool_call_result_2"]["data"]["lines"][0].startswith("web-3 sshd[1000]")
    code, rolled, err = cli("rollback", iid, compression["snapshot_id"], "--layers", "L3", "--store", store,
                            "--reason", "audit the raw logs")
    assert code == 0 and rolled["restored_layers"] == ["L3"], (rolled, err)
    assert rolled["layers"]["L3"] == before["layers"]["L3"] | {k: v for k, v in history.items()
                                                               if k not in before["layers"]["L3"]
                                                               and not k.startswith("compaction:")}
    _, now, _ = cli("inspect", iid, "--store", store)
    assert now["compressions"][0]["undone"]["by"] == "rollback"
    assert cli("replay", iid, "--store", store)[1]["layers"] == now["layers"]


def test_incident_with_a_fake_model_arbiter_and_the_default_path_through_python() -> None:
    from context_layers import LayeredContext
    from engine import Engine, load_process
    from gateways.arbiter import ArbitrationAnswer

    class Arbiter:                      # the deterministic stand-in for the model at the join
        def __init__(self) -> None:
            self.asked: list[Any] = []

        def arbitrate(self, request: Any) -> ArbitrationAnswer:
            self.asked.append(request)
            return ArbitrationAnswer(final_value="security", rationale="a login alert is security's first")

    arbiter = Arbiter()
    engine = Engine("memory://", arbiter=arbiter)
    process = load_process(INCIDENT)
    instance = engine.run(process, ALERT)
    assert instance.status == "completed", instance.error
    [request] = arbiter.asked
    assert request.key == "notified" and dict(request.values) == {"page_oncall": "oncall", "notify_security": "security"}
    assert request.policy_text == "Critical production incidents page on-call; security incidents notify security."
    [conflict] = instance.to_document()["conflicts"]
    assert conflict["resolution"] == {"value": "security", "resolver": "model",
                                      "reason": "a login alert is security's first"}
    assert LayeredContext.replay(instance.main.tape) == instance.main
    # neither condition holds: only the default flow (a ticket), no conflict, nothing asked
    quiet = engine.run(process, {"alert_id": "A-8", "host": "web-4", "alert_text": "disk latency on staging"})
    assert quiet.status == "completed" and len(arbiter.asked) == 1
    assert [c["branch_id"] for c in quiet.to_document()["contexts"].values()] == ["log_ticket"]
    assert "ticket: INC-A-8" in quiet.main.resolve("compaction:1")["summary"]


def test_incident_and_purchase_order_through_rest(tmp_path: Path) -> None:
    from engine import create_app
    from tests.engine.governance_helpers import ServerThread

    catalog = tmp_path / "catalog"
    shutil.copytree(HERE, catalog)
    headers = {"Authorization": "Bearer t0k"}
    with ServerThread(create_app(f"sqlite:///{tmp_path / 'rest.db'}", catalog, token="t0k")) as server:
        api = server.url + "/api"
        assert http.get(f"{api}/instances").status_code == 401
        listed = http.get(f"{api}/processes", headers=headers).json()
        assert {p["id"] for p in listed} >= {"purchase_order", "incident_response", "budget_check"}
        started = http.post(f"{api}/instances", headers=headers, json={
            "process_id": "incident_response", "data": ALERT,
            "answers": {"confirmations": {"notify_join/notified": "oncall"}}})
        assert started.status_code == 201, started.text
        doc = started.json()
        check_document(doc)
        iid = doc["instance_id"]
        assert doc["status"] == "completed" and doc["notices"] == []
        evaluated = http.post(f"{api}/context-governance/compress", headers=headers,
                              json={"instance_id": iid, "action": "evaluate"}).json()
        assert evaluated["preserved_intact"] is True
        assert set(evaluated["checked_preserved"]) == {"severity", "category", "isolation"}
        undone = http.post(f"{api}/context-governance/compress", headers=headers,
                           json={"instance_id": iid, "action": "decompress"}).json()
        assert undone["tokens_after"] == evaluated["tokens_before"]
        doc = http.get(f"{api}/instances/{iid}", headers=headers).json()
        assert doc["layers"]["L3"]["notified"] == "oncall" and "tool_call_result_1" in doc["layers"]["L3"]
        assert doc["compressions"][0]["undone"]["by"] == "decompress"
        tape = http.get(f"{api}/instances/{iid}/tape", headers=headers, params={"kind": "human_decision"}).json()
        assert [e["data"]["value"] for e in tape["events"]] == ["oncall"]

        # the purchase order: a person in a parallel branch, the join's question, the supplier's message
        po = http.post(f"{api}/instances", headers=headers, json={"process_id": "purchase_order", "data": REQUEST}).json()
        pid = po["instance_id"]
        typo = http.post(f"{api}/instances/{pid}/user-tasks/legal_reveiw", headers=headers, json={"data": {}})
        # a task id the process lacks is a wrong address (404, naming the likely task), no state (409)
        assert typo.status_code == 404 and "legal_review" in typo.json()["error"]["message"]
        done = http.post(f"{api}/instances/{pid}/user-tasks/legal_review", headers=headers,
                         json={"data": json.loads(LEGAL), "user": "lena"}).json()
        assert [w["id"] for w in done["waiting_for"]] == ["reviews_join/po_status"]
        wrong = http.post(f"{api}/confirmations/reviews_join/po_status", headers=headers,
                          json={"value": "maybe", "instance_id": pid})
        assert wrong.status_code == 400 and wrong.json()["error"]["kind"] == "invalid_answer"
        answered = http.post(f"{api}/confirmations/reviews_join/po_status", headers=headers,
                             json={"value": "needs_cfo", "instance_id": pid, "user": "carol"})
        assert answered.status_code == 200, answered.text
        again = http.post(f"{api}/confirmations/reviews_join/po_status", headers=headers,
                          json={"value": "approved", "instance_id": pid})
        assert again.status_code == 409 and again.json()["error"]["kind"] == "already_answered"
        denied = http.post(f"{api}/context-governance/inject", headers=headers,
                           json={"instance_id": pid, "key": "quantity", "value": 31})
        assert denied.status_code == 403 and denied.json()["error"]["key"] == "quantity"
        sent = http.post(f"{api}/instances/{pid}/events", headers=headers,
                         json={"name": "supplier_ack", "payload": {"delivery_date": "2026-12-24"}}).json()
        assert sent["status"] == "completed" and sent["layers"]["L3"]["delivery_date"] == "2026-12-24"
        replayed = http.get(f"{api}/instances/{pid}/replay", headers=headers).json()
        assert {k["key"]: k["value"] for k in replayed["layers"]["L3"]["keys"]} == sent["layers"]["L3"]


def test_a_query_template_naming_a_key_the_context_lacks_is_named_on_the_retrieval_note(tmp_path: Path) -> None:
    """`knowledgeConfig.query: "{alert_txt}"` (for alert_text): the query came out empty, the triage
    found no runbook, and the retrieval note said only `query: "", kept: 0`: nothing told the team
    that the template named a key the context does not hold. The note now names it (`absent`), and
    the plain `tape` listing shows the retrieval's query and counts."""
    shutil.copytree(HERE, tmp_path / "p")
    config = tmp_path / "p" / "incident_response.layerflow.yaml"
    config.write_text(config.read_text().replace('query: "{alert_text}"', 'query: "runbook {alert_txt} {host}"'))
    store = f"sqlite:///{tmp_path / 'q.db'}"
    code, doc, err = cli("run", str(tmp_path / "p" / "incident_response.bpmn"), "--data", json.dumps(ALERT),
                         "--answer", "notify_join/notified=security", "--store", store)
    assert code == 0, (doc, err)
    _, [note], _ = cli("tape", doc["instance_id"], "--kind", "retrieval", "--store", store)
    assert note["data"]["query"] == "runbook  web-3" and note["data"]["absent"] == ["alert_txt"], note
    from click.testing import CliRunner

    from engine.cli import main

    plain = CliRunner(env={"LAYERFLOW_STORE": None}).invoke(main, ["tape", doc["instance_id"], "--kind", "retrieval",
                                                                   "--store", store])
    assert "absent=[\"alert_txt\"]" in plain.stdout and "query=\"runbook  web-3\"" in plain.stdout, plain.stdout


def test_tape_takes_limit_as_the_rest_tape_does(store: str) -> None:
    """README: REST's tape filters are "as `layerflow tape`: context, kind, activity, branch, key, since,
    limit"; `layerflow tape ID --limit 5` answered "No such option: --limit" (exit 2)."""
    iid = start_po(store)
    _, whole, _ = cli("tape", iid, "--store", store)
    code, first, err = cli("tape", iid, "--store", store, "--since", "3", "--limit", "4")
    assert code == 0, err
    assert first == [e for e in whole if e["seq"] >= 3][:4] and len(first) == 4
    code, doc, err = cli("tape", iid, "--store", store, "--limit", "0")
    assert code == 2 and "--limit" in doc["error"]["message"], (doc, err)


def test_an_escalated_join_tells_a_cli_user_how_to_settle_it_from_the_cli(store: str) -> None:
    """A person escalates the join's question: the instance fails at the join, and its error said only
    "given as runtime config (POST /api/context-governance/config)": a team that runs layerflow from the
    CLI on a sqlite file has no server. The README's other way, correcting a branch's own value with
    `resume --set KEY=VALUE --context BRANCH_ID`, is named now, and it settles the join."""
    iid = start_po(store)
    code, doc, err = cli("resume", iid, "--store", store, "--answer", 'legal_review={"po_status": "rejected"}',
                         "--answer", "reviews_join/po_status=$escalate")
    assert code == 1 and doc["error"]["kind"] == "merge_conflict", (doc, err)
    message = doc["error"]["message"]
    assert "POST /api/context-governance/config" in message
    # the id is the instance's, as a person pastes it (it read `resume ID`); the plain output adds the store
    assert (f"layerflow resume {iid} --set po_status=VALUE --context BRANCH_ID` (the branches: "
            "legal_review, finance_review)") in message, message
    assert f"(`layerflow resume {iid}`)" in message, message
    from click.testing import CliRunner

    from engine.cli import main

    shown = CliRunner(env={"LAYERFLOW_STORE": None}).invoke(main, ["inspect", iid, "--store", store])
    assert f"`layerflow resume {iid} --store {store} --set po_status=VALUE" in " ".join(shown.stdout.split()), shown.stdout
    code, doc, err = cli("resume", iid, "--store", store, "--set", "po_status=rejected", "--context", "finance_review")
    assert code == 3 and doc["error"] is None and doc["layers"]["L3"]["po_status"] == "rejected", (doc, err)


def test_a_policy_rule_that_cannot_be_evaluated_is_named_in_the_resolution_it_left_to_the_ranking(tmp_path: Path) -> None:
    """The CFO rule's `when` misspelt (`requested_totl > 10000`): the rule does not apply (DESIGN of the
    expressions: an absent key means the rule does not apply, the caller records why), and the ranking
    settled po_status. The why was only a `resolution` note on the tape; the resolution itself, which
    `run --json`, `_mergedConflicts` and the summary show, read as if the ranking were the policy's whole
    answer, so nobody learnt that the CFO rule had never been evaluated. Its reason now says so."""
    shutil.copytree(HERE, tmp_path / "p")
    config = tmp_path / "p" / "purchase_order.layerflow.yaml"
    config.write_text(config.read_text().replace("requested_total > 10000", "requested_totl > 10000"))
    files = [str(tmp_path / "p" / "purchase_order.bpmn"), str(tmp_path / "p" / "budget_check.bpmn")]
    code, doc, err = cli("run", *files, "--data", json.dumps(REQUEST), "--answer", f"legal_review={LEGAL}",
                         "--store", f"sqlite:///{tmp_path / 'rule.db'}")
    assert code == 3, (doc, err)
    [conflict] = doc["conflicts"]
    reason = conflict["resolution"]["reason"]
    assert conflict["resolution"]["resolver"] == "policy" and conflict["resolution"]["value"] == "changes_requested"
    assert reason.startswith("policy ranking for 'po_status'"), reason
    assert "rule 0 (when 'requested_totl > 10000') did not apply: unknown name 'requested_totl'" in reason, reason
    assert doc["layers"]["L3"]["_mergedConflicts"][0]["resolution"]["reason"] == reason


def test_a_scripted_run_answers_every_person_in_advance(tmp_path: Path, store: str) -> None:
    """`run --answers FILE`, as CI runs it: legal's review and the join's question answered before they
    come; the run stops only where no person can help (the supplier's message or its timer), and says
    nothing of unused answers, since every one was used."""
    answers = tmp_path / "answers.json"
    answers.write_text(json.dumps({"user_tasks": {"legal_review": json.loads(LEGAL)},
                                   "confirmations": {"reviews_join/po_status": "needs_cfo"}}))
    code, doc, err = cli("run", *PO, "--data", json.dumps(REQUEST), "--answers", str(answers), "--store", store)
    assert code == 3 and doc["error"] is None, (doc, err)
    assert sorted(w["kind"] for w in doc["waiting_for"]) == ["event", "timer"]
    assert doc["conflicts"][0]["resolution"]["value"] == "needs_cfo" and doc["confirmations"][0]["answer"] == "needs_cfo"
    assert "not used" not in err and "matches no confirmation" not in err, err
