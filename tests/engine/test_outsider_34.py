"""Outsider round 34: processes nobody here had seen, written from README.md and DESIGN.md only
(tests/engine/outsider34/, exported as Camunda Modeler saves them, with their diagrams), driven through
the CLI, the Python API and one real ``layerflow serve``.

claim_triage: an inclusive gateway (its default flow, fraud scoring, taken only when no condition holds)
  opens the injury and property assessments, two agent steps (``llm:`` blocks run by their offline
  handlers) that each add their own entry to a shared ``findings`` object, grow the ``flags`` and ``notes``
  lists, raise the ``reserve`` and the ``severity``, and disagree on ``liability``. Its config is JSON
  (``claim_triage.layerflow.json``) with a ``system:`` section of model limits and a ``data_layers``
  mapping that sends ``status`` to WORKING. The join reduces per key (``merge``, ``union``, ``append``,
  ``sum``, ``max``) and settles ``liability`` by ``BRANCH_PRIORITY``; a second config asks a person.

security_rounds: an embedded sub-process on a loop (an exclusive gateway leads back to it) forks two scans
  in parallel inside; the tally after their join compresses by an attention score (``redundancy``
  written, DESIGN's defaults for the others: ``density`` fires first) with a ``count_only`` rule.

Expected before anything ran: as README and DESIGN say, and so it was, but for:
- ``layerflow validate`` of a join config with a misspelt reducer (``unoin``) and a misspelt
  ``branchPriority`` id named only the reducer; the branch id came out on the next run of validate, after
  the reducer was fixed (README: "every problem at once"). An element whose config has a bad field is now
  still cross-checked with its other fields.
- security_rounds failed in its third round: ``web_medium``, folded by the tally's compression, was
  written again (same value) by the next round's scan, but the join dropped it ("a key folded before the
  split keeps the value it had" was read as "stays folded"), so the tally's script read a key that was
  gone. The join now keeps the value a branch wrote back when no branch changed it otherwise.
- ``Engine.answer_confirmation`` of a value the confirmation does not offer raised ``ActivityError``
  (kind ``activity_failed``), where README names the refusal ``InvalidAnswer`` (``invalid_answer``), as the
  CLI, REST and ``Engine.resume(answers=...)`` report it. It now raises an ``InvalidAnswer`` that is
  still an ``ActivityError``.
- with ``reducers: {findings: merge}`` and ``BRANCH_PRIORITY``, two agents that each added their own entry to
  ``findings`` and disagreed on one more (``liability``) lost the lower branch's entry: the strategy took the
  first branch's whole object. It now settles only the entries that collide and keeps the rest, as the merged
  object a person is offered does.
- ``layerflow validate`` with a JSON config that has one syntax error warned, beside the error, that the two
  agent steps have "no handler, and its config gives no handler": the handlers were in that file. The
  warning now says the config file could not be read.
- ``layerflow tape --key liabilty`` (a typo) or ``--branch Activity_fraud`` (a branch the inclusive gateway did
  not take) printed nothing, exit 0, not a word, where ``--kind`` and ``--activity`` name what the tape has:
  they now do too (stderr, exit 0 as before).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import httpx
import pytest

from context_layers import Layer

from engine_helpers import cli_in_a_tmp_store, run_json, serving_catalog
from test_contracts_cli import check_run_document

cli = cli_in_a_tmp_store  # the fixture "cli", here too

HERE = Path(__file__).resolve().parent / "outsider34"
CLAIM = HERE / "claim_triage.bpmn"
CLAIM_CONFIG = HERE / "claim_triage.layerflow.json"
PEOPLE = HERE / "claim_triage_people.layerflow.json"
LIABILITY = "Gateway_assess_join/liability"


def claim(**extra: Any) -> str:
    return json.dumps({"claim_id": "CL-9", "amount": 20000, "injury": True, "property_damage": True,
                       "status": "new", **extra})


def edited_config(tmp_path: Path, **join: Any) -> Path:
    config = json.loads(CLAIM_CONFIG.read_text())
    config["Gateway_assess_join"].update(join)
    path = tmp_path / "claim_triage.layerflow.json"
    path.write_text(json.dumps(config, indent=2))
    return path


def test_inclusive_join_reduces_each_key_and_settles_liability_by_branch_priority(cli: Any) -> None:
    doc = run_json(cli, "run", str(CLAIM), "--data", claim())
    check_run_document(doc)
    assert doc["status"] == "completed"
    assert doc["layers"]["L0"]["model_limits"] == {"context_tokens": 8000, "max_output_tokens": 512}
    assert "status" not in doc["layers"]["L1"] and doc["layers"]["L3"]["status"] == "new"  # data_layers
    history = doc["layers"]["L3"]
    assert history["findings"] == {"claim": "CL-9", "medical": {"icd": "S82.0", "days_off": 21},
                                   "property": {"estimate": 1800}}
    assert history["flags"] == ["filed", "injury", "hospital", "property"]
    assert history["notes"] == ["claim opened", "medical: fractured knee", "property: bumper"]
    assert history["reserve"] == 100 + 4100 + 1700 and history["severity"] == 3
    assert "fraud_score" not in history  # the default flow: only when no condition holds
    [conflict] = doc["conflicts"]
    assert conflict["key"] == "liability" and conflict["base_value"] is None and conflict["base_absent"] is True
    assert conflict["values"] == {"Activity_medical": "insured", "Activity_property": "third_party"}
    assert conflict["resolution"]["resolver"] == "strategy" and conflict["resolution"]["value"] == "insured"
    assert "Activity_medical" in conflict["resolution"]["reason"]
    assert history["decision"] == "investigate" and history["final_reserve"] == 5900
    assert doc["waiting_for"] == [] and doc["confirmations"] == [] and doc["tape_length"] > 0


def test_only_the_default_flow_runs_when_no_condition_holds(cli: Any) -> None:
    doc = run_json(cli, "run", str(CLAIM), "--data", claim(injury=False, property_damage=False, amount=60000))
    history = doc["layers"]["L3"]
    assert history["fraud_score"] == 0.7 and history["flags"] == ["filed", "high_value"]
    assert doc["conflicts"] == [] and history["reserve"] == 100


def test_validate_names_a_bad_reducer_and_a_bad_branch_priority_id_at_once(cli: Any, tmp_path: Path) -> None:
    config = edited_config(tmp_path, reducers={"flags": "unoin", "reserve": "sum"},
                           branchPriority=["Activity_medicl", "Activity_property"])
    result = cli("validate", str(CLAIM), "--config", str(config))
    assert result.exit_code == 2
    assert "'unoin'" in result.stdout and "reducers.flags" in result.stdout
    assert "'Activity_medicl'" in result.stdout and "did you mean 'Activity_medical'" in result.stdout
    assert "2 errors" in result.stdout


def test_validate_of_an_unreadable_config_does_not_ask_for_the_handlers_it_holds(cli: Any, tmp_path: Path) -> None:
    broken = tmp_path / "claim_triage.layerflow.json"
    broken.write_text(CLAIM_CONFIG.read_text().replace('"system": {', '"system": {,', 1))
    result = cli("validate", str(CLAIM), "--config", str(broken))
    assert result.exit_code == 2 and "invalid JSON" in result.stdout
    assert "its config gives no handler" not in result.stdout
    assert "could not be read" in result.stdout and "Activity_medical" in result.stdout


def test_a_person_settles_liability_and_an_answer_outside_the_options_is_refused(cli: Any, tmp_path: Path) -> None:
    doc = run_json(cli, "run", str(CLAIM), "--config", str(PEOPLE), "--data", claim(), code=3)
    iid = doc["instance_id"]
    assert doc["waiting_for"][0]["id"] == LIABILITY and doc["waiting_for"][0]["kind"] == "confirmation"
    [asked] = doc["confirmations"]
    assert [o["value"] for o in asked["options"]] == ["insured", "third_party", "shared", "$escalate"]
    refused = run_json(cli, "resume", iid, "--answer", f"{LIABILITY}=nobody", code=2)
    assert refused["error"]["kind"] == "invalid_answer" and refused["error"]["instance_status"] == "waiting"
    assert "'nobody'" in refused["error"]["message"] and '"shared"' in refused["error"]["message"]
    answers = tmp_path / "answers.json"
    answers.write_text(json.dumps({"confirmations": {LIABILITY: "shared"}}))
    done = run_json(cli, "resume", iid, "--answers", str(answers))
    assert done["status"] == "completed"
    [conflict] = done["conflicts"]
    assert conflict["resolution"]["resolver"] == "human" and conflict["resolution"]["value"] == "shared"
    assert done["layers"]["L3"]["liability"] == "shared"
    assert [c["answer"] for c in done["confirmations"]] == ["shared"]


def test_rollback_to_a_merged_branch_snapshot_names_the_split_snapshot(cli: Any) -> None:
    doc = run_json(cli, "run", str(CLAIM), "--data", claim())
    listed = cli("snapshot", doc["instance_id"], "--list").stdout
    branch_snap = next(line.split("\t")[0] for line in listed.splitlines() if "Activity_property" in line)
    result = cli("rollback", doc["instance_id"], branch_snap)
    assert result.exit_code == 2
    assert "already merged into 'main'" in result.stderr and "snap:main:" in result.stderr
    back = run_json(cli, "rollback", doc["instance_id"], "snap:main:10", "--layers", "L3")
    assert back["restored_layers"] == ["L3"] and back["tokens_after"]["L3"] < back["tokens_before"]["L3"]
    assert "findings" in back["layers"]["L3"] and "liability" not in back["layers"]["L3"]


SECURITY = HERE / "security_rounds.bpmn"


def test_a_loop_of_subprocess_rounds_with_a_nested_parallel_compresses_and_completes(cli: Any) -> None:
    doc = run_json(cli, "run", str(SECURITY), "--data", '{"rounds": 3}')
    check_run_document(doc)
    assert doc["status"] == "completed", doc["error"]
    history = doc["layers"]["L3"]
    assert history["report"] == "9 open findings after 3 rounds"
    assert history["web_medium"] == 2 and history["db_medium"] == 1
    assert doc["compressions"] and all(c["activity_id"] == "Activity_tally" for c in doc["compressions"])
    for c in doc["compressions"]:
        assert c["triggers"] and c["snapshot_id"].startswith("snap:main:")
        assert isinstance(c["tokens_before"], int) and isinstance(c["tokens_after"], int)


def test_the_rounds_compress_on_redundancy_alone(cli: Any) -> None:
    doc = run_json(cli, "run", str(SECURITY), "--config", str(HERE / "security_rounds_redundancy.layerflow.yaml"),
                   "--data", '{"rounds": 3}')
    assert doc["status"] == "completed" and doc["layers"]["L3"]["report"] == "9 open findings after 3 rounds"
    assert doc["compressions"] and all(c["triggers"] == ["redundancy"] for c in doc["compressions"])
    assert all(c["attention_before"]["redundancy"] > 0.05 for c in doc["compressions"])
    counter = doc["layers"]["L3"]["summary:count:*_log"]
    assert counter["count"] >= 2 and len(counter["kept"]) == 1


def test_a_value_written_again_after_its_fold_survives_the_join() -> None:
    """The join alone: the split's HISTORY lost ``n`` to a fold (it was 2), one branch writes 2 again,
    the other leaves it: ``n`` is 2 after the join; a branch that writes 3 beside it wins, no conflict."""
    from context_layers import LayeredContext
    from gateways import ContextSplitter
    from gateways.join import join_contexts

    def run(second: int | None) -> Any:
        ctx = LayeredContext(system={"policy": "p"})
        branches = ContextSplitter().split(ctx, "fork", ["a", "b"])
        branches[0].context.write(Layer.WORKING, "n", 2, actor="scan_a")
        if second is not None:
            branches[1].context.write(Layer.WORKING, "n", second, actor="scan_b")
        return join_contexts(ctx, branches, config={}, gateway_id="join", base_folded={"n": 2})

    merged = dict(run(None).changes[Layer.WORKING])
    assert merged["n"] == 2
    contested = run(3)
    assert dict(contested.changes[Layer.WORKING])["n"] == 3 and not contested.conflicts


def test_the_python_api_refuses_an_answer_outside_the_options_as_invalid_answer() -> None:
    from context_layers.errors import ActivityError
    from engine import Engine, load_process
    from engine.governance import InvalidAnswer

    engine = Engine("memory://")
    process = load_process(CLAIM, config=PEOPLE)
    waiting = engine.run(process, json.loads(claim()))
    assert waiting.status == "waiting"
    for answer in (lambda: engine.answer_confirmation(waiting.id, LIABILITY, "nobody"),
                   lambda: engine.resume(waiting.id, answers={"confirmations": {LIABILITY: "nobody"}})):
        with pytest.raises(InvalidAnswer, match="'nobody'") as refused:
            answer()
        assert refused.value.kind == "invalid_answer"
    with pytest.raises(ActivityError):  # what answer_confirmation raised before: still caught
        engine.answer_confirmation(waiting.id, LIABILITY, "insurd")
    done = engine.answer_confirmation(waiting.id, LIABILITY, "third_party", by="kim")
    assert done.status == "completed" and done.main.resolve("liability") == "third_party"
    assert done.main.resolve("_mergedConflicts")[0]["resolution"]["by"] == "kim"


@pytest.mark.parametrize(("strategy", "liability"), [("BRANCH_PRIORITY", "insured"), ("LAST_WRITER_WINS", "third_party")])
def test_a_strategy_settles_only_the_colliding_entries_of_a_merge_key(strategy: str, liability: str) -> None:
    """``reducers: {findings: merge}``: both branches set ``liability`` inside the object, each adds its own
    entry; the strategy decides ``liability`` and keeps both entries, instead of dropping one branch's."""
    from context_layers import LayeredContext
    from gateways import ContextSplitter
    from gateways.join import join_contexts

    ctx = LayeredContext(system={"policy": "p"})
    ctx.write(Layer.WORKING, "findings", {"claim": "CL-9"}, actor="intake")
    medical, prop = ContextSplitter().split(ctx, "assess", ["medical", "property"])
    medical.context.write(Layer.WORKING, "findings", {"claim": "CL-9", "medical": {"icd": "S82.0"},
                                                      "liability": "insured"}, actor="medical")
    prop.context.write(Layer.WORKING, "findings", {"claim": "CL-9", "property": {"estimate": 1800},
                                                   "liability": "third_party"}, actor="property")
    joined = join_contexts(ctx, [medical, prop], gateway_id="assess_join", config={
        "mergeStrategy": strategy, "branchPriority": ["medical", "property"], "reducers": {"findings": "merge"}})
    [(conflict, resolution)] = joined.conflicts
    assert conflict.key == "findings" and resolution.resolver == "strategy"
    assert resolution.value == {"claim": "CL-9", "medical": {"icd": "S82.0"}, "property": {"estimate": 1800},
                                "liability": liability}
    assert "liability" in resolution.reason


def test_tape_names_a_key_or_branch_that_has_no_event(cli: Any) -> None:
    doc = run_json(cli, "run", str(CLAIM), "--data", claim())
    iid = doc["instance_id"]
    found = cli("tape", iid, "--key", "liability")
    assert found.exit_code == 0 and "note:conflict" in found.stdout and found.stderr == ""
    typo = cli("tape", iid, "--key", "liabilty")
    assert typo.exit_code == 0 and typo.stdout == ""
    assert "no event of key 'liabilty'" in typo.stderr and "did you mean 'liability'" in typo.stderr
    untaken = cli("tape", iid, "--branch", "Activity_fraud")
    assert untaken.exit_code == 0 and untaken.stdout == ""
    assert "no event of branch 'Activity_fraud'" in untaken.stderr
    assert "Activity_medical, Activity_property" in untaken.stderr


TOKEN = "outsider34-token"


def test_claim_triage_over_http_with_a_person_answering(tmp_path: Path) -> None:
    catalog = tmp_path / "catalog"
    catalog.mkdir()
    shutil.copy(CLAIM, catalog / CLAIM.name)
    shutil.copy(HERE / "claim_agents.py", catalog / "claim_agents.py")
    shutil.copy(PEOPLE, catalog / "claim_triage.layerflow.json")
    with serving_catalog(catalog, f"sqlite:///{tmp_path / 'api.db'}", tmp_path / "serve.log", TOKEN) as api:
        assert httpx.get(f"{api.base_url}/api/instances").status_code == 401
        started = api.post("/api/instances", json={"process_id": "claim_triage", "data": json.loads(claim())})
        assert started.status_code in (200, 201), started.text
        doc = started.json()
        check_run_document(doc)
        assert doc["status"] == "waiting" and doc["waiting_for"][0]["id"] == LIABILITY
        iid = doc["instance_id"]
        refused = api.post(f"/api/confirmations/{LIABILITY}", json={"value": "nobody", "instance_id": iid})
        assert refused.status_code == 400 and refused.json()["error"]["kind"] == "invalid_answer"
        answered = api.post(f"/api/confirmations/{LIABILITY}", json={"value": "shared", "instance_id": iid})
        assert answered.status_code == 200, answered.text
        done = api.get(f"/api/instances/{iid}").json()
        assert done["status"] == "completed" and done["layers"]["L3"]["liability"] == "shared"
        [conflict] = done["conflicts"]
        assert conflict["resolution"]["resolver"] == "human"
        tape = api.get(f"/api/instances/{iid}/tape", params={"kind": "conflict"}).json()
        events = tape["events"] if isinstance(tape, dict) else tape
        assert events and all("liability" in json.dumps(e) for e in events)
        split = api.get(f"/api/instances/{iid}/tape", params={"kind": "split"}).json()
        [split_event] = split["events"] if isinstance(split, dict) else split
        snapshot_id = split_event["data"]["snapshot_id"]
        back = api.post("/api/context-governance/rollback", json={"instance_id": iid, "snapshot_id": snapshot_id})
        assert back.status_code == 200, back.text
        assert "liability" not in back.json()["layers"]["L3"]


if __name__ == "__main__":  # pragma: no cover
    pytest.main([__file__, "-q"])
