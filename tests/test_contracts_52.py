"""Contracts checked on processes layerflow has never seen (round 52), written from DESIGN.md's
"Interfaces" and "Engine" sections, the seeds' JSON shapes and the README alone:

- an inclusive split that takes two of its three paths, whose branches disagree at the inclusive join,
  with start data that ``data_layers`` maps to WORKING, KNOWLEDGE and HISTORY;
- a sequential multi-instance user task, then a sub-process whose script throws a BPMN error that a
  boundary event of the sub-process catches;
- a sequential multi-instance sub-process with a parallel split/join inside, whose join conflicts in
  every instance;

through the CLI (``run``/``resume``/``inspect``/``tape``/``replay``/``validate``, exit codes 0/1/2/3),
the REST API (a real ``layerflow serve``) and the Python API names of DESIGN.md."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from test_contracts_cli import LAYERS, Cli, check_run_document, one_document
from test_contracts_rest import serving
from test_contracts_rest_35 import _json

XSI = 'xmlns:xsi="http://www.w3.org/2001/XMLSchema-instance"'
HEAD = f"""<?xml version="1.0" encoding="UTF-8"?>
<bpmn:definitions xmlns:bpmn="http://www.omg.org/spec/BPMN/20100524/MODEL" {XSI} id="d" targetNamespace="c52">"""

# two of three paths taken (score 5: not tax_look); both taken paths change `verdict`
VETTING = HEAD + """
  <bpmn:process id="vendor_vetting" isExecutable="true">
    <bpmn:startEvent id="begin"/>
    <bpmn:inclusiveGateway id="fan_out" default="s_none"/>
    <bpmn:scriptTask id="legal_look"><bpmn:script>verdict = "ok"
notes_legal = "fine " + ticket</bpmn:script></bpmn:scriptTask>
    <bpmn:scriptTask id="sec_look"><bpmn:script>verdict = "block"
attempts = attempts + 1</bpmn:script></bpmn:scriptTask>
    <bpmn:scriptTask id="tax_look"><bpmn:script>verdict = "tax"</bpmn:script></bpmn:scriptTask>
    <bpmn:inclusiveGateway id="fan_in"/>
    <bpmn:scriptTask id="wrap_up"><bpmn:script>final = verdict + "/" + str(attempts)</bpmn:script></bpmn:scriptTask>
    <bpmn:endEvent id="finish"/>
    <bpmn:sequenceFlow id="s1" sourceRef="begin" targetRef="fan_out"/>
    <bpmn:sequenceFlow id="s2" sourceRef="fan_out" targetRef="legal_look">
      <bpmn:conditionExpression xsi:type="bpmn:tFormalExpression">score &gt; 1</bpmn:conditionExpression></bpmn:sequenceFlow>
    <bpmn:sequenceFlow id="s3" sourceRef="fan_out" targetRef="sec_look">
      <bpmn:conditionExpression xsi:type="bpmn:tFormalExpression">score &gt; 2</bpmn:conditionExpression></bpmn:sequenceFlow>
    <bpmn:sequenceFlow id="s4" sourceRef="fan_out" targetRef="tax_look">
      <bpmn:conditionExpression xsi:type="bpmn:tFormalExpression">score &gt; 100</bpmn:conditionExpression></bpmn:sequenceFlow>
    <bpmn:sequenceFlow id="s_none" sourceRef="fan_out" targetRef="fan_in"/>
    <bpmn:sequenceFlow id="s5" sourceRef="legal_look" targetRef="fan_in"/>
    <bpmn:sequenceFlow id="s6" sourceRef="sec_look" targetRef="fan_in"/>
    <bpmn:sequenceFlow id="s7" sourceRef="tax_look" targetRef="fan_in"/>
    <bpmn:sequenceFlow id="s8" sourceRef="fan_in" targetRef="wrap_up"/>
    <bpmn:sequenceFlow id="s9" sourceRef="wrap_up" targetRef="finish"/>
  </bpmn:process>
</bpmn:definitions>
"""
VETTING_CONFIG = """system:
  policy: vet every vendor
data_layers:
  attempts: WORKING
  verdict: WORKING
  ticket: KNOWLEDGE
  intake_note: HISTORY
"""
VETTING_DATA = {"score": 5, "attempts": 0, "verdict": "pending", "ticket": "T-52", "intake_note": "by phone"}

# each juror votes in turn; a sub-process counts the votes and throws `no_support` when none is yes
PANEL = HEAD + """
  <bpmn:process id="panel_votes" isExecutable="true">
    <bpmn:startEvent id="go"/>
    <bpmn:userTask id="cast_vote">
      <bpmn:multiInstanceLoopCharacteristics isSequential="true">
        <bpmn:loopDataInputRef>jurors</bpmn:loopDataInputRef>
        <bpmn:loopDataOutputRef>votes</bpmn:loopDataOutputRef>
        <bpmn:inputDataItem id="juror"/>
        <bpmn:outputDataItem id="vote"/>
      </bpmn:multiInstanceLoopCharacteristics>
    </bpmn:userTask>
    <bpmn:subProcess id="tally">
      <bpmn:startEvent id="t_start"/>
      <bpmn:scriptTask id="count_votes"><bpmn:script>yes_votes = len([v for v in votes if v == "yes"])
if yes_votes == 0:
    raise BpmnError("no_support")</bpmn:script></bpmn:scriptTask>
      <bpmn:endEvent id="t_end"/>
      <bpmn:sequenceFlow id="t1" sourceRef="t_start" targetRef="count_votes"/>
      <bpmn:sequenceFlow id="t2" sourceRef="count_votes" targetRef="t_end"/>
    </bpmn:subProcess>
    <bpmn:boundaryEvent id="on_no_support" attachedToRef="tally">
      <bpmn:errorEventDefinition errorRef="err_ns"/>
    </bpmn:boundaryEvent>
    <bpmn:scriptTask id="reject"><bpmn:script>outcome = "rejected"</bpmn:script></bpmn:scriptTask>
    <bpmn:scriptTask id="accept"><bpmn:script>outcome = "accepted"</bpmn:script></bpmn:scriptTask>
    <bpmn:endEvent id="done_ok"/>
    <bpmn:endEvent id="done_rej"/>
    <bpmn:sequenceFlow id="f1" sourceRef="go" targetRef="cast_vote"/>
    <bpmn:sequenceFlow id="f2" sourceRef="cast_vote" targetRef="tally"/>
    <bpmn:sequenceFlow id="f3" sourceRef="tally" targetRef="accept"/>
    <bpmn:sequenceFlow id="f4" sourceRef="accept" targetRef="done_ok"/>
    <bpmn:sequenceFlow id="f5" sourceRef="on_no_support" targetRef="reject"/>
    <bpmn:sequenceFlow id="f6" sourceRef="reject" targetRef="done_rej"/>
  </bpmn:process>
  <bpmn:error id="err_ns" errorCode="no_support"/>
</bpmn:definitions>
"""

# two readers grade each essay in turn; their join conflicts once per essay
GRADING = HEAD + """
  <bpmn:process id="essay_grading" isExecutable="true">
    <bpmn:startEvent id="e0"/>
    <bpmn:subProcess id="grade_each">
      <bpmn:multiInstanceLoopCharacteristics isSequential="true">
        <bpmn:loopDataInputRef>essays</bpmn:loopDataInputRef>
        <bpmn:loopDataOutputRef>grades</bpmn:loopDataOutputRef>
        <bpmn:inputDataItem id="essay"/>
        <bpmn:outputDataItem id="grade"/>
      </bpmn:multiInstanceLoopCharacteristics>
      <bpmn:startEvent id="g0"/>
      <bpmn:parallelGateway id="gsplit"/>
      <bpmn:scriptTask id="reader_a"><bpmn:script>grade = "A" if len(essay) &gt; 3 else "B"</bpmn:script></bpmn:scriptTask>
      <bpmn:scriptTask id="reader_b"><bpmn:script>grade = "C"</bpmn:script></bpmn:scriptTask>
      <bpmn:parallelGateway id="gjoin"/>
      <bpmn:endEvent id="g9"/>
      <bpmn:sequenceFlow id="h1" sourceRef="g0" targetRef="gsplit"/>
      <bpmn:sequenceFlow id="h2" sourceRef="gsplit" targetRef="reader_a"/>
      <bpmn:sequenceFlow id="h3" sourceRef="gsplit" targetRef="reader_b"/>
      <bpmn:sequenceFlow id="h4" sourceRef="reader_a" targetRef="gjoin"/>
      <bpmn:sequenceFlow id="h5" sourceRef="reader_b" targetRef="gjoin"/>
      <bpmn:sequenceFlow id="h6" sourceRef="gjoin" targetRef="g9"/>
    </bpmn:subProcess>
    <bpmn:scriptTask id="report"><bpmn:script>summary = ",".join(grades)</bpmn:script></bpmn:scriptTask>
    <bpmn:endEvent id="e9"/>
    <bpmn:sequenceFlow id="k1" sourceRef="e0" targetRef="grade_each"/>
    <bpmn:sequenceFlow id="k2" sourceRef="grade_each" targetRef="report"/>
    <bpmn:sequenceFlow id="k3" sourceRef="report" targetRef="e9"/>
  </bpmn:process>
</bpmn:definitions>
"""
EVENT_FIELDS = {"seq": int, "kind": str, "time": (int, float), "actor": str, "context": str}


@pytest.fixture
def cli(tmp_path: Path) -> Cli:
    c = Cli(tmp_path)
    c.file("vetting.bpmn", VETTING)
    c.file("vetting.layerflow.yaml", VETTING_CONFIG)
    c.file("panel.bpmn", PANEL)
    c.file("grading.bpmn", GRADING)
    return c


def _tape(cli: Cli, iid: str, *args: str) -> list[dict[str, Any]]:
    out = cli("tape", iid, *args, "--json")
    assert out.returncode == 0, out.stderr
    events: list[dict[str, Any]] = one_document(out.stdout)
    return events


def check_tape(events: list[dict[str, Any]]) -> None:
    """Every event: a sequence number, time, actor, activity and branch (DESIGN "Tape"); each context
    numbers its own tape from 1, without gaps."""
    by_context: dict[str, list[int]] = {}
    for e in events:
        for field, kind in EVENT_FIELDS.items():
            assert isinstance(e[field], kind), (field, e)
        assert "activity" in e and "branch" in e, e
        by_context.setdefault(e["context"], []).append(e["seq"])
    for name, seqs in by_context.items():
        assert sorted(seqs) == list(range(1, len(seqs) + 1)), (name, seqs)


# ----------------------------------------------------------------------------- inclusive: two of three


def test_inclusive_two_of_three_conflict_waits_then_resumes(cli: Cli) -> None:
    doc = cli.doc("run", "vetting.bpmn", "--data", cli.file("v.json", VETTING_DATA), code=3)
    check_run_document(doc)
    iid = doc["instance_id"]
    assert doc["process_id"] == "vendor_vetting" and doc["status"] == "waiting"
    # start data went where data_layers says; the rest to PROCESS; SYSTEM from the config
    layers = doc["layers"]
    assert layers["L0"] == {"policy": "vet every vendor"} and layers["L1"] == {"score": 5}
    assert layers["L2"]["ticket"] == "T-52" and layers["L3"]["intake_note"] == "by phone"
    assert layers["L4"] == {"attempts": 0, "verdict": "pending"}
    # the conflict: branch ids are the targets of the taken flows (not tax_look, not taken)
    [conflict] = doc["conflicts"]
    assert conflict["gateway_id"] == "fan_in" and conflict["key"] == "verdict" and conflict["layer"] == "L4"
    assert conflict["base_value"] == "pending" and conflict["resolution"] is None
    assert conflict["values"] == {"legal_look": "ok", "sec_look": "block"}
    [waiting] = doc["waiting_for"]
    assert (waiting["kind"], waiting["id"], waiting["task_id"]) == ("confirmation", "fan_in/verdict", "fan_in")
    [asked] = doc["confirmations"]
    assert asked["id"] == "fan_in/verdict" and asked["answer"] is None and asked["timed_out"] is False
    assert {"ok", "block"} <= {o["value"] for o in asked["options"]}

    done = cli.doc("resume", iid, "--answer", "fan_in/verdict=block", code=0)
    check_run_document(done)
    assert done["status"] == "completed" and done["waiting_for"] == []
    [settled] = done["conflicts"]
    assert settled["resolution"]["value"] == "block" and settled["resolution"]["resolver"] == "human"
    history = done["layers"]["L3"]
    # only sec_look changed `attempts`: taken without a conflict; the resolution is what the next step read
    assert history["verdict"] == "block" and history["attempts"] == 1 and history["final"] == "block/1"
    assert history["notes_legal"] == "fine T-52"
    [logged] = history["_mergedConflicts"]  # the seed's shape
    assert logged["key"] == "verdict" and logged["baseValue"] == "pending"
    assert logged["conflictingValues"] == ["ok", "block"] and logged["sourceBranches"] == ["legal_look", "sec_look"]
    assert logged["resolution"]["value"] == "block"
    record = history["activity:wrap_up"]
    assert record["activity"] == "wrap_up" and record["status"] == "completed" and "final" in record["keys"]
    assert done["layers"]["L4"] == {} and done["layers"]["L5"] == {}

    events = _tape(cli, iid)
    check_tape(events)
    assert len(events) == done["tape_length"]
    [split] = [e for e in events if (e.get("data") or {}).get("note") == "split"]
    assert split["data"]["branches"] == ["legal_look", "sec_look"]
    branch_writes = [e for e in events if e["kind"] == "write" and e["context"] != "main"]
    assert {e["branch"] for e in branch_writes} == {"legal_look", "sec_look"}
    assert all(e["activity"] == e["branch"] for e in branch_writes)  # each branch's only activity wrote it
    [conflict_note] = [e for e in events if (e.get("data") or {}).get("note") == "conflict"]
    assert conflict_note["data"]["key"] == "verdict" and conflict_note["actor"] == "fan_in"

    # the whole tape rebuilds the context as it is now; --until rebuilds it as it was
    now = cli.doc("replay", iid, code=0)
    assert now["layers"] == done["layers"] and now["tokens"] == done["tokens"]
    before_split = cli.doc("replay", iid, "--until", str(split["seq"] - 1), code=0)
    assert before_split["layers"]["L4"] == {"attempts": 0, "verdict": "pending"}
    assert before_split["until"] == split["seq"] - 1


# ----------------------------------------------------------------------------- sequential MI user task + error


def test_sequential_votes_then_a_caught_sub_process_error(cli: Cli) -> None:
    doc = cli.doc("run", "panel.bpmn", "--data", '{"jurors": ["ann", "bob"]}', code=3)
    check_run_document(doc)
    [first] = doc["waiting_for"]
    assert (first["kind"], first["task_id"], first["instance"], first["input"]) == \
        ("user_task", "cast_vote", 1, {"juror": "ann"})
    iid = doc["instance_id"]
    # the BPMN id answers every instance alike, one after the other
    done = cli.doc("resume", iid, "--answer", 'cast_vote={"vote": "no"}', code=0)
    check_run_document(done)
    history = done["layers"]["L3"]
    assert history["votes"] == ["no", "no"] and history["outcome"] == "rejected"
    assert "yes_votes" not in history  # the throwing script's writes are not kept
    assert history["activity:count_votes"]["status"] == "error_thrown"
    assert history["event:on_no_support"]["code"] == "no_support"
    assert history["error_code"] == "no_support"
    events = _tape(cli, iid)
    check_tape(events)
    assert len(events) == done["tape_length"]


# ----------------------------------------------------------------------------- sequential MI sub-process joins


def test_a_join_inside_a_sequential_multi_instance_asks_once_per_instance(tmp_path: Path) -> None:
    from engine import Engine, load_process

    (tmp_path / "grading.bpmn").write_text(GRADING)
    engine = Engine("memory://")
    first = engine.run(load_process(str(tmp_path / "grading.bpmn")), {"essays": ["long essay", "no"]})
    doc = first.to_document()
    check_run_document(doc)
    [c1] = doc["conflicts"]
    assert c1["values"] == {"reader_a": "A", "reader_b": "C"} and c1["context"] != "main"
    mid = engine.resume(first.id, answers={"confirmations": {"gjoin/grade": "A"}})
    doc = mid.to_document()
    assert [c["values"] for c in doc["conflicts"]] == [{"reader_a": "A", "reader_b": "C"},
                                                       {"reader_a": "B", "reader_b": "C"}]
    [waiting] = doc["waiting_for"]
    assert waiting["id"] == "gjoin/grade" and waiting["context"] == doc["conflicts"][1]["context"]
    done = engine.resume(first.id, answers={"confirmations": {"gjoin/grade": "C"}})
    assert done.status == "completed"
    assert done.main.resolve("grades") == ["A", "C"] and done.main.resolve("summary") == "A,C"


# ----------------------------------------------------------------------------- validate and bad input


def test_validate_names_file_line_element_and_field(cli: Cli) -> None:
    cli.file("broken.bpmn", VETTING.replace("vendor_vetting", "broken_vetting"))
    cli.file("broken.layerflow.yaml", "data_layers:\n  verdict: WORKNG\nfan_in:\n  mergeStrategy: FIRST_WINS\n"
                                      "legal_lok:\n  preserveKeys: [a]\n")
    out = cli("validate", "broken.bpmn", "--json")
    assert out.returncode == 2, out.stderr
    report = one_document(out.stdout)
    assert report["ok"] is False and report["errors"] == 3
    found = {(p["element_id"], p["field"], p["line"]) for p in report["problems"]}
    assert found == {(None, "data_layers.verdict", 2), ("fan_in", "mergeStrategy", 4), ("legal_lok", None, 5)}
    assert all(p["file"].endswith("broken.layerflow.yaml") for p in report["problems"])
    assert "broken.layerflow.yaml:4: element 'fan_in': field 'mergeStrategy'" in \
        next(p["text"] for p in report["problems"] if p["element_id"] == "fan_in")


# ----------------------------------------------------------------------------- REST


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    folder = tmp_path_factory.mktemp("rest52")
    catalog = folder / "catalog"
    catalog.mkdir()
    (catalog / "vetting.bpmn").write_text(VETTING)
    (catalog / "vetting.layerflow.yaml").write_text(VETTING_CONFIG)
    yield from serving(folder, catalog)


def test_rest_start_inspect_resolve_and_tape(server: str) -> None:
    started = _json("POST", f"{server}/api/instances", json={"process_id": "vendor_vetting", "data": VETTING_DATA})
    check_run_document(started)
    iid = started["instance_id"]
    assert started["status"] == "waiting" and started["layers"]["L4"] == {"attempts": 0, "verdict": "pending"}
    # the seed's context_inspect shape
    seen = _json("POST", f"{server}/api/context-governance/inspect",
                 json={"instance_id": iid, "layers": ["L3", "L4"], "metrics": ["token_count", "key_count",
                                                                               "attention_score"]})
    for name in ("L3", "L4"):
        assert type(seen[name]["token_count"]) is int and type(seen[name]["key_count"]) is int
        assert set(seen[name]["attention_score"]) >= {"density", "redundancy"}
    assert seen["L4"]["key_count"] == 2
    # the seed's resolve shape
    settled = _json("POST", f"{server}/api/context-governance/resolve",
                    json={"instance_id": iid, "conflict_key": "verdict", "resolution": "ok", "reason": "legal wins"})
    assert settled["status"] == "completed"
    [c] = settled["conflicts"]
    assert c["resolution"]["value"] == "ok" and "legal wins" in c["resolution"]["reason"]
    assert settled["layers"]["L3"]["final"] == "ok/1"
    document = _json("GET", f"{server}/api/instances/{iid}")
    assert document["layers"] == settled["layers"] and document["tape_length"] == settled["tape_length"]
    tape = _json("GET", f"{server}/api/instances/{iid}/tape")
    check_tape(tape["events"])
    assert tape["total"] == document["tape_length"]


# ----------------------------------------------------------------------------- Python API


def test_python_api_runs_the_unseen_process(tmp_path: Path) -> None:
    from context_layers import Layer, LayeredContext
    from engine import Engine, load_process

    (tmp_path / "vetting.bpmn").write_text(VETTING)
    (tmp_path / "vetting.layerflow.yaml").write_text(VETTING_CONFIG)
    engine = Engine("memory://")
    instance = engine.run(engine.start(load_process(str(tmp_path / "vetting.bpmn")), dict(VETTING_DATA)))
    assert instance.status == "waiting"
    done = engine.resume(instance.id, answers={"confirmations": {"fan_in/verdict": "ok"}})
    assert done.status == "completed" and done.main.resolve("final") == "ok/1"
    assert done.main.layer(Layer.PROCESS) == {"score": 5}
    assert LayeredContext.replay(done.main.tape) == done.main
    assert [str(layer) for layer in Layer] == LAYERS
