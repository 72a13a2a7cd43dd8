"""Round 38 gaps.

* An answer ``ACTIVITY/KEY`` (``--answers``, ``--answer``, ``Engine.run``/``resume(answers=...)``,
  REST's ``answers``) settles a conflict of a parallel multi-instance activity's instances, as
  ``GATEWAY/KEY`` settles a join's: the instances meet as a join's branches do.
* The instances of a multi-instance sub-process with an output collection bring back what else they
  wrote, merged as a join's branches are (Camunda and Zeebe propagate an instance's variables to the
  scope around it); they were dropped without a word.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from engine import Engine, load_process
from engine.governance import InvalidAnswer

from engine_helpers import chain_bpmn, cli_in_a_tmp_store, run_json, script_task, variables
from test_gaps35 import _process

cli = cli_in_a_tmp_store


def _answers(**confirmations: Any) -> dict[str, Any]:
    return {"confirmations": {k.replace("__", "/"): v for k, v in confirmations.items()}}


# ----------------------------------------------------------------------------- 1. answers settle MI conflicts


@pytest.mark.parametrize("kind", ["subProcess", "callActivity"])
@pytest.mark.parametrize("answer", ["v1", "v2", "v3"])
def test_an_answer_activity_slash_key_settles_the_instances_conflict(tmp_path: Path, kind: str, answer: str) -> None:
    """Before, ``each/verdict`` was refused as naming no join (exit 2), so no answer could settle it.
    The instances meet two at a time as each ends: the answer settles each meeting whose values it is
    among (``v3``, the last instance's, is none of the first meeting's: that one keeps the instance that
    ended last until ``each#3`` brings it)."""
    engine = Engine()
    inst = engine.run(engine.start(load_process(_process(tmp_path, kind, config="each:\n  reducers: {total: sum}\n"))),
                      answers=_answers(each__verdict=answer))
    assert inst.status == "completed", inst.error
    assert variables(inst.main)["verdict"] == answer
    records = [c for c in inst.conflicts if c["key"] == "verdict"]
    assert records and records[-1]["resolution"]["resolver"] == "human", records
    assert records[-1]["resolution"]["value"] == answer
    assert f'a person chose "{answer}"' in records[-1]["resolution"]["reason"], records[-1]
    assert not [n for n in inst.notices if "each/verdict" in n], inst.notices
    steps = [e.data for e in inst.main.tape if e.data.get("note") == "resolution" and e.data.get("key") == "verdict"]
    assert steps and steps[-1]["resolver"] == "human" and steps[-1]["outcome"] == "answered", steps


def test_an_answer_no_instance_brought_is_named_as_not_used(tmp_path: Path) -> None:
    engine = Engine()
    inst = engine.run(engine.start(load_process(_process(tmp_path, "subProcess"))),
                      answers=_answers(each__verdict="v9"))
    assert inst.status == "completed", inst.error
    assert variables(inst.main)["verdict"] == "v3"  # as without the answer: the last instance's
    [notice] = [n for n in inst.notices if "each/verdict" in n]
    for part in ("was not used", "multi-instance activity 'each'", '"v9"', '"v1"', '"v2"', '"v3"'):
        assert part in notice, (part, notice)


def test_a_failed_activity_is_settled_by_the_answer_its_error_asks_for_on_resume(tmp_path: Path) -> None:
    engine = Engine(f"sqlite:///{tmp_path / 'runs.db'}")
    config = "each:\n  mergeStrategy: MERGE_WITH_CONFLICT_DETECT\n  reducers: {total: sum}\n"
    inst = engine.run(engine.start(load_process(_process(tmp_path, "subProcess", config=config))))
    assert inst.status == "error" and inst.error["kind"] == "merge_conflict", inst.error
    assert "--answer each/KEY=VALUE" in inst.error["message"] or "each/verdict" in inst.error["message"]
    inst = engine.resume(engine.load(inst.id), answers=_answers(each__verdict="v2"))
    assert inst.status == "completed", inst.error
    got = variables(inst.main)
    assert got["verdict"] == "v2" and got["total"] == 6
    assert all(c["resolution"] is not None for c in inst.conflicts)


def test_the_cli_takes_the_answer_and_still_refuses_a_key_of_no_activity(cli: Any, tmp_path: Path) -> None:
    [path] = _process(tmp_path, "subProcess")
    done = run_json(cli, "run", str(path), "--answer", "each/verdict=v1", code=0)
    assert done["layers"]["L4"].get("verdict", done["layers"]["L3"].get("verdict")) == "v1", done["layers"]
    refused = run_json(cli, "run", str(path), "--answer", "eahc/verdict=v1", code=2)
    assert refused["error"]["kind"] == "invalid_answer" and "'eahc/verdict'" in refused["error"]["message"]
    with pytest.raises(InvalidAnswer):
        Engine().run(load_process(path), answers=_answers(judge__verdict="v1"))  # a task inside: no merge of its own


def test_rest_start_and_resume_take_the_answer(tmp_path: Path) -> None:
    """REST's ``answers`` went through the same check, which refused ``each/verdict`` (400)."""
    import local_http

    from engine.api import create_app

    from governance_helpers import TOKEN, ServerThread

    catalog = tmp_path / "catalog"
    catalog.mkdir()
    _process(catalog, "subProcess", config="each:\n  mergeStrategy: MERGE_WITH_CONFLICT_DETECT\n  reducers: {total: sum}\n")
    auth = {"Authorization": f"Bearer {TOKEN}"}
    with ServerThread(create_app(f"sqlite:///{tmp_path / 'rest.db'}", catalog, TOKEN)) as server:
        started = local_http.post(server.url + "/api/instances", headers=auth, json={
            "process_id": "mi", "answers": {"confirmations": {"each/verdict": "v1"}}})
        assert started.status_code == 201, started.text
        doc = started.json()
        assert doc["status"] == "completed", doc
        assert [c["resolution"]["resolver"] for c in doc["conflicts"]] == ["human", "human"], doc["conflicts"]
        failed = local_http.post(server.url + "/api/instances", headers=auth, json={"process_id": "mi"}).json()
        assert failed["status"] == "error" and failed["error"]["kind"] == "merge_conflict", failed
        resumed = local_http.post(server.url + f"/api/instances/{failed['instance_id']}/resume", headers=auth,
                                  json={"answers": {"confirmations": {"each/verdict": "v3"}}})
        assert resumed.status_code == 200, resumed.text
        assert resumed.json()["status"] == "completed" and resumed.json()["notices"] == [], resumed.json()


# ----------------------------------------------------------------------------- 2. output collection + other keys


def _collecting(tmp_path: Path, judge: str, config: str | None = None) -> Path:
    loop = ('<bpmn:multiInstanceLoopCharacteristics isSequential="false">'
            '<bpmn:loopDataInputRef>numbers</bpmn:loopDataInputRef><bpmn:loopDataOutputRef>outs</bpmn:loopDataOutputRef>'
            '<bpmn:inputDataItem id="number" name="number"/><bpmn:outputDataItem id="result" name="result"/>'
            '</bpmn:multiInstanceLoopCharacteristics>')
    sub = (f'<bpmn:subProcess id="each">{loop}<bpmn:startEvent id="in_start"/>' + script_task("judge", judge)
           + '<bpmn:endEvent id="in_end"/><bpmn:sequenceFlow id="in1" sourceRef="in_start" targetRef="judge"/>'
           '<bpmn:sequenceFlow id="in2" sourceRef="judge" targetRef="in_end"/></bpmn:subProcess>')
    path = tmp_path / "mi.bpmn"
    path.write_text(chain_bpmn("mi", [script_task("init", "numbers = [1, 2, 3]\nchecked = 0\nverdict = 'none'"), sub]),
                    encoding="utf-8")
    if config is not None:
        (tmp_path / "mi.layerflow.yaml").write_text(config, encoding="utf-8")
    return path


def test_keys_instances_write_beside_their_output_item_are_named_on_the_tape_not_dropped_silently(
        tmp_path: Path) -> None:
    """Decided: the output item alone comes back, as SpiffWorkflow collects it and as this engine has
    always run (Camunda and Zeebe would propagate the rest, the last instance's value winning over
    the others: the loss this engine's scopes avoid). What else an instance changed stays in its scope,
    and the tape says so: before, nothing told the keys were left behind."""
    path = _collecting(tmp_path, "result = number * 10\nchecked = checked + 1\nauditor = 'ann'")
    engine = Engine()
    inst = engine.run(engine.start(load_process(path)))
    assert inst.status == "completed", inst.error
    got = variables(inst.main)
    assert got["outs"] == [10, 20, 30] and got["checked"] == 0 and "auditor" not in got
    notes = [e.data for e in inst.main.tape if e.data.get("note") == "kept_in_scope"]
    assert [n["instance"] for n in notes] == ["each#1", "each#2", "each#3"], notes
    for n in notes:
        assert n["activity"] == "each" and n["keys"] == ["auditor", "checked"], n
        assert variables(inst.contexts[n["context"]])["auditor"] == "ann"  # where they stay
        for part in ("output item", "'result'", "SpiffWorkflow", "loopDataOutputRef", "inspect --context"):
            assert part in n["reason"], (part, n["reason"])


# ----------------------------------------------------------------------------- 3/4. a join on a loop


def _loop(tmp_path: Path) -> Path:
    """test_known_gaps_21's loop: a parallel split whose branches set ``level`` differently, a join
    that asks a person (``merge/level``), a review that may send the flow round again."""
    from engine_helpers import flow, write_elements

    path = write_elements(tmp_path, "loop", [
        '<bpmn:startEvent id="start"/>', '<bpmn:parallelGateway id="split"/>',
        script_task("a", 'level = "a%d" % rounds'), script_task("b", 'level = "b%d" % rounds'),
        '<bpmn:parallelGateway id="merge"/>', '<bpmn:userTask id="review"/>', script_task("count", "rounds = rounds + 1"),
        '<bpmn:exclusiveGateway id="again"/>', '<bpmn:endEvent id="end"/>', script_task("init", "rounds = 1"),
        flow("start", "init"), flow("init", "split"), flow("split", "a"), flow("split", "b"), flow("a", "merge"),
        flow("b", "merge"), flow("merge", "review"), flow("review", "count"), flow("count", "again"),
        flow("again", "split", "redo == True"), flow("again", "end", "redo == False")])
    (tmp_path / "loop.layerflow.yaml").write_text("merge:\n  humanConfirm: {timeout: 600}\n", encoding="utf-8")
    return path


def test_a_misspelt_key_of_a_join_on_a_loop_that_waits_is_refused_with_the_key_it_meant(
        cli: Any, tmp_path: Path) -> None:
    """A join on no loop that asked refuses ``merge/levle`` (exit 2, did you mean); one on a loop took
    it as a question a later round might ask and left the instance waiting (exit 3) with a notice.
    While the join waits, this round asks nothing more: a key close to one it asks now is a typo."""
    started = run_json(cli, "run", str(_loop(tmp_path)), code=3)
    assert [w["id"] for w in started["waiting_for"]] == ["merge/level"], started["waiting_for"]
    typo = run_json(cli, "resume", started["instance_id"], "--answer", "merge/levle=a1", code=2)
    assert typo["error"]["kind"] == "invalid_answer", typo["error"]
    message = typo["error"]["message"]
    assert "'merge/levle'" in message and "did you mean 'merge/level'" in message, message
    # the right key still passes, and a key of no question near it stays a possible later question
    run_json(cli, "resume", started["instance_id"], "--answer", "merge/other=1", "--answer", "merge/level=a1", code=3)


# ----------------------------------------------------------------------------- 5. side paths


def test_a_side_paths_clash_says_on_the_tape_which_value_was_kept_and_why(tmp_path: Path) -> None:
    """The ``side_conflict`` note listed the keys with both values, but not whose each was nor why the
    flow's stayed: a reader of the tape alone (``layerflow tape --kind side_conflict``) could not tell."""
    from test_conformance import votes_clash

    instance = votes_clash(tmp_path)
    assert instance.status == "completed", instance.error
    [note] = [e.data for e in instance.main.tape if e.data.get("note") == "side_conflict"]
    [key] = note["keys"]
    assert (key["key"], key["kept"], key["dropped"]) == ("outcome", "counted 2", "reminded")
    assert (key["kept_from"], key["dropped_from"]) == ("main", "nudge"), key
    for part in ("boundary path 'nudge'", "'main'", "stays", "never overwrites the flow"):
        assert part in note["reason"], (part, note["reason"])
