"""What a report says is what happened.

(a) REST ``compress`` with ``action: evaluate`` reports a compression's effect: the context as it was
    right after that compression (rebuilt from the tape up to the compression's event, as ``replay``
    does) against the snapshot taken before it, whatever ran since. It compared the snapshot with the
    context *now*: an activity that ran after the compression counted as the compression's
    "tokens_after", and a preserved key an operator changed later made the compression look as if
    it had broken it.
(b) An instance's ``compressions`` (``run --json``, ``inspect``, REST documents) kept listing a compression
    that ``compress`` ``action: decompress`` or a ``rollback`` to a snapshot before it had undone, as if
    it stood (only an ``abort`` marked one ``undone``); and a second ``decompress`` without a
    ``snapshot_id`` undid the same compression again, answering 200 for a change that changed nothing.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import local_http
import pytest

from context_layers import Layer, LayeredContext
from context_layers.compression import evaluate
from engine.api import create_app
from engine.governance import CompressArgs, GovernanceService, StartArgs
from engine.runtime import Engine

from engine_helpers import cli_in_a_tmp_store, run_json
from governance_helpers import NOTES, ServerThread, make_catalog

cli = cli_in_a_tmp_store

TOKEN = "gaps27"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
GOV = "/api/context-governance"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    tmp = tmp_path_factory.mktemp("gaps27")
    with ServerThread(create_app("memory://", make_catalog(tmp), TOKEN)) as served:
        yield served.url


def _post(server: str, path: str, body: dict[str, Any]) -> Any:
    r = local_http.post(server + path, json=body, headers=AUTH)
    assert r.status_code in (200, 201), r.text
    return r.json()


def _compressed_notes(server: str) -> tuple[str, dict[str, Any]]:
    """A notes_review instance (waiting at `approve`) whose HISTORY an operator compressed."""
    iid = _post(server, "/api/instances", {"process_id": "notes_review", "data": NOTES})["instance_id"]
    done = _post(server, f"{GOV}/compress", {"instance_id": iid, "action": "compress", "max_tokens": 300,
                                              "preserve_keys": ["risk_level", "assessment_id"]})
    assert done["changed"]
    return iid, done


@pytest.mark.parametrize("after", ["an_activity", "an_inject_of_a_preserved_key", "nothing"])
def test_evaluate_reports_the_compression_not_what_ran_after_it(server: str, after: str) -> None:
    iid, done = _compressed_notes(server)
    right_after = _post(server, f"{GOV}/compress", {"instance_id": iid, "action": "evaluate",
                                                     "before_snapshot_id": done["snapshot_id"]})
    assert right_after["tokens_after"] == done["tokens_after"] and right_after["preserved_intact"]
    if after == "an_activity":  # `finish` writes outcome into the context the compression left
        doc = _post(server, f"/api/instances/{iid}/user-tasks/approve", {"data": {"decision": "approved"}})
        assert doc["status"] == "completed" and doc["layers"]["L3"]["outcome"] == "approved RA-APP9"
    elif after == "an_inject_of_a_preserved_key":  # a preserved key corrected after the compression
        _post(server, f"{GOV}/inject", {"instance_id": iid, "layer": "L4", "values": {"risk_level": "low"},
                                        "reason": "re-rated"})
    later = _post(server, f"{GOV}/compress", {"instance_id": iid, "action": "evaluate",
                                               "before_snapshot_id": done["snapshot_id"]})
    since = ["risk_level"] if after == "an_inject_of_a_preserved_key" else []
    assert right_after["changed_preserved_since"] == []
    assert later == {**right_after, "version": later["version"], "changed_preserved_since": since}
    assert later["tokens_after"] == done["tokens_after"] and later["preserved_intact"]
    assert later["attention_after"] == done["attention_after"]
    # the state it compared with is the compression's: the context rebuilt from the tape up to its event
    tape = local_http.get(f"{server}/api/instances/{iid}/tape", headers=AUTH).json()["events"]
    main = [e for e in tape if e.get("context", "main") == "main"]
    compress_seq = next(e["seq"] for e in main if e.get("data", {}).get("note") == "compress")
    assert later["after_seq"] == compress_seq
    rebuilt = LayeredContext.replay(main, until=compress_seq)
    assert later["tokens_after"] == rebuilt.tokens(Layer.HISTORY) + rebuilt.tokens(Layer.WORKING)


def test_evaluate_in_python_compares_with_the_compression_too() -> None:
    from context_layers import RuleDrivenCompressor

    ctx = LayeredContext(system={"policy": "p"})
    for i in range(6):
        ctx.begin_activity(f"t{i}")
        ctx.write(Layer.WORKING, f"note_{i}", f"step {i} " * 40, actor=f"t{i}")
        ctx.complete_activity(f"t{i}", preserve_keys=["note_0"] if i == 0 else [])
    done = RuleDrivenCompressor().compress(ctx, {"compressTokenThreshold": 100})
    assert done.changed
    ctx.begin_activity("late")
    ctx.write(Layer.WORKING, "late", "more " * 200, actor="late")
    ctx.complete_activity("late")
    report = evaluate(ctx, done)
    assert report.tokens_after == done.tokens_after and report.after_seq == done.event_seq


def _document(server: str, iid: str) -> Any:
    r = local_http.get(f"{server}/api/instances/{iid}", headers=AUTH)
    assert r.status_code == 200, r.text
    return r.json()


@pytest.mark.parametrize("how", ["decompress", "rollback"])
def test_a_compression_undone_is_listed_as_undone(server: str, how: str) -> None:
    iid, done = _compressed_notes(server)
    assert _document(server, iid)["compressions"][0].get("undone") is None
    if how == "decompress":
        undo = _post(server, f"{GOV}/compress", {"instance_id": iid, "action": "decompress"})
    else:
        undo = _post(server, f"{GOV}/rollback", {"instance_id": iid, "snapshot_id": done["snapshot_id"],
                                                 "layers": ["L3"], "reason": "too much folded"})
    doc = _document(server, iid)
    [listed] = doc["compressions"]
    tape = local_http.get(f"{server}/api/instances/{iid}/tape", headers=AUTH).json()["events"]
    restore = [e["seq"] for e in tape if e["kind"] == "restore"]
    assert listed["undone"]["by"] == how and listed["undone"]["seq"] == restore[-1]
    if how == "rollback":
        assert listed["undone"]["snapshot_id"] == done["snapshot_id"]
    inspected = _post(server, f"{GOV}/inspect", {"instance_id": iid})
    assert inspected["compress_status"]["compressions"] == [listed]
    assert doc["tokens"]["L3"] == done["tokens_before"]
    # nothing left to undo: refused, nothing written (it undid the same compression again, answering 200)
    again = local_http.post(f"{server}{GOV}/compress", json={"instance_id": iid, "action": "decompress"}, headers=AUTH)
    assert again.status_code == 400, again.text
    assert "undone" in again.json()["error"]["message"] and done["snapshot_id"] in again.json()["error"]["message"]
    assert _document(server, iid)["tape_length"] == doc["tape_length"]
    # the one it names still tells what it did (its snapshot is given), and a new compression stands
    named = _post(server, f"{GOV}/compress", {"instance_id": iid, "action": "evaluate",
                                               "before_snapshot_id": done["snapshot_id"]})
    assert named["tokens_after"] == done["tokens_after"]
    redo = _post(server, f"{GOV}/compress", {"instance_id": iid, "action": "compress", "max_tokens": 300})
    assert [c.get("undone") is None for c in _document(server, iid)["compressions"]] == [False, True]
    assert undo["version"] < redo["version"]


def test_inspect_says_a_compression_was_rolled_back(tmp_path: Path, cli: Any) -> None:
    import os

    service = GovernanceService(Engine(os.environ["LAYERFLOW_STORE"]), make_catalog(tmp_path))
    iid = service.start(StartArgs(process_id="notes_review", data=NOTES))["instance_id"]
    done = service.compress(iid, CompressArgs(action="compress", max_tokens=300))
    rolled = run_json(cli, "rollback", iid, done["snapshot_id"], "--layers", "L3")
    [listed] = run_json(cli, "inspect", iid)["compressions"]
    assert listed["undone"] == {"by": "rollback", "seq": rolled["event_seq"], "snapshot_id": done["snapshot_id"]}
    shown = cli("inspect", iid)
    assert shown.exit_code == 0, shown.stderr
    assert f"undone by rollback to {done['snapshot_id']} (event {rolled['event_seq']})" in shown.stdout
