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
