"""Unseen processes, round 13: a medical prior authorization (tests/engine/unseen13/prior_auth.bpmn),
written by an outsider who read DESIGN.md and the README only, driven through the CLI in subprocesses,
the Python API (with a clock of the test's own), the REST API of a real server and a fake model.

The process: a model step summarizes the request (offline: a handler), writing to WORKING and, for
`plan_tier`, which the start data put in KNOWLEDGE (`data_layers`), to KNOWLEDGE by auto-promotion;
an exclusive gateway with a default sends an urgent request to `fast_track`, any other to a
clinician's `clinical_review` (a Camunda form, an interrupting 48-hour boundary timer that pends the
request); three parallel checks disagree: `medical_necessity` and `benefits_check` write `decision`
differently (a policy rule that asks a person: `confirm: true`), `benefits_check` raises `copay`
while `fraud_screen` deletes it (a rule settles it), and each adds to `reviewers` (a `union`
reducer); an event-based gateway waits for the provider's records (a message) or 72 hours; a
determination sub-process with its own config gathers long evidence and writes the letter, whose
token threshold folds the older history but never a preserved key.

Every expectation was worked out by hand from DESIGN.md and the README first."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from context_layers import ContextWriteDenied, Layer, LayeredContext
from engine import Engine, load_process
from engine.api import create_app

from test_unseen_processes import _check_document
from test_unseen_processes_4 import fake_model  # noqa: F401 - the "fake_model" fixture
from governance_helpers import TOKEN, ServerThread

HERE = Path(__file__).resolve().parent / "unseen13"
ROOT = Path(__file__).resolve().parents[2]
BPMN = HERE / "prior_auth.bpmn"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
HOUR = 3600.0
REQUEST = {"member_id": "M-1001", "procedure": "MRI lumbar", "diagnosis_code": "M54.5", "cost": 1800,
           "plan_tier": "gold"}
# what the letter step and the preserveKeys of the sub-process and of write_letter keep whole
PRESERVED = {"member_id", "letter", "copay", "decision"}
RECORDS = ("activity:", "event:", "compaction:", "summary:", "_")


def layerflow(*args: str, store: str) -> tuple[int, Any, str]:
    """``layerflow ARGS --store STORE`` in a subprocess: (exit code, the --json document or stdout, stderr)."""
    done = subprocess.run([sys.executable, "-m", "engine.cli", *args, "--store", store], capture_output=True,
                          text=True, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=120)
    out: Any = done.stdout
    if "--json" in args:
        try:
            out = json.loads(done.stdout)
        except json.JSONDecodeError:
            raise AssertionError(f"not one JSON document: {done.stdout!r} {done.stderr!r}") from None
    return done.returncode, out, done.stderr


def data_of(layer: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in layer.items() if not k.startswith(RECORDS)}


class Clock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


# ------------------------------------------------------------------ the CLI, step by step


def test_the_cli_runs_the_request_through_review_join_records_and_letter(tmp_path: Path) -> None:
    """run (3: the clinician and the deadline wait) -> bad answers (2, the task still waits, only the
    refusal on the tape) -> the answer (3: the join asks about `decision`; `copay` the rule settled,
    `reviewers` the reducer merged) -> a wrong option (2) -> the answer (3: the records or the timer)
    -> a message nobody waits for (2) -> the records (0: the letter)."""
    store = f"sqlite:///{tmp_path / 'pa.db'}"
    code, doc, err = layerflow("run", str(BPMN), "--data", json.dumps(REQUEST), "--json", store=store)
    _check_document(doc, code, "prior_auth")
    assert code == 3, err
    iid = doc["instance_id"]
    assert [(w["kind"], w["task_id"]) for w in doc["waiting_for"]] == [("user_task", "clinical_review"),
                                                                         ("timer", "review_deadline")]
    form = doc["waiting_for"][0]["form"]
    assert [(f["id"], f["type"], f["required"], f["default"]) for f in form["fields"]] == [
        ("necessity", "enum", True, None), ("review_minutes", "long", False, 15)]
    # the model step's writes: WORKING -> HISTORY; plan_tier auto-promoted to KNOWLEDGE, where the data put it
    assert doc["layers"]["L2"] == {"plan_tier": "gold-reviewed"}
    assert data_of(doc["layers"]["L3"]) == {"clinical_summary": "MRI lumbar for M54.5", "urgency": "routine",
                                            "copay": 20, "reviewers": ["intake"]}
    assert doc["layers"]["L1"] == {k: v for k, v in REQUEST.items() if k != "plan_tier"}
    assert doc["layers"]["L3"]["activity:summarize_request"]["keys"] == [
        "clinical_summary", "urgency", "plan_tier", "copay", "reviewers"]

    length = doc["tape_length"]
    for answer, field in (('{"necessity": "maybe"}', "necessity"), ('{"necessity": "yes", "review_minutes": 0}',
                                                                      "review_minutes")):
        code, bad, err = layerflow("resume", iid, "--answer", f"clinical_review={answer}", "--json", store=store)
        assert code == 2 and bad["error"]["kind"] == "invalid_answer", (bad, err)
        assert bad["error"]["task_id"] == "clinical_review" and [p["field"] for p in bad["error"]["problems"]] == [field]
        length += 1                                             # the refusal (answer_refused) and nothing else
        code, now, _ = layerflow("inspect", iid, "--json", store=store)
        assert now["status"] == "waiting" and now["tape_length"] == length
        assert now["layers"]["L3"] == doc["layers"]["L3"]
    # a person's answer may not rewrite a PROCESS fact: exit 2 naming the key and the layer
    code, bad, _ = layerflow("resume", iid, "--answer", 'clinical_review={"necessity": "yes", "cost": 1}', "--json",
                             store=store)
    assert code == 2 and "'cost'" in bad["error"]["message"] and "L1" in bad["error"]["message"]

    code, doc, err = layerflow("resume", iid, "--answer", 'clinical_review={"necessity": "yes"}', "--json",
                               store=store)
    assert code == 3, err
    assert [w["id"] for w in doc["waiting_for"]] == ["checks_join/decision"]
    conflicts = {c["key"]: c for c in doc["conflicts"]}
    assert set(conflicts) == {"copay", "decision"}          # reviewers: the reducer, no conflict
    assert conflicts["copay"] == {"gateway_id": "checks_join", "layer": "L4", "key": "copay", "base_value": 20,
                                  "values": {"benefits_check": 50, "fraud_screen": {"$deleted": True}},
                                  "resolution": {"value": 50, "resolver": "policy",
                                                 "reason": "the benefit schedule applies"}}
    assert conflicts["decision"]["values"] == {"medical_necessity": "approve", "benefits_check": "deny"}
    assert conflicts["decision"]["resolution"] is None and conflicts["decision"]["base_absent"] is True
    [asked] = doc["confirmations"]
    assert (asked["suggested"], asked["default"]) == ("approve", "deny")
    assert [o["value"] for o in asked["options"]] == ["approve", "deny", "$escalate"]
    # the join waits for a person: the main context is as the split left it (README)
    assert "decision" not in doc["layers"]["L3"] and doc["layers"]["L3"]["copay"] == 20

    code, bad, _ = layerflow("resume", iid, "--answer", "checks_join/decision=maybe", "--json", store=store)
    assert code == 2 and "checks_join/decision" in bad["error"]["message"] and "maybe" in bad["error"]["message"]

    code, doc, err = layerflow("resume", iid, "--answer", "checks_join/decision=approve", "--json", store=store)
    assert code == 3, err
    assert sorted((w["kind"], w["task_id"]) for w in doc["waiting_for"]) == [("event", "await_provider"),
                                                                             ("timer", "records_late")]
    merged = data_of(doc["layers"]["L3"])
    assert (merged["decision"], merged["copay"], merged["reviewers"], merged["fraud_flag"]) == (
        "approve", 50, ["intake", "md", "benefits", "siu"], False)
    log = {c["key"]: c["resolution"]["resolver"] for c in doc["layers"]["L4"]["_mergedConflicts"]}
    assert log == {"copay": "policy", "decision": "human"}

    code, bad, err = layerflow("send", iid, "records_recieved", "--json-payload", '{"files": ["mri.pdf"]}', "--json",
                               store=store)
    assert code == 2 and "records_received" in bad["error"]["message"], err
    code, bad, err = layerflow("send", iid, "records_received", "--json-payload",
                               '{"files": ["mri.pdf"], "member_id": "M-9"}', "--json", store=store)
    assert code == 2 and "member_id" in bad["error"]["message"], err

    code, doc, err = layerflow("send", iid, "records_received", "--json-payload",
                               '{"files": ["mri.pdf", "notes.pdf"]}', "--json", store=store)
    _check_document(doc, code, "prior_auth")
    assert code == 0, err
    history = doc["layers"]["L3"]
    assert history["letter"] == "Request M-1001: approve, copay 50, records attached:2"
    [c] = doc["compressions"]
    assert (c["activity_id"], c["context"], c["triggers"][0]) == ("write_letter", "main", "token_threshold")
    assert c["tokens_before"] > 300 and c["tokens_after"] < c["tokens_before"]
    assert c["snapshot_id"].startswith("snap:") and "evidence_log" in c["folded"]
    # preserved keys are never lost, whoever preserved them: the letter step, the sub-process, the model step
    assert not PRESERVED & set(c["folded"])
    assert {k: history.get(k, doc["layers"]["L1"].get(k)) for k in PRESERVED} == {
        "member_id": "M-1001", "letter": history["letter"], "copay": 50, "decision": "approve"}
    (tmp_path / "done.json").write_text(json.dumps(doc))


def _completed(tmp_path: Path) -> tuple[dict[str, Any], str]:
    """A request run to its end through the CLI, with its answers given in advance (--answers)."""
    store = f"sqlite:///{tmp_path / 'done.db'}"
    answers = tmp_path / "answers.json"
    answers.write_text(json.dumps({"user_tasks": {"clinical_review": {"necessity": "yes"}},
                                   "confirmations": {"checks_join/decision": "approve"}}))
    code, doc, err = layerflow("run", str(BPMN), "--data", json.dumps(REQUEST), "--answers", str(answers), "--json",
                               store=store)
    assert code == 3 and [w["kind"] for w in doc["waiting_for"]] == ["timer", "event"], err
    code, doc, err = layerflow("send", doc["instance_id"], "records_received", "--json-payload", '{"files": []}',
                               "--json", store=store)
    assert code == 0, err
    return doc, store


def test_tape_replay_and_rollback_of_the_finished_request(tmp_path: Path) -> None:
    """DESIGN: the compression is one event on the tape after its snapshot; replay up to before it
    gives the unfolded history; a rollback to that snapshot brings the folded keys back and adds to
    the tape (nothing deleted); the whole tape rebuilds the context byte for byte."""
    doc, store = _completed(tmp_path)
    iid = doc["instance_id"]
    [c] = doc["compressions"]
    code, events, _ = layerflow("tape", iid, "--kind", "compression", "--json", store=store)
    assert code == 0 and [(e["seq"], e["actor"]) for e in events] == [(c["event_seq"], "write_letter")]
    code, kinds, _ = layerflow("tape", iid, "--kind", "conflict", "--json", store=store)
    assert code == 0 and sorted(e["data"]["key"] for e in kinds) == ["copay", "decision"]
    code, before, _ = layerflow("replay", iid, "--until", str(c["event_seq"] - 1), "--json", store=store)
    assert code == 0 and set(c["folded"]) <= set(before["layers"]["L3"])
    assert "compaction:1" not in before["layers"]["L3"]
    code, _, err = layerflow("rollback", iid, "--snapshot", c["snapshot_id"], "--json", store=store)
    assert code == 0, err
    code, after, _ = layerflow("inspect", iid, "--json", store=store)
    assert code == 0 and after["tape_length"] > doc["tape_length"]
    assert set(c["folded"]) <= set(after["layers"]["L3"]) and "compaction:1" not in after["layers"]["L3"]
    # the engine's snapshot is taken as write_letter ended, before its cliff: the letter is in it
    assert after["layers"]["L3"]["letter"] == doc["layers"]["L3"]["letter"]
    main = Engine(store).load(iid).main
    assert LayeredContext.replay(main.tape) == main
    code, bad, err = layerflow("rollback", iid, "--snapshot", "snap:main:nope", "--json", store=store)
    assert code == 2 and "snap:main:nope" in (json.dumps(bad) + err)
    code, again, _ = layerflow("inspect", iid, "--json", store=store)
    assert again["tape_length"] == after["tape_length"]


# ------------------------------------------------------------------ the sub-process's own config


def test_a_sub_processes_preserve_keys_survive_the_compressions_inside_it() -> None:
    """DESIGN: preserveKeys always survive unchanged, and no compressor may drop them. The
    determination sub-process preserves `decision`, the join's settled outcome; the cliff after its
    `write_letter` step (whose own preserveKeys do not name it) must not fold it. Before the fix a
    sub-process's config was read by no one: `decision` went into `compaction:1`."""
    engine = Engine("memory://")
    answers = {"user_tasks": {"clinical_review": {"necessity": "no"}}, "confirmations": {"checks_join/decision": "deny"}}
    waiting = engine.run(load_process(BPMN), REQUEST, answers=answers)
    assert [w["kind"] for w in waiting.waiting_for] == ["timer", "event"], waiting.error
    done = engine.send_event(waiting.id, "records_received", {"files": ["a.pdf"]})
    assert done.status == "completed", done.error
    [c] = done.compressions
    assert "decision" not in c["folded"] and "evidence_log" in c["folded"]
    assert done.main.layer(Layer.HISTORY)["decision"] == "deny"
    assert "decision" in done.main.preserved
    marks = [e for e in done.main.tape if e.data.get("note") == "preserve" and "decision" in e.data["preserve"]]
    assert [e.actor for e in marks] == ["determination"]
    assert LayeredContext.replay(done.main.tape) == done.main
