"""Outsider round 19: an operator's day on the CLI, written from DESIGN.md ("Interfaces") and README.md
only, with tests/engine/unseen19/batch_release.bpmn:

batch_release: a pharmaceutical batch is inspected in parallel by a QC chemist (a user task) and the
  micro lab (a script that decides `release_decision` from the bioburden); the join `qc_join` asks the
  qualified person when they disagree (humanConfirm default `quarantine`); `certify` writes the
  certificate and folds the lab notes (compressMessageThreshold 3).

Expected before anything ran:
- `run --json` prints one document with every key of DESIGN's shape, the types it names; a person's
  step leaves it `waiting` (exit 3), listed in `waiting_for` (kind user_task / confirmation);
- a disagreement on `release_decision` is one conflict (gateway qc_join, values by branch id: the
  chemist_review and micro_lab branches), its confirmation offering both values and the default;
- each KEY form (the confirmation id, `qc_join/release_decision`, `*`) answers it, by `--answer` and
  by `--answers FILE`; the resolution is the person's (resolver human), the run completes (exit 0);
- `replay --until SEQ` rebuilds the state the tape up to SEQ implies;
- bad input (unknown id, unknown answer key, an answer that is not an option, a malformed answers
  file, `--until` beyond the tape) exits 2 naming what is wrong and writes nothing (tape unchanged);
- stdin that is not a terminal never blocks.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from test_contracts_cli import check_run_document

HERE = Path(__file__).resolve().parent / "unseen19"
BPMN = HERE / "batch_release.bpmn"
ROOT = Path(__file__).resolve().parents[2]
DATA = '{"batch_id": "B-17"}'
CHEMIST_REJECTS = '{"release_decision": "reject", "assay": 99.1}'
LAYERS = ["L0", "L1", "L2", "L3", "L4", "L5"]


def cli(*args: str, stdin: str | None = "") -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    # a pipe that is never a terminal; the timeout only stops a hung CLI, it asserts no speed
    return subprocess.run([sys.executable, "-m", "engine.cli", *args], input=stdin, capture_output=True,
                          text=True, env=env, cwd=ROOT, timeout=120)


@pytest.fixture
def store(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'runs.db'}"


def doc_of(proc: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    doc = json.loads(proc.stdout)
    assert isinstance(doc, dict)
    return doc


def check_schema(doc: dict[str, Any]) -> None:
    """DESIGN's shape, field by field (the contract suite's check), for this process."""
    check_run_document(doc)
    assert doc["process_id"] == "batch_release" and doc["tape_length"] > 0


def start(store: str) -> dict[str, Any]:
    proc = cli("run", str(BPMN), "--data", DATA, "--store", store, "--json")
    assert proc.returncode == 3, proc.stderr
    doc = doc_of(proc)
    check_schema(doc)
    return doc


def at_conflict(store: str) -> dict[str, Any]:
    """An instance whose chemist rejected the batch the lab would release: waiting at the join."""
    iid = start(store)["instance_id"]
    proc = cli("resume", iid, "--answer", f"chemist_review={CHEMIST_REJECTS}", "--store", store, "--json")
    assert proc.returncode == 3, proc.stderr
    doc = doc_of(proc)
    check_schema(doc)
    return doc


def _copy(source: tuple[Path, dict[str, Any]], tmp_path: Path) -> tuple[str, dict[str, Any]]:
    """Each test gets its own copy of a store made once per module (a CLI run costs seconds)."""
    db, doc = source
    shutil.copy(db, tmp_path / "runs.db")
    return f"sqlite:///{tmp_path / 'runs.db'}", doc


@pytest.fixture(scope="module")
def conflict_db(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    db = tmp_path_factory.mktemp("conflict") / "runs.db"
    return db, at_conflict(f"sqlite:///{db}")


@pytest.fixture(scope="module")
def completed_db(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    db = tmp_path_factory.mktemp("completed") / "runs.db"
    return db, completed(f"sqlite:///{db}", db.parent)


@pytest.fixture
def waiting(conflict_db: tuple[Path, dict[str, Any]], tmp_path: Path) -> tuple[str, dict[str, Any]]:
    return _copy(conflict_db, tmp_path)


@pytest.fixture
def done(completed_db: tuple[Path, dict[str, Any]], tmp_path: Path) -> tuple[str, dict[str, Any]]:
    return _copy(completed_db, tmp_path)


def digest(store: str) -> str:
    """What the store holds (instances, tapes, snapshots, confirmations; not the short-lived leases a
    command takes while it looks): a command that writes nothing leaves it as it was."""
    with sqlite3.connect(store.removeprefix("sqlite:///")) as db:
        rows = sorted(line for line in db.iterdump() if "leases" not in line)
    return hashlib.sha256("\n".join(rows).encode()).hexdigest()


def tape_length(store: str, iid: str) -> int:
    proc = cli("inspect", iid, "--store", store, "--json")
    assert proc.returncode == 0, proc.stderr
    return int(doc_of(proc)["tape_length"])


def test_validate_accepts_the_process() -> None:
    proc = cli("validate", str(BPMN))
    assert proc.returncode == 0, proc.stderr + proc.stdout


def test_validate_names_the_bad_field(tmp_path: Path) -> None:
    (tmp_path / "batch_release.bpmn").write_text(BPMN.read_text())
    (tmp_path / "batch_release.layerflow.yaml").write_text(
        "certify:\n  compressMessageThreshold: many\n")
    proc = cli("validate", str(tmp_path / "batch_release.bpmn"))
    assert proc.returncode == 2
    out = proc.stdout + proc.stderr
    assert "certify" in out and "compressMessageThreshold" in out and "batch_release.layerflow.yaml" in out


def test_run_waits_for_the_chemist(store: str) -> None:
    doc = start(store)
    assert doc["status"] == "waiting"
    assert doc["layers"]["L0"]["policy"].startswith("A batch is released")
    assert doc["layers"]["L1"] == {"batch_id": "B-17"}
    assert [(w["kind"], w["task_id"]) for w in doc["waiting_for"]] == [("user_task", "chemist_review")]
    assert doc["conflicts"] == [] and doc["confirmations"] == []


def test_disagreement_is_one_conflict_for_a_person(waiting: tuple[str, dict[str, Any]]) -> None:
    store, doc = waiting
    assert doc["status"] == "waiting"
    [conflict] = doc["conflicts"]
    assert conflict["gateway_id"] == "qc_join" and conflict["key"] == "release_decision"
    assert conflict["values"] == {"chemist_review": "reject", "micro_lab": "release"}
    assert conflict["base_value"] is None and conflict["resolution"] is None
    [confirmation] = doc["confirmations"]
    values = [o["value"] if isinstance(o, dict) else o for o in confirmation["options"]]
    assert {"reject", "release", "quarantine"} <= set(map(str, values)), confirmation["options"]
    assert confirmation["answer"] is None and confirmation["timed_out"] is False
    assert [(w["kind"], w["id"]) for w in doc["waiting_for"]] == [("confirmation", confirmation["id"])]


def finish(doc: dict[str, Any], value: str) -> None:
    check_schema(doc)
    assert doc["status"] == "completed" and doc["waiting_for"] == []
    [conflict] = doc["conflicts"]
    assert conflict["resolution"]["value"] == value and conflict["resolution"]["resolver"] == "human"
    assert doc["layers"]["L3"]["certificate"] == f"B-17:{value}"
    [confirmation] = doc["confirmations"]
    assert confirmation["answer"] == value


@pytest.mark.parametrize("form", ["id", "gateway", "star"])
def test_each_key_form_answers_the_conflict(waiting: tuple[str, dict[str, Any]], form: str) -> None:
    store, doc = waiting
    key = {"id": doc["confirmations"][0]["id"], "gateway": "qc_join/release_decision", "star": "*"}[form]
    before = doc["tape_length"]
    proc = cli("resume", doc["instance_id"], "--answer", f"{key}=quarantine", "--store", store, "--json")
    assert proc.returncode == 0, proc.stderr
    done = doc_of(proc)
    finish(done, "quarantine")
    assert done["tape_length"] > before


def test_a_confirmation_id_in_an_answers_file(waiting: tuple[str, dict[str, Any]], tmp_path: Path) -> None:
    """(`GATEWAY/KEY` and `*` in a file: test_answers_in_advance_run_to_the_end, the `done` fixture)"""
    store, doc = waiting
    key = doc["confirmations"][0]["id"]
    answers = tmp_path / "answers.json"
    answers.write_text(json.dumps({"confirmations": {key: "reject"}}))
    proc = cli("resume", doc["instance_id"], "--answers", str(answers), "--store", store, "--json")
    assert proc.returncode == 0, proc.stderr
    finish(doc_of(proc), "reject")


def test_answers_in_advance_run_to_the_end(store: str, tmp_path: Path) -> None:
    doc = completed(store, tmp_path, "qc_join/release_decision", "release")
    assert doc["layers"]["L3"]["assay"] == 99.1
    for c in doc["compressions"]:
        assert c["activity_id"] == "certify" and c["tokens_after"] <= c["tokens_before"]


def test_agreement_is_no_conflict(store: str, tmp_path: Path) -> None:
    answers = tmp_path / "answers.json"
    answers.write_text(json.dumps({"user_tasks": {"chemist_review": {"release_decision": "release"}}}))
    proc = cli("run", str(BPMN), "--data", DATA, "--answers", str(answers), "--store", store, "--json")
    assert proc.returncode == 0, proc.stderr
    doc = doc_of(proc)
    check_schema(doc)
    assert doc["conflicts"] == [] and doc["confirmations"] == []
    assert doc["layers"]["L3"]["certificate"] == "B-17:release"


def test_closed_stdin_pipe_never_blocks(waiting: tuple[str, dict[str, Any]]) -> None:
    store, doc = waiting
    iid = doc["instance_id"]
    # stdin is a pipe with nothing in it: the CLI must not read a terminal answer from it
    proc = cli("resume", iid, "--store", store, "--json", stdin=None)
    assert proc.returncode == 3, proc.stderr
    assert doc_of(proc)["status"] == "waiting"


def test_inspect_and_tape(waiting: tuple[str, dict[str, Any]]) -> None:
    store, doc = waiting
    iid = doc["instance_id"]
    proc = cli("inspect", iid, "--store", store, "--json")
    assert proc.returncode == 0, proc.stderr
    assert doc_of(proc)["tape_length"] == doc["tape_length"]
    proc = cli("tape", iid, "--store", store, "--kind", "conflict")
    assert proc.returncode == 0 and "release_decision" in proc.stdout, proc.stderr
    proc = cli("tape", iid, "--store", store, "--activity", "chemist_review", "--json")
    assert proc.returncode == 0, proc.stderr
    proc = cli("tape", iid, "--store", store, "--activity", "chemist_reveiw")
    assert proc.returncode == 0 and "chemist_reveiw" in proc.stderr and "chemist_review" in proc.stderr


def events(store: str, iid: str, *context: str) -> list[dict[str, Any]]:
    proc = cli("tape", iid, "--store", store, *(("--context", *context) if context else ()), "--json")
    assert proc.returncode == 0, proc.stderr
    found = json.loads(proc.stdout)
    assert isinstance(found, list) and found
    return found


def implied(tape: list[dict[str, Any]], until: int) -> dict[str, dict[str, Any]]:
    """The layers the tape's changes up to `until` leave: [layer, key, value] sets, [layer, key] deletes."""
    layers: dict[str, dict[str, Any]] = {name: {} for name in LAYERS}
    for event in tape:
        if event["seq"] > until:
            break
        for change in event.get("changes") or []:
            layer = layers[f"L{change[0]}"]
            if len(change) == 3:
                layer[change[1]] = change[2]
            else:
                layer.pop(change[1], None)
    return layers


def completed(store: str, tmp_path: Path, key: str = "*", value: str = "quarantine") -> dict[str, Any]:
    """A run answered in advance by an answers file: the chemist rejects, `key` settles the conflict."""
    answers = tmp_path / "answers.json"
    answers.write_text(json.dumps({"user_tasks": {"chemist_review": json.loads(CHEMIST_REJECTS)},
                                   "confirmations": {key: value}}))
    proc = cli("run", str(BPMN), "--data", DATA, "--answers", str(answers), "--store", store, "--json")
    assert proc.returncode == 0, proc.stderr
    doc = doc_of(proc)
    finish(doc, value)
    return doc


def test_tape_length_counts_every_context(done: tuple[str, dict[str, Any]]) -> None:
    store, doc = done
    tape = events(store, doc["instance_id"])
    assert len(tape) == doc["tape_length"]
    assert {e["context"] for e in tape} == {"main", "main/chemist_review@3", "main/micro_lab@3"}


def test_replay_until_matches_the_tape(done: tuple[str, dict[str, Any]]) -> None:
    store, doc = done
    iid = doc["instance_id"]
    tape = events(store, iid, "main")
    seqs = [e["seq"] for e in tape]
    assert seqs == list(range(1, len(seqs) + 1))
    whole = cli("replay", iid, "--store", store, "--json")
    assert whole.returncode == 0, whole.stderr
    assert doc_of(whole)["layers"] == doc["layers"] == implied(tape, seqs[-1])
    join = next(e["seq"] for e in tape if any(c[1] == "release_decision" for c in e.get("changes") or []))
    fold = doc["compressions"][0]["event_seq"] if doc["compressions"] else seqs[-1]
    replayed = {}
    for seq, args in [(join - 1, ["--until", str(join - 1)]), (join, [str(join)]),   # `replay ID SEQ` too
                      (fold - 1, ["--until", str(fold - 1)])]:
        proc = cli("replay", iid, *args, "--store", store, "--json")
        assert proc.returncode == 0, proc.stderr
        replayed[seq] = doc_of(proc)["layers"]
        assert replayed[seq] == implied(tape, seq), seq
    assert replayed[join]["L3"]["release_decision"] == "quarantine"
    assert "release_decision" not in replayed[join - 1]["L3"]
    assert "lab_note_1" in replayed[fold - 1]["L3"] and "lab_note_1" not in doc["layers"]["L3"]
    # past the end (README: `replay` of a seq the context's tape has not reached is its last state)
    proc = cli("replay", iid, "--until", "9999", "--store", store, "--json")
    assert proc.returncode == 0, proc.stderr
    past = doc_of(proc)
    assert past["tape_end"] == past["until"] == seqs[-1] and past["until_requested"] == 9999
    assert past["layers"] == doc["layers"]


def test_rollback_brings_folded_notes_back(done: tuple[str, dict[str, Any]]) -> None:
    store, doc = done
    iid = doc["instance_id"]
    [fold] = doc["compressions"]
    before = doc["tape_length"]
    proc = cli("rollback", iid, fold["snapshot_id"], "--layers", "L3", "--reason", "audit", "--store", store,
               "--json")
    assert proc.returncode == 0, proc.stderr
    assert tape_length(store, iid) > before
    now = doc_of(cli("inspect", iid, "--store", store, "--json"))["layers"]
    assert now["L3"]["lab_note_1"] == "plate count read at 24h for B-17"
    proc = cli("tape", iid, "--store", store, "--kind", "rollback")
    assert proc.returncode == 0 and fold["snapshot_id"] in proc.stdout, proc.stdout + proc.stderr


@pytest.mark.parametrize("key", ["qc_join/relase_decision", "qc_jion/release_decision"])
def test_a_single_answer_that_matches_nothing_is_named_and_changes_nothing(waiting: tuple[str, dict[str, Any]],
                                                                          key: str) -> None:
    """README: an `--answer` for a key the join waiting now never met, or one that can match nothing,
    is bad input as an answers file's is (BAD below): named, and the instance is unchanged."""
    store, doc = waiting
    before = digest(store)
    proc = cli("resume", doc["instance_id"], "--answer", f"{key}=quarantine", "--store", store)
    # round 18 changed this deliberately: refused as bad input (exit 2), as in an answers file, no
    # longer left out with the instance waiting (exit 3); still named, still changing nothing
    assert proc.returncode == 2 and key in proc.stderr and "Traceback" not in proc.stderr
    assert digest(store) == before


BAD = {
    "unknown instance": (["resume", "nope-123", "--answer", "*=quarantine"], ["nope-123"]),
    "unknown answer key in a file": (["resume", "{iid}", "--answers", "{typo}"],
                                     ["qc_jion/release_decision", "qc_join", "answers.json"]),
    "unknown user task": (["resume", "{iid}", "--answer", 'chemist_reveiw={{"assay": 1}}'],
                          ["chemist_reveiw", "chemist_review"]),
    "not an option": (["resume", "{iid}", "--answer", "qc_join/release_decision=destroy"],
                      ["destroy", "release_decision"]),
    "malformed answers file": (["resume", "{iid}", "--answers", "{bad}"], ["answers.json"]),
    "answers file not an object": (["resume", "{iid}", "--answers", "{list}"], ["answers"]),
    "rollback with open branches": (["rollback", "{iid}", "snap:main:3"], ["chemist_review", "--context"]),
    "rollback unknown snapshot": (["rollback", "{iid}", "snap-nope"], ["snap-nope"]),
}


@pytest.mark.parametrize("case", list(BAD))
def test_bad_input_exits_2_and_writes_nothing(waiting: tuple[str, dict[str, Any]], tmp_path: Path,
                                              case: str) -> None:
    store, doc = waiting
    iid = doc["instance_id"]
    bad = tmp_path / "answers.json"
    bad.write_text('{"confirmations": {"*": "quarantine"')
    typo = tmp_path / "typo" / "answers.json"
    typo.parent.mkdir()
    typo.write_text('{"confirmations": {"qc_jion/release_decision": "quarantine"}}')
    listed = tmp_path / "list_answers.json"
    listed.write_text('["quarantine"]')
    args, names = BAD[case]
    args = [a.format(iid=iid, bad=bad, list=listed, typo=typo) for a in args]
    before = digest(store)
    proc = cli(*args, "--store", store)
    assert proc.returncode == 2, (proc.returncode, proc.stdout, proc.stderr)
    assert "Traceback" not in proc.stderr
    for name in names:
        assert name in proc.stderr, (name, proc.stderr)
    assert digest(store) == before   # nothing written: the tape (and everything else) as it was
