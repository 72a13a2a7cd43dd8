"""The CLI contract as an outsider checks it: a hand-written insurance claim (a user task, a
parallel split whose branches both write `recommendation`, a person settling it at the join, an
XOR on the decision), driven through `python -m engine.cli` as a subprocess on a sqlite store of
the test's own; every expectation is taken from DESIGN.md ("Interfaces") and the README."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
CLAIM = ROOT / "tests" / "engine" / "cli12" / "insurance_claim.bpmn"
LAYERS = ["L0", "L1", "L2", "L3", "L4", "L5"]
FILED = {"file_claim": {"damage": 20000}}


class Cli:
    def __init__(self, tmp_path: Path) -> None:
        self.tmp = tmp_path
        self.store = f"sqlite:///{tmp_path / 'claims.db'}"
        self.env = {k: v for k, v in os.environ.items() if k not in ("LAYERFLOW_STORE", "LAYERFLOW_MODEL")}
        self.env["PYTHONPATH"] = str(ROOT)
        self.env["XDG_DATA_HOME"] = str(tmp_path / "xdg")

    def __call__(self, *args: str, stdin: Any = subprocess.DEVNULL, code: int | None = None,
                 input: str | None = None) -> subprocess.CompletedProcess[str]:
        if input is not None:
            stdin = None
        store = [] if args[0] == "validate" else ["--store", self.store]   # validate reads no store
        proc = subprocess.run([sys.executable, "-m", "engine.cli", *args, *store],
                              stdin=stdin, input=input, capture_output=True, text=True, env=self.env,
                              timeout=60, cwd=self.tmp)
        if code is not None:
            assert proc.returncode == code, (proc.returncode, proc.stdout, proc.stderr)
        return proc

    def json(self, *args: str, code: int, **kw: Any) -> dict[str, Any]:
        proc = self(*args, "--json", code=code, **kw)
        doc: dict[str, Any] = json.loads(proc.stdout)   # exactly one document: anything else fails here
        check_shape(doc)
        return doc

    def file(self, name: str, obj: Any) -> str:
        path = self.tmp / name
        path.write_text(json.dumps(obj) if not isinstance(obj, str) else obj, encoding="utf-8")
        return str(path)


@pytest.fixture(name="cli")
def cli_fixture(tmp_path: Path) -> Cli:
    return Cli(tmp_path)


def check_shape(doc: dict[str, Any]) -> None:
    """Every field of DESIGN's `--json` shape, with its type."""
    assert doc["instance_id"] is None or isinstance(doc["instance_id"], str)
    assert doc["status"] in ("completed", "waiting", "error")
    err = doc["error"]
    if doc["status"] == "error":
        assert isinstance(err, dict) and isinstance(err["kind"], str) and isinstance(err["message"], str)
        assert err["task_id"] is None or isinstance(err["task_id"], str)
    else:
        assert err is None
    assert sorted(doc["layers"]) == LAYERS and all(isinstance(v, dict) for v in doc["layers"].values())
    tokens = doc["tokens"]
    assert sorted(tokens) == sorted(LAYERS + ["total"])
    assert all(type(v) is int for v in tokens.values())
    assert tokens["total"] == sum(tokens[k] for k in LAYERS)
    for c in doc["conflicts"]:
        assert isinstance(c["gateway_id"], str) and c["layer"] in LAYERS and isinstance(c["key"], str)
        assert "base_value" in c and isinstance(c["values"], dict)
        r = c["resolution"]
        assert r is None or (r["resolver"] in ("policy", "model", "human", "strategy")
                             and isinstance(r["reason"], str) and "value" in r)
    for c in doc["compressions"]:
        assert isinstance(c["activity_id"], str) and isinstance(c["triggers"], list)
    for c in doc["confirmations"]:
        assert isinstance(c["id"], str) and isinstance(c["type"], str) and isinstance(c["message"], str)
        assert isinstance(c["options"], list) and "answer" in c and isinstance(c["timed_out"], bool)
    for w in doc["waiting_for"]:
        assert w["kind"] in ("user_task", "confirmation", "timer", "message", "signal")
        assert isinstance(w["id"], str) and isinstance(w["task_id"], str)
    assert type(doc["tape_length"]) is int


def test_a_step_with_no_answer_waits_with_stdin_closed_or_a_pipe(cli: Cli) -> None:
    for stdin in (subprocess.DEVNULL, subprocess.PIPE):
        doc = cli.json("run", str(CLAIM), "--data", '{"claimant": "ann"}', code=3, stdin=stdin)
        assert doc["status"] == "waiting" and doc["process_id"] == "insurance_claim"
        assert [(w["kind"], w["task_id"]) for w in doc["waiting_for"]] == [("user_task", "file_claim")]
        assert doc["layers"]["L1"] == {"claimant": "ann"}
        assert doc["layers"]["L0"]["policy"].startswith("Claims over")
    # the user task answered, the join's conflict has nobody to answer it: waiting again
    doc = cli.json("resume", doc["instance_id"], "--answer", 'file_claim={"damage": 20000}', code=3, input="")
    assert [(w["kind"], w["id"], w["task_id"]) for w in doc["waiting_for"]] == [
        ("confirmation", "checks_join/recommendation", "checks_join")]
    [conflict] = doc["conflicts"]
    # branch ids are the BPMN ids of the first element of each branch
    assert conflict["values"] == {"assess_damage": "pay", "fraud_screen": "investigate"}
    assert conflict["layer"] == "L4" and conflict["resolution"] is None and conflict["base_value"] is None
    [conf] = doc["confirmations"]
    assert {o["value"] for o in conf["options"]} >= {"pay", "investigate"}
    assert conf["answer"] is None and conf["timed_out"] is False
    assert doc["layers"]["L3"]["damage"] == 20000


@pytest.mark.parametrize(("key", "answer", "outcome"), [
    ("checks_join/recommendation", "pay", "paid 18000.0"),   # confirmation id == GATEWAY/KEY here
    ("*", "investigate", "sent to investigation"),
])
def test_answers_file_runs_it_through(cli: Cli, key: str, answer: str, outcome: str) -> None:
    answers = cli.file("answers.json", {"user_tasks": FILED, "confirmations": {key: answer}})
    doc = cli.json("run", str(CLAIM), "--data", cli.file("claim.json", {"claimant": "bo"}),
                   "--answers", answers, code=0)
    assert doc["status"] == "completed" and doc["waiting_for"] == []
    [conflict] = doc["conflicts"]
    assert conflict["resolution"]["value"] == answer and conflict["resolution"]["resolver"] == "human"
    assert doc["confirmations"][0]["answer"] == answer
    assert doc["layers"]["L3"]["outcome"] == outcome
    assert doc["layers"]["L3"]["recommendation"] == answer
    assert doc["layers"]["L1"] == {"claimant": "bo"}


def test_resume_with_answers_file_and_with_answer(cli: Cli) -> None:
    doc = cli.json("run", str(CLAIM), code=3)
    iid = doc["instance_id"]
    doc = cli.json("resume", iid, "--answers", cli.file("a.json", {"user_tasks": FILED}), code=3)
    assert doc["waiting_for"][0]["kind"] == "confirmation"
    before = doc["tape_length"]
    # not an offered option: bad input (2), one JSON document, nothing saved
    for args in (["--answer", "checks_join/recommendation=maybe"],
                 ["--answers", cli.file("b.json", {"confirmations": {"checks_join/recommendation": "maybe"}})]):
        bad = cli.json("resume", iid, *args, code=2)
        assert bad["status"] == "error" and "maybe" in bad["error"]["message"]
        assert "checks_join/recommendation" in bad["error"]["message"]
        assert bad["tape_length"] == before
    doc = cli.json("resume", iid, "--answer", "checks_join/recommendation=investigate", code=0)
    assert doc["status"] == "completed" and doc["layers"]["L3"]["outcome"] == "sent to investigation"
    # the same answer again is harmless (an answers file reused on every resume): exit 0, nothing used
    again = cli("resume", iid, "--answer", "checks_join/recommendation=investigate", code=0)
    assert "checks_join/recommendation" in again.stderr
    # another answer to a confirmation a person answered already is refused with their decision (as
    # REST's 409 is), not dropped: bad input (2)
    other = cli("resume", iid, "--answer", "checks_join/recommendation=pay", code=2)
    assert "checks_join/recommendation" in other.stderr and "investigate" in other.stderr


def test_bad_data_and_answers_are_bad_input_with_one_json_document(cli: Cli) -> None:
    cases = [("--data", "{bad"), ("--data", "[1, 2]"), ("--data", str(cli.tmp / "missing.json")),
             ("--data", cli.file("bad.json", "{not json")), ("--answers", str(cli.tmp / "none.json"))]
    for opt, value in cases:
        doc = cli.json("run", str(CLAIM), opt, value, code=2)
        assert doc["status"] == "error" and doc["error"]["kind"]
        if value.endswith(".json"):
            assert Path(value).name in doc["error"]["message"]
    # nothing was started
    assert "insurance_claim" not in cli("list", code=0).stdout


def test_inspect_tape_replay_rollback(cli: Cli) -> None:
    answers = cli.file("answers.json", {"user_tasks": FILED, "confirmations": {"*": "pay"}})
    doc = cli.json("run", str(CLAIM), "--answers", answers, code=0)
    iid = doc["instance_id"]
    shown = json.loads(cli("inspect", iid, "--json", code=0).stdout)
    assert shown["layers"] == doc["layers"]
    l3 = cli("inspect", iid, "--layer", "L3", code=0).stdout
    assert "recommendation" in l3 and "outcome" in l3
    conflicts = json.loads(cli("tape", iid, "--kind", "conflict", "--json", code=0).stdout)
    assert [e["data"]["key"] for e in conflicts] == ["recommendation"]
    assert conflicts[0]["data"]["conflicting_values"] == {"assess_damage": "pay", "fraud_screen": "investigate"}
    # the tape says what `run --json` says: the key was not set before the split (not "deleted")
    assert conflicts[0]["data"]["base_value"] is None and conflicts[0]["data"]["base_absent"] is True
    assert conflicts[0]["data"]["layer"] == doc["conflicts"][0]["layer"]
    join_events = json.loads(cli("tape", iid, "--activity", "checks_join", "--json", code=0).stdout)
    # the join's own events (its conflict, resolutions, merge), the person's decision it asked for,
    # and the split's snapshot it merged against; nothing the branches' tasks did
    assert {e["actor"] for e in join_events} <= {"checks_join", "checks_split", "person"}
    assert any(e["kind"] == "join" or e["data"].get("note") == "join" for e in join_events if e["actor"] == "checks_join")
    # a filter that finds nothing is no error, but a mistyped id is named on stderr with the ids there are
    none = cli("tape", iid, "--kind", "nonsense", "--json", code=0)
    assert json.loads(none.stdout) == [] and "nonsense" in none.stderr and "join" in none.stderr
    none = cli("tape", iid, "--activity", "check_join", code=0)
    assert none.stdout == "" and "'check_join'" in none.stderr and "checks_join" in none.stderr
    tape = json.loads(cli("tape", iid, "--json", code=0).stdout)
    assert len(tape) == doc["tape_length"]
    # the context as it was before the split: the claim filed, no check run yet
    split = next(e for e in tape if e["kind"] == "snapshot" and e["actor"] == "checks_split")
    early = json.loads(cli("replay", iid, "--until", str(split["seq"]), "--json", code=0).stdout)
    assert early["layers"]["L3"]["damage"] == 20000 and "recommendation" not in early["layers"]["L3"]
    rolled = json.loads(cli("rollback", iid, split["data"]["snapshot_id"], "--json", code=0).stdout)
    assert rolled["snapshot_id"] == split["data"]["snapshot_id"]
    now = json.loads(cli("inspect", iid, "--json", code=0).stdout)
    assert "recommendation" not in now["layers"]["L3"] and now["layers"]["L3"]["damage"] == 20000
    after = json.loads(cli("tape", iid, "--json", code=0).stdout)
    assert len(after) > len(tape) and after[:len(tape)] == tape       # nothing deleted
    assert cli("rollback", iid, "snap:nope", code=2).returncode == 2
    assert cli("inspect", "nosuchid", code=2).returncode == 2


def test_validate_names_file_line_and_id(cli: Cli) -> None:
    text = CLAIM.read_text(encoding="utf-8")
    bad = cli.tmp / "bad_flow.bpmn"
    bad.write_text(text.replace('sourceRef="fraud_screen" targetRef="checks_join"',
                                'sourceRef="fraud_screen" targetRef="nowhere"'), encoding="utf-8")
    proc = cli("validate", str(bad), code=2)
    line = next(i for i, s in enumerate(bad.read_text().splitlines(), 1) if 'targetRef="nowhere"' in s)
    assert f"{bad}:{line}" in proc.stdout + proc.stderr and "s6" in proc.stdout + proc.stderr
    broken = cli.tmp / "broken.bpmn"
    broken.write_text(text.replace("<bpmn:endEvent id=\"paid\"/>", "<bpmn:endEvent id=\"paid\">"), encoding="utf-8")
    out = cli("validate", str(broken), code=2)
    assert str(broken) in out.stdout + out.stderr
    cfg = cli.file("cfg.yaml", "checks_join:\n  mergeStrategy: NOPE\n")
    out = cli("validate", str(CLAIM), "--config", cfg, code=2)
    assert f"{cfg}:2" in out.stdout + out.stderr and "mergeStrategy" in out.stdout + out.stderr
    assert cli("validate", str(CLAIM), code=0).returncode == 0
    # run of an invalid file: bad input, one JSON document
    doc = cli.json("run", str(bad), code=2)
    assert doc["status"] == "error" and "nowhere" in doc["error"]["message"]


def test_the_installed_console_script_keeps_the_contract(cli: Cli) -> None:
    """`layerflow` as pip installed it (pyproject's console script), stdin a pipe nobody writes to:
    one JSON document, waiting, exit 3, never a prompt."""
    import sysconfig

    script = Path(sysconfig.get_path("scripts")) / "layerflow"
    assert script.is_file(), f"{script}: install the package (pip install -e .) to get the console script"
    proc = subprocess.run([str(script), "run", str(CLAIM), "--data", '{"claimant": "cy"}', "--json",
                           "--store", cli.store], stdin=subprocess.PIPE, capture_output=True, text=True,
                          env=cli.env, timeout=60, cwd=cli.tmp)
    assert proc.returncode == 3, proc.stderr
    doc = json.loads(proc.stdout)
    check_shape(doc)
    assert doc["waiting_for"][0]["task_id"] == "file_claim" and doc["layers"]["L1"] == {"claimant": "cy"}
