"""Black-box checks of the ``layerflow`` CLI contract (DESIGN.md "Interfaces").

The CLI runs as a separate process, with stdin that is not a terminal, on processes
written here: exit codes 0 completed / 3 waiting / 1 error / 2 bad input; ``--json``
prints exactly one JSON document with the documented fields and types; ``--answers``
keyed by task id, confirmation id, ``GATEWAY/KEY`` and ``*``; ``resume``; branch ids;
deleted keys absent."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
LAYERS = ["L0", "L1", "L2", "L3", "L4", "L5"]

SEQ = """<?xml version="1.0" encoding="UTF-8"?>
<bpmn:definitions xmlns:bpmn="http://www.omg.org/spec/BPMN/20100524/MODEL" id="d" targetNamespace="x">
  <bpmn:process id="seq_proc" isExecutable="true">
    <bpmn:startEvent id="s"><bpmn:outgoing>f1</bpmn:outgoing></bpmn:startEvent>
    <bpmn:scriptTask id="prep"><bpmn:incoming>f1</bpmn:incoming><bpmn:outgoing>f2</bpmn:outgoing>
      <bpmn:script>temp = "drop me"
score = amount * 2</bpmn:script></bpmn:scriptTask>
    <bpmn:scriptTask id="clean"><bpmn:incoming>f2</bpmn:incoming><bpmn:outgoing>f3</bpmn:outgoing>
      <bpmn:script>del temp</bpmn:script></bpmn:scriptTask>
    <bpmn:userTask id="approve"><bpmn:incoming>f3</bpmn:incoming><bpmn:outgoing>f4</bpmn:outgoing></bpmn:userTask>
    <bpmn:exclusiveGateway id="decide" default="f_no">
      <bpmn:incoming>f4</bpmn:incoming><bpmn:outgoing>f_yes</bpmn:outgoing><bpmn:outgoing>f_no</bpmn:outgoing>
    </bpmn:exclusiveGateway>
    <bpmn:scriptTask id="accept"><bpmn:incoming>f_yes</bpmn:incoming><bpmn:outgoing>f5</bpmn:outgoing>
      <bpmn:script>outcome = "accepted"</bpmn:script></bpmn:scriptTask>
    <bpmn:scriptTask id="refuse"><bpmn:incoming>f_no</bpmn:incoming><bpmn:outgoing>f6</bpmn:outgoing>
      <bpmn:script>outcome = "refused"</bpmn:script></bpmn:scriptTask>
    <bpmn:endEvent id="e1"><bpmn:incoming>f5</bpmn:incoming></bpmn:endEvent>
    <bpmn:endEvent id="e2"><bpmn:incoming>f6</bpmn:incoming></bpmn:endEvent>
    <bpmn:sequenceFlow id="f1" sourceRef="s" targetRef="prep"/>
    <bpmn:sequenceFlow id="f2" sourceRef="prep" targetRef="clean"/>
    <bpmn:sequenceFlow id="f3" sourceRef="clean" targetRef="approve"/>
    <bpmn:sequenceFlow id="f4" sourceRef="approve" targetRef="decide"/>
    <bpmn:sequenceFlow id="f_yes" sourceRef="decide" targetRef="accept">
      <bpmn:conditionExpression>ok == True</bpmn:conditionExpression></bpmn:sequenceFlow>
    <bpmn:sequenceFlow id="f_no" sourceRef="decide" targetRef="refuse"/>
    <bpmn:sequenceFlow id="f5" sourceRef="accept" targetRef="e1"/>
    <bpmn:sequenceFlow id="f6" sourceRef="refuse" targetRef="e2"/>
  </bpmn:process>
</bpmn:definitions>
"""

# three branches: one starts with a throw event, one goes straight to the join; two
# branches change `level` differently, one deletes `tags`
PAR = """<?xml version="1.0" encoding="UTF-8"?>
<bpmn:definitions xmlns:bpmn="http://www.omg.org/spec/BPMN/20100524/MODEL" id="d" targetNamespace="x">
  <bpmn:process id="par_proc" isExecutable="true">
    <bpmn:startEvent id="s"><bpmn:outgoing>f1</bpmn:outgoing></bpmn:startEvent>
    <bpmn:scriptTask id="init"><bpmn:incoming>f1</bpmn:incoming><bpmn:outgoing>f2</bpmn:outgoing>
      <bpmn:script>level = 1
tags = ["a"]
same = {"x": [1, 2]}</bpmn:script></bpmn:scriptTask>
    <bpmn:parallelGateway id="fork"><bpmn:incoming>f2</bpmn:incoming>
      <bpmn:outgoing>fa</bpmn:outgoing><bpmn:outgoing>fb</bpmn:outgoing><bpmn:outgoing>fc</bpmn:outgoing>
    </bpmn:parallelGateway>
    <bpmn:scriptTask id="raise_level"><bpmn:incoming>fa</bpmn:incoming><bpmn:outgoing>fa2</bpmn:outgoing>
      <bpmn:script>level = 5
same = {"x": [1, 2]}</bpmn:script></bpmn:scriptTask>
    <bpmn:intermediateThrowEvent id="marker"><bpmn:incoming>fb</bpmn:incoming><bpmn:outgoing>fb1</bpmn:outgoing>
    </bpmn:intermediateThrowEvent>
    <bpmn:scriptTask id="lower_level"><bpmn:incoming>fb1</bpmn:incoming><bpmn:outgoing>fb2</bpmn:outgoing>
      <bpmn:script>level = 0
del tags</bpmn:script></bpmn:scriptTask>
    <bpmn:parallelGateway id="merge"><bpmn:incoming>fa2</bpmn:incoming><bpmn:incoming>fb2</bpmn:incoming>
      <bpmn:incoming>fc</bpmn:incoming><bpmn:outgoing>f3</bpmn:outgoing></bpmn:parallelGateway>
    <bpmn:scriptTask id="after"><bpmn:incoming>f3</bpmn:incoming><bpmn:outgoing>f4</bpmn:outgoing>
      <bpmn:script>final = level</bpmn:script></bpmn:scriptTask>
    <bpmn:endEvent id="e"><bpmn:incoming>f4</bpmn:incoming></bpmn:endEvent>
    <bpmn:sequenceFlow id="f1" sourceRef="s" targetRef="init"/>
    <bpmn:sequenceFlow id="f2" sourceRef="init" targetRef="fork"/>
    <bpmn:sequenceFlow id="fa" sourceRef="fork" targetRef="raise_level"/>
    <bpmn:sequenceFlow id="fb" sourceRef="fork" targetRef="marker"/>
    <bpmn:sequenceFlow id="fc" sourceRef="fork" targetRef="merge"/>
    <bpmn:sequenceFlow id="fb1" sourceRef="marker" targetRef="lower_level"/>
    <bpmn:sequenceFlow id="fa2" sourceRef="raise_level" targetRef="merge"/>
    <bpmn:sequenceFlow id="fb2" sourceRef="lower_level" targetRef="merge"/>
    <bpmn:sequenceFlow id="f3" sourceRef="merge" targetRef="after"/>
    <bpmn:sequenceFlow id="f4" sourceRef="after" targetRef="e"/>
  </bpmn:process>
</bpmn:definitions>
"""

FAILING = """<?xml version="1.0" encoding="UTF-8"?>
<bpmn:definitions xmlns:bpmn="http://www.omg.org/spec/BPMN/20100524/MODEL" id="d" targetNamespace="x">
  <bpmn:process id="failing_proc" isExecutable="true">
    <bpmn:startEvent id="s"><bpmn:outgoing>f1</bpmn:outgoing></bpmn:startEvent>
    <bpmn:scriptTask id="divide"><bpmn:incoming>f1</bpmn:incoming><bpmn:outgoing>f2</bpmn:outgoing>
      <bpmn:script>ratio = 1 / divisor</bpmn:script></bpmn:scriptTask>
    <bpmn:endEvent id="e"><bpmn:incoming>f2</bpmn:incoming></bpmn:endEvent>
    <bpmn:sequenceFlow id="f1" sourceRef="s" targetRef="divide"/>
    <bpmn:sequenceFlow id="f2" sourceRef="divide" targetRef="e"/>
  </bpmn:process>
</bpmn:definitions>
"""


class Cli:
    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.env = {**os.environ, "LAYERFLOW_STORE": f"sqlite:///{folder / 'contracts.db'}",
                    "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
        self.env.pop("LAYERFLOW_MODEL_API_BASE", None)

    def file(self, name: str, content: Any) -> str:
        path = self.folder / name
        path.write_text(content if isinstance(content, str) else json.dumps(content))
        return str(path)

    def __call__(self, *args: str) -> subprocess.CompletedProcess[str]:
        # stdin is not a terminal: nothing may block on it (the timeout only keeps a hang from hanging CI)
        return subprocess.run([sys.executable, "-m", "engine.cli", *args], cwd=self.folder, env=self.env,
                              capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=180)

    def doc(self, *args: str, code: int) -> dict[str, Any]:
        out = self(*args, "--json")
        assert out.returncode == code, (out.returncode, out.stdout[-1500:], out.stderr[-1500:])
        return one_document(out.stdout)


def one_document(stdout: str) -> Any:
    """Exactly one JSON document on stdout, nothing before or after it."""
    decoder = json.JSONDecoder()
    text = stdout.strip()
    doc, end = decoder.raw_decode(text)
    assert text[end:].strip() == "", f"more than one document: {text[end:][:200]!r}"
    return doc


def check_run_document(doc: dict[str, Any]) -> None:
    """Every documented field with its documented type."""
    assert {"instance_id", "process_id", "status", "error", "layers", "tokens", "conflicts", "compressions",
            "confirmations", "waiting_for", "tape_length"} <= set(doc)
    assert doc["status"] in ("completed", "waiting", "error")
    assert isinstance(doc["instance_id"], str) or (doc["status"] == "error" and doc["instance_id"] is None)
    assert isinstance(doc["process_id"], str) or (doc["status"] == "error" and doc["process_id"] is None)
    if doc["status"] == "error":
        err = doc["error"]
        assert isinstance(err["kind"], str) and isinstance(err["message"], str) and err["message"]
        assert err["task_id"] is None or isinstance(err["task_id"], str)
    else:
        assert doc["error"] is None
    assert list(doc["layers"]) == LAYERS and all(isinstance(v, dict) for v in doc["layers"].values())
    assert set(doc["tokens"]) == {*LAYERS, "total"}
    assert all(type(v) is int for v in doc["tokens"].values())
    assert doc["tokens"]["total"] == sum(doc["tokens"][name] for name in LAYERS)
    for c in doc["conflicts"]:
        assert isinstance(c["gateway_id"], str) and c["layer"] in LAYERS and isinstance(c["key"], str)
        assert "base_value" in c and isinstance(c["values"], dict) and len(c["values"]) >= 2
        res = c["resolution"]
        if res is not None:
            assert set(res) >= {"value", "resolver", "reason"} and isinstance(res["reason"], str)
            assert res["resolver"] in ("policy", "model", "human", "strategy")
    for c in doc["compressions"]:
        assert isinstance(c["activity_id"], str) and all(isinstance(t, str) for t in c["triggers"])
        assert type(c["tokens_before"]) is int and type(c["tokens_after"]) is int
        assert isinstance(c["snapshot_id"], str)
    for c in doc["confirmations"]:
        assert isinstance(c["id"], str) and isinstance(c["type"], str) and isinstance(c["message"], str)
        assert isinstance(c["options"], list) and "answer" in c and type(c["timed_out"]) is bool
    for w in doc["waiting_for"]:
        assert w["kind"] in ("user_task", "confirmation", "event", "timer")
        assert isinstance(w["id"], str) and isinstance(w["task_id"], str)
    assert type(doc["tape_length"]) is int and doc["tape_length"] >= 0
    if doc["status"] == "waiting":
        assert doc["waiting_for"]


@pytest.fixture
def cli(tmp_path: Path) -> Cli:
    c = Cli(tmp_path)
    c.file("seq.bpmn", SEQ)
    c.file("par.bpmn", PAR)
    c.file("failing.bpmn", FAILING)
    c.file("data.json", {"amount": 7})
    return c


def _data_keys(layer: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in layer.items() if ":" not in k and not k.startswith("_")}


# ----------------------------------------------------------------------------- completed / waiting / error

def test_a_user_task_waits_then_resume_with_answer_completes(cli: Cli) -> None:
    waiting = cli.doc("run", "seq.bpmn", "--data", "data.json", code=3)
    check_run_document(waiting)
    assert waiting["status"] == "waiting" and waiting["process_id"] == "seq_proc"
    assert [(w["kind"], w["task_id"]) for w in waiting["waiting_for"]] == [("user_task", "approve")]
    assert waiting["layers"]["L1"] == {"amount": 7}  # initial data goes to PROCESS
    assert "temp" not in waiting["layers"]["L3"] and "temp" not in waiting["layers"]["L4"]  # deleted: absent
    done = cli.doc("resume", waiting["instance_id"], "--answer", 'approve={"ok": true}', code=0)
    check_run_document(done)
    assert done["instance_id"] == waiting["instance_id"] and done["status"] == "completed"
    assert done["layers"]["L3"]["outcome"] == "accepted" and done["layers"]["L3"]["score"] == 14
    assert done["tape_length"] > waiting["tape_length"]


def test_answers_file_answers_user_tasks_in_advance(cli: Cli) -> None:
    answers = cli.file("answers.json", {"user_tasks": {"approve": {"ok": False}}})
    doc = cli.doc("run", "seq.bpmn", "--data", "data.json", "--answers", answers, code=0)
    check_run_document(doc)
    assert doc["layers"]["L3"]["outcome"] == "refused" and doc["layers"]["L3"]["_branch_id"] == "refuse"


def test_resume_takes_an_answers_file(cli: Cli) -> None:
    waiting = cli.doc("run", "seq.bpmn", "--data", "data.json", code=3)
    answers = cli.file("later.json", {"user_tasks": {"approve": {"ok": True}}})
    done = cli.doc("resume", waiting["instance_id"], "--answers", answers, code=0)
    assert done["layers"]["L3"]["outcome"] == "accepted"


def test_a_failing_script_is_status_error_exit_1(cli: Cli) -> None:
    divisor = cli.file("zero.json", {"divisor": 0})
    doc = cli.doc("run", "failing.bpmn", "--data", divisor, code=1)
    check_run_document(doc)
    assert doc["error"]["task_id"] == "divide" and "ZeroDivisionError" in doc["error"]["message"]
    assert isinstance(doc["instance_id"], str)


def test_human_output_without_json_goes_to_stdout_progress_to_stderr(cli: Cli) -> None:
    out = cli("run", "seq.bpmn", "--data", "data.json")
    assert out.returncode == 3
    assert "waiting" in out.stdout and "approve" in out.stdout
    with pytest.raises(ValueError):
        json.loads(out.stdout)


# ----------------------------------------------------------------------------- join conflicts

def test_a_join_conflict_waits_with_branch_ids_of_first_elements(cli: Cli) -> None:
    doc = cli.doc("run", "par.bpmn", code=3)
    check_run_document(doc)
    [conflict] = doc["conflicts"]
    assert conflict["gateway_id"] == "merge" and conflict["key"] == "level" and conflict["base_value"] == 1
    # the first element of each branch: a task, a throw event (the join itself had no change)
    assert conflict["values"] == {"raise_level": 5, "marker": 0}
    assert conflict["resolution"] is None
    assert doc["waiting_for"][0]["kind"] == "confirmation" and doc["waiting_for"][0]["id"] == "merge/level"
    [confirmation] = doc["confirmations"]
    assert confirmation["id"] == "merge/level" and confirmation["answer"] is None
    assert {5, 0} <= {o["value"] for o in confirmation["options"]}


@pytest.mark.parametrize("key", ["merge/level", "*"])
def test_answers_by_gateway_key_and_star(cli: Cli, key: str) -> None:
    answers = cli.file("answers.json", {"confirmations": {key: 5}})
    doc = cli.doc("run", "par.bpmn", "--answers", answers, code=0)
    check_run_document(doc)
    assert doc["layers"]["L3"]["final"] == 5 and doc["layers"]["L3"]["level"] == 5
    assert "tags" not in doc["layers"]["L3"]  # one branch deleted it: the merge takes the delete
    assert doc["layers"]["L3"]["same"] == {"x": [1, 2]}  # written with the value it had: no change
    [conflict] = doc["conflicts"]
    assert conflict["resolution"]["value"] == 5 and conflict["resolution"]["resolver"] == "human"
    assert doc["confirmations"][0]["answer"] == 5


def test_answer_by_confirmation_id_on_resume(cli: Cli) -> None:
    waiting = cli.doc("run", "par.bpmn", code=3)
    cid = waiting["confirmations"][0]["id"]
    done = cli.doc("resume", waiting["instance_id"], "--answer", f"{cid}=0", code=0)
    assert done["layers"]["L3"]["final"] == 0 and done["error"] is None


@pytest.mark.parametrize(("strategy", "expected"), [
    ("LAST_WRITER_WINS", None),
    ("BRANCH_PRIORITY", 0),
])
def test_merge_strategies_resolve_as_strategy(cli: Cli, strategy: str, expected: Any) -> None:
    extra = "  branchPriority: [marker, raise_level, merge]\n" if strategy == "BRANCH_PRIORITY" else ""
    config = cli.file("strategy.yaml", f"merge:\n  mergeStrategy: {strategy}\n{extra}")
    doc = cli.doc("run", "par.bpmn", "--config", config, code=0)
    check_run_document(doc)
    [conflict] = doc["conflicts"]
    assert conflict["resolution"]["resolver"] == "strategy"
    if expected is not None:
        assert doc["layers"]["L3"]["final"] == expected


def test_fail_on_conflict_names_every_conflict_in_the_documented_shape(cli: Cli) -> None:
    config = cli.file("fail.yaml", "merge:\n  mergeStrategy: FAIL_ON_CONFLICT\n")
    doc = cli.doc("run", "par.bpmn", "--config", config, code=1)
    check_run_document(doc)
    assert doc["error"]["task_id"] == "merge" and "level" in doc["error"]["message"]
    [conflict] = doc["conflicts"]
    assert conflict["gateway_id"] == "merge" and conflict["key"] == "level"
    assert conflict["values"] == {"raise_level": 5, "marker": 0} and conflict["resolution"] is None


def test_policy_rule_resolves_as_policy(cli: Cli) -> None:
    config = cli.file("policy.yaml", "merge:\n  conflictPolicy:\n    rules:\n"
                                     "      - {key: level, when: 'level >= 0', value: 0, reason: the cautious level}\n")
    doc = cli.doc("run", "par.bpmn", "--config", config, code=0)
    check_run_document(doc)
    assert doc["conflicts"][0]["resolution"]["resolver"] == "policy" and doc["layers"]["L3"]["final"] == 0


def test_compressions_are_reported(cli: Cli) -> None:
    config = cli.file("compress.yaml", "after:\n  compressTokenThreshold: 10\n")
    answers = cli.file("answers.json", {"confirmations": {"*": 5}})
    doc = cli.doc("run", "par.bpmn", "--config", config, "--answers", answers, code=0)
    check_run_document(doc)
    [compression] = doc["compressions"]
    assert compression["activity_id"] == "after" and compression["tokens_after"] < compression["tokens_before"]
    assert "token_threshold" in compression["triggers"]


# ----------------------------------------------------------------------------- bad input: exit 2

def _bad(cli: Cli, *args: str, words: tuple[str, ...]) -> dict[str, Any]:
    doc = cli.doc(*args, code=2)
    check_run_document(doc)
    assert doc["status"] == "error"
    for word in words:
        assert word in doc["error"]["message"], (word, doc["error"]["message"])
    return doc


def test_bad_inputs_exit_2_with_one_document(cli: Cli) -> None:
    _bad(cli, "run", "missing.bpmn", words=("missing.bpmn",))
    _bad(cli, "run", "seq.bpmn", "--data", cli.file("list.json", [1, 2]), words=("list.json",))
    _bad(cli, "run", "seq.bpmn", "--data", cli.file("broken.json", "{nope"), words=("broken.json",))
    _bad(cli, "run", "seq.bpmn", "--answers", cli.file("typo.json", {"usertasks": {}}), words=("usertasks",))
    _bad(cli, "run", "seq.bpmn", "--answers", cli.file("unknown.json", {"user_tasks": {"aprove": {"ok": True}}}),
         words=("unknown.json", "aprove"))
    _bad(cli, "run", "seq.bpmn", "--answers", cli.file("notobj.json", {"user_tasks": {"approve": [1]}}),
         words=("notobj.json", "approve"))
    _bad(cli, "run", "seq.bpmn", "--config", "nowhere.yaml", words=("nowhere.yaml",))
    _bad(cli, "run", "seq.bpmn", "--store", "bogus://x", words=("bogus",))
    _bad(cli, "run", "seq.bpmn", "--config", cli.file("unknown_id.yaml", "nosuchtask:\n  preserveKeys: [a]\n"),
         words=("nosuchtask",))
    _bad(cli, "resume", "no-such-instance", words=("no-such-instance",))
    _bad(cli, "inspect", "no-such-instance", words=("no-such-instance",))


def test_an_answer_that_is_not_offered_is_bad_input_and_changes_nothing(cli: Cli) -> None:
    answers = cli.file("wrong.json", {"confirmations": {"merge/level": 42}})
    doc = _bad(cli, "run", "par.bpmn", "--answers", answers, words=("wrong.json", "merge/level", "42"))
    assert doc["error"]["kind"] == "invalid_answer" and doc["waiting_for"]
    instance = doc["instance_id"]
    shown = cli.doc("inspect", instance, code=0)
    assert shown["status"] == "waiting" and shown["error"] is None  # still waiting for a valid answer
    again = _bad(cli, "resume", instance, "--answer", "merge/level=42", words=("42",))
    assert again["instance_id"] == instance and again["error"]["kind"] == "invalid_answer"
    done = cli.doc("resume", instance, "--answer", "merge/level=5", code=0)
    assert done["status"] == "completed" and done["error"] is None and done["layers"]["L3"]["final"] == 5


def test_an_answer_for_nothing_the_instance_may_ask_is_bad_input(cli: Cli) -> None:
    # round 18 changed this deliberately: an --answer whose key matches nothing the instance waits
    # for or may still ask was said on stderr (exit 3); it is refused as in an answers file (exit 2)
    waiting = cli.doc("run", "par.bpmn", code=3)
    doc = _bad(cli, "resume", waiting["instance_id"], "--answer", "nosuch=1", words=("'nosuch'", "'merge/level'"))
    assert doc["error"]["kind"] == "invalid_answer"
    assert cli.doc("inspect", waiting["instance_id"], code=0)["tape_length"] == waiting["tape_length"]


# ----------------------------------------------------------------------------- the other commands

def test_inspect_tape_replay_snapshot_rollback(cli: Cli) -> None:
    waiting = cli.doc("run", "seq.bpmn", "--data", "data.json", code=3)
    iid = waiting["instance_id"]
    shown = cli.doc("inspect", iid, code=0)
    assert shown["layers"] == waiting["layers"]
    tape = cli.doc("tape", iid, code=0)
    assert isinstance(tape, list) and len(tape) == waiting["tape_length"]
    assert all({"seq", "kind", "time", "actor"} <= set(e) for e in tape)
    deletes = cli.doc("tape", iid, "--kind", "delete", code=0)
    assert deletes and all(e["kind"] == "delete" for e in deletes)
    last = max(e["seq"] for e in tape if e.get("context", "main") == "main")
    replayed = cli.doc("replay", iid, "--until", str(last), code=0)
    assert replayed["layers"] == waiting["layers"]
    early = cli.doc("replay", iid, "--until", "2", code=0)
    assert early["layers"]["L1"] == {"amount": 7} and early["layers"]["L3"] == {}
    snap = cli.doc("snapshot", iid, code=0)
    assert isinstance(snap["snapshot_id"], str)
    plain = cli("snapshot", iid)
    assert plain.returncode == 0 and plain.stdout.strip()  # the id alone: SNAP=$(layerflow snapshot ID)
    back = cli.doc("rollback", iid, "--snapshot", snap["snapshot_id"], "--layers", "L3", code=0)
    assert back["snapshot_id"] == snap["snapshot_id"]
    assert len(cli.doc("tape", iid, code=0)) > len(tape)  # rollback is an event; nothing deleted
    _bad(cli, "rollback", iid, "--snapshot", "no-such-snap", words=("no-such-snap",))
    _bad(cli, "rollback", iid, "--snapshot", snap["snapshot_id"], "--layers", "L9", words=("L9",))
    _bad(cli, "replay", iid, "--until", "-1", words=("-1",))


def test_validate(cli: Cli) -> None:
    ok = cli("validate", "par.bpmn")
    assert ok.returncode == 0
    cli.file("broken.bpmn", PAR.replace('targetRef="after"', 'targetRef="nowhere"'))
    bad = cli("validate", "broken.bpmn")
    assert bad.returncode == 2 and "nowhere" in (bad.stdout + bad.stderr)
    report = one_document(cli("validate", "broken.bpmn", "--json").stdout)
    assert "nowhere" in json.dumps(report)


@pytest.mark.parametrize("command", ["run", "demo", "resume", "inspect", "tape", "replay", "rollback", "validate",
                                     "serve", "worker", "snapshot", "send", "submit"])
def test_every_documented_command_exists(cli: Cli, command: str) -> None:
    out = cli(command, "--help")
    assert out.returncode == 0, out.stderr


def test_run_takes_every_documented_flag(cli: Cli) -> None:
    out = cli("run", "--help")
    for flag in ("--config", "--data", "--answers", "--store", "--model", "--json", "--answer", "--yes"):
        assert flag in out.stdout, flag
    store = f"sqlite:///{cli.folder / 'other.db'}"
    doc = cli.doc("run", "seq.bpmn", "--data", "data.json", "--store", store, code=3)
    assert cli.doc("inspect", doc["instance_id"], "--store", store, code=0)["status"] == "waiting"
    _bad(cli, "inspect", doc["instance_id"], words=(doc["instance_id"],))  # not in the default store


def test_demo_loan_conflict_waits_then_resumes_as_the_readme_says(cli: Cli) -> None:
    doc = cli.doc("demo", "loan", "--scenario", "conflict", code=3)
    check_run_document(doc)
    assert doc["waiting_for"][0]["id"] == "review_join/approval_status"
    assert set(doc["conflicts"][0]["values"]) == {"finance_review", "risk_review"}
    done = cli.doc("resume", doc["instance_id"], "--answer", "review_join/approval_status=pending_dual_approval",
                   code=0)
    assert done["conflicts"][0]["resolution"]["value"] == "pending_dual_approval"


def test_initial_data_the_layer_rules_refuse_names_the_file_and_key(cli: Cli) -> None:
    cli.file("seq.layerflow.yaml", "system:\n  policy: fixed by the engine\n")
    bad = cli.file("clash.json", {"amount": 1, "policy": "mine"})
    doc = _bad(cli, "run", "seq.bpmn", "--data", bad, words=("clash.json", "policy", "L0"))
    assert doc["instance_id"] is None
    assert cli.doc("inspect", "x", code=2)["error"]["kind"] == "not_found"


def test_a_value_that_is_not_json_fails_the_activity_naming_the_key(cli: Cli) -> None:
    cli.file("setter.bpmn", FAILING.replace("ratio = 1 / divisor", "tags = {1, 2}"))
    doc = cli.doc("run", "setter.bpmn", code=1)
    assert doc["error"]["task_id"] == "divide" and "'tags'" in doc["error"]["message"]
    assert "tags" not in doc["layers"]["L3"] and "tags" not in doc["layers"]["L4"]


def test_an_invalid_answer_on_resume_names_the_gateway(cli: Cli) -> None:
    waiting = cli.doc("run", "par.bpmn", code=3)
    doc = _bad(cli, "resume", waiting["instance_id"], "--answer", "merge/level=7", words=("merge/level", "7"))
    assert doc["error"]["task_id"] == "merge" and doc["instance_id"] == waiting["instance_id"]


def test_a_user_task_answered_with_a_non_object_is_bad_input(cli: Cli) -> None:
    _bad(cli, "run", "seq.bpmn", "--data", "data.json", "--answer", "approve=yes", words=("approve", "JSON object"))
    waiting = cli.doc("run", "seq.bpmn", "--data", "data.json", code=3)
    _bad(cli, "resume", waiting["instance_id"], "--answer", "approve=[1]", words=("approve",))
    assert cli.doc("inspect", waiting["instance_id"], code=0)["status"] == "waiting"


@pytest.mark.parametrize("args", [["run", "par.bpmn"], ["run", "seq.bpmn", "--data", "data.json"],
                                  ["demo", "loan", "--scenario", "conflict"]])
def test_an_open_stdin_pipe_is_never_read(cli: Cli, args: list[str]) -> None:
    """stdin is a pipe nobody writes to and nobody closes: reading it would hang."""
    proc = subprocess.Popen([sys.executable, "-m", "engine.cli", *args, "--json"], cwd=cli.folder, env=cli.env,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        stdout = proc.stdout.read()  # type: ignore[union-attr]  # returns once the CLI exits (stdin still open)
        proc.wait(timeout=180)
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.stdin.close()  # type: ignore[union-attr]
    assert proc.returncode == 3
    assert one_document(stdout)["status"] == "waiting"


def test_branch_ids_work_wherever_a_context_is_named(cli: Cli) -> None:
    waiting = cli.doc("run", "par.bpmn", code=3)
    iid = waiting["instance_id"]
    assert cli.doc("inspect", iid, "--context", "marker", code=0)["layers"]["L3"]["level"] == 0
    events = cli.doc("tape", iid, "--context", "marker", code=0)
    assert events and {e["context"] for e in events} == {next(n for n in waiting["contexts"] if "marker" in n)}
    assert cli.doc("replay", iid, "--until", "1", "--context", "marker", code=0)["layers"]["L4"]["_branch_id"] == "marker"
    assert cli("snapshot", iid, "--context", "marker").returncode == 0
    _bad(cli, "replay", iid, "--until", "1", "--context", "nope", words=("nope",))


def test_set_never_writes_under_open_branches(cli: Cli) -> None:
    waiting = cli.doc("run", "par.bpmn", code=3)
    doc = _bad(cli, "resume", waiting["instance_id"], "--set", "x=1", words=("open branches",))
    assert doc["instance_id"] == waiting["instance_id"]
    assert cli.doc("inspect", waiting["instance_id"], code=0)["tape_length"] == waiting["tape_length"]


# a conflict at a join inside a loop: every round asks again under the same id, with new options
LOOP_JOIN = """<?xml version="1.0" encoding="UTF-8"?>
<bpmn:definitions xmlns:bpmn="http://www.omg.org/spec/BPMN/20100524/MODEL" id="d" targetNamespace="x">
  <bpmn:process id="loop_join" isExecutable="true">
    <bpmn:startEvent id="s"/>
    <bpmn:scriptTask id="init"><bpmn:script>round = 0
verdict = "none"</bpmn:script></bpmn:scriptTask>
    <bpmn:parallelGateway id="fork"/>
    <bpmn:scriptTask id="rev_a"><bpmn:script>verdict = f"a{round}"</bpmn:script></bpmn:scriptTask>
    <bpmn:scriptTask id="rev_b"><bpmn:script>verdict = f"b{round}"</bpmn:script></bpmn:scriptTask>
    <bpmn:parallelGateway id="join"/>
    <bpmn:scriptTask id="count"><bpmn:script>round = round + 1</bpmn:script></bpmn:scriptTask>
    <bpmn:exclusiveGateway id="again" default="f_done"/>
    <bpmn:endEvent id="e"/>
    <bpmn:sequenceFlow id="f1" sourceRef="s" targetRef="init"/>
    <bpmn:sequenceFlow id="f2" sourceRef="init" targetRef="fork"/>
    <bpmn:sequenceFlow id="f3" sourceRef="fork" targetRef="rev_a"/>
    <bpmn:sequenceFlow id="f4" sourceRef="fork" targetRef="rev_b"/>
    <bpmn:sequenceFlow id="f5" sourceRef="rev_a" targetRef="join"/>
    <bpmn:sequenceFlow id="f6" sourceRef="rev_b" targetRef="join"/>
    <bpmn:sequenceFlow id="f7" sourceRef="join" targetRef="count"/>
    <bpmn:sequenceFlow id="f8" sourceRef="count" targetRef="again"/>
    <bpmn:sequenceFlow id="f_loop" sourceRef="again" targetRef="fork">
      <bpmn:conditionExpression>round &lt; 3</bpmn:conditionExpression></bpmn:sequenceFlow>
    <bpmn:sequenceFlow id="f_done" sourceRef="again" targetRef="e"/>
  </bpmn:process>
</bpmn:definitions>
"""


def test_an_answer_taken_by_an_earlier_round_leaves_the_next_round_waiting(cli: Cli) -> None:
    # the answer is valid and is taken by the first round; the second round offers a1/b1, so it
    # waits for its own answer (exit 3), not a refusal of input that was good (exit 2)
    cli.file("loop_join.bpmn", LOOP_JOIN)
    answers = cli.file("answers.json", {"confirmations": {"join/verdict": "b0"}})
    out = cli("run", "loop_join.bpmn", "--answers", answers, "--json")
    assert out.returncode == 3, (out.stdout[-800:], out.stderr[-800:])
    doc = one_document(out.stdout)
    assert doc["status"] == "waiting" and doc["error"] is None
    assert [w["id"] for w in doc["waiting_for"]] == ["join/verdict"]
    assert [c["answer"] for c in doc["confirmations"]] == ["b0", None]
    assert "earlier round" in out.stderr
    # resume answers the open round; its answer is not reapplied as bad input to the third
    done = cli.doc("resume", doc["instance_id"], "--answer", "join/verdict=a1", code=3)
    assert [c["answer"] for c in done["confirmations"]] == ["b0", "a1", None]
    # a value no round ever offered is still bad input
    cli.file("bad.json", {"confirmations": {"join/verdict": "zz"}})
    _bad(cli, "run", "loop_join.bpmn", "--answers", "bad.json", words=("zz",))


def test_the_waiting_hint_offers_the_open_rounds_options(cli: Cli) -> None:
    cli.file("loop_join.bpmn", LOOP_JOIN)
    waiting = cli.doc("run", "loop_join.bpmn", code=3)
    cli("resume", waiting["instance_id"], "--answer", "join/verdict=a0")  # the first round; the second waits
    out = cli("resume", waiting["instance_id"])
    assert out.returncode == 3, out.stderr[-800:]
    hint = next(line for line in out.stdout.splitlines() if "waiting for confirmation" in line)
    assert '"a1" | "b1"' in hint and '"a0"' not in hint, hint


def test_every_tape_event_names_its_seq_time_actor_activity_and_branch(cli: Cli) -> None:
    # DESIGN "Tape": every event carries a sequence number, time, actor, activity and branch
    # (null when it has none), in the main context and in the branches' alike
    waiting = cli.doc("run", "par.bpmn", code=3)
    events = cli.doc("tape", waiting["instance_id"], code=0)
    assert events
    for e in events:
        assert {"context", "seq", "kind", "time", "actor", "activity", "branch"} <= set(e), e
    assert any(e["branch"] is None for e in events) and any(e["branch"] == "marker" for e in events)
    assert any(e["activity"] == "init" for e in events)


def test_human_confirm_takes_the_message_and_options_design_names(cli: Cli) -> None:
    # DESIGN "Resolution": human_confirm (message, options, timeout, default on timeout)
    cli.file("par.layerflow.yaml", "merge:\n  humanConfirm:\n"
             "    message: Reviewers disagree on the level; pick one.\n"
             "    options: [{label: hold for a second review, value: 3}, 9]\n"
             "    timeout: 60\n    default: 3\n")
    doc = cli.doc("run", "par.bpmn", code=3)
    [confirmation] = doc["confirmations"]
    assert confirmation["message"].startswith("Reviewers disagree on the level; pick one.")
    values = [o["value"] for o in confirmation["options"]]
    assert {5, 0, 3, 9} <= set(values) and len(values) == len(set(map(json.dumps, values)))
    assert confirmation["default"] == 3
    done = cli.doc("resume", doc["instance_id"], "--answer", "merge/level=3", code=0)
    assert done["layers"]["L3"]["level"] == 3


@pytest.mark.parametrize("typed, chosen", [("true", "true"), ("0", "0"), ('"0"', "0")])
def test_answer_typed_as_the_offered_string_option_picks_it(cli: Cli, typed: str, chosen: str) -> None:
    # `--answer KEY=VALUE`: the waiting hint shows the option values "true" and "0"; typing them
    # as shown picks them (the JSON reading of VALUE, true or 0, is no option here)
    cli.file("strs.bpmn", PAR.replace("level = 5", 'level = "true"').replace("level = 0", 'level = "0"'))
    waiting = cli.doc("run", "strs.bpmn", code=3)
    done = cli.doc("resume", waiting["instance_id"], "--answer", f"merge/level={typed}", code=0)
    assert done["layers"]["L3"]["level"] == chosen and done["layers"]["L3"]["final"] == chosen
    [conflict] = done["conflicts"]
    assert conflict["resolution"]["value"] == chosen


def test_a_user_task_answer_that_is_no_json_value_is_bad_input_and_the_task_waits(cli: Cli) -> None:
    # like an answer the layer rules refuse: the person's mistake, not a failure of the process
    path = cli.folder / "nan.json"
    path.write_text('{"user_tasks": {"approve": {"ok": NaN}}}')  # Python reads NaN; JSON cannot hold it
    doc = cli.doc("run", "seq.bpmn", "--data", "data.json", "--answers", str(path), code=2)
    assert doc["error"]["kind"] == "invalid_answer" and "ok" in doc["error"]["message"]
    assert doc["error"]["task_id"] == "approve"
    assert [w["task_id"] for w in doc["waiting_for"]] == ["approve"]
    done = cli.doc("resume", doc["instance_id"], "--answer", 'approve={"ok": true}', code=0)
    assert done["layers"]["L3"]["outcome"] == "accepted"


def test_a_confirmation_answer_that_is_no_json_value_is_bad_input_and_the_join_waits(cli: Cli) -> None:
    path = cli.folder / "nan.json"
    path.write_text('{"confirmations": {"*": NaN}}')  # Python reads NaN; JSON cannot hold it
    doc = cli.doc("run", "par.bpmn", "--answers", str(path), code=2)
    assert doc["error"]["kind"] == "invalid_answer" and "merge/level" in doc["error"]["message"]
    assert [w["id"] for w in doc["waiting_for"]] == ["merge/level"]
    assert cli.doc("resume", doc["instance_id"], "--answer", "merge/level=5", code=0)["layers"]["L3"]["final"] == 5


def test_a_label_that_is_no_text_is_bad_input_with_one_document(cli: Cli) -> None:
    # bytes that are no UTF-8 on the command line arrive as lone surrogates: no tape can carry them
    waiting = cli.doc("run", "par.bpmn", code=3)
    doc = cli.doc("snapshot", waiting["instance_id"], "--label", "bad\udcff", code=2)
    assert doc["status"] == "error" and "label" in doc["error"]["message"]
    assert cli.doc("inspect", waiting["instance_id"], code=0)["tape_length"] == waiting["tape_length"]
