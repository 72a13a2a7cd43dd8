"""The owner of a purchase-order approval changes it while instances are in flight.

tests/outsider_versions50/po50.bpmn (v1): intake -> route by ``path``: the user task
manager_approval -> record_manager (a handler of po50_handlers.py); two reviews whose join asks a
person on a conflict; a one-hour timer (hold -> release_hold); the message supplier_confirmed
(wait_supplier); or auto_ok -> merge -> finalize (``summary = "v1 ..."``). Instances are left
waiting at each place, then v2 is deployed the ways a user would (the BPMN edited in place, the
file gone or broken, only the config file edited, a handler file gone) and they are resumed.

The rule checked (README, "Changing a process while instances run"): an instance
continues on the definition it started with (its BPMN and config travel in its record), as in
Camunda/Zeebe, and is told so when the files changed; new instances take the files as they are.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

import local_http
from engine.cli import main
from tests.stores.conftest import scene_on

HERE = Path(__file__).resolve().parent / "outsider_versions50"
ROOT = Path(__file__).resolve().parent.parent
TOKEN = "outsider50-token"
REDIS = os.environ.get("LAYERFLOW_TEST_REDIS_50", "redis://127.0.0.1:6379/14")
PATHS = ("manual", "review", "hold", "supplier")


def order(path: str) -> dict[str, Any]:
    return {"po_id": f"PO-{path}", "quantity": 10, "unit_price": 150, "path": path}


def cli(store: str | None, *args: str, code: int | None = 0) -> Any:
    out = CliRunner().invoke(main, [*args, *(["--store", store] if store else []), "--json"])
    if code is not None:
        assert out.exit_code == code, (args, out.stdout, out.stderr)
    return json.loads(out.stdout)


def cli_process(store: str, *args: str) -> tuple[int, Any, str]:
    """The CLI as its own process: what a new shell (or another machine) has loaded, nothing more."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-m", "engine.cli", *args, "--store", store, "--json"],
                          env=env, capture_output=True, text=True, timeout=120)
    return done.returncode, json.loads(done.stdout), done.stderr


def edit(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    assert old in text, (path, old)
    path.write_text(text.replace(old, new))


@pytest.fixture
def v1(tmp_path: Path) -> Path:
    """A catalog folder holding v1: the BPMN, its config file and its handlers."""
    folder = tmp_path / "catalog"
    shutil.copytree(HERE, folder)
    return folder


@pytest.fixture
def store(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'runs.db'}"


def start_all(folder: Path, store: str) -> dict[str, str]:
    """One instance waiting at each place: path -> instance id."""
    ids = {}
    for path in PATHS:
        doc = cli(store, "run", str(folder / "po50.bpmn"), "--data", json.dumps(order(path)), code=3)
        ids[path] = doc["instance_id"]
    return ids


def finish(store: str, ids: dict[str, str]) -> dict[str, Any]:
    """Answer, fire or send what each instance waits for: path -> its final document."""
    return {
        "manual": cli(store, "resume", ids["manual"], "--answer", 'manager_approval={"approved": true}'),
        "review": cli(store, "resume", ids["review"], "--answer", "reviews_join/po_status=needs_cfo"),
        "hold": cli(store, "resume", ids["hold"], "--now", "2099-01-01T00:00:00Z"),
        "supplier": cli(store, "send", ids["supplier"], "supplier_confirmed", "--json-payload", '{"ok": true}'),
    }


V2_EDITS = [  # (old, new) of po50.bpmn: v2 as its owner writes it
    ('summary = "v1 "', 'summary = "v2 "'),  # a script's text
    ('path == "review"', 'path == "review" and total &gt; 100000'),  # a gateway condition
    ('<bpmn:sequenceFlow id="m1" sourceRef="manager_approval" targetRef="record_manager"/>',  # a step added
     '<bpmn:sequenceFlow id="m1" sourceRef="manager_approval" targetRef="notify_buyer"/>\n'
     '    <bpmn:sequenceFlow id="m0" sourceRef="notify_buyer" targetRef="record_manager"/>\n'
     '    <bpmn:scriptTask id="notify_buyer"><bpmn:script>notified = True</bpmn:script></bpmn:scriptTask>'),
    ('<bpmn:sequenceFlow id="h1" sourceRef="hold" targetRef="release_hold"/>',  # a step removed
     '<bpmn:sequenceFlow id="h1" sourceRef="hold" targetRef="merge"/>'),
    ('<bpmn:sequenceFlow id="h2" sourceRef="release_hold" targetRef="merge"/>', ''),
    ('wait_supplier', 'await_supplier'),  # the waiting element renamed
]


def deploy_v2(folder: Path) -> None:
    bpmn = folder / "po50.bpmn"
    for old, new in V2_EDITS:
        edit(bpmn, old, new)
    edit(bpmn, '<bpmn:scriptTask id="release_hold" name="Release hold">\n      <bpmn:script>po_status = "released"'
               '</bpmn:script>\n    </bpmn:scriptTask>', '')


@pytest.mark.parametrize("change", ["edited", "gone", "broken"])
def test_waiting_instances_finish_on_the_definition_they_started_with(v1: Path, store: str, change: str) -> None:
    ids = start_all(v1, store)
    bpmn = v1 / "po50.bpmn"
    if change == "edited":
        deploy_v2(v1)
        cli(None, "validate", str(bpmn))
    elif change == "gone":
        bpmn.unlink()
    else:
        bpmn.write_text(bpmn.read_text()[:500])
    done = finish(store, ids)
    for path, doc in done.items():
        assert doc["status"] == "completed", (path, doc)
        assert doc["layers"]["L3"]["summary"].startswith("v1 PO-"), (path, doc["layers"]["L3"])
        assert "notified" not in doc["layers"]["L3"]
    assert done["hold"]["layers"]["L3"]["po_status"] == "released"  # v1's step, which v2 removed
    assert done["manual"]["layers"]["L3"]["recorded_by"] == "po50_handlers"
    assert done["review"]["layers"]["L3"]["po_status"] == "needs_cfo"
    if change == "edited":  # a new start takes v2
        new = cli(store, "run", str(bpmn), "--data", json.dumps(order("supplier")), code=3)
        assert [w["task_id"] for w in new["waiting_for"]] == ["await_supplier"]
        review = cli(store, "run", str(bpmn), "--data", json.dumps(order("review")))
        assert review["layers"]["L3"]["summary"] == "v2 PO-review auto"


def test_a_handler_file_gone_keeps_the_managers_answer_and_names_the_step_that_needs_it(v1: Path, store: str) -> None:
    """The handler file a later step needs is gone (moved aside on deploy): the manager's answer is
    taken, the step that needs the file fails naming it, and a resume once it is back goes on
    without asking the manager again."""
    iid = cli(store, "run", str(v1 / "po50.bpmn"), "--data", json.dumps(order("manual")), code=3)["instance_id"]
    handlers = v1 / "po50_handlers.py"
    handlers.rename(v1 / "po50_handlers.py.bak")
    code, failed, _ = cli_process(store, "resume", iid, "--answer", 'manager_approval={"approved": true}')
    assert code == 1 and failed["status"] == "error", failed
    assert failed["error"]["task_id"] == "record_manager", failed["error"]
    assert "po50_handlers.py" in failed["error"]["message"] and "resume" in failed["error"]["message"]
    assert failed["layers"]["L3"]["approved"] is True  # the answer is kept
    (v1 / "po50_handlers.py.bak").rename(handlers)
    code, done, _ = cli_process(store, "resume", iid)
    assert code == 0 and done["status"] == "completed", done
    assert done["layers"]["L3"]["po_status"] == "approved"


def test_rest_new_starts_take_an_edited_config_file_and_waiting_ones_are_told(v1: Path, tmp_path: Path) -> None:
    """Only po50.layerflow.yaml is edited while `layerflow serve` runs: the join no longer asks a
    person and SYSTEM's approval_limit rises. New starts take the new file at once (no restart);
    the instance waiting at the join keeps its terms and its resume says what changed."""
    headers = {"Authorization": f"Bearer {TOKEN}"}
    with local_http.serving(v1, tmp_path / "served.db", TOKEN) as base:
        def start(path: str) -> dict[str, Any]:
            r = local_http.post(f"{base}/api/instances", headers=headers,
                                json={"process_id": "po_approval50", "data": order(path)})
            assert r.status_code == 201, r.text
            return dict(r.json())

        waiting = start("review")
        assert [w["id"] for w in waiting["waiting_for"]] == ["reviews_join/po_status"]
        config = v1 / "po50.layerflow.yaml"
        edit(config, "confirm: true", "confirm: false")
        edit(config, "approval_limit: 5000", "approval_limit: 9000")
        new = start("review")
        assert new["status"] == "completed", new["waiting_for"]
        assert new["layers"]["L0"]["approval_limit"] == 9000
        assert new["layers"]["L3"]["po_status"] == "needs_cfo"
        r = local_http.post(f"{base}/api/instances/{waiting['instance_id']}/resume", headers=headers,
                            json={"answers": {"confirmations": {"reviews_join/po_status": "needs_cfo"}}})
        assert r.status_code == 200, r.text
        done = r.json()
        assert done["status"] == "completed" and done["layers"]["L0"]["approval_limit"] == 5000
        assert new["definition"]["version"] != waiting["definition"]["version"]  # a config edit is a new version
        shown = local_http.get(f"{base}/api/instances/{waiting['instance_id']}", headers=headers).json()
        assert shown["definition"]["version"] == waiting["definition"]["version"]
        assert shown["definition"]["on_disk"] == "changed"
        svg = local_http.get(f"{base}/api/instances/{waiting['instance_id']}/diagram.svg", headers=headers).text
        assert f"the instance runs version {waiting['definition']['version']}" in svg
        notices = " ".join(done["notices"])
        assert "conflictPolicy.rules[0].confirm True -> False" in notices, notices
        assert "approval_limit 5000 -> 9000" in notices


def test_inspect_and_resume_say_which_definition_an_instance_runs(v1: Path, store: str) -> None:
    """The version an instance runs is the one it started with: `inspect` names it and says when the
    files changed since; `resume` says so too, and a new start gets the new version."""
    ids = start_all(v1, store)
    started = cli(store, "inspect", ids["manual"])["definition"]
    assert started["on_disk"] == "same" and len(started["version"]) == 12
    assert {Path(f["path"]).name for f in started["files"]} == {"po50.bpmn", "po50.layerflow.yaml"}
    deploy_v2(v1)
    now = cli(store, "inspect", ids["manual"])["definition"]
    assert now["version"] == started["version"] and now["on_disk"] == "changed"
    assert {Path(f["path"]).name: f["now"] for f in now["files"]} == {"po50.bpmn": "changed", "po50.layerflow.yaml": "same"}
    text = CliRunner().invoke(main, ["inspect", ids["manual"], "--store", store]).stdout
    assert f"definition\tversion {started['version']}" in text and "po50.bpmn changed on disk since it started" in text
    renamed = CliRunner().invoke(main, ["resume", ids["manual"], "--answer", 'mgr_approval={"approved": true}',
                                        "--store", store])
    assert renamed.exit_code == 2 and "(manager_approval)" in renamed.stderr
    assert f"runs the definition it started with, version {started['version']}" in renamed.stderr.replace("\n", " ")
    out = CliRunner().invoke(main, ["resume", ids["manual"], "--answer", 'manager_approval={"approved": true}',
                                    "--store", store, "--json"])
    done = json.loads(out.stdout)
    notice = out.stderr.replace("\n", " ")
    assert "po50.bpmn changed since instance" in notice and started["version"] in notice and "cancel" in notice, notice
    assert done["definition"]["version"] == started["version"]
    sent = CliRunner().invoke(main, ["send", ids["supplier"], "supplier_confirmed", "--store", store, "--json"])
    assert json.loads(sent.stdout)["status"] == "completed"  # v1's wait_supplier, renamed in v2
    assert "po50.bpmn changed since instance" in sent.stderr.replace("\n", " "), sent.stderr
    new = cli(store, "run", str(v1 / "po50.bpmn"), "--data", json.dumps(order("auto")))
    assert new["definition"]["version"] != started["version"] and new["definition"]["on_disk"] == "same"
    (v1 / "po50.bpmn").unlink()
    gone = cli(store, "inspect", ids["hold"])["definition"]
    assert gone["version"] == started["version"] and gone["on_disk"] == "gone"
    assert cli(store, "resume", ids["hold"], "--now", "2099-01-01T00:00:00Z")["status"] == "completed"


@pytest.fixture
def scene() -> Iterator[dict[str, str]]:
    """A key prefix and a stream of this test's own on Redis DB 14, removed afterwards."""
    yield from scene_on(REDIS, "o50")


def test_workers_run_what_was_submitted_before_v2_on_v1_and_new_submits_on_v2(v1: Path, scene: dict[str, str]) -> None:
    """Orders submitted to the workers' Redis before v2 is deployed run on v1 when a worker picks
    them up after it (an instance is bound to its definition when it is created); those submitted
    after run on v2."""
    store, stream = scene["store"], scene["stream"]

    def submit(path: str) -> str:
        doc = cli(store, "submit", str(v1 / "po50.bpmn"), "--data", json.dumps(order(path)), "--stream", stream)
        return str(doc["instance_ids"][0])

    manual, auto = submit("manual"), submit("auto")
    deploy_v2(v1)
    newer = submit("auto")
    code, stats, err = cli_process(store, "worker", "--stream", stream, "--timer-interval", "0", "--stop-after", "3")
    assert code == 0 and stats["statuses"] == {"completed": 2, "waiting": 1}, (stats, err)
    assert "Traceback" not in err
    assert cli(store, "inspect", auto)["layers"]["L3"]["summary"] == "v1 PO-auto auto"
    assert cli(store, "inspect", newer)["layers"]["L3"]["summary"] == "v2 PO-auto auto"
    waiting = cli(store, "inspect", manual)
    assert waiting["definition"]["on_disk"] == "changed"
    done = cli(store, "resume", manual, "--answer", 'manager_approval={"approved": true}')
    assert done["layers"]["L3"]["summary"] == "v1 PO-manual approved" and "notified" not in done["layers"]["L3"]
