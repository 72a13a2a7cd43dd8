"""A newcomer's clinical-trial enrolment (tests/engine/trial_o46/), driven only through the CLI:
screening form -> eligibility script and consent form in parallel -> a conflict on ``eligible``
at the join -> XOR with a default -> a baseline-visit sub-process with a 14-day timer ->
randomisation -> enrolment."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from engine_helpers import ROOT

TRIAL = Path(__file__).parent / "trial_o46" / "trial_enrolment.bpmn"
ANSWERS = {"user_tasks": {"screening": {"age": 40}, "consent": {"consented": False, "eligible": False}},
           "confirmations": {"checks_join/eligible": True}}


def layerflow(*args: str, store: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "LAYERFLOW_STORE": store}
    return subprocess.run([sys.executable, "-m", "engine.cli", *args], capture_output=True, text=True, env=env,
                          cwd=ROOT, timeout=120)


def layerflow_all(*calls: tuple[str, ...], store: str) -> list[subprocess.CompletedProcess[str]]:
    """Independent commands at once (each is a process of its own): the module stays quick."""
    with ThreadPoolExecutor(len(calls)) as pool:
        return list(pool.map(lambda args: layerflow(*args, store=store), calls))


@pytest.fixture(scope="module")
def waiting(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, str]:
    """An instance past the join (a person chose true), waiting in the baseline visit; (store, id)."""
    tmp = tmp_path_factory.mktemp("trial_o46")
    store = f"sqlite:///{tmp / 'trial.db'}"
    answers = tmp / "answers.json"
    answers.write_text(json.dumps(ANSWERS))
    run = layerflow("run", str(TRIAL), "--data", '{"subject_id": "S-0042"}', "--answers", str(answers), "--json",
                    store=store)
    assert run.returncode == 3, run.stderr
    doc: dict[str, Any] = json.loads(run.stdout)
    assert [w["task_id"] for w in doc["waiting_for"]] == ["baseline_visit", "visit_overdue"]
    assert doc["conflicts"][0]["key"] == "eligible" and doc["conflicts"][0]["resolution"]["value"] is True
    return store, doc["instance_id"]


def test_tape_filters_that_exclude_each_other_do_not_blame_a_kind_the_tape_has(waiting) -> None:
    """``--kind conflict`` with ``--since`` past it, or with a key it is not about, found nothing: the
    tape has conflicts, so the message must not say it has none (it said ``no event of kind 'conflict'
    here; kinds ...: ..., conflict, ...``); it names the filters that found nothing together, and
    where the tapes end."""
    store, iid = waiting
    late, other_key, past, negative, kind_typo = layerflow_all(
        ("tape", iid, "--kind", "conflict", "--since", "100"), ("tape", iid, "--kind", "conflict", "--key", "age"),
        ("tape", iid, "--since", "100", "--json"), ("tape", iid, "--since", "-3"), ("tape", iid, "--kind", "confict"),
        store=store)
    assert late.returncode == 0 and late.stdout == ""
    assert "no event of kind 'conflict' here" not in late.stderr
    assert "kind 'conflict'" in late.stderr and "#100" in late.stderr and "main ends at #" in late.stderr
    assert "no event of kind 'conflict' here" not in other_key.stderr
    assert "kind 'conflict'" in other_key.stderr and "key 'age'" in other_key.stderr
    # a misspelt kind gets the nearest kinds, as a misspelt activity or key does
    assert "no event of kind 'confict' here; did you mean 'conflict'?" in kind_typo.stderr
    # --since alone past the end said nothing at all
    assert json.loads(past.stdout) == [] and "main ends at #" in past.stderr
    # a negative --since listed the whole tape, where REST's tape?since=-3 is refused (422)
    assert negative.returncode == 2 and negative.stdout == "" and "--since" in negative.stderr


def test_rollback_by_a_snapshots_label_goes_back_to_that_snapshot(waiting) -> None:
    """``snapshot --label`` is "a label to find the snapshot by later": an operator gives it to
    ``rollback``, which said only ``no snapshot 'before-audit'`` while listing ``snap:main:N
    (before-audit)``. A label only one snapshot has names it (round 37: it was refused, naming the id)."""
    store, iid = waiting
    taken = layerflow("snapshot", iid, "--label", "before-audit", store=store)
    assert taken.returncode == 0, taken.stderr
    snap = taken.stdout.strip()
    by_label, helped = layerflow_all(("rollback", iid, "before-audit", "--json"), ("snapshot", "--help"), store=store)
    assert by_label.returncode == 0, by_label.stderr
    assert json.loads(by_label.stdout)["snapshot_id"] == snap
    help_text = " ".join(helped.stdout.split())
    assert "--label" in help_text and "rollback takes its id, or the label while no other snapshot has it" in help_text


def test_schema_takes_json_as_every_command_does(tmp_path: Path) -> None:
    """A script adds ``--json`` to every layerflow command; ``schema`` refused it (``No such option
    '--json'``, exit 2) although what it prints is one JSON document: it takes the flag."""
    store = f"sqlite:///{tmp_path / 'none.db'}"
    flagged, helped = layerflow_all(("schema", "--json"), ("schema", "--help"), store=store)
    assert flagged.returncode == 0, flagged.stderr
    assert json.loads(flagged.stdout)["title"] == "ActivityExtensionConfig"
    assert "--json" in helped.stdout


def test_tape_activity_of_a_sub_process_is_not_called_a_typo(waiting) -> None:
    """``--activity baseline`` names the sub-process the instance waits in: no typo, but it has no
    events of its own. The message said ``did you mean 'baseline_visit'?`` as for a misspelt id; it
    says what ``baseline`` is and which of its tasks have events (none yet: the visit waits), and a
    boundary event with no event yet is an element of the process too, not a typo."""
    store, iid = waiting
    sub, timer, typo, context = layerflow_all(
        ("tape", iid, "--activity", "baseline"), ("tape", iid, "--activity", "visit_overdue"),
        ("tape", iid, "--activity", "eligibilty"), ("inspect", iid, "--context", "baseline"), store=store)
    assert sub.returncode == 0 and sub.stdout == ""
    assert "did you mean" not in sub.stderr
    assert "'baseline' is a sub-process of process 'trial_enrolment'" in sub.stderr
    assert "baseline_visit" in sub.stderr  # the task inside it, by id
    assert "did you mean" not in timer.stderr
    assert "'visit_overdue' is an element of process 'trial_enrolment' with no event on this tape" in timer.stderr
    assert "did you mean 'eligibility'?" in typo.stderr
    # nor is it a context: it runs in the context of the flow it is on (main), which the refusal says
    assert context.returncode == 2
    assert ("'baseline' is an element of process 'trial_enrolment' with no context of its own"
            in context.stderr), context.stderr


def test_the_answer_hint_gives_escalate_as_a_shell_takes_it(tmp_path: Path) -> None:
    """The waiting conflict's hint listed ``(VALUE: true | false | "$escalate")``: pasted into a shell,
    ``--answer checks_join/eligible="$escalate"`` expands an unset variable and answers ``''``
    (refused). The hint gives the word the CLI takes for it, ``escalate``."""
    answers = tmp_path / "answers.json"
    answers.write_text(json.dumps({"user_tasks": ANSWERS["user_tasks"]}))
    run = layerflow("run", str(TRIAL), "--data", '{"subject_id": "S-0050"}', "--answers", str(answers),
                    store=f"sqlite:///{tmp_path / 'hint.db'}")
    assert run.returncode == 3, run.stderr
    hint = next(line for line in run.stdout.splitlines() if "waiting for confirmation checks_join/eligible" in line)
    assert "(VALUE: true | false | escalate)" in hint and "$escalate" not in hint


def test_an_escalated_conflict_shows_json_values_and_set_warns_on_python_words(tmp_path: Path) -> None:
    """The escalation's message showed the branches' values as Python (``eligibility=True,
    consent=False``) beside ``--set eligible=VALUE``, whose VALUE is JSON, else text: an operator who
    copied ``False`` wrote the text 'False' into the branch. The message shows JSON (``true``,
    ``false``), and ``--set`` names the text a Python word becomes, with the JSON to write instead."""
    store = f"sqlite:///{tmp_path / 'escalated.db'}"
    answers = tmp_path / "answers.json"
    answers.write_text(json.dumps({**ANSWERS, "confirmations": {"checks_join/eligible": "$escalate"}}))
    run = layerflow("run", str(TRIAL), "--data", '{"subject_id": "S-0051"}', "--answers", str(answers), "--json",
                    store=store)
    assert run.returncode == 1, run.stderr
    doc = json.loads(run.stdout)
    assert "eligibility=true, consent=false" in doc["error"]["message"], doc["error"]["message"]
    fixed = layerflow("resume", doc["instance_id"], "--set", "eligible=False", "--context", "consent", store=store)
    assert "--set eligible=False: False is not JSON, so it was written as the text 'False'" in fixed.stderr
    assert "write eligible=false for the JSON value" in fixed.stderr


def test_a_data_file_given_as_a_bpmn_file_is_named_as_such(tmp_path: Path) -> None:
    """``layerflow run trial.bpmn subject.json`` (``--data`` forgotten) said only ``not well-formed
    XML: Start tag expected``: the JSON file is named as no BPMN, with the option it belongs to."""
    data = tmp_path / "subject.json"
    data.write_text('{"subject_id": "S-0052"}')
    run = layerflow("run", str(TRIAL), str(data), store=f"sqlite:///{tmp_path / 'x.db'}")
    assert run.returncode == 2 and "subject.json" in run.stderr
    assert "it is no BPMN but JSON or YAML: give start data with --data FILE" in run.stderr


def test_two_different_answers_to_one_step_are_refused(tmp_path: Path) -> None:
    """``--answer screening='{"age": 40}' --answer screening='{"age": 41}'`` took the last one
    silently: two people's answers (or a copy-paste slip) to one step. Refused, naming the key and
    both values, nothing run; the same answer given twice is no conflict."""
    store = f"sqlite:///{tmp_path / 'twice.db'}"
    two, same = layerflow_all(
        ("run", str(TRIAL), "--data", '{"subject_id": "S-0053"}', "--answer", 'screening={"age": 40}',
         "--answer", 'screening={"age": 41}', "--json"),
        ("run", str(TRIAL), "--data", '{"subject_id": "S-0054"}', "--answer", 'screening={"age": 40}',
         "--answer", 'screening={"age": 40}', "--json"), store=store)
    assert two.returncode == 2
    message = json.loads(two.stdout)["error"]["message"]
    assert "--answer 'screening' is given twice with different values" in message, message
    assert '{"age": 40}' in message and '{"age": 41}' in message
    assert same.returncode == 3 and json.loads(same.stdout)["waiting_for"][0]["task_id"] == "consent"
