"""An IT change-management team builds its process from README.md and DESIGN.md alone.

tests/outsider_change42/change42.bpmn: intake -> check_window (a script that fails on a bad
``window_hours``; fixed with ``resume --set``) -> outer_fork: [tech_review -> inner_fork: [the user
task sec_signoff, ops_check] -> inner_join -> tech_done] and [biz_review -> an inclusive split whose
conditions pick 1-3 of notify_users / notify_cab / notify_vendor -> notify_join] -> outer_join -> the
call activity deploy (process deploy42) -> end, plus an event sub-process whose non-interrupting
message start (``urgent``) records an urgent note. Joins use LAST_WRITER_WINS, so every conflict is
reported and settled by the strategy. Checked through the CLI (in this process), a real
``layerflow serve`` and plain SpiffWorkflow.
"""

from __future__ import annotations

import copy
import json
import shutil
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

import local_http
from context_layers import LayeredContext
from engine.cli import main

HERE = Path(__file__).resolve().parent / "outsider_change42"
BPMN = HERE / "change42.bpmn"
TOKEN = "change42-token"
BAD = {"change_id": "CHG-1", "risk": "high", "customers": 500, "window_hours": "four"}
SEC = {"status": "sec_ok", "approvals": ["sec"], "scratch": "kept by sec", "ticket_state": "ready",
       "window_ok": True, "sec_note": "checked",
       "change": {"id": "CHG-1", "plan": {"steps": ["backup", "patch"], "owner": "sec"}, "risk": "high"}}
BASE_CHANGE = {"id": "CHG-1", "plan": {"steps": ["backup", "patch"], "owner": "ops"}, "risk": "high"}
OPS_CHANGE = {"id": "CHG-1", "plan": {"steps": ["backup", "patch", "reboot"], "owner": "ops"}, "risk": "high"}
NS = "{http://www.omg.org/spec/BPMN/20100524/MODEL}"


def cli(store: str, *args: str, code: int | None = 0) -> Any:
    out = CliRunner().invoke(main, [*args, "--store", store, "--json"])
    if code is not None:
        assert out.exit_code == code, (args, out.stdout, out.stderr)
    return json.loads(out.stdout)


def events_of(store: str, iid: str, *args: str) -> list[dict[str, Any]]:
    doc = cli(store, "tape", iid, *args)
    return doc if isinstance(doc, list) else doc["events"]


def outgoing_targets() -> dict[str, list[str]]:
    process = ET.parse(BPMN).getroot().find(f"{NS}process")
    assert process is not None
    targets: dict[str, list[str]] = {}
    for flow in process.iter(f"{NS}sequenceFlow"):
        targets.setdefault(flow.get("sourceRef", ""), []).append(flow.get("targetRef", ""))
    return targets


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> str:
    return f"sqlite:///{tmp_path_factory.mktemp('change42') / 'runs.db'}"


@pytest.fixture(scope="module")
def run(store: str) -> dict[str, Any]:
    """The whole story: a failing script, its fix, the urgent message, the user task."""
    failed = cli(store, "run", str(BPMN), "--data", json.dumps(BAD), code=1)
    iid = failed["instance_id"]
    fixed = cli(store, "resume", iid, "--set", "window_hours=4", code=3)
    cli(store, "send", iid, "urgent", "--json-payload", '{"reason": "db down"}', code=3)
    done = cli(store, "resume", iid, "--answer", "sec_signoff=" + json.dumps(SEC), code=0)
    return {"id": iid, "failed": failed, "fixed": fixed, "done": done, "events": events_of(store, iid)}


def test_a_bad_window_fails_the_script_and_set_fixes_it(run: dict[str, Any]) -> None:
    failed = run["failed"]
    assert failed["status"] == "error"
    assert failed["error"]["task_id"] == "check_window" and "window_hours" in failed["error"]["message"]
    fixed = run["fixed"]
    assert fixed["layers"]["L3"]["window_hours"] == 4 and fixed["layers"]["L3"]["window_ok"] is True
    kinds = {(w["kind"], w["task_id"]) for w in fixed["waiting_for"]}
    assert kinds == {("user_task", "sec_signoff"), ("event", "urgent_start")}
    assert run["done"]["status"] == "completed"


def test_every_join_reports_exactly_the_keys_two_branches_changed_differently(run: dict[str, Any]) -> None:
    by_join: dict[str, dict[str, dict[str, Any]]] = {}
    for c in run["done"]["conflicts"]:
        by_join.setdefault(c["gateway_id"], {})[c["key"]] = c
    assert set(by_join) == {"inner_join", "notify_join", "outer_join"}
    inner = by_join["inner_join"]
    # nested object, list, scalar, and a delete against a change
    assert set(inner) == {"change", "approvals", "status", "scratch"}
    assert inner["change"]["base_value"] == BASE_CHANGE
    assert inner["change"]["values"] == {"sec_signoff": SEC["change"], "ops_check": OPS_CHANGE}
    assert inner["approvals"]["values"] == {"sec_signoff": ["sec"], "ops_check": ["ops"]}
    assert inner["scratch"]["values"] == {"sec_signoff": "kept by sec", "ops_check": {"$deleted": True}}
    # ticket_state changed identically in both, window_ok written with the value it had: no conflict
    assert run["done"]["layers"]["L3"]["ticket_state"] == "ready"
    assert set(by_join["notify_join"]) == {"approvals"}
    assert by_join["notify_join"]["approvals"]["values"] == {"notify_cab": ["cab"], "notify_vendor": ["vendor"]}
    # change and ticket_state changed only in the tech branch: no conflict at the outer join
    assert set(by_join["outer_join"]) == {"approvals", "status"}
    assert by_join["outer_join"]["status"]["values"] == {"tech_review": "sec_ok", "biz_review": "users_notified"}
    for c in run["done"]["conflicts"]:
        assert c["resolution"]["resolver"] == "strategy"


def test_merged_history_is_base_then_each_branchs_new_keys_in_branch_order(run: dict[str, Any]) -> None:
    history = list(run["done"]["layers"]["L3"])
    base = ["window_hours", "change", "approvals", "status", "scratch", "ticket_state", "activity:intake",
            "window_ok", "activity:check_window"]
    tech = ["tech", "activity:tech_review", "sec_note", "activity:sec_signoff", "ops_note", "activity:ops_check",
            "tech_ok", "activity:tech_done"]
    biz = ["biz", "activity:biz_review", "notified_users", "activity:notify_users", "notified_cab", "activity:notify_cab",
           "notified_vendor", "activity:notify_vendor"]
    expected = [k for k in base + tech + biz if k != "window_ok"]
    assert history[:len(expected)] == expected
    assert history.index("_mergedConflicts") > history.index("activity:notify_vendor")
    final = run["done"]["layers"]["L3"]
    # notify_users deleted window_ok; the tech branch wrote the value it had: the delete is the only change
    assert "window_ok" not in final and final["scratch"] == "kept by sec"
    assert final["urgent_note"] == "urgent: db down"
    assert final["deployed"] == {"change": "CHG-1", "steps": 2}


def test_branch_ids_are_the_targets_of_the_splits_outgoing_flows(run: dict[str, Any]) -> None:
    targets = outgoing_targets()
    splits = [e["data"] for e in run["events"] if e["kind"] == "note" and e["data"].get("note") == "split"]
    seen = {s["gateway_id"]: s["branches"] for s in splits}
    assert seen["outer_fork"] == targets["outer_fork"]
    assert seen["inner_fork"] == targets["inner_fork"]
    # the inclusive split took the two flows whose conditions held (high risk, 500 customers)
    assert seen["notify_split"] == targets["notify_split"] == ["notify_users", "notify_cab", "notify_vendor"]
    for split in splits:   # each branch's context starts with its branch id
        for branch in split["branches"]:
            first = next(e for e in run["events"] if e["branch"] == branch)
            # WORKING, or HISTORY in a nested branch where the outer split's marker already lives
            assert first["kind"] == "fork", first
            assert [c for c in first["changes"] if c[1] == "_branch_id"] in ([[4, "_branch_id", branch]],
                                                                            [[3, "_branch_id", branch]])


@pytest.mark.parametrize(("data", "taken"), [
    ({"risk": "low", "customers": 5}, ["notify_users"]),
    ({"risk": "high", "customers": 5}, ["notify_users", "notify_cab"]),
    ({"risk": "low", "customers": 500}, ["notify_users", "notify_vendor"]),
])
def test_the_inclusive_conditions_pick_the_branches(store: str, data: dict[str, Any], taken: list[str]) -> None:
    doc = cli(store, "run", str(BPMN), "--data",
              json.dumps({"change_id": "CHG-2", "window_hours": 2, **data}), code=3)
    tape = events_of(store, doc["instance_id"], "--kind", "split")
    split = next(e["data"] for e in tape if e["data"].get("gateway_id") == "notify_split")
    assert split["branches"] == taken


def test_tape_branch_lists_the_branchs_events(store: str, run: dict[str, Any]) -> None:
    ops = events_of(store, run["id"], "--branch", "ops_check")
    assert ops and all(e["branch"] == "ops_check" for e in ops)
    assert any(e["kind"] == "complete" and e["activity"] == "ops_check" for e in ops)
    sec = events_of(store, run["id"], "--branch", "sec_signoff")   # a branch of a branch
    assert {e["context"] for e in sec} == {next(e["context"] for e in run["events"] if e["branch"] == "sec_signoff")}
    out = CliRunner().invoke(main, ["tape", run["id"], "--branch", "sec_signof", "--store", store])
    assert "sec_signof" in out.stderr and "sec_signoff" in out.stderr


def test_replay_at_every_sequence_number_rebuilds_the_context(store: str, run: dict[str, Any]) -> None:
    contexts: dict[str, list[dict[str, Any]]] = {}
    for e in run["events"]:
        contexts.setdefault(e["context"], []).append(e)
    assert len(contexts) >= 7
    main_events = contexts["main"]
    for e in main_events:
        doc = cli(store, "replay", run["id"], "--until", str(e["seq"]))
        mine = LayeredContext.replay(main_events, until=e["seq"])
        for layer in ("L0", "L1", "L2", "L3", "L4", "L5"):
            assert doc["layers"][layer] == dict(mine.layer(layer)), (e["seq"], layer)
    assert doc["layers"] == run["done"]["layers"]
    for name, events in contexts.items():   # each branch's context too, from the whole tape
        if name == "main":
            continue
        for e in events[::3] + events[-1:]:
            doc = cli(store, "replay", run["id"], "--context", name, "--until", str(e["seq"]))
            mine = LayeredContext.replay(run["events"], until=e["seq"], name=name)
            for layer in ("L0", "L1", "L2", "L3", "L4", "L5"):
                assert doc["layers"][layer] == dict(mine.layer(layer)), (name, e["seq"], layer)


def test_snapshot_and_rollback(store: str, run: dict[str, Any]) -> None:
    snap = CliRunner().invoke(main, ["snapshot", run["id"], "--store", store])
    assert snap.exit_code == 0, snap.stderr
    snap_id = snap.stdout.strip()
    after = cli(store, "rollback", run["id"], "--snapshot", snap_id, "--layers", "L3")
    assert after["restored_layers"] == ["L3"]
    assert after["layers"]["L3"] == run["done"]["layers"]["L3"]
    assert cli(store, "inspect", run["id"])["layers"]["L3"] == run["done"]["layers"]["L3"]


def test_plain_spiffworkflow_takes_the_same_path_to_the_same_values(run: dict[str, Any]) -> None:
    from SpiffWorkflow.bpmn import BpmnWorkflow
    from SpiffWorkflow.bpmn.parser import BpmnParser
    from SpiffWorkflow.util.task import TaskState

    parser = BpmnParser()
    parser.add_bpmn_file(str(BPMN))
    wf = BpmnWorkflow(parser.get_spec("change42"), parser.get_subprocess_specs("change42"))
    start = wf.get_tasks(state=TaskState.READY)[0]
    start.data.update({k: v for k, v in BAD.items()}, window_hours=4)
    wf.do_engine_steps()
    user = [t for t in wf.get_tasks(state=TaskState.READY) if t.task_spec.name == "sec_signoff"][0]
    user.data.update(copy.deepcopy(SEC))   # SpiffWorkflow's join merges nested dicts in place
    user.run()
    wf.do_engine_steps()
    assert wf.is_completed()
    spiff_path = [t.task_spec.name for t in wf.get_tasks(state=TaskState.COMPLETED)
                  if t.task_spec.__class__.__name__ in ("ScriptTask", "UserTask")]
    ours = [e["activity"] for e in run["events"] if e["kind"] == "complete"]
    assert set(spiff_path) == set(ours) - {"record_urgent", "urgent_start"}
    data = wf.data if wf.data else wf.last_task.data
    final = run["done"]["layers"]["L3"]
    assert "window_ok" in data   # SpiffWorkflow's join unions the branches' data: a delete is lost
    for key in ("tech", "tech_ok", "biz", "sec_note", "ops_note", "notified_users", "notified_cab", "notified_vendor",
                "ticket_state", "deployed"):
        assert data.get(key, wf.last_task.data.get(key)) == final[key], key


@pytest.mark.parametrize(("args", "words"), [
    (("--context", "sec_signoff", "--set", "risk=low"), ["risk", "L1"]),
    (("--answer", "intake={}"), ["intake", "sec_signoff"]),
    (("--answer", "sec_signoff=not json"), ["sec_signoff", "JSON"]),
])
def test_plausible_mistakes_are_refused_naming_what_is_wrong(store: str, args: tuple[str, ...],
                                                              words: list[str]) -> None:
    doc = cli(store, "run", str(BPMN), "--data", json.dumps({**BAD, "window_hours": 4}), code=3)
    out = CliRunner().invoke(main, ["resume", doc["instance_id"], *args, "--store", store, "--json"])
    assert out.exit_code == 2, out.stdout
    err = json.loads(out.stdout)["error"]
    for word in words:
        assert word in err["message"], (word, err)
    again = cli(store, "inspect", doc["instance_id"])
    assert again["layers"] == doc["layers"]


def test_rest_gives_the_same_conflicts_history_and_replay(tmp_path: Path, run: dict[str, Any]) -> None:
    catalog = tmp_path / "catalog"
    shutil.copytree(HERE, catalog)
    auth = {"Authorization": f"Bearer {TOKEN}"}
    with local_http.serving(catalog, tmp_path / "served.db", TOKEN) as base:
        r = local_http.post(f"{base}/api/instances", headers=auth,
                            json={"process_id": "change42", "data": BAD})
        assert r.status_code in (200, 201, 422, 500) and r.json()["status"] == "error", r.text
        iid = r.json()["instance_id"]
        r = local_http.post(f"{base}/api/context-governance/inject", headers=auth,
                            json={"instance_id": iid, "layer": "L4", "values": {"window_hours": 4},
                                  "reason": "fix the window"})
        assert r.status_code == 200, r.text
        r = local_http.post(f"{base}/api/instances/{iid}/resume", headers=auth, json={})
        assert r.status_code == 200 and r.json()["status"] == "waiting", r.text
        r = local_http.post(f"{base}/api/instances/{iid}/events", headers=auth,
                            json={"name": "urgent", "payload": {"reason": "db down"}})
        assert r.status_code == 200, r.text
        r = local_http.post(f"{base}/api/instances/{iid}/user-tasks/sec_signoff", headers=auth,
                            json={"data": SEC})
        assert r.status_code == 200, r.text
        doc = r.json()
        assert doc["status"] == "completed"
        strip = lambda cs: sorted((c["gateway_id"], c["key"], json.dumps(c["values"], sort_keys=True))
                                  for c in cs)
        assert strip(doc["conflicts"]) == strip(run["done"]["conflicts"])
        assert list(doc["layers"]["L3"]) == list(run["done"]["layers"]["L3"])
        tape = local_http.get(f"{base}/api/instances/{iid}/tape", headers=auth).json()
        tape = tape if isinstance(tape, list) else tape["events"]
        last = max(e["seq"] for e in tape if e["context"] == "main")
        r = local_http.get(f"{base}/api/instances/{iid}/replay", headers=auth,
                           params={"context": "main", "until": last})
        assert r.status_code == 200, r.text
        keys = [k["key"] for k in r.json()["layers"]["L3"]["keys"]]
        assert keys == list(doc["layers"]["L3"])


def test_rollback_to_each_snapshot_of_main_gives_what_replay_rebuilds_at_it(store: str) -> None:
    """Two ways to the same past: a snapshot the engine took, and the tape replayed up to it."""
    doc = cli(store, "run", str(BPMN), "--data", json.dumps({**BAD, "window_hours": 4}), code=3)
    iid = doc["instance_id"]
    cli(store, "resume", iid, "--answer", "sec_signoff=" + json.dumps(SEC), code=0)
    snaps = [s for s in cli(store, "snapshot", iid, "--list")["snapshots"] if s["context"] == "main"]
    assert len(snaps) >= 4
    for snap in snaps:
        then = cli(store, "replay", iid, "--until", str(snap["seq"]))["layers"]
        back = cli(store, "rollback", iid, "--snapshot", snap["snapshot_id"])
        assert back["layers"] == then, snap


def test_a_misspelt_set_key_is_named_with_the_key_it_likely_meant(store: str) -> None:
    """``--set window_hour=5`` (for window_hours) wrote a new key and retried: the script failed again
    with its own error and nothing said the fix had gone elsewhere. A new key close to one the context
    holds is named now, with the likely one; the write itself stands (a new key may be the fix)."""
    iid = cli(store, "run", str(BPMN), "--data", json.dumps(BAD), code=1)["instance_id"]
    out = CliRunner().invoke(main, ["resume", iid, "--set", "window_hour=5", "--store", store, "--json"])
    assert out.exit_code == 1
    assert "--set window_hour" in out.stderr and "did you mean 'window_hours' (L3)" in out.stderr, out.stderr
    out = CliRunner().invoke(main, ["resume", iid, "--set", "window_hours=5", "--store", store, "--json"])
    assert out.exit_code == 3 and "did you mean" not in out.stderr
