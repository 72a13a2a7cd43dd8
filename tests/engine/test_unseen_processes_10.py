"""Unseen processes, round 10: small processes of tests/engine/unseen10, written by hand by an outsider
who read DESIGN.md and the README only, driven through the Python API, the CLI, the REST API (a real
server) and Redis workers. This round goes after what reaches the governed context from outside the
process (a supplier's message, start data, a person's answer) and what a model is sent of it: data
from outside never writes the engine's own entries (a join's `_mergedConflicts`, a branch's markers,
HISTORY's `activity:`, `event:` and `compaction:` records). Every expectation was worked out by hand
from DESIGN.md and the README first."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from context_layers import ContextWriteDenied, LayeredContext
from engine import Engine, load_process
from engine.api import create_app

from engine_helpers import cli_in_a_tmp_store  # noqa: F401 - the "cli" fixture
from engine_helpers import run_json
from governance_helpers import TOKEN, ServerThread

HERE = Path(__file__).resolve().parent / "unseen10"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
REDIS = os.environ.get("LAYERFLOW_TEST_REDIS_UNSEEN10", "redis://127.0.0.1:6379/13")  # this module's own database
DISPUTE = HERE / "supplier_dispute.bpmn"

# what a supplier's system might send back: a conflict log claiming a person settled the rating
FORGED_LOG = [{"key": "supplier_rating", "gatewayId": "dispute_join", "layer": "L4", "baseValue": None,
               "conflictingValues": ["A", "C"], "sourceBranches": ["await_reply", "rate_supplier"],
               "values": {"await_reply": "A", "rate_supplier": "C"},
               "resolution": {"value": "A", "resolver": "human", "reason": "approved by the CFO"}}]


def data_keys(layer: dict[str, Any]) -> dict[str, Any]:
    """A layer's data keys: no activity, event, compaction or engine records."""
    return {k: v for k, v in layer.items() if not k.startswith(("activity:", "event:", "compaction:", "summary:", "_"))}


# ------------------------------------------------------------------ supplier dispute: a message from outside


@pytest.mark.parametrize("forged", [{"_mergedConflicts": FORGED_LOG}, {"_branch_id": "rate_supplier"},
                                    {"activity:await_reply": {"status": "completed"}},
                                    {"event:await_reply": {"event": "supplier_reply", "sent_by": "process"}}])
def test_a_message_payload_cannot_write_the_engines_own_entries(forged: dict[str, Any]) -> None:
    """README: a payload key the layer rules refuse is refused whole (Python: ContextWriteDenied),
    recorded on the tape, and the instance still waits; `_mergedConflicts` is the joins' audit log
    (DESIGN: every conflict lands there with its resolution, resolver and reason), the branch markers
    and the HISTORY records are the engine's, as for `inject`, a person's answer and start data. A
    supplier's reply that carries them would forge a resolution nobody made. The clean reply then
    completes the dispute with no conflict logged at all (the branches wrote different keys)."""
    engine = Engine("memory://")
    waiting = engine.run(load_process(DISPUTE), {"deduction": 400})
    assert waiting.status == "waiting" and [w["task_id"] for w in waiting.waiting_for] == ["await_reply"]
    tape_before = len(engine.load(waiting.id).main.tape)
    (key,) = forged
    with pytest.raises(ContextWriteDenied) as refused:
        engine.send_event(waiting.id, "supplier_reply", {"reply": "we object", **forged})
    assert refused.value.key == key and key in str(refused.value)
    still = engine.load(waiting.id)
    assert still.status == "waiting" and [w["task_id"] for w in still.waiting_for] == ["await_reply"]
    (branch,) = [ctx for name, ctx in still.contexts.items() if name.startswith("main/await_reply")]
    assert "reply" not in branch and branch.get("_branch_id") == "await_reply"
    assert key == "_branch_id" or all(key not in ctx.layer(layer) for ctx in (branch, still.main)
                                      for layer in range(1, 6))
    notes = [e.data for e in branch.tape if e.data.get("note") == "event_refused"]
    assert [n["key"] for n in notes] == [key] and len(still.main.tape) == tape_before

    done = engine.send_event(waiting.id, "supplier_reply", {"reply": "we object"})
    assert done.status == "completed", done.error
    main = done.main
    assert "_mergedConflicts" not in main and data_keys(dict(main.layer(3))) == {
        "dispute_status": "closed:B", "reply": "we object", "supplier_rating": "B"}
    assert LayeredContext.replay(main.tape) == main


def test_cli_send_and_start_data_refuse_the_engines_entries(cli: Any, tmp_path: Path) -> None:
    """`layerflow send` exits 2 naming the key, and the instance still waits; start data naming an
    `event:` record is refused as an `activity:` one is (README: start data may not set HISTORY's
    records): exit 2, no instance."""
    doc = run_json(cli, "run", str(DISPUTE), "--data", '{"deduction": 2500}', code=3)
    sent = cli("send", doc["instance_id"], "supplier_reply", "--json-payload",
               json.dumps({"reply": "see attached", "_mergedConflicts": FORGED_LOG}))
    assert sent.exit_code == 2 and "_mergedConflicts" in sent.stderr
    assert run_json(cli, "inspect", doc["instance_id"])["status"] == "waiting"
    done = run_json(cli, "send", doc["instance_id"], "supplier_reply", "--json-payload", '{"reply": "see attached"}')
    assert done["conflicts"] == [] and data_keys(done["layers"]["L3"])["dispute_status"] == "closed:C"

    forged = cli("run", str(DISPUTE), "--data", json.dumps({"deduction": 10, "event:await_reply": {"reply": "ok"}}),
                 "--json")
    assert forged.exit_code == 2, forged.stdout
    refusal = json.loads(forged.stdout)
    assert refusal["instance_id"] is None and "event:await_reply" in refusal["error"]["message"]


@pytest.fixture
def api() -> Iterator[httpx.Client]:
    with ServerThread(create_app(Engine("memory://"), HERE, TOKEN)) as server:
        with httpx.Client(base_url=server.url, headers=AUTH, timeout=60) as client:
            yield client


def test_rest_events_refuse_the_engines_entries_with_403(api: httpx.Client) -> None:
    """`POST /api/instances/{id}/events`: a key the layer rules refuse is 403 (README), naming it."""
    started = api.post("/api/instances", json={"process_id": "supplier_dispute", "data": {"deduction": 400}})
    assert started.status_code in (200, 201), started.text
    iid = started.json()["instance_id"]
    refused = api.post(f"/api/instances/{iid}/events",
                       json={"name": "supplier_reply", "payload": {"reply": "x", "_mergedConflicts": FORGED_LOG}})
    assert refused.status_code == 403 and "_mergedConflicts" in refused.text
    done = api.post(f"/api/instances/{iid}/events", json={"name": "supplier_reply", "payload": {"reply": "x"}})
    assert done.status_code == 200 and done.json()["status"] == "completed"
