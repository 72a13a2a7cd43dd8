"""Round 32 gaps: `inspect`/`tape`/`replay --json` refused after finding their instance show it as it
is; `tape --kind denied` lists an answer's refused bookkeeping keys; an answer to a user task the
instance has passed is named as unused; a called config's ignored section is worded right; the plain
"waiting for" lines of a multi-instance activity say which instance waits."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from context_layers import LayeredContext
from engine import Engine, load_process

from engine_helpers import chain_bpmn, cli_in_a_tmp_store, run_json

cli = cli_in_a_tmp_store  # the "cli" fixture: the CLI in this process, on the test's own sqlite store

TOKEN = "gaps32-token-0123456789abcdef"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
TWO_STEPS = ['<bpmn:userTask id="draft"/>', '<bpmn:userTask id="approve"/>']
CAST = ('<bpmn:userTask id="cast"><bpmn:multiInstanceLoopCharacteristics isSequential="false">'
        '<bpmn:loopDataInputRef>voters</bpmn:loopDataInputRef><bpmn:inputDataItem id="voter" name="voter"/>'
        '</bpmn:multiInstanceLoopCharacteristics></bpmn:userTask>')


def two_steps(folder: Path) -> Path:
    """draft -> approve, two people's steps; SYSTEM holds `policy`."""
    folder.mkdir(exist_ok=True)
    path = folder / "two_steps.bpmn"
    path.write_text(chain_bpmn("two_steps", TWO_STEPS), encoding="utf-8")
    (folder / "two_steps.layerflow.yaml").write_text("system:\n  policy: strict\n", encoding="utf-8")
    return path


# ----------------------------------------------------------------------------- 1. refusals show the instance


@pytest.mark.parametrize(("args", "kind"), [
    (["inspect", "{iid}", "--context", "legal_reveiw"], "not_found"),
    (["inspect", "{iid}", "--layer", "L9"], "bad_input"),
    (["tape", "{iid}", "--context", "legal_reveiw"], "not_found"),
    (["replay", "{iid}", "--context", "legal_reveiw"], "not_found"),
    (["replay", "{iid}", "--until", "-1"], "bad_input"),
    (["replay", "{iid}", "3", "--until", "4"], "bad_input"),
])
def test_a_refused_inspect_tape_or_replay_shows_the_instance_as_it_is(cli: Any, tmp_path: Path, args: list[str],
                                                                     kind: str) -> None:
    """As `resume`, `send`, `cancel`, `rollback` and `snapshot` do: a refusal (exit 2) of a command that
    found its instance gives the instance as it is (layers, `waiting_for`, `instance_status`), not the
    empty document of a failure before any instance exists (no layers, `"waiting_for": []`)."""
    started = run_json(cli, "run", str(two_steps(tmp_path)), code=3)
    iid = started["instance_id"]
    refused = run_json(cli, *[a.format(iid=iid) for a in args], code=2)
    assert refused["status"] == "error" and refused["error"]["kind"] == kind, refused["error"]
    assert refused["error"]["instance_status"] == "waiting"
    assert (refused["instance_id"], refused["process_id"]) == (iid, "two_steps")
    assert refused["layers"] == started["layers"] and refused["layers"]["L0"] == {"policy": "strict"}
    assert [w["task_id"] for w in refused["waiting_for"]] == ["draft"]
    assert refused["tape_length"] == started["tape_length"]


# ----------------------------------------------------------------------------- 2. tape --kind denied


def test_tape_kind_denied_lists_an_answers_refused_bookkeeping_keys_once_each(cli: Any, tmp_path: Path) -> None:
    """An answer setting `_mergedConflicts` or an `activity:` record is refused with an `answer_refused`
    note and no `denied` write (the engine's rule, not a layer's, refuses it): `--kind denied` left it
    out, so a user filtering for refusals missed it. A layer's refusal (SYSTEM's `policy`) is listed
    once: its `denied` write (its note names the task, `tape --activity` lists it)."""
    from fastapi.testclient import TestClient

    from engine.api import create_app

    catalog = tmp_path / "catalog"
    iid = run_json(cli, "run", str(two_steps(catalog)), code=3)["instance_id"]
    for answer in ({"_mergedConflicts": []}, {"activity:draft": {"status": "forged"}}, {"policy": "lax"}):
        run_json(cli, "resume", iid, "--answer", f"draft={json.dumps(answer)}", code=2)
    listed = run_json(cli, "tape", iid, "--kind", "denied")
    assert [(e["kind"], e["data"].get("note"), e["data"]["key"]) for e in listed] == [
        ("note", "answer_refused", "_mergedConflicts"), ("note", "answer_refused", "activity:draft"),
        ("denied", None, "policy")]
    plain = cli("tape", iid, "--kind", "denied").stdout.splitlines()
    assert len(plain) == 3 and "task_id=\"draft\"" in plain[0] and "_mergedConflicts" in plain[0], plain
    with TestClient(create_app(os.environ["LAYERFLOW_STORE"], catalog, TOKEN)) as client:
        rest = client.get(f"/api/instances/{iid}/tape", params={"kind": "denied"}, headers=AUTH).json()
    assert [(e["context"], e["seq"]) for e in rest["events"]] == [(e["context"], e["seq"]) for e in listed]


@pytest.mark.parametrize(("note", "data", "listed"), [
    ("answer_refused", {"task_id": "t", "key": "_branch_id", "reason": "engine key"}, True),
    ("answer_refused", {"task_id": "t", "key": "kb:docs/a#1", "reason": "engine key"}, True),
    ("model_answer_refused", {"key": "_mergedConflicts", "reason": "engine key"}, True),
    ("event_refused", {"event": "paid", "key": "event:paid", "reason": "engine key"}, True),
    # a layer's refusal: its `denied` write is the line; a missing output item or a form's problems: no write
    ("answer_refused", {"task_id": "t", "key": "policy", "reason": "L0 SYSTEM is fixed"}, False),
    ("answer_refused", {"task_id": "t", "key": "review", "instance": 1, "reason": "no output item"}, False),
    ("answer_refused", {"task_id": "t", "form": None, "problems": [{"field": "a", "problem": "missing"}]}, False),
])
def test_the_denied_filter_takes_the_refusal_notes_of_bookkeeping_keys(note: str, data: dict[str, Any],
                                                                       listed: bool) -> None:
    ctx = LayeredContext()
    ctx.record(note, actor="person", data=data)
    assert [e.data.get("note") for e in ctx.tape.filter(kind="denied")] == ([note] if listed else [])


# ----------------------------------------------------------------------------- 3. answers to passed steps


def test_an_answer_to_a_user_task_already_passed_is_named_unused_in_cli_rest_and_python(
        cli: Any, tmp_path: Path) -> None:
    """`draft` is done and the instance waits at `approve`: an answer for `draft` can never be used (an
    answer is used only by the resume it is given to), yet stderr said it "is kept for a later step"."""
    from fastapi.testclient import TestClient

    from engine.api import create_app

    catalog = tmp_path / "catalog"
    path = two_steps(catalog)
    iid = run_json(cli, "run", str(path), code=3)["instance_id"]
    run_json(cli, "resume", iid, "--answer", 'draft={"text": "v1"}', code=3)
    again = cli("resume", iid, "--answer", 'draft={"text": "v2"}')
    assert again.exit_code == 3, again.stderr
    assert "kept for a later step" not in again.stderr
    assert (f"answer 'draft' was not used: user task 'draft' of instance {iid} is done (it waits for: approve)"
            in again.stderr), again.stderr
    answers = tmp_path / "answers.json"
    answers.write_text(json.dumps({"user_tasks": {"draft": {"text": "v3"}}}), encoding="utf-8")
    by_file = cli("resume", iid, "--answers", str(answers))
    assert "answer 'draft' was not used: user task 'draft'" in by_file.stderr, by_file.stderr
    # both: `approve` is answered and the instance completes; `draft` is still named
    done = cli("resume", iid, "--answer", 'draft={"text": "v2"}', "--answer", 'approve={"ok": true}')
    assert done.exit_code == 0 and "answer 'draft' was not used" in done.stderr, done.stderr

    engine = Engine("memory://")
    instance = engine.run(load_process(str(path)), {}, answers={"user_tasks": {"draft": {"text": "v1"}}})
    assert instance.notices == []  # used by the run it was given to
    instance = engine.resume(instance, answers={"user_tasks": {"draft": {"text": "v2"}}})
    assert [n for n in instance.notices if "'draft'" in n] == [
        f"answer 'draft' was not used: user task 'draft' of instance {instance.id} is done (it waits for: approve); "
        "an answer is used only by the run or resume in which its step waits"]
    with TestClient(create_app(os.environ["LAYERFLOW_STORE"], catalog, TOKEN)) as client:  # the CLI's store
        other = client.post("/api/instances", json={"process_id": "two_steps", "data": {}}, headers=AUTH).json()
        rid = other["instance_id"]
        client.post(f"/api/instances/{rid}/resume", json={"answers": {"user_tasks": {"draft": {"t": 1}}}},
                    headers=AUTH)
        reply = client.post(f"/api/instances/{rid}/resume", json={"answers": {"user_tasks": {"draft": {"t": 2}}}},
                            headers=AUTH).json()
    assert any(n.startswith("answer 'draft' was not used") for n in reply["notices"]), reply["notices"]


def test_an_answer_to_a_step_not_reached_yet_is_still_kept_for_a_later_step(cli: Any, tmp_path: Path) -> None:
    """`approve` answered while `draft` waits: the same resume reaches it, uses it, and names nothing."""
    iid = run_json(cli, "run", str(two_steps(tmp_path)), code=3)["instance_id"]
    done = cli("resume", iid, "--answer", 'approve={"ok": true}', "--answer", 'draft={"text": "v1"}')
    assert done.exit_code == 0, done.stderr
    assert "not used" not in done.stderr


# ----------------------------------------------------------------------------- 4. wording


def test_a_called_configs_ignored_system_section_is_worded_as_english(tmp_path: Path) -> None:
    from engine.validate import validate_process

    caller = tmp_path / "caller.bpmn"
    caller.write_text(chain_bpmn("caller", ['<bpmn:callActivity id="call" calledElement="callee"/>']), encoding="utf-8")
    callee = tmp_path / "callee.bpmn"
    callee.write_text(chain_bpmn("callee", ['<bpmn:scriptTask id="s"><bpmn:script>x = 1</bpmn:script></bpmn:scriptTask>']),
                      encoding="utf-8")
    (tmp_path / "callee.layerflow.yaml").write_text("system:\n  policy: strict\n", encoding="utf-8")
    report = validate_process([str(caller), str(callee)])
    [found] = [p for p in report.problems if p.code == "called_config_section_ignored"]
    assert "come from" not in found.message
    assert found.message == ("system: of a called process's config file is not read: an instance's system: section "
                             "is read from its main process's config file only; move it there")


# ----------------------------------------------------------------------------- 5. which instance waits


def test_the_plain_waiting_lines_say_which_instance_of_a_multi_instance_activity_waits(cli: Any,
                                                                                        tmp_path: Path) -> None:
    path = tmp_path / "vote.bpmn"
    path.write_text(chain_bpmn("vote", [CAST]), encoding="utf-8")
    data = json.dumps({"voters": ["ann", "bob"]})
    doc = run_json(cli, "run", str(path), "--data", data, code=3)
    iid = doc["instance_id"]
    ids = [w["id"] for w in doc["waiting_for"]]
    plain = cli("inspect", iid)  # any command's summary; `resume` prints the same lines
    lines = [ln for ln in cli("resume", iid).stdout.splitlines() if "waiting for user_task" in ln]
    assert plain.exit_code == 0
    assert len(lines) == 2
    for line, item_id, who in zip(lines, ids, ("ann", "bob")):
        n = 1 if who == "ann" else 2
        assert f"waiting for user_task {item_id} at cast (instance {n}, voter {json.dumps(who)})" in line, line
        assert f"--answer {item_id}='{{...}}'" in line, line
