"""Multi-instance activities, standard loops and timers under layerflow's context.

A multi-instance task is one activity: its instances run inside it, each with its
input item (in EPHEMERAL and as a script variable) and its output item scoped to the
instance; the output collection is written to the activity's WORKING, so it moves to
HISTORY when the activity completes. SpiffWorkflow's bookkeeping stays in ``task.data``
of the multi-instance task and its instances, never in the context.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

from context_layers import Layer
from engine import Engine, load_process
from engine.handlers import ActivityContext

from engine_helpers import EXAMPLES, BPMN_HEAD, run_json, variables
from engine_helpers import cli_in_a_tmp_store  # noqa: F401 - the "cli" fixture

_MI = """<bpmn:scriptTask id="{tid}">
      <bpmn:multiInstanceLoopCharacteristics isSequential="{seq}">
        {source}
        <bpmn:loopDataOutputRef>{out}</bpmn:loopDataOutputRef>
        <bpmn:inputDataItem id="item" name="item"/>
        <bpmn:outputDataItem id="res" name="res"/>{extra}
      </bpmn:multiInstanceLoopCharacteristics>
      <bpmn:script>{script}</bpmn:script>
    </bpmn:scriptTask>"""


def _process(tmp_path: Path, pid: str, elements: list[str], flows: list[tuple[str, str]]) -> Path:
    body = '    <bpmn:startEvent id="start"/>\n' + "".join(f"    {e}\n" for e in elements) + '    <bpmn:endEvent id="end"/>\n'
    body += "".join(f'    <bpmn:sequenceFlow id="f{i}" sourceRef="{a}" targetRef="{b}"/>\n' for i, (a, b) in enumerate(flows))
    path = tmp_path / f"{pid}.bpmn"
    path.write_text(BPMN_HEAD.format(pid=pid) + body + "  </bpmn:process>\n</bpmn:definitions>\n", encoding="utf-8")
    return path


def _mi_process(tmp_path: Path, *, seq: bool = False, script: str = "res = item * 10", source: str | None = None,
                extra: str = "", out: str = "results", task: str | None = None) -> Path:
    source = source or "<bpmn:loopDataInputRef>items</bpmn:loopDataInputRef>"
    element = task or _MI.format(tid="each", seq=str(seq).lower(), source=source, out=out, extra=extra,
                                 script=script.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;"))
    return _process(tmp_path, "mi", [element], [("start", "each"), ("each", "end")])


def _run(path: Path, data: dict[str, Any] | None = None, engine: Engine | None = None, **kw: Any) -> Any:
    engine = engine or Engine()
    return engine.run(engine.start(load_process(path), data), **kw)


# ----------------------------------------------------------------- multi-instance


@pytest.mark.parametrize("seq", [False, True], ids=["parallel", "sequential"])
def test_the_output_collection_lands_in_history_as_one_activity(tmp_path: Path, seq: bool) -> None:
    inst = _run(_mi_process(tmp_path, seq=seq), {"items": [1, 2, 3]})
    assert inst.status == "completed", inst.error
    ctx = inst.main
    assert variables(ctx)["results"] == [10, 20, 30]
    assert "results" in ctx.layer(Layer.HISTORY)
    records = [k for k in ctx.layer(Layer.HISTORY) if k.startswith("activity:each")]
    assert records == ["activity:each"]  # one activity, not one per instance
    assert list(ctx.layer(Layer.HISTORY)["activity:each"]["keys"]) == ["results"]
    # instance items never stay in the context
    assert "item" not in ctx and "res" not in ctx
    assert dict(ctx.layer(Layer.WORKING)) == {} and dict(ctx.layer(Layer.EPHEMERAL)) == {}
    # spiff's bookkeeping did not leak into task.data of any task after the activity
    assert all(not t.data for t in inst.workflow.get_tasks() if t.task_spec.name != "Start")


@pytest.mark.parametrize("seq", [False, True], ids=["parallel", "sequential"])
def test_each_instance_item_is_on_the_tape_in_ephemeral(tmp_path: Path, seq: bool) -> None:
    inst = _run(_mi_process(tmp_path, seq=seq), {"items": ["a", "b"]})
    assert inst.status == "completed", inst.error
    notes = [(e.data.get("note"), e.data.get("instance")) for e in inst.main.tape
             if e.data.get("note") in ("instance_item", "instance_done")]
    assert notes == [("instance_item", 0), ("instance_done", 0), ("instance_item", 1), ("instance_done", 1)]
    done = [e.data["output"] for e in inst.main.tape if e.data.get("note") == "instance_done"]
    assert done == [{"res": "aaaaaaaaaa"}, {"res": "bbbbbbbbbb"}]


def test_parallel_instances_do_not_see_each_others_items(tmp_path: Path) -> None:
    seen: list[Any] = []

    def handler(ctx: ActivityContext) -> dict[str, Any]:
        seen.append((ctx.get("item"), ctx.get("res"), ctx.context.layer(Layer.EPHEMERAL).get("item")))
        return {"res": {"n": ctx["item"]}, "touched": True}

    engine = Engine(handlers={"each": handler})
    inst = _run(_mi_process(tmp_path), {"items": [5, 6, 7]}, engine=engine)
    assert inst.status == "completed", inst.error
    assert seen == [(5, None, 5), (6, None, 6), (7, None, 7)]
    assert variables(inst.main) == {"items": [5, 6, 7], "results": [{"n": 5}, {"n": 6}, {"n": 7}], "touched": True}


def test_an_instance_obeys_the_layer_rules(tmp_path: Path) -> None:
    inst = _run(_mi_process(tmp_path, script="res = item\nseen = seen + [item]"), {"items": [1, 2], "seen": []})
    # "seen" is a PROCESS key: an instance cannot change it, and the whole activity fails
    assert inst.status == "error"
    assert "seen" in inst.error["message"] and inst.error["task_id"] == "each"
    assert inst.main.current_activity is None and "results" not in inst.main


def test_a_shared_working_key_accumulates_across_instances(tmp_path: Path) -> None:
    path = _process(tmp_path, "mi", [
        '<bpmn:scriptTask id="init"><bpmn:script>seen = []</bpmn:script></bpmn:scriptTask>',
        _MI.format(tid="each", seq="true", source="<bpmn:loopDataInputRef>items</bpmn:loopDataInputRef>",
                   out="results", extra="", script="res = item\nseen.append(item)"),
    ], [("start", "init"), ("init", "each"), ("each", "end")])
    inst = _run(path, {"items": [1, 2, 3]})
    assert inst.status == "completed", inst.error
    assert variables(inst.main)["seen"] == [1, 2, 3]


def test_cardinality_gives_the_index_as_item(tmp_path: Path) -> None:
    inst = _run(_mi_process(tmp_path, source="<bpmn:loopCardinality>n + 1</bpmn:loopCardinality>",
                            script="res = f'#{item}'"), {"n": 2})
    assert inst.status == "completed", inst.error
    assert variables(inst.main)["results"] == ["#0", "#1", "#2"]


def test_completion_condition_sees_the_instance_and_the_collection(tmp_path: Path) -> None:
    extra = "\n        <bpmn:completionCondition>len(results) &gt;= 2 and res &gt; 0</bpmn:completionCondition>"
    inst = _run(_mi_process(tmp_path, seq=True, extra=extra), {"items": [1, 2, 3, 4]})
    assert inst.status == "completed", inst.error
    assert variables(inst.main)["results"] == [10, 20]


def test_completion_example_stops_early() -> None:
    inst = _run(EXAMPLES / "multi_instance_completion.bpmn", {"amounts": [2, 4, 6, 8], "limit": 10})
    assert variables(inst.main)["doubled"] == [4, 8, 12] and variables(inst.main)["checked"] == 3


def test_an_empty_input_gives_an_empty_output(tmp_path: Path) -> None:
    inst = _run(_mi_process(tmp_path), {"items": []})
    assert inst.status == "completed", inst.error
    assert variables(inst.main)["results"] == []


def test_a_map_input_keeps_its_keys(tmp_path: Path) -> None:
    inst = _run(_mi_process(tmp_path, out="items"), {"items": {"a": 1, "b": 2}})
    # the output is the input, updated in place: a PROCESS key cannot change
    assert inst.status == "error" and "items" in inst.error["message"]
    path = _process(tmp_path, "mi2", [
        '<bpmn:scriptTask id="init"><bpmn:script>prices = {"a": 1, "b": 2}</bpmn:script></bpmn:scriptTask>',
        _MI.format(tid="each", seq="false", source="<bpmn:loopDataInputRef>prices</bpmn:loopDataInputRef>",
                   out="prices", extra="", script="res = item * 100"),
    ], [("start", "init"), ("init", "each"), ("each", "end")])
    inst = _run(path)
    assert inst.status == "completed", inst.error
    assert variables(inst.main)["prices"] == {"a": 100, "b": 200}


def test_a_missing_input_collection_is_named(tmp_path: Path) -> None:
    inst = _run(_mi_process(tmp_path), {})
    assert inst.status == "error"
    assert "'items'" in inst.error["message"] and "loopDataInputRef" in inst.error["message"]


def test_an_instance_without_its_output_item_fails_the_activity(tmp_path: Path) -> None:
    inst = _run(_mi_process(tmp_path, script="other = item"), {"items": [1]})
    assert inst.status == "error"
    assert "'res'" in inst.error["message"] and inst.error["task_id"] == "each"


def test_a_failing_instance_aborts_the_whole_activity(tmp_path: Path) -> None:
    inst = _run(_mi_process(tmp_path, seq=True, script="res = 10 // item\nlast = item"), {"items": [1, 2, 0]})
    assert inst.status == "error"
    assert "ZeroDivisionError" in inst.error["message"] and inst.error["task_id"] == "each"
    ctx = inst.main
    assert "last" not in ctx and ctx.current_activity is None  # back as at the activity's start
    assert not ctx.layer(Layer.EPHEMERAL)


@pytest.mark.parametrize("seq", [False, True], ids=["parallel", "sequential"])
def test_resume_after_a_failed_instance_runs_the_whole_activity_again(tmp_path: Path, seq: bool) -> None:
    engine = Engine()
    inst = _run(_mi_process(tmp_path, seq=seq, script="res = 10 // (item - bad)"), {"items": [1, 2, 3]}, engine=engine)
    assert inst.status == "error" and inst.error["task_id"] == "each"
    assert inst.error_task is not None  # the failed instance, below its STARTED multi-instance task
    engine.inject(inst, {"bad": 0})
    inst = engine.resume(engine.load(inst.id))
    assert inst.status == "completed", inst.error
    assert variables(inst.main)["results"] == [10, 5, 3]
    assert [k for k in inst.main.layer(Layer.HISTORY) if k.startswith("activity:each")] == ["activity:each"]


def test_multi_instance_user_tasks_wait_and_collect_answers(tmp_path: Path) -> None:
    task = _MI_USERS
    engine = Engine()
    inst = _run(_mi_process(tmp_path, task=task), {"items": ["x", "y"]}, engine=engine)
    assert inst.status == "waiting"
    ids = [w["id"] for w in inst.waiting_for if w["kind"] == "user_task"]
    assert len(ids) == 2 and all(w["task_id"] == "each" for w in inst.waiting_for)
    assert inst.main.current_activity == "each"  # the activity stays open while people answer
    # saved and loaded between the answers: spiff's collection travels with the workflow
    inst = engine.complete_user_task(engine.load(inst.id), ids[1], {"res": "second", "note": "n"})
    assert inst.status == "waiting"
    inst = engine.complete_user_task(engine.load(inst.id), ids[0], {"res": "first"})
    assert inst.status == "completed", inst.error
    out = variables(inst.main)
    assert out["note"] == "n"
    assert sorted(out["results"]) == ["first", "second"]


def test_each_waiting_instance_says_which_it_is_and_its_input(tmp_path: Path) -> None:
    """Several instances of one user task wait under one BPMN id: each waiting item names its
    instance and input item, so a person (or a script) answers the right one."""
    engine = Engine()
    inst = _run(_mi_process(tmp_path, task=_MI_USERS), {"items": ["x", "y", "z"]}, engine=engine)
    assert [(w["task_id"], w["instance"], w["input"]) for w in inst.waiting_for] == [
        ("each", 1, {"item": "x"}), ("each", 2, {"item": "y"}), ("each", 3, {"item": "z"})]
    for w in reversed(inst.waiting_for):
        inst = engine.complete_user_task(engine.load(inst.id), w["id"], {"res": f"for {w['input']['item']}"})
        assert [v["input"]["item"] for v in inst.waiting_for] == [v for v in "xyz" if v < w["input"]["item"]]
    assert inst.status == "completed", inst.error
    # answered last to first, each output at its item's place
    assert variables(inst.main)["results"] == ["for x", "for y", "for z"]
    sequential = _run(_mi_process(tmp_path, task=_MI_USERS.replace('"false"', '"true"')), {"items": ["x", "y"]},
                      engine=engine)
    [first] = sequential.waiting_for
    assert (first["instance"], first["input"]) == (1, {"item": "x"})
    [second] = engine.complete_user_task(sequential, first["id"], {"res": 1}).waiting_for
    assert (second["instance"], second["input"]) == (2, {"item": "y"})


_MI_USERS = """<bpmn:userTask id="each">
      <bpmn:multiInstanceLoopCharacteristics isSequential="false">
        <bpmn:loopDataInputRef>items</bpmn:loopDataInputRef>
        <bpmn:loopDataOutputRef>results</bpmn:loopDataOutputRef>
        <bpmn:inputDataItem id="item" name="item"/>
        <bpmn:outputDataItem id="res" name="res"/>
      </bpmn:multiInstanceLoopCharacteristics>
    </bpmn:userTask>"""


def test_by_bpmn_id_the_first_waiting_instance_is_completed_and_named(tmp_path: Path) -> None:
    """``complete_user_task(instance, BPMN_ID, data)`` with several instances waiting completes one: the
    first in the order ``waiting_for`` lists them. The instance names it (``completed_user_task``: its
    waiting item's id, instance number and input) and so does the ``user_input`` note on the tape; a caller
    loops until none waits."""
    engine = Engine()
    inst = _run(_mi_process(tmp_path, task=_MI_USERS), {"items": ["x", "y", "z"]}, engine=engine)
    done: list[dict[str, Any]] = []
    while inst.waiting_for:
        first = inst.waiting_for[0]
        inst = engine.complete_user_task(engine.load(inst.id), "each", {"res": len(done)})
        assert inst.completed_user_task == {k: first[k] for k in ("id", "task_id", "instance", "input")}
        done.append(inst.completed_user_task)
    assert [(d["instance"], d["input"]) for d in done] == [(1, {"item": "x"}), (2, {"item": "y"}), (3, {"item": "z"})]
    assert inst.status == "completed" and variables(inst.main)["results"] == [0, 1, 2]
    notes = [e.data for e in inst.main.tape if e.data.get("note") == "user_input"]
    assert [(n["task_id"], n["instance"]) for n in notes] == [("each", 1), ("each", 2), ("each", 3)]
    # by its own id: that instance, whatever its place
    inst = _run(_mi_process(tmp_path, task=_MI_USERS), {"items": ["x", "y"]}, engine=engine)
    second = inst.waiting_for[1]
    inst = engine.complete_user_task(inst, second["id"], {"res": "y!"})
    assert inst.completed_user_task["instance"] == 2 and [w["instance"] for w in inst.waiting_for] == [1]


def test_a_plain_user_task_names_what_was_completed_without_an_instance(tmp_path: Path) -> None:
    task = '<bpmn:userTask id="check" name="Check"/>'
    engine = Engine()
    inst = _run(_process(tmp_path, "plain", [task], [("start", "check"), ("check", "end")]), engine=engine)
    [item] = inst.waiting_for
    inst = engine.complete_user_task(inst, "check", {"ok": True})
    assert inst.completed_user_task == {"id": item["id"], "task_id": "check"}
    [note] = [e.data for e in inst.main.tape if e.data.get("note") == "user_input"]
    assert "instance" not in note


def test_the_cli_answers_every_instance_by_the_bpmn_id(tmp_path: Path, cli: Any) -> None:
    """``--answers`` keyed by the BPMN id still answers all the waiting instances alike, in one run."""
    path = _mi_process(tmp_path, task=_MI_USERS)
    answers = tmp_path / "answers.json"
    answers.write_text(json.dumps({"user_tasks": {"each": {"res": "ok"}}}), encoding="utf-8")
    doc = run_json(cli, "run", str(path), "--data", json.dumps({"items": ["x", "y", "z"]}), "--answers", str(answers))
    assert doc["status"] == "completed" and doc["layers"]["L3"]["results"] == ["ok", "ok", "ok"]
    waiting = run_json(cli, "run", str(path), "--data", json.dumps({"items": ["x", "y"]}), code=3)
    assert [w["instance"] for w in waiting["waiting_for"]] == [1, 2]
    done = run_json(cli, "resume", waiting["instance_id"], "--answer", 'each={"res": "ok"}')
    assert done["status"] == "completed" and done["layers"]["L3"]["results"] == ["ok", "ok"]


def test_an_instance_holds_its_own_item_not_a_copy_of_the_collections(tmp_path: Path) -> None:
    """SpiffWorkflow gives every instance a deep copy of the activity's data (the input and
    output collections): n copies of n items, written again at every save."""
    engine = Engine()
    items = [f"doc-{i}" for i in range(40)]
    inst = _run(_mi_process(tmp_path, task=_MI_USERS), {"items": items}, engine=engine)
    instances = [t for t in inst.workflow.tasks.values() if t.task_spec.name == "each [child]"]
    assert sorted(t.data["item"] for t in instances) == sorted(items)
    assert all(set(t.data) == {"item"} for t in instances)
    # the saved workflow holds the collection once (the activity's), not once per instance
    saved = engine.store.load(inst.id)["workflow"]
    assert str(saved).count("doc-39") == 2  # the collection, and the item of its instance
    ids = [w["id"] for w in inst.waiting_for]
    for n, task_id in enumerate(ids):
        inst = engine.complete_user_task(engine.load(inst.id), task_id, {"res": n})
    assert inst.status == "completed", inst.error
    assert sorted(variables(inst.main)["results"]) == list(range(40))


# ----------------------------------------------------------------- standard loops


_LOOP = """<bpmn:scriptTask id="work">
      <bpmn:standardLoopCharacteristics {attrs}>{cond}</bpmn:standardLoopCharacteristics>
      <bpmn:script>count = count + 1</bpmn:script>
    </bpmn:scriptTask>"""


@pytest.mark.parametrize(("attrs", "cond", "data", "expected"), [
    ('loopMaximum="10"', "<bpmn:loopCondition>count &lt; limit</bpmn:loopCondition>", {"limit": 4}, 4),
    ('loopMaximum="3"', "<bpmn:loopCondition>count &lt; limit</bpmn:loopCondition>", {"limit": 9}, 3),
    ('loopMaximum="2"', "", {}, 2),
    ('testBefore="true"', "<bpmn:loopCondition>count &lt; limit</bpmn:loopCondition>", {"limit": 0}, 0),
], ids=["condition", "maximum", "maximum-only", "test-before"])
def test_standard_loop_condition_is_evaluated_over_the_context(tmp_path: Path, attrs: str, cond: str,
                                                               data: dict[str, Any], expected: int) -> None:
    path = _process(tmp_path, "loop", [
        '<bpmn:scriptTask id="init"><bpmn:script>count = 0</bpmn:script></bpmn:scriptTask>',
        _LOOP.format(attrs=attrs, cond=cond),
    ], [("start", "init"), ("init", "work"), ("work", "end")])
    inst = _run(path, data)
    assert inst.status == "completed", inst.error
    assert inst.main.resolve("count") == expected
    records = [k for k in inst.main.layer(Layer.HISTORY) if k.startswith("activity:work")]
    assert len(records) == expected  # each pass is its own activity


# ----------------------------------------------------------------- timers


class Clock:
    def __init__(self) -> None:
        self.now = time.time()

    def __call__(self) -> float:
        return self.now


def _timer_process(tmp_path: Path, duration: str) -> Path:
    return _process(tmp_path, "timer", [
        '<bpmn:scriptTask id="before"><bpmn:script>x = 1</bpmn:script></bpmn:scriptTask>',
        f'<bpmn:intermediateCatchEvent id="wait"><bpmn:timerEventDefinition><bpmn:timeDuration>{duration}'
        '</bpmn:timeDuration></bpmn:timerEventDefinition></bpmn:intermediateCatchEvent>',
        '<bpmn:scriptTask id="after"><bpmn:script>y = x + 1</bpmn:script></bpmn:scriptTask>',
    ], [("start", "before"), ("before", "wait"), ("wait", "after"), ("after", "end")])


def test_a_due_timer_fires_within_the_run(tmp_path: Path) -> None:
    inst = _run(_timer_process(tmp_path, '"PT0S"'))
    assert inst.status == "completed", inst.error
    assert inst.main.resolve("y") == 2


def test_a_future_timer_waits_and_a_later_run_continues(tmp_path: Path) -> None:
    clock = Clock()
    engine = Engine(clock=clock)
    inst = _run(_timer_process(tmp_path, "wait_for"), {"wait_for": "PT2H"}, engine=engine)
    assert inst.status == "waiting"
    [item] = inst.waiting_for
    assert (item["kind"], item["task_id"]) == ("timer", "wait")
    from datetime import datetime, timezone
    due = datetime.fromisoformat(item["due"])
    assert abs(due.timestamp() - (clock.now + 7200)) < 1
    clock.now += 3600
    inst = engine.run(engine.load(inst.id))
    assert inst.status == "waiting" and inst.waiting_for[0]["due"] == item["due"]
    clock.now += 3601
    inst = engine.resume(engine.load(inst.id))
    assert inst.status == "completed", inst.error
    assert inst.main.resolve("y") == 2
    assert datetime.now(timezone.utc) < due  # the engine's clock decided, not the wall clock


def test_a_boundary_timer_on_a_user_task(tmp_path: Path) -> None:
    clock = Clock()
    engine = Engine(clock=clock)
    path = EXAMPLES / "timer_boundary.bpmn"
    inst = _run(path, engine=engine)
    assert inst.status == "waiting"
    assert [w["kind"] for w in inst.waiting_for] == ["user_task", "timer"]
    # answered in time: the timer is cancelled
    done = engine.complete_user_task(engine.load(inst.id), "approve", {"approved": True})
    assert done.status == "completed" and done.main.resolve("outcome") == "approved"
    # not answered: the timer cancels the user task and the request escalates
    inst = _run(path, engine=engine)
    clock.now += 3601
    inst = engine.run(engine.load(inst.id), answers={})
    assert inst.status == "completed", inst.error
    assert inst.main.resolve("outcome") == "escalated"
    assert "approve" not in [k.split(":")[1] for k in inst.main.layer(Layer.HISTORY) if k.startswith("activity:")]


def test_the_cli_reports_a_timer(tmp_path: Path) -> None:
    import json

    from click.testing import CliRunner

    from engine.cli import main

    path = _timer_process(tmp_path, '"PT1H"')
    result = CliRunner().invoke(main, ["run", str(path), "--store", "memory://", "--json"])
    doc = json.loads(result.stdout)
    assert doc["status"] == "waiting"
    assert [(w["kind"], w["task_id"]) for w in doc["waiting_for"]] == [("timer", "wait")]
    assert doc["waiting_for"][0]["due"]


def test_the_examples_validate() -> None:
    from engine.validate import validate_process

    for name in ("multi_instance_parallel", "multi_instance_sequential", "multi_instance_cardinality",
                 "multi_instance_completion", "standard_loop", "timer_boundary"):
        report = validate_process(EXAMPLES / f"{name}.bpmn")
        assert report.ok, (name, report)


def test_a_multi_instance_activity_in_a_parallel_branch_runs_in_the_branch_context(tmp_path: Path) -> None:
    mi = _MI.format(tid="each", seq="false", source="<bpmn:loopDataInputRef>items</bpmn:loopDataInputRef>",
                    out="results", extra="", script="res = item * 2")
    path = _process(tmp_path, "branch", [
        '<bpmn:parallelGateway id="split"/>', mi,
        '<bpmn:scriptTask id="other"><bpmn:script>o = len(items)</bpmn:script></bpmn:scriptTask>',
        '<bpmn:parallelGateway id="join"/>',
        '<bpmn:scriptTask id="fin"><bpmn:script>total = sum(results) + o</bpmn:script></bpmn:scriptTask>',
    ], [("start", "split"), ("split", "each"), ("split", "other"), ("each", "join"), ("other", "join"),
        ("join", "fin"), ("fin", "end")])
    inst = _run(path, {"items": [1, 2, 3]})
    assert inst.status == "completed", inst.error
    assert variables(inst.main) == {"items": [1, 2, 3], "results": [2, 4, 6], "o": 3, "total": 15}
    branch = next(n for n, i in inst.branches.items() if i["branch_id"] == "each")
    assert "activity:each" in inst.contexts[branch].layer(Layer.HISTORY)
    assert "results" not in inst.contexts[next(n for n in inst.branches if n != branch)]


_NO_COLLECTION = """<bpmn:scriptTask id="each">
      <bpmn:multiInstanceLoopCharacteristics isSequential="{seq}">
        <bpmn:loopDataInputRef>items</bpmn:loopDataInputRef>
        <bpmn:inputDataItem id="item" name="item"/>{out}
      </bpmn:multiInstanceLoopCharacteristics>
      <bpmn:script>last = item * 2</bpmn:script>
    </bpmn:scriptTask>"""


@pytest.mark.parametrize("out", ["", '\n        <bpmn:outputDataItem id="res" name="res"/>'], ids=["no-output-item", "output-item"])
@pytest.mark.parametrize("seq", [True, False], ids=["sequential", "parallel"])
def test_an_input_item_without_an_output_collection_runs_each_instance(tmp_path: Path, seq: bool, out: str) -> None:
    # SpiffWorkflow 3.2 merges a whole instance's data, its item with it, into the activity's: the
    # next sequential instance failed with "Multiinstance input item item already exists"
    seen: list[Any] = []

    def handler(ctx: ActivityContext) -> dict[str, Any]:
        seen.append(ctx["item"])
        return {"last": ctx["item"] * 2}

    task = _NO_COLLECTION.format(seq=str(seq).lower(), out=out)
    for engine in (Engine(), Engine(handlers={"each": handler})):
        inst = _run(_mi_process(tmp_path, task=task), {"items": [1, 2, 3]}, engine=engine)
        assert inst.status == "completed", inst.error
        items = [e.changes[0][2] for e in inst.main.tape if e.data.get("note") == "instance_item"]
        assert items == [1, 2, 3]
        assert variables(inst.main) == {"items": [1, 2, 3], "last": 6}  # nothing collected, no item left
        assert all(not t.data for t in inst.workflow.get_tasks() if t.task_spec.name != "Start")
    assert seen == [1, 2, 3]


def test_sequential_user_tasks_without_an_output_collection_each_wait_with_their_item(tmp_path: Path) -> None:
    task = """<bpmn:userTask id="each">
      <bpmn:multiInstanceLoopCharacteristics isSequential="true">
        <bpmn:loopDataInputRef>items</bpmn:loopDataInputRef>
        <bpmn:inputDataItem id="item" name="item"/>
      </bpmn:multiInstanceLoopCharacteristics>
    </bpmn:userTask>"""
    engine = Engine()
    inst = _run(_mi_process(tmp_path, task=task), {"items": ["x", "y"]}, engine=engine)
    answered = []
    while inst.status == "waiting":  # saved and loaded between the answers
        waiting = [w for w in inst.waiting_for if w["kind"] == "user_task"]
        assert len(waiting) == 1 and waiting[0]["input"] == {"item": ["x", "y"][len(answered)]}
        answered.append(waiting[0]["input"]["item"])
        inst = engine.complete_user_task(engine.load(inst.id), waiting[0]["id"], {"seen": answered[-1]})
    assert inst.status == "completed", inst.error
    assert answered == ["x", "y"]
    assert variables(inst.main) == {"items": ["x", "y"], "seen": "y"}
