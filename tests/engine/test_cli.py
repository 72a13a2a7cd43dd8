"""The ``layerflow`` CLI: exit codes, the ``--json`` contract, answers, resume."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from engine.cli import main

from engine_helpers import EXAMPLES, ROOT, script_task, without_due, write_process

CONTRACT = {"instance_id", "process_id", "status", "error", "layers", "tokens", "conflicts", "compressions",
            "confirmations", "waiting_for", "tape_length"}


@pytest.fixture
def cli(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("LAYERFLOW_STORE", f"sqlite:///{tmp_path / 'cli.db'}")
    runner = CliRunner()

    def invoke(*args: str):
        return runner.invoke(main, list(args), catch_exceptions=False)
    return invoke


def _doc(result) -> dict:
    return json.loads(result.stdout)  # one document and nothing else


@pytest.mark.parametrize(("args", "code", "status"), [
    (["--scenario", "fast"], 0, "completed"),
    (["--scenario", "full"], 0, "completed"),
    (["--scenario", "conflict"], 3, "waiting"),          # not a terminal, no answers: waits, never blocks
    (["--scenario", "conflict", "--yes"], 0, "completed"),
    (["--scenario", "conflict", "--answer", "review_join/approval_status=rejected"], 0, "completed"),
])
def test_demo_loan(cli, args, code, status) -> None:
    result = cli("demo", "loan", "--json", *args)
    assert result.exit_code == code, result.stderr
    doc = _doc(result)
    assert CONTRACT <= set(doc) and doc["status"] == status
    assert set(doc["layers"]) == {"L0", "L1", "L2", "L3", "L4", "L5"}
    assert set(doc["tokens"]) == {"L0", "L1", "L2", "L3", "L4", "L5", "total"}
    if status == "waiting":
        assert without_due(doc["waiting_for"]) == [{"kind": "confirmation", "id": "review_join/approval_status",
                                       "task_id": "review_join", "key": "approval_status", "context": "main"}]
        assert doc["conflicts"][0]["resolution"] is None


def test_answers_file_and_resume(cli, tmp_path: Path) -> None:
    waiting = _doc(cli("run", str(EXAMPLES / "parallel_user_task.bpmn"), "--json",
                       "--data", _json(tmp_path, "data.json", {"title": "T"})))
    assert waiting["status"] == "waiting" and waiting["waiting_for"][0]["task_id"] == "review"
    answers = _json(tmp_path, "answers.json", {"user_tasks": {"review": {"approved": True, "reviewer": "ann"}}})
    result = cli("resume", waiting["instance_id"], "--answers", answers, "--json")
    assert result.exit_code == 0
    doc = _doc(result)
    assert doc["instance_id"] == waiting["instance_id"] and doc["layers"]["L3"]["outcome"].startswith("published")


def test_an_answer_the_layer_rules_refuse_is_bad_input_and_the_task_still_waits(cli, tmp_path: Path) -> None:
    """``title`` is a PROCESS key (from --data): an answer changing it exits 2 naming the task,
    the key and the layer; the instance is saved still waiting, and a corrected answer completes it."""
    waiting = _doc(cli("run", str(EXAMPLES / "parallel_user_task.bpmn"), "--json",
                       "--data", _json(tmp_path, "data.json", {"title": "T"})))
    iid = waiting["instance_id"]
    bad = cli("resume", iid, "--answer", 'review={"approved": true, "reviewer": "ann", "title": "U"}', "--json")
    assert bad.exit_code == 2
    doc = _doc(bad)
    assert doc["error"]["kind"] == "invalid_answer" and doc["error"]["task_id"] == "review"
    assert "user task 'review'" in doc["error"]["message"] and "'title' to L1" in doc["error"]["message"]
    assert doc["error"]["instance_status"] == "waiting" and doc["layers"]["L1"]["title"] == "T"
    tape = _doc(cli("tape", iid, "--kind", "denied", "--json"))
    assert [e["data"]["key"] for e in tape] == ["title"]
    # named flat too, as a write is: the key and the layer the answer asked for
    assert [(e["key"], e["layer"]) for e in tape] == [("title", "L4")]
    good = cli("resume", iid, "--answer", 'review={"approved": true, "reviewer": "ann"}', "--json")
    assert good.exit_code == 0, good.stdout
    assert _doc(good)["layers"]["L3"]["outcome"].startswith("published")


def test_error_then_resume_with_a_fix(cli, tmp_path: Path) -> None:
    path = write_process(tmp_path, "failing", [script_task("prepare", "divisor = 0"),
                                               script_task("compute", "ratio = 8 / divisor")])
    result = cli("run", str(path), "--json")
    assert result.exit_code == 1
    doc = _doc(result)
    assert doc["error"]["task_id"] == "compute" and "ZeroDivisionError" in doc["error"]["message"]
    result = cli("resume", doc["instance_id"], "--set", "divisor=2", "--json")
    assert result.exit_code == 0, result.stdout
    assert _doc(result)["layers"]["L3"]["ratio"] == 4.0


@pytest.mark.parametrize("args", [
    ["run", "does-not-exist.bpmn"],
    ["run", str(EXAMPLES / "loan_approval.bpmn"), "--data", "missing.json"],
    ["resume", "no-such-instance"],
    ["validate", "does-not-exist.bpmn"],
])
def test_bad_input_exits_2(cli, args) -> None:
    assert cli(*args).exit_code == 2


def test_bad_input_with_json_is_still_one_document(cli) -> None:
    result = cli("run", "does-not-exist.bpmn", "--json")
    assert result.exit_code == 2
    assert _doc(result)["error"]["message"]


def test_inspect_tape_replay_list_validate(cli) -> None:
    doc = _doc(cli("demo", "loan", "--scenario", "fast", "--json"))
    iid = doc["instance_id"]
    inspect = cli("inspect", iid)
    assert inspect.exit_code == 0 and "risk_level" in inspect.stdout and "tokens" in inspect.stdout
    inspected = _doc(cli("inspect", iid, "--json"))
    assert inspected["layers"] == doc["layers"]
    events = _doc(cli("tape", iid, "--json", "--activity", "risk_assessment"))
    assert events and all(e["activity"] == "risk_assessment" for e in events)
    assert "complete" in cli("tape", iid, "--kind", "complete").stdout
    early = _doc(cli("replay", iid, "--until", "3", "--json"))
    assert "risk_level" not in early["layers"]["L3"] and early["until"] == 3
    assert iid in cli("list").stdout
    ok = cli("validate", str(EXAMPLES / "loan_approval.bpmn"))
    assert ok.exit_code == 0 and "is valid" in ok.stdout


def test_tape_of_a_gateway_by_its_bpmn_id(cli) -> None:
    # a join's conflict and resolution events name it as gateway_id, between activities (activity
    # null): `tape --activity review_join` found none of them
    iid = _doc(cli("demo", "loan", "--scenario", "conflict", "--json"))["instance_id"]
    events = _doc(cli("tape", iid, "--json", "--activity", "review_join"))
    notes = [e["data"].get("note") for e in events]
    assert "conflict" in notes and "resolution" in notes and "confirmation_pending" in notes
    assert all(e["data"].get("gateway_id") == "review_join" for e in events)
    split = _doc(cli("tape", iid, "--json", "--activity", "parallel_review", "--kind", "split"))
    assert [e["data"]["branches"] for e in split] == [["finance_review", "risk_review"]]


def test_plain_lines_when_not_a_terminal(cli) -> None:
    result = cli("demo", "loan", "--scenario", "fast")
    assert result.exit_code == 0
    assert "completed" in result.stdout and "\x1b[" not in result.stdout
    assert "activity risk_assessment completed" in result.stderr


def test_a_run_without_model_calls_never_imports_litellm() -> None:
    code = ("import sys\nfrom engine.cli import main\n"
            "try:\n    main(['demo', 'loan', '--scenario', 'conflict', '--yes', '--store', 'memory://', '--json'])\n"
            "except SystemExit as e:\n    assert e.code == 0, e.code\n"
            "assert 'litellm' not in sys.modules, 'litellm was imported'\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120,
                          stdin=subprocess.DEVNULL)
    assert done.returncode == 0, done.stderr


def _json(tmp_path: Path, name: str, value: object) -> str:
    path = tmp_path / name
    path.write_text(json.dumps(value), encoding="utf-8")
    return str(path)


def test_data_inline_or_from_stdin(cli, tmp_path: Path) -> None:
    """``--data`` takes a file, ``-`` (stdin) or an object written on the command line."""
    path = write_process(tmp_path, "doubling", [script_task("double", "y = x * 2")])
    inline = cli("run", str(path), "--json", "--data", '{"x": 21}')
    assert inline.exit_code == 0, inline.stdout
    assert _doc(inline)["layers"]["L3"]["y"] == 42
    runner = CliRunner()
    piped = runner.invoke(main, ["run", str(path), "--json", "--data", "-"], input='{"x": 4}', catch_exceptions=False)
    assert piped.exit_code == 0 and _doc(piped)["layers"]["L3"]["y"] == 8
    bad = cli("run", str(path), "--json", "--data", '{"x": ')
    assert bad.exit_code == 2 and "inline data is not valid JSON" in _doc(bad)["error"]["message"]
    not_object = runner.invoke(main, ["run", str(path), "--json", "--data", "-"], input="[1, 2]")
    assert not_object.exit_code == 2 and "data from stdin must hold an object, got list" in _doc(not_object)["error"]["message"]
    inline_list = cli("run", str(path), "--json", "--data", "[1, 2]")
    assert inline_list.exit_code == 2
    assert "inline data must hold an object, got list" in _doc(inline_list)["error"]["message"]
    missing = cli("run", str(path), "--data", "nowhere.json")
    assert missing.exit_code == 2
    assert "cannot read data file nowhere.json" in missing.stderr and "inline JSON object" in missing.stderr


def test_tape_kind_that_matches_nothing_lists_the_kinds_and_replay_past_the_end_says_so(cli) -> None:
    iid = _doc(cli("demo", "loan", "--scenario", "fast", "--json"))["instance_id"]
    none = cli("tape", iid, "--kind", "conflcit", "--json")
    assert none.exit_code == 0 and _doc(none) == []  # an empty result is still the document
    assert "no event of kind 'conflcit'" in none.stderr and "complete" in none.stderr and "split" in none.stderr
    found = cli("tape", iid, "--kind", "complete")
    assert found.exit_code == 0 and found.stdout and not found.stderr
    end = _doc(cli("replay", iid, "--until", "100000", "--json"))
    assert end["until"] == end["tape_end"] >= 1 and end["until_requested"] == 100000  # where the state stands
    last = _doc(cli("replay", iid, "--until", str(end["tape_end"]), "--json"))
    assert last["layers"] == end["layers"] and last["tape_end"] == end["tape_end"]
    text = cli("replay", iid, "--until", "100000").stdout.splitlines()[0]
    assert text == f"context main of {iid} at #{end['tape_end']} (the tape ends at #{end['tape_end']}: this is its last state)"
