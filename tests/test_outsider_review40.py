"""A content-moderation team builds a document review loop from README.md and DESIGN.md alone.

The process (tests/outsider_review40/doc_review.bpmn and its .layerflow.yaml): draft -> review (an
``llm:`` step whose offline handler stands in for the model) -> an XOR back to revise -> review,
until the review approves or six rounds have run -> publish. Each review adds a tool result, a
reasoning chain and a retry log of its round to HISTORY, so the review's compression (a token and a
message threshold; ``extract_keys``, ``summarize``, ``count_only`` with ``keepLast``) fires in
several rounds. Everything is checked from outside: ``layerflow`` commands (in this process,
click's runner) and the REST governance API.

What the team found:

* The loop stopped in round 2 with "'approved' was removed from HISTORY by the compression after
  activity 'review'": the review had just answered ``approved: false`` again, but a value a handler
  returns that the context already holds was no write at all, so the review's record did not list
  it, and the cliff that keeps the latest activity whole folded it before the gateway read it. A key
  of HISTORY written again with its value is a write now (on the tape, in the activity's record).
* A misspelt ``preserveKeys`` entry (``round_nr``) gave the same folded-key error with the advice to
  preserve ``round_no``, which the team believed it had. The error now names the preserved key no
  layer holds as the likely misspelling.
"""

from __future__ import annotations

import json
import re
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from fastapi.testclient import TestClient

from context_layers import LayeredContext, render
from engine.api import create_app
from engine.cli import main

HERE = Path(__file__).resolve().parent / "outsider_review40"
BPMN = HERE / "doc_review.bpmn"
TOKEN = "review40-token"
NEVER = {"doc_id": "DOC-40", "approve_at_round": 99}   # six rounds, then publish unapproved


def look(store: str, *args: str, code: int | None = 0) -> dict[str, Any]:
    out = CliRunner().invoke(main, [*args, "--store", store, "--json"])
    if code is not None:
        assert out.exit_code == code, (args, out.stdout, out.stderr)
    return json.loads(out.stdout)


def run_review(store: str, data: dict[str, Any] = NEVER, bpmn: Path = BPMN, code: int = 0) -> dict[str, Any]:
    return look(store, "run", str(bpmn), "--data", json.dumps(data), code=code)


def tape_events(store: str, iid: str) -> list[dict[str, Any]]:
    doc = look(store, "tape", iid)
    return doc if isinstance(doc, list) else doc["events"]


def at(events: list[dict[str, Any]], seq: int) -> LayeredContext:
    return LayeredContext.replay(events, until=seq)


def scope_tokens(ctx: LayeredContext) -> int:
    return ctx.tokens("L3") + ctx.tokens("L4")


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> str:
    return f"sqlite:///{tmp_path_factory.mktemp('review40') / 'runs.db'}"


@pytest.fixture(scope="module")
def six(store: str) -> dict[str, Any]:
    """One uninterrupted run of six rounds, and its whole tape."""
    doc = run_review(store)
    return {"doc": doc, "events": tape_events(store, doc["instance_id"])}


@pytest.fixture
def api(store: str) -> Iterator[TestClient]:
    with TestClient(create_app(store, token=TOKEN)) as client:
        client.headers["Authorization"] = f"Bearer {TOKEN}"
        yield client


def test_six_rounds_loop_counter_and_round_keys(six: dict[str, Any]) -> None:
    doc = six["doc"]
    assert doc["status"] == "completed", doc["error"]
    history = doc["layers"]["L3"]
    assert history["round_no"] == 6 and history["approved"] is False
    assert history["published"] == {"doc": "DOC-40", "rounds": 6, "approved": False}
    # the review ran six times, the revision five: one record each, numbered by pass
    completes = [e for e in six["events"] if e["kind"] == "complete"]
    assert [e["activity"] for e in completes] == ["draft", *["review", "revise"] * 5, "review", "publish"]
    # each review saw the round the loop counter said, and wrote that round's keys
    rounds = [at(six["events"], e["seq"]) for e in completes if e["activity"] == "review"]
    assert [ctx.get("round_no") for ctx in rounds] == [1, 2, 3, 4, 5, 6]
    for n, ctx in enumerate(rounds, 1):
        record = ctx.layer("L3")[f"activity:review#{n}" if n > 1 else "activity:review"]
        assert {f"check_result_{n}", f"reasoning_{n}", f"retry_log_{n}", "approved"} <= set(record["keys"])


def test_a_verdict_written_again_is_kept_for_the_gateway(six: dict[str, Any]) -> None:
    """The review answers ``approved: false`` in every round; the gateway right after reads it. The
    cliff after the review keeps that review whole, its unchanged verdict included."""
    writes = [e for e in six["events"] if e["kind"] == "write" and e["activity"] == "review"
              and any(c[1] == "approved" for c in e["changes"])]
    assert len(writes) == 6
    for c in six["doc"]["compressions"]:
        after = at(six["events"], c["event_seq"])
        assert after.get("approved") is False, c


def test_compressions_fire_in_several_rounds_with_designs_fields(store: str, six: dict[str, Any]) -> None:
    doc, events = six["doc"], six["events"]
    comps = doc["compressions"]
    assert len(comps) >= 3
    fired = {t for c in comps for t in c["triggers"]}
    assert {"token_threshold", "message_threshold"} <= fired
    snapshots = look(store, "snapshot", doc["instance_id"], "--list")
    listed = {s["snapshot_id"] if isinstance(s, dict) else s for s in
              (snapshots["snapshots"] if isinstance(snapshots, dict) else snapshots)}
    listing = look(store, "tape", doc["instance_id"], "--kind", "compression")
    on_tape = listing if isinstance(listing, list) else listing["events"]
    assert [(e["seq"], e["data"]["snapshot_id"]) for e in on_tape] == [(c["event_seq"], c["snapshot_id"]) for c in comps]
    for c in comps:
        assert c["activity_id"] == "review"
        assert isinstance(c["triggers"], list) and c["triggers"]
        assert c["snapshot_id"] in listed
        seq = int(c["snapshot_id"].rsplit(":", 1)[1])
        before, after = at(events, seq), at(events, c["event_seq"])
        assert c["tokens_before"] == scope_tokens(before)
        assert c["tokens_after"] == scope_tokens(after) < c["tokens_before"]
        if "token_threshold" in c["triggers"]:
            assert c["tokens_before"] > 620
        if "message_threshold" in c["triggers"]:
            assert len(before.layer("L3")) > 14


def test_preserved_keys_survive_every_compression_unchanged(six: dict[str, Any]) -> None:
    for c in six["doc"]["compressions"]:
        seq = int(c["snapshot_id"].rsplit(":", 1)[1])
        before, after = at(six["events"], seq), at(six["events"], c["event_seq"])
        for key in ("risk_flags", "round_no"):
            assert after.layer("L3")[key] == before.layer("L3")[key], (key, c)
            assert key not in c["folded"]
        assert after.get("risk_flags") == ["medical-claim", "pii-mention"]


def _prefix(ctx: LayeredContext) -> tuple[str, str]:
    """The stable part of a render: the system message, and the user message up to the end of HISTORY."""
    messages = render(ctx, format="xml")
    user = messages[-1]["content"]
    return messages[0]["content"], user[:user.index("</history>")]


def test_each_compression_is_a_cliff_the_prefix_is_stable_between(six: dict[str, Any]) -> None:
    events, comps = six["events"], six["doc"]["compressions"]
    completes = [e["seq"] for e in events if e["kind"] == "complete"]
    for this, nxt in zip(comps, comps[1:]):
        cliff = int(nxt["snapshot_id"].rsplit(":", 1)[1])
        between = [s for s in completes if this["event_seq"] < s < cliff]
        assert between, (this, nxt)   # at least the revision and the next review ran between
        stable_system, stable = _prefix(at(events, this["event_seq"]))
        for seq in [*between, cliff]:
            system, text = _prefix(at(events, seq))
            assert system == stable_system
            assert text.startswith(stable), seq
        # the cliff itself rewrites the prefix
        assert not _prefix(at(events, nxt["event_seq"]))[1].startswith(stable)


def test_replay_at_every_seq_is_the_context_the_run_had(store: str, six: dict[str, Any]) -> None:
    """Each activity's completion, as the run saw it (the layers its event left), is what ``replay
    --until`` rebuilds there, from the CLI and from REST, and the end is what ``inspect`` shows."""
    iid, events = six["doc"]["instance_id"], six["events"]
    with TestClient(create_app(store, token=TOKEN)) as client:
        client.headers["Authorization"] = f"Bearer {TOKEN}"
        for e in events:
            ctx = at(events, e["seq"])
            layers = {name: dict(ctx.layer(name)) for name in ("L0", "L1", "L2", "L3", "L4", "L5")}
            if e["kind"] in ("complete", "compress", "snapshot") or e["seq"] % 7 == 0:
                got = look(store, "replay", iid, "--until", str(e["seq"]))
                assert json.loads(json.dumps(got["layers"])) == json.loads(json.dumps(layers)), e["seq"]
            rest = client.get(f"/api/instances/{iid}/replay", params={"until": e["seq"]})
            assert rest.status_code == 200, rest.text
            rest_l3 = rest.json()["layers"]["L3"]["keys"]
            assert {k["key"]: k["value"] for k in rest_l3} == json.loads(json.dumps(layers["L3"])), e["seq"]
            assert [k["key"] for k in rest_l3] == list(layers["L3"]), e["seq"]
    assert look(store, "inspect", iid)["layers"] == six["doc"]["layers"]
    with TestClient(create_app(store, token=TOKEN)) as client:
        client.headers["Authorization"] = f"Bearer {TOKEN}"
        seen = client.post("/api/context-governance/inspect", json={"instance_id": iid})
    assert seen.status_code == 200, seen.text
    assert seen.json()["layers"]["L3"]["keys"] == list(six["doc"]["layers"]["L3"])
    assert {"risk_flags", "round_no"} <= set(seen.json()["preserved"])
    assert at(events, events[-1]["seq"]).layer("L3") == six["doc"]["layers"]["L3"]


def test_evaluate_then_decompress_restores_history_on_the_tape(store: str, api: TestClient) -> None:
    """Undoing the third compression brings back what it folded, exactly as its snapshot held it, on
    the tape (nothing deleted); the compressions after it still stand, and say so."""
    doc = run_review(store)
    iid = doc["instance_id"]
    events = tape_events(store, iid)
    comps = doc["compressions"]
    third = comps[2]
    report = api.post("/api/context-governance/compress",
                      json={"instance_id": iid, "action": "evaluate", "before_snapshot_id": third["snapshot_id"]})
    assert report.status_code == 200, report.text
    ev = report.json()
    assert (ev["tokens_before"], ev["tokens_after"]) == (third["tokens_before"], third["tokens_after"])
    assert ev["preserved_intact"] is True
    undone = api.post("/api/context-governance/compress",
                      json={"instance_id": iid, "action": "decompress", "snapshot_id": third["snapshot_id"]})
    assert undone.status_code == 200, undone.text
    after = tape_events(store, iid)
    assert after[:len(events)] == events            # nothing deleted, the undoing appended
    assert [e.get("data", {}).get("note") for e in after[len(events):]][0] == "decompress"
    snap_history = at(events, int(third["snapshot_id"].rsplit(":", 1)[1])).layer("L3")
    now = look(store, "inspect", iid)
    assert third["folded"]
    for key in third["folded"]:                     # what it folded is back, exactly
        assert now["layers"]["L3"][key] == json.loads(json.dumps(snap_history[key])), key
    assert third["compaction_key"] not in now["layers"]["L3"]
    # the later compressions' records still stand in HISTORY, so they are not undone
    later = comps[3:]
    assert later and later[-1]["compaction_key"] in now["layers"]["L3"]
    marks = {c["snapshot_id"]: c.get("undone") for c in now["compressions"]}
    assert marks[third["snapshot_id"]]["by"] == "decompress"
    assert [marks[c["snapshot_id"]] for c in later] == [None] * len(later)
    assert [marks[c["snapshot_id"]] for c in comps[:2]] == [None, None]


def _normal(layers: dict[str, Any]) -> str:
    """Layers without the snapshot ids (their numbers are tape positions: a rollback adds events)."""
    return re.sub(r"snap:main:\d+", "snap", json.dumps(layers, sort_keys=True))


@pytest.mark.parametrize("how", ["cli", "rest"])
def test_rollback_mid_loop_then_resume_ends_as_an_uninterrupted_run(store: str, six: dict[str, Any], api: TestClient,
                                                                    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                    how: str) -> None:
    flag = tmp_path / "fail_once"
    flag.write_text("4")
    monkeypatch.setenv("REVIEW40_FAIL_ONCE", str(flag))
    failed = run_review(store, code=1)
    assert failed["status"] == "error" and failed["error"]["task_id"] == "review"
    iid = failed["instance_id"]
    # the operator rolls the context back to the snapshot taken as round 4's review began
    begins = [e for e in tape_events(store, iid) if e["kind"] == "begin" and e["activity"] == "review"]
    snap = begins[-1]["data"]["snapshot_id"]
    if how == "rest":
        answer = api.post("/api/context-governance/rollback", json={"instance_id": iid, "snapshot_id": snap})
        assert answer.status_code == 200, answer.text
        rolled = answer.json()
    else:
        rolled = look(store, "rollback", iid, "--snapshot", snap)
    assert rolled["layers"]["L3"]["round_no"] == 4 and rolled["snapshot_id"] == snap
    done = look(store, "resume", iid)
    assert done["status"] == "completed", done["error"]
    assert _normal(done["layers"]) == _normal(six["doc"]["layers"])
    assert len(done["compressions"]) == len(six["doc"]["compressions"])


@pytest.mark.parametrize(("change", "field", "said"), [
    (("action: count_only", "action: count_onyl"), "compressRules.2.action", "'extract_keys', 'summarize' or 'count_only'"),
    (("keepLast: 2", "keepLast: -1"), "compressRules.2.keepLast", "greater than or equal to 0"),
    (("compressTokenThreshold: 620", "compressTokenThreshold: 0"), "compressTokenThreshold", "greater than 0"),
    (("compressMessageThreshold: 14", "compressMessageThreshold: 0"), "compressMessageThreshold", "greater than 0"),
])
def test_config_mistakes_name_file_element_field(tmp_path: Path, change: tuple[str, str], field: str, said: str) -> None:
    for name in ("doc_review.bpmn", "review_handlers.py"):
        shutil.copy(HERE / name, tmp_path / name)
    text = (HERE / "doc_review.layerflow.yaml").read_text()
    assert change[0] in text
    (tmp_path / "doc_review.layerflow.yaml").write_text(text.replace(change[0], change[1]))
    for args in (["validate", str(tmp_path / "doc_review.bpmn")],
                 ["run", str(tmp_path / "doc_review.bpmn"), "--data", json.dumps(NEVER), "--store", "memory://"]):
        out = CliRunner().invoke(main, args)
        assert out.exit_code == 2, out.output
        message = out.output
        assert "doc_review.layerflow.yaml" in message and "'review'" in message and field in message, message
        assert said in message and "correct this value" in message, message


def test_a_misspelt_preserve_key_is_named_when_the_key_is_folded(tmp_path: Path) -> None:
    for name in ("doc_review.bpmn", "review_handlers.py"):
        shutil.copy(HERE / name, tmp_path / name)
    text = (HERE / "doc_review.layerflow.yaml").read_text()
    (tmp_path / "doc_review.layerflow.yaml").write_text(text.replace("preserveKeys: [round_no]", "preserveKeys: [round_nr]"))
    doc = run_review("memory://", bpmn=tmp_path / "doc_review.bpmn", code=1)
    message = doc["error"]["message"]
    assert doc["error"]["task_id"] == "verdict"
    assert "'round_no' was removed from HISTORY by the compression after activity 'review'" in message
    assert "'round_nr'" in message and "misspel" in message, message
