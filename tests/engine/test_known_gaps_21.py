"""Gaps closed in round 21.

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

from engine_helpers import cli_in_a_tmp_store
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
    most the running one), with status "running" and, until the run stops, the ``waiting_for`` it
    started from. A poll that lands between the fired timer's first activity and the end of the run
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
    assert seen == [("running", ["cooling_off"])]  # mid-run: no outcome yet, and not "waiting" either
    assert "running" not in AT_REST
