"""Joins after compressions inside the branches, reduced from the generative test
(test_random_governed's compression test): what a join reads for a key a branch's compression
folded. A fold is no decision about a value: a key the branch left alone (the split's value, or
the value its ``contextInject`` gave it) is unchanged for the join however it was compressed."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from context_layers import Layer
from engine import Engine, load_process

from engine_helpers import flow, script_task, write_elements

FOLD_EVERY_TIME = "{compressMessageThreshold: 2, preserveKeys: [x]}"


def run(tmp_path: Path, elements: list[str], config: str) -> Any:
    path = write_elements(tmp_path, "cj", ['<bpmn:startEvent id="start"/>', *elements])
    (tmp_path / "cj.layerflow.yaml").write_text(config, encoding="utf-8")
    engine = Engine(store="memory://")
    return engine.run(engine.start(load_process(path)))


def data(instance: Any) -> dict[str, Any]:
    ctx = instance.main
    return {k: v for layer in (Layer.WORKING, Layer.HISTORY) for k, v in ctx.layer(layer).items()
            if not k.startswith(("_", "activity:", "compaction:", "summary:"))}


def test_an_injected_key_the_branch_left_alone_and_folded_keeps_the_split_value(tmp_path: Path) -> None:
    # b's compression folds k0 holding b's injected 1: the process's k0 (2) was never b's to
    # remove; before, the join took the fold as b's change, and `after` found no k0
    instance = run(tmp_path, [
        script_task("init", "k0 = 2"), flow("start", "init"),
        '<bpmn:parallelGateway id="split"/>', flow("init", "split"), '<bpmn:parallelGateway id="join"/>',
        script_task("a", "pass"), flow("split", "a"), flow("a", "join"),
        script_task("b", "pass"), flow("split", "b"), flow("b", "join"),
        script_task("after", "seen = k0"), flow("join", "after"),
        '<bpmn:endEvent id="end"/>', flow("after", "end"),
    ], "split: {branches: [{id: b, contextInject: {k0: 1}}]}\nb: {compressMessageThreshold: 2}\n")
    assert instance.status == "completed", instance.error
    assert data(instance)["k0"] == 2 and data(instance)["seen"] == 2
    join = next(e for e in instance.main.tape if e.data.get("note") == "join")
    assert "k0" not in (join.data.get("folded") or ())


def test_an_injected_key_whose_fold_the_join_undoes_is_no_change(tmp_path: Path) -> None:
    # both branches of p8 fold the same base entries; the join keeps t10's compaction record and
    # gives t12 back the entries its own record folded, k0 = 1 among them: the value p8 injected,
    # which t12 left alone. Before, the join read it as t12's change and asked a person to
    # choose between t10's 0 and t12's 1.
    fold = FOLD_EVERY_TIME
    instance = run(tmp_path, [
        script_task("init", "x = 1"), flow("start", "init"),
        '<bpmn:parallelGateway id="p1"/>', flow("init", "p1"), '<bpmn:parallelGateway id="j2"/>',
        script_task("t3", "pass"), flow("p1", "t3"), flow("t3", "j2"),
        script_task("t7", "pass"), flow("p1", "t7"),
        '<bpmn:parallelGateway id="p8"/>', flow("t7", "p8"), '<bpmn:parallelGateway id="j9"/>',
        script_task("t10", "pass"), flow("p8", "t10"), script_task("t11", "k0 = 0"), flow("t10", "t11"),
        flow("t11", "j9"),
        script_task("t12", "pass"), flow("p8", "t12"), flow("t12", "j9"),
        script_task("t13", "seen = k0"), flow("j9", "t13"), flow("t13", "j2"),
        '<bpmn:endEvent id="end"/>', flow("j2", "end"),
    ], "p1: {branches: [{id: t7, contextInject: {k0: 2}}]}\n"
       "p8: {branches: [{id: t12, contextInject: {k0: 1}}]}\n"
       + "".join(f"{t}: {fold}\n" for t in ("t3", "t7", "t10", "t11", "t12")))
    assert instance.status == "completed", (instance.error, instance.waiting_for)
    (j9,) = [e for ctx in instance.contexts.values() for e in ctx.tape
             if e.data.get("note") == "join" and e.data["gateway_id"] == "j9"]
    assert j9.data["conflicts"] == 0
    seen = [v for e in instance.main.tape if e.data.get("note") == "join" for _, k, v in e.changes if k == "seen"]
    assert seen == [0]


@pytest.mark.parametrize("init", ["pass", "k0 = 0"])
def test_a_value_a_branch_wrote_and_then_folded_still_meets_the_other_branchs_value(tmp_path: Path, init: str) -> None:
    # a writes k0 = 1, then its compressions fold it into a summary; b writes k0 = 2. a's
    # decision stands: a conflict, as without the compression. Before, the join read a's k0 as
    # the split's and took b's 2 silently beside a summary saying "k0: 1".
    elements = [
        script_task("init", init), flow("start", "init"),
        '<bpmn:parallelGateway id="split"/>', flow("init", "split"), '<bpmn:parallelGateway id="join"/>',
        script_task("a", "k0 = 1"), flow("split", "a"), script_task("a2", "pass"), flow("a", "a2"),
        script_task("a3", "pass"), flow("a2", "a3"), flow("a3", "join"),
        script_task("b", "k0 = 2"), flow("split", "b"), flow("b", "join"),
        '<bpmn:endEvent id="end"/>', flow("join", "end"),
    ]
    config = "".join(f"{t}: {{compressMessageThreshold: 2}}\n" for t in ("a", "a2", "a3"))
    instance = run(tmp_path, elements, config)
    assert [w["id"] for w in instance.waiting_for] == ["join/k0"]
    (branch_a,) = [ctx for name, ctx in instance.contexts.items() if "/a@" in name]
    assert "k0" not in branch_a.layer(Layer.HISTORY)  # folded, as the test means
    engine = Engine(store="memory://")
    done = engine.run(engine.start(load_process(tmp_path / "cj.bpmn")), answers={"confirmations": {"join/k0": 1}})
    assert done.status == "completed", done.error
    assert data(done)["k0"] == 1
    (conflict,) = done.conflicts
    assert conflict["key"] == "k0" and conflict["values"] == {"a": 1, "b": 2}


def test_a_key_folded_before_the_split_keeps_its_value_for_the_join(tmp_path: Path) -> None:
    # k0 (2), not preserved, was folded into a compaction record before the split; a writes the
    # value it had, b a new one. A fold is no decision about a value: a did not change k0, b did,
    # so b's 3 is taken, as without the compressions. Before, the join's base lacked k0, both
    # branches read as adding it, and a person was asked to choose.
    instance = run(tmp_path, [
        script_task("init", "k0 = 2"), flow("start", "init"),
        script_task("c1", "pass"), flow("init", "c1"), script_task("c2", "pass"), flow("c1", "c2"),
        '<bpmn:parallelGateway id="split"/>', flow("c2", "split"), '<bpmn:parallelGateway id="join"/>',
        script_task("a", "k0 = 2"), flow("split", "a"), flow("a", "join"),
        script_task("b", "k0 = 3"), flow("split", "b"), flow("b", "join"),
        '<bpmn:endEvent id="end"/>', flow("join", "end"),
    ], "c1: {compressMessageThreshold: 2}\nc2: {compressMessageThreshold: 2}\n")
    split = next(e for e in instance.main.tape if e.data.get("note") == "split")
    assert "k0" not in instance.main.get_snapshot(split.data["snapshot_id"]).layer(Layer.HISTORY)  # folded
    assert instance.status == "completed", (instance.error, instance.waiting_for)
    assert instance.conflicts == [] and data(instance)["k0"] == 3


def test_a_reducer_key_folded_before_the_split_adds_the_branches_deltas_to_its_value(tmp_path: Path) -> None:
    # r (3) was folded before the split; a sum join adds a's +1 and b's +2 to it: 6, as without
    # the compressions (from no base, the branches' values would add up to 9)
    instance = run(tmp_path, [
        script_task("init", "r = 3"), flow("start", "init"),
        script_task("c1", "pass"), flow("init", "c1"), script_task("c2", "pass"), flow("c1", "c2"),
        '<bpmn:parallelGateway id="split"/>', flow("c2", "split"), '<bpmn:parallelGateway id="join"/>',
        script_task("a", "r = 4"), flow("split", "a"), flow("a", "join"),
        script_task("b", "r = 5"), flow("split", "b"), flow("b", "join"),
        '<bpmn:endEvent id="end"/>', flow("join", "end"),
    ], "c1: {compressMessageThreshold: 2}\nc2: {compressMessageThreshold: 2}\njoin: {reducers: {r: sum}}\n")
    assert instance.status == "completed", (instance.error, instance.waiting_for)
    assert data(instance)["r"] == 6


def test_a_conflict_on_a_key_folded_before_the_split_shows_the_value_it_had(tmp_path: Path) -> None:
    # the person asked sees "was 2", the value the fold summarised, not an absent key
    instance = run(tmp_path, [
        script_task("init", "k0 = 2"), flow("start", "init"),
        script_task("c1", "pass"), flow("init", "c1"), script_task("c2", "pass"), flow("c1", "c2"),
        '<bpmn:parallelGateway id="split"/>', flow("c2", "split"), '<bpmn:parallelGateway id="join"/>',
        script_task("a", "k0 = 1"), flow("split", "a"), flow("a", "join"),
        script_task("b", "k0 = 3"), flow("split", "b"), flow("b", "join"),
        '<bpmn:endEvent id="end"/>', flow("join", "end"),
    ], "c1: {compressMessageThreshold: 2}\nc2: {compressMessageThreshold: 2}\n")
    assert [w["id"] for w in instance.waiting_for] == ["join/k0"]
    (conflict,) = instance.conflicts
    assert conflict["values"] == {"a": 1, "b": 3} and conflict["base_value"] == 2
    assert "(was 2)" in instance.confirmations[0]["message"]


def test_a_key_a_branch_inherited_and_folded_before_a_nested_split_keeps_its_value(tmp_path: Path) -> None:
    # t4's compression folds k1 (0), which t4's branch inherited from the split p1; t8 then
    # writes 0 again and t9 writes 1 in the nested split: t9's 1 is taken, no question asked (the
    # value before the fold is on the tape of the context t4's branch was forked from)
    fold = FOLD_EVERY_TIME
    instance = run(tmp_path, [
        script_task("init", "x = 0\nk1 = 0"), flow("start", "init"),
        '<bpmn:parallelGateway id="p1"/>', flow("init", "p1"), '<bpmn:parallelGateway id="j2"/>',
        script_task("t3", "pass"), flow("p1", "t3"), flow("t3", "j2"),
        script_task("t4", "pass"), flow("p1", "t4"),
        '<bpmn:parallelGateway id="p6"/>', flow("t4", "p6"), '<bpmn:parallelGateway id="j7"/>',
        script_task("t8", "k1 = 0"), flow("p6", "t8"), flow("t8", "j7"),
        script_task("t9", "k1 = 1"), flow("p6", "t9"), flow("t9", "j7"),
        flow("j7", "j2"), '<bpmn:endEvent id="end"/>', flow("j2", "end"),
    ], "".join(f"{t}: {fold}\n" for t in ("t3", "t4", "t8", "t9")))
    assert instance.status == "completed", (instance.error, instance.waiting_for)
    assert instance.conflicts == []
    (j7,) = [e for ctx in instance.contexts.values() for e in ctx.tape
             if e.data.get("note") == "join" and e.data["gateway_id"] == "j7"]
    assert [v for _, k, v in j7.changes if k == "k1"] == [1]


def test_a_value_a_nested_join_took_as_a_fold_still_meets_the_other_branchs_value(tmp_path: Path) -> None:
    # t5 writes k0 = 0 and t6's compression folds it; the nested join j4 takes the fold (nobody
    # else wrote k0) and names the value in its event (folded_values). At j2 that value meets
    # t12's 1: a conflict, as without the compressions. Before, p3's branch read as never having
    # written k0 and t12's 1 was taken silently.
    fold = FOLD_EVERY_TIME
    instance = run(tmp_path, [
        script_task("init", "x = 0\nr_num = 0"), flow("start", "init"),
        '<bpmn:parallelGateway id="p1"/>', flow("init", "p1"), '<bpmn:parallelGateway id="j2"/>',
        '<bpmn:parallelGateway id="p3"/>', flow("p1", "p3"), '<bpmn:parallelGateway id="j4"/>',
        script_task("t5", "k0 = 0"), flow("p3", "t5"), script_task("t6", "pass"), flow("t5", "t6"), flow("t6", "j4"),
        script_task("t7", "pass"), flow("p3", "t7"), flow("t7", "j4"), flow("j4", "j2"),
        script_task("t12", "k0 = 1"), flow("p1", "t12"), flow("t12", "j2"),
        '<bpmn:endEvent id="end"/>', flow("j2", "end"),
    ], "".join(f"{t}: {fold}\n" for t in ("t5", "t6", "t7", "t12")))
    (j4,) = [e for ctx in instance.contexts.values() for e in ctx.tape
             if e.data.get("note") == "join" and e.data["gateway_id"] == "j4"]
    assert j4.data["folded_values"]["k0"] == 0
    assert [w["id"] for w in instance.waiting_for] == ["j2/k0"]
    (conflict,) = instance.conflicts
    assert conflict["values"] == {"p3": 0, "t12": 1}


def test_a_value_an_exclusive_branch_injected_and_a_nested_join_took_as_a_fold_meets_the_other_branchs(
        tmp_path: Path) -> None:
    # x3's taken branch injects k0 = 0 (the process's value from there on, in WORKING at p5);
    # t7 moves it into HISTORY and t8's compression folds it; j6 (t9 was not taken) takes the
    # fold. Before, j6 deleted k0 from WORKING without naming its value and j2 took t15's 1 silently
    fold = FOLD_EVERY_TIME
    instance = run(tmp_path, [
        script_task("init", "x = 0\nr_num = 0"), flow("start", "init"),
        '<bpmn:parallelGateway id="p1"/>', flow("init", "p1"), '<bpmn:parallelGateway id="j2"/>',
        '<bpmn:exclusiveGateway id="x3" default="x3_d"/>', flow("p1", "x3"), '<bpmn:exclusiveGateway id="xm4"/>',
        '<bpmn:inclusiveGateway id="p5"/>', flow("x3", "p5", "x % 2 == 0"), '<bpmn:inclusiveGateway id="j6"/>',
        script_task("t7", "pass"), flow("p5", "t7", "True"), script_task("t8", "pass"), flow("t7", "t8"),
        flow("t8", "j6"), script_task("t9", "pass"), flow("p5", "t9", "x % 2 != 0"), flow("t9", "j6"),
        flow("j6", "xm4"), script_task("t10", "pass"),
        '<bpmn:sequenceFlow id="x3_d" sourceRef="x3" targetRef="t10"/>', flow("t10", "xm4"), flow("xm4", "j2"),
        script_task("t15", "k0 = 1"), flow("p1", "t15"), flow("t15", "j2"),
        '<bpmn:endEvent id="end"/>', flow("j2", "end"),
    ], "x3: {branches: [{id: p5, contextInject: {k0: 0}}]}\n"
       + "".join(f"{t}: {fold}\n" for t in ("t7", "t8", "t9", "t10", "t15")))
    assert [w["id"] for w in instance.waiting_for] == ["j2/k0"]
    (conflict,) = instance.conflicts
    assert conflict["values"] == {"x3": 0, "t15": 1}


def test_an_injected_key_a_nested_join_took_as_a_fold_is_left_alone(tmp_path: Path) -> None:
    # p1 injects k0 = 1 into p3's branch; inside it, the branches of p3 move k0 into HISTORY and
    # fold it, and j4 names the fold's value (1, the injected one). p3's branch left k0 as
    # injected: t9's 0 is taken, no conflict (before: a conflict {p3: 1, t9: 0})
    fold = FOLD_EVERY_TIME
    instance = run(tmp_path, [
        script_task("init", "x = 0\nr_num = 0"), flow("start", "init"),
        '<bpmn:parallelGateway id="p1"/>', flow("init", "p1"), '<bpmn:parallelGateway id="j2"/>',
        '<bpmn:parallelGateway id="p3"/>', flow("p1", "p3"), '<bpmn:parallelGateway id="j4"/>',
        script_task("t5", "pass"), flow("p3", "t5"), flow("t5", "j4"),
        script_task("t7", "pass"), flow("p3", "t7"), script_task("t8", "pass"), flow("t7", "t8"), flow("t8", "j4"),
        flow("j4", "j2"), script_task("t9", "k0 = 0"), flow("p1", "t9"), flow("t9", "j2"),
        script_task("after", "seen = k0"), flow("j2", "after"), '<bpmn:endEvent id="end"/>', flow("after", "end"),
    ], "p1: {branches: [{id: p3, contextInject: {k0: 1}}]}\n"
       + "".join(f"{t}: {fold}\n" for t in ("t5", "t7", "t8", "t9")))
    assert instance.status == "completed", (instance.error, instance.waiting_for)
    assert instance.conflicts == [] and data(instance)["seen"] == 0


def test_a_key_of_the_splits_working_a_branch_moved_and_folded_is_left_alone(tmp_path: Path) -> None:
    # p1 injects k0 = 0 into p3's branch, so k0 is in WORKING at the nested split p3. t5 moves it
    # into HISTORY as it was and t6's compression folds it; t7 writes 1. t5's branch left k0
    # alone: t7's 1 is taken, no question asked (before: a conflict {t5: 0, t7: 1} at j4)
    fold = FOLD_EVERY_TIME
    instance = run(tmp_path, [
        script_task("init", "x = 0"), flow("start", "init"),
        '<bpmn:parallelGateway id="p1"/>', flow("init", "p1"), '<bpmn:parallelGateway id="j2"/>',
        script_task("t0", "pass"), flow("p1", "t0"), flow("t0", "j2"),
        '<bpmn:parallelGateway id="p3"/>', flow("p1", "p3"), '<bpmn:parallelGateway id="j4"/>',
        script_task("t5", "pass"), flow("p3", "t5"), script_task("t6", "pass"), flow("t5", "t6"), flow("t6", "j4"),
        script_task("t7", "k0 = 1"), flow("p3", "t7"), flow("t7", "j4"), flow("j4", "j2"),
        script_task("after", "seen = k0"), flow("j2", "after"), '<bpmn:endEvent id="end"/>', flow("after", "end"),
    ], "p1: {branches: [{id: p3, contextInject: {k0: 0}}]}\n"
       + "".join(f"{t}: {fold}\n" for t in ("t0", "t5", "t6", "t7")))
    assert instance.status == "completed", (instance.error, instance.waiting_for)
    assert instance.conflicts == [] and data(instance)["seen"] == 1


def test_a_value_a_nested_join_took_over_an_injected_one_meets_the_other_branchs_value(tmp_path: Path) -> None:
    # p1 injects k0 = 1 into p3's branch; there t6 writes 0 and the nested join j4 takes it (t5 left
    # k0 alone), then t7's compression folds it. p3's branch decided 0, t8 wrote 1: a conflict at
    # j2, as without the compressions (before: none, t8's 1 was taken)
    fold = FOLD_EVERY_TIME
    instance = run(tmp_path, [
        script_task("init", "x = 0"), flow("start", "init"),
        '<bpmn:parallelGateway id="p1"/>', flow("init", "p1"), '<bpmn:parallelGateway id="j2"/>',
        script_task("t8", "k0 = 1"), flow("p1", "t8"), flow("t8", "j2"),
        '<bpmn:parallelGateway id="p3"/>', flow("p1", "p3"), '<bpmn:parallelGateway id="j4"/>',
        script_task("t5", "pass"), flow("p3", "t5"), flow("t5", "j4"),
        script_task("t6", "k0 = 0"), flow("p3", "t6"), flow("t6", "j4"),
        script_task("t7", "pass"), flow("j4", "t7"), flow("t7", "j2"),
        '<bpmn:endEvent id="end"/>', flow("j2", "end"),
    ], "p1: {branches: [{id: p3, contextInject: {k0: 1}}]}\n"
       + "".join(f"{t}: {fold}\n" for t in ("t5", "t6", "t7", "t8")))
    assert [w["id"] for w in instance.waiting_for] == ["j2/k0"], (instance.status, instance.error)
    (conflict,) = instance.conflicts
    assert conflict["values"] == {"p3": 0, "t8": 1}


def test_a_value_written_again_after_a_fold_comes_back_as_the_later_fold_found_it(tmp_path: Path) -> None:
    # in t9's branch t9's compression folds k0 (0, the split's) into compaction:2, x10's taken
    # branch injects k0 = 1, and t13's compression folds compaction:2 and k0 = 1 into compaction:3.
    # The join drops compaction:3 (p5's branch summarises the same base entries) and gives t9's
    # branch back what it folded: k0 = 1, the value it decided, which meets p5's 2. Before, the
    # older fold's 0 came back, t9's branch read as never changing k0 and p5's 2 was taken.
    fold = FOLD_EVERY_TIME
    instance = run(tmp_path, [
        script_task("init", "x = 0\nk0 = 0"), flow("start", "init"),
        '<bpmn:parallelGateway id="p3"/>', flow("init", "p3"), '<bpmn:parallelGateway id="j4"/>',
        '<bpmn:parallelGateway id="p5"/>', flow("p3", "p5"), '<bpmn:parallelGateway id="j6"/>',
        script_task("t7", "pass"), flow("p5", "t7"), flow("t7", "j6"),
        script_task("t8", "k0 = 2"), flow("p5", "t8"), flow("t8", "j6"), flow("j6", "j4"),
        script_task("t9", "pass"), flow("p3", "t9"),
        '<bpmn:exclusiveGateway id="x10" default="x10_d"/>', flow("t9", "x10"), '<bpmn:exclusiveGateway id="xm11"/>',
        script_task("t12", "pass"), flow("x10", "t12", "x % 2 == 0"), script_task("t13", "pass"), flow("t12", "t13"),
        script_task("t14", "pass"), '<bpmn:sequenceFlow id="x10_d" sourceRef="x10" targetRef="t14"/>',
        flow("t13", "xm11"), flow("t14", "xm11"), flow("xm11", "j4"),
        '<bpmn:endEvent id="end"/>', flow("j4", "end"),
    ], "x10: {branches: [{id: t12, contextInject: {k0: 1}}]}\n"
       + "".join(f"{t}: {fold}\n" for t in ("t7", "t8", "t9", "t12", "t13", "t14")))
    j4 = [e for e in instance.main.tape if e.data.get("note") == "join" and e.data["gateway_id"] == "j4"]
    assert [w["id"] for w in instance.waiting_for] == ["j4/k0"], (instance.status, j4)
    (conflict,) = instance.conflicts
    assert conflict["values"] == {"p5": 2, "t9": 1} and conflict["base_value"] == 0


def test_a_value_decided_after_a_dropped_fold_comes_back_as_decided_last(tmp_path: Path) -> None:
    # p1 injects i0 = 0 into s11's branch; t13's compression folds it into compaction:2. Inside
    # p14, x17's taken branch injects i0 = 1, which the nested join j22 and then j15 take as folds
    # (folded_values). At j2 the join drops compaction:2 (x7's branch summarises the same base
    # entries) and gives s11's branch back what it folded: i0 as s11 last decided it, 1, which meets
    # x7's 0. Before, the record's 0 came back, the injected value: s11 read as leaving i0 alone
    # and x7's 0 was taken silently.
    fold = "{compressMessageThreshold: 2, preserveKeys: [x]}"

    def xor(g: str, m: str, entry: str, then: str, orelse: str) -> list[str]:
        return [f'<bpmn:exclusiveGateway id="{g}" default="{g}_d"/>', flow(entry, g),
                f'<bpmn:exclusiveGateway id="{m}"/>', script_task(then, "pass"), flow(g, then, "x % 2 == 0"),
                script_task(orelse, "pass"), f'<bpmn:sequenceFlow id="{g}_d" sourceRef="{g}" targetRef="{orelse}"/>',
                flow(then, m), flow(orelse, m)]
    instance = run(tmp_path, [
        script_task("init", "x = 0\nr_num = 0"), flow("start", "init"),
        '<bpmn:parallelGateway id="p1"/>', flow("init", "p1"), '<bpmn:parallelGateway id="j2"/>',
        *xor("x7", "xm8", "p1", "t9", "t10"), flow("xm8", "j2"),
        '<bpmn:subProcess id="s11"><bpmn:startEvent id="s11_start"/>' + script_task("t12", "pass")
        + flow("s11_start", "t12") + script_task("t13", "pass") + flow("t12", "t13")
        + '<bpmn:endEvent id="s11_end"/>' + flow("t13", "s11_end") + '</bpmn:subProcess>', flow("p1", "s11"),
        '<bpmn:parallelGateway id="p14"/>', flow("s11", "p14"), '<bpmn:parallelGateway id="j15"/>',
        script_task("t16", "pass"), flow("p14", "t16"), flow("t16", "j15"),
        *xor("x17", "xm18", "p14", "t19", "t20"),
        '<bpmn:parallelGateway id="p21"/>', flow("xm18", "p21"), '<bpmn:parallelGateway id="j22"/>',
        script_task("t23", "pass"), flow("p21", "t23"), flow("t23", "j22"),
        script_task("t24", "pass"), flow("p21", "t24"), flow("t24", "j22"), flow("j22", "j15"),
        flow("j15", "j2"), '<bpmn:endEvent id="end"/>', flow("j2", "end"),
    ], "p1: {branches: [{id: s11, contextInject: {i0: 0}}]}\nx7: {branches: [{id: t9, contextInject: {i0: 0}}]}\n"
       "x17: {branches: [{id: t19, contextInject: {i0: 1}}]}\n"
       + "".join(f"{t}: {fold}\n" for t in ("t9", "t10", "t12", "t13", "t16", "t19", "t20", "t23", "t24")))
    assert [w["id"] for w in instance.waiting_for] == ["j2/i0"], (instance.status, instance.error)
    (conflict,) = instance.conflicts
    assert conflict["values"] == {"x7": 0, "s11": 1}


def test_a_nested_join_names_the_value_a_branch_decided_not_the_one_another_only_folded(tmp_path: Path) -> None:
    # in p8's branch, t10 only compresses r_num (0, the split's); j12 takes t14's 1 and t15's
    # compression folds it. j9 takes the fold and names the value p11's branch decided, 1, though
    # t10 comes first; at j2 that 1 meets t7's -1. Before, j9 named t10's 0 (the split's value),
    # p8's branch read as leaving r_num alone and t7's -1 was taken silently.
    fold = "{compressMessageThreshold: 2, preserveKeys: [x]}"
    instance = run(tmp_path, [
        script_task("init", "x = 0\nr_num = 0"), flow("start", "init"),
        '<bpmn:parallelGateway id="p1"/>', flow("init", "p1"), '<bpmn:parallelGateway id="j2"/>',
        script_task("t7", "r_num = -1"), flow("p1", "t7"), flow("t7", "j2"),
        '<bpmn:parallelGateway id="p8"/>', flow("p1", "p8"), '<bpmn:parallelGateway id="j9"/>',
        script_task("t10", "pass"), flow("p8", "t10"), flow("t10", "j9"),
        '<bpmn:parallelGateway id="p11"/>', flow("p8", "p11"), '<bpmn:parallelGateway id="j12"/>',
        script_task("t13", "pass"), flow("p11", "t13"), flow("t13", "j12"),
        script_task("t14", "r_num = 1"), flow("p11", "t14"), flow("t14", "j12"),
        script_task("t15", "pass"), flow("j12", "t15"), flow("t15", "j9"),
        flow("j9", "j2"), '<bpmn:endEvent id="end"/>', flow("j2", "end"),
    ], "".join(f"{t}: {fold}\n" for t in ("t7", "t10", "t13", "t14", "t15")))
    (j9,) = [e for ctx in instance.contexts.values() for e in ctx.tape
             if e.data.get("note") == "join" and e.data["gateway_id"] == "j9"]
    assert j9.data["folded_values"] == {"r_num": 1}
    assert [w["id"] for w in instance.waiting_for] == ["j2/r_num"], (instance.status, instance.error)
    (conflict,) = instance.conflicts
    assert conflict["values"] == {"t7": -1, "p8": 1}


def test_a_value_a_branch_folded_meets_an_exclusive_choices_value_still_in_working(tmp_path: Path) -> None:
    # x3's taken branch injects i0 = 1, t5 moves it into HISTORY and t6's compression folds it;
    # x8's taken branch injects i0 = 0, and after j11 it is still in WORKING (both branches of p10
    # left it alone). x3 decided 1, x8 decided 0: a conflict at j2, as without the compressions.
    # Before, only HISTORY changes made a key contested: x3's fold read as no change and x8's 0
    # was taken silently.
    fold = "{compressMessageThreshold: 2, preserveKeys: [r_list, x]}"
    instance = run(tmp_path, [
        script_task("init", "x = 0\nr_num = 0\nr_list = []"), flow("start", "init"),
        '<bpmn:parallelGateway id="p1"/>', flow("init", "p1"), '<bpmn:parallelGateway id="j2"/>',
        '<bpmn:exclusiveGateway id="x3" default="x3_d"/>', flow("p1", "x3"), '<bpmn:exclusiveGateway id="xm4"/>',
        script_task("t5", "pass"), flow("x3", "t5", "x % 2 == 0"), script_task("t6", "pass"), flow("t5", "t6"),
        script_task("t7", "pass"), '<bpmn:sequenceFlow id="x3_d" sourceRef="x3" targetRef="t7"/>',
        flow("t6", "xm4"), flow("t7", "xm4"), flow("xm4", "j2"),
        '<bpmn:exclusiveGateway id="x8" default="x8_d"/>', flow("p1", "x8"), '<bpmn:exclusiveGateway id="xm9"/>',
        '<bpmn:parallelGateway id="p10"/>', flow("x8", "p10", "x % 2 == 0"), '<bpmn:parallelGateway id="j11"/>',
        script_task("t12", "pass"), flow("p10", "t12"), script_task("t13", "pass"), flow("t12", "t13"), flow("t13", "j11"),
        script_task("t14", "pass"), flow("p10", "t14"), flow("t14", "j11"),
        script_task("t15", "pass"), '<bpmn:sequenceFlow id="x8_d" sourceRef="x8" targetRef="t15"/>',
        flow("j11", "xm9"), flow("t15", "xm9"), flow("xm9", "j2"),
        '<bpmn:endEvent id="end"/>', flow("j2", "end"),
    ], "p10: {branches: [{id: t12, contextInject: {i0: 0}}]}\nx3: {branches: [{id: t5, contextInject: {i0: 1}}]}\n"
       "x8: {branches: [{id: p10, contextInject: {i0: 0}}]}\n"
       + "".join(f"{t}: {fold}\n" for t in ("t5", "t6", "t7", "t12", "t13", "t14", "t15")))
    assert [w["id"] for w in instance.waiting_for] == ["j2/i0"], (instance.status, instance.error)
    (conflict,) = instance.conflicts
    assert conflict["values"] == {"x3": 1, "x8": 0}


def test_a_reducer_reads_what_each_branch_decided_not_its_folds(tmp_path: Path) -> None:
    # j4 reduces r_num with min: t5's branch left it 0 (and its compression folded it), p6's
    # decided 2 (j7 took t9's 2, t10's compression folded it): min is 0, no change, and t15's 1
    # is taken at j2. Before, the reducer saw only p6's fold, j4 took it as a fold naming 2, and
    # j2 asked a person to choose between 2 and 1.
    fold = "{compressMessageThreshold: 2, preserveKeys: [r_list, x]}"
    instance = run(tmp_path, [
        script_task("init", "x = 1\nr_num = 0\nr_list = []"), flow("start", "init"),
        '<bpmn:parallelGateway id="p1"/>', flow("init", "p1"), '<bpmn:parallelGateway id="j2"/>',
        '<bpmn:parallelGateway id="p3"/>', flow("p1", "p3"), '<bpmn:parallelGateway id="j4"/>',
        script_task("t5", "pass"), flow("p3", "t5"), flow("t5", "j4"),
        '<bpmn:parallelGateway id="p6"/>', flow("p3", "p6"), '<bpmn:parallelGateway id="j7"/>',
        script_task("t8", "pass"), flow("p6", "t8"), flow("t8", "j7"),
        script_task("t9", "r_num = 2"), flow("p6", "t9"), flow("t9", "j7"),
        script_task("t10", "pass"), flow("j7", "t10"), flow("t10", "j4"), flow("j4", "j2"),
        script_task("t15", "r_num = 1"), flow("p1", "t15"), flow("t15", "j2"),
        script_task("after", "seen = r_num"), flow("j2", "after"), '<bpmn:endEvent id="end"/>', flow("after", "end"),
    ], "j4: {reducers: {r_num: min}}\n" + "".join(f"{t}: {fold}\n" for t in ("t5", "t8", "t9", "t10", "t15")))
    assert instance.status == "completed", (instance.error, instance.waiting_for)
    assert instance.conflicts == [] and data(instance)["seen"] == 1


def test_a_join_brings_a_branchs_compaction_with_what_its_rules_kept(tmp_path: Path) -> None:
    # a fetches a source; after a2, a's compression reduces it to the extract_keys paths and folds
    # it, the reduced lines carried verbatim in the record's `kept`. The join takes the record as
    # it is, and names the value a decided (the whole result) among its folded_values.
    fetch = "src_1 = {'status': 'ok', 'data': {'id': 'SRC-1', 'body': 'lorem ipsum dolor sit amet ' * 40}}"
    instance = run(tmp_path, [
        script_task("init", "pass"), flow("start", "init"),
        '<bpmn:parallelGateway id="split"/>', flow("init", "split"), '<bpmn:parallelGateway id="join"/>',
        script_task("a", fetch), flow("split", "a"), script_task("a2", "checked = 'yes' * 30"), flow("a", "a2"),
        flow("a2", "join"),
        script_task("b", "pass"), flow("split", "b"), flow("b", "join"),
        '<bpmn:endEvent id="end"/>', flow("join", "end"),
    ], "a2:\n  compressTokenThreshold: 150\n  preserveKeys: [checked]\n"
       "  compressRules: [{pattern: src, action: extract_keys, extractKeys: [status, data.id]}]\n")
    assert instance.status == "completed", instance.error
    history = instance.main.layer(Layer.HISTORY)
    (record,) = [v for k, v in history.items() if k.startswith("compaction:")]
    assert record["kept"] == ["src_1: data.id: SRC-1; status: ok"] and "src_1" not in history
    join = next(e for e in instance.main.tape if e.data.get("note") == "join")
    assert join.data["folded_values"]["src_1"]["data"]["body"].startswith("lorem")
