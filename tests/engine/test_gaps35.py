"""Gaps closed in session 35.

* The parallel instances of a multi-instance sub-process or call activity each run in a scope
  of their own, forked from the activity's context: they are parallel branches, and what two of
  them write to the same key meets as at a join (three-way, the activity's own join settings
  resolve it), never last-writer-wins.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from engine import Engine, load_process

from engine_helpers import chain_bpmn, script_task, variables


def _mi(kind: str, *, sequential: bool = False, body: str = "") -> str:
    """A multi-instance ``kind`` (subProcess / callActivity) over ``numbers``, no output collection."""
    loop = (f'<bpmn:multiInstanceLoopCharacteristics isSequential="{str(sequential).lower()}">'
            '<bpmn:loopDataInputRef>numbers</bpmn:loopDataInputRef>'
            '<bpmn:inputDataItem id="number" name="number"/></bpmn:multiInstanceLoopCharacteristics>')
    if kind == "callActivity":
        return f'<bpmn:callActivity id="each" calledElement="judge_one">{loop}</bpmn:callActivity>'
    return (f'<bpmn:subProcess id="each">{loop}<bpmn:startEvent id="in_start"/>{body}<bpmn:endEvent id="in_end"/>'
            '<bpmn:sequenceFlow id="in1" sourceRef="in_start" targetRef="judge"/>'
            '<bpmn:sequenceFlow id="in2" sourceRef="judge" targetRef="in_end"/></bpmn:subProcess>')


JUDGE = "verdict = 'v%d' % number\ntotal = total + number\nsame = 'x'"


def _process(tmp_path: Path, kind: str, *, sequential: bool = False, config: str | None = None,
             judge: str = JUDGE) -> list[Path]:
    init = script_task("init", "numbers = [1, 2, 3]\nverdict = 'none'\ntotal = 0")
    paths = [tmp_path / "mi.bpmn"]
    paths[0].write_text(chain_bpmn("mi", [init, _mi(kind, sequential=sequential, body=script_task("judge", judge))]),
                        encoding="utf-8")
    if kind == "callActivity":
        called = tmp_path / "judge_one.bpmn"
        called.write_text(chain_bpmn("judge_one", [script_task("judge", judge)]), encoding="utf-8")
        paths.append(called)
    if config is not None:
        (tmp_path / "mi.layerflow.yaml").write_text(config, encoding="utf-8")
    return paths


def _run(paths: list[Path]) -> Any:
    engine = Engine()
    return engine.run(engine.start(load_process(paths)))


KINDS = ["subProcess", "callActivity"]


@pytest.mark.parametrize("kind", KINDS)
def test_parallel_instances_writing_one_key_differently_are_a_conflict_not_the_last_writer(
        tmp_path: Path, kind: str) -> None:
    inst = _run(_process(tmp_path, kind))
    # before: completed with verdict 'v3' and total 3, the other instances' writes silently lost
    assert inst.status == "error", variables(inst.main)
    assert inst.error["kind"] == "merge_conflict" and inst.error["task_id"] == "each"
    message = inst.error["message"]
    for part in ("multi-instance activity 'each'", "'verdict'", "each#1", "each#2", "'v1'", "'v2'",
                 "mergeStrategy", "reducers", "conflictPolicy", "loopDataOutputRef"):
        assert part in message, (part, message)
    assert "'same'" not in message  # written alike by every instance: no conflict
    assert inst.main.current_activity is None and inst.main.resolve("verdict") == "none"  # init's, untouched
    assert [c["key"] for c in inst.conflicts] and {c["key"] for c in inst.conflicts} <= {"verdict", "total"}
    assert all(c["gateway_id"] == "each" and c["resolution"] is None for c in inst.conflicts)


@pytest.mark.parametrize("kind", KINDS)
def test_the_activitys_join_settings_resolve_its_instances_conflicts(tmp_path: Path, kind: str) -> None:
    config = ("each:\n  mergeStrategy: BRANCH_PRIORITY\n  branchPriority: ['each#2', 'each#1', 'each#3']\n"
              "  reducers: {total: sum}\n")
    inst = _run(_process(tmp_path, kind, config=config))
    assert inst.status == "completed", inst.error
    got = variables(inst.main)
    assert got["verdict"] == "v2" and got["total"] == 6 and got["same"] == "x"
    records = [c for c in inst.conflicts if c["key"] == "verdict"]
    assert records and all(c["gateway_id"] == "each" and c["resolution"]["resolver"] == "strategy" for c in records)
    assert {"each#1", "each#2"} <= {b for c in records for b in c["values"]}
    assert "total" not in {c["key"] for c in inst.conflicts}  # the reducer combined them
    log = inst.main.resolve("_mergedConflicts")
    assert [e["key"] for e in log] == [c["key"] for c in records]
    notes = [e.data for e in inst.main.tape if e.data.get("note") == "conflict"]
    assert notes and all(n["gateway_id"] == "each" and n["key"] == "verdict" for n in notes)


@pytest.mark.parametrize("kind", KINDS)
def test_last_writer_wins_is_a_choice_the_activity_states(tmp_path: Path, kind: str) -> None:
    inst = _run(_process(tmp_path, kind, config="each:\n  mergeStrategy: LAST_WRITER_WINS\n"))
    assert inst.status == "completed", inst.error
    assert variables(inst.main)["verdict"] == "v3"
    assert {c["key"] for c in inst.conflicts} == {"verdict", "total"}
    assert all(c["resolution"]["resolver"] == "strategy" for c in inst.conflicts)


def test_sequential_instances_each_see_the_one_before_and_never_conflict(tmp_path: Path) -> None:
    inst = _run(_process(tmp_path, "subProcess", sequential=True))
    assert inst.status == "completed", inst.error
    got = variables(inst.main)
    assert got["verdict"] == "v3" and got["total"] == 6 and inst.conflicts == []


def test_join_settings_on_a_parallel_multi_instance_scope_are_no_validate_warning(tmp_path: Path) -> None:
    from engine.validate import validate_process

    paths = _process(tmp_path, "subProcess", config="each:\n  mergeStrategy: LAST_WRITER_WINS\n")
    codes = [p.code for p in validate_process(paths).problems]
    assert "join_config_on_non_join" not in codes


# ----- count_only that would cost more than it saves ---------------------------------------------

def test_a_count_only_rule_that_makes_no_counter_says_why_and_what_took_its_entries() -> None:
    """DESIGN: a rule never makes HISTORY bigger, so a counter that costs more tokens than the entries
    it replaces is not made; the cliff then folds those entries with the rest. That is another
    strategy than the config asked for: the rule's report, the result's notes and the compress event
    on the tape say so (before: ``"entries": 0`` and nothing else)."""
    from context_layers import Layer, LayeredContext, config_from_dict
    from context_layers.compression import RuleDrivenCompressor

    ctx = LayeredContext()

    def activity(task: str, writes: dict[str, Any]) -> None:
        ctx.begin_activity(task)
        for k, v in writes.items():
            ctx.write(Layer.WORKING, k, v, actor=task)
        ctx.complete_activity(task)

    for i in range(6):
        activity(f"step{i}", {f"note{i}": " ".join(f"n{i} observed item {j}: checked." for j in range(12))})
    activity("pinger", {f"ping:{i}": i for i in range(4)})
    activity("step6", {"note6": "the last step's note"})
    cfg = config_from_dict({"compressRules": [{"pattern": "ping:*", "action": "count_only", "keepLast": 1}],
                            "compressTokenThreshold": 50})
    result = RuleDrivenCompressor().compress(ctx, cfg)
    [rule] = result.rules
    assert rule["entries"] == 0
    declined = rule["declined"]
    assert declined["entries"] == 3 and declined["counter_tokens"] > declined["entries_tokens"]
    assert "count_only" in declined["reason"] and "'ping:*'" in declined["reason"]
    assert "ping:0" in result.folded  # the cliff took them instead
    assert any("count_only rule 'ping:*' made no counter" in n and "folded" in n for n in result.notes)
    [event] = [e for e in ctx.tape if e.data.get("note") == "compress"]
    assert event.data["rules_declined"] == [{"pattern": "ping:*", "action": "count_only", **declined}]


# ----- llm.outputKeys: the keys the model is asked for, and the only ones it may write ----------

def _model_step(tmp_path: Path, output_keys: str, handler_answer: str) -> Path:
    path = tmp_path / "triage.bpmn"
    path.write_text(chain_bpmn("triage", [script_task("classify", handler_answer)]), encoding="utf-8")
    (tmp_path / "triage.layerflow.yaml").write_text(
        f"classify:\n  llm:\n    instructions: Classify the ticket.\n    outputKeys: {output_keys}\n"
        "    maxRetries: 1\n    timeout: 5\n", encoding="utf-8")
    return path


def test_a_model_answer_with_a_key_outputkeys_does_not_list_is_refused_naming_activity_and_key(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """outputKeys is the answer's contract: the prompt asks for those keys and says each is written to
    the context, so a key beyond them (a model talked into ``approved``) is refused as a missing one is:
    sent back to the model to correct, and after its retries the step fails naming it. Before, the
    extra key was written to the context silently."""
    from stub_llm import Reply, StubLLM

    monkeypatch.setenv("LAYERFLOW_MODEL_API_KEY", "test-key")
    monkeypatch.setenv("LAYERFLOW_RETRY_BASE_DELAY", "0.01")
    path = _model_step(tmp_path, "[category]", "category = 'offline'")
    with StubLLM() as stub:
        monkeypatch.setenv("LAYERFLOW_MODEL_API_BASE", stub.url)
        stub.push(Reply.json({"category": "billing", "approved": True}), Reply.json({"category": "billing"}))
        engine = Engine(model="openai/stub")
        inst = engine.run(engine.start(load_process(path)))
        assert inst.status == "completed", inst.error
        assert variables(inst.main) == {"category": "billing"}  # corrected on the second try
        told = str(stub.requests[1]["messages"])
        assert "approved" in told and "outputKeys" in told

        stub.push(Reply.json({"category": "billing", "approved": True}),
                  Reply.json({"category": "billing", "approved": True}))
        inst = engine.run(engine.start(load_process(path)))
    assert inst.status == "error" and inst.error["task_id"] == "classify"
    assert "'approved'" in inst.error["message"] and "outputKeys" in inst.error["message"], inst.error
    assert "approved" not in inst.main and "category" not in inst.main


def test_an_offline_handler_answer_with_a_key_outputkeys_does_not_list_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "triage.bpmn"
    path.write_text(chain_bpmn("triage", ['<bpmn:serviceTask id="classify"/>']), encoding="utf-8")
    (tmp_path / "triage.layerflow.yaml").write_text(
        "classify:\n  llm:\n    instructions: Classify the ticket.\n    outputKeys: [category]\n", encoding="utf-8")
    engine = Engine(handlers={"classify": lambda ctx: {"category": "billing", "approved": True}})
    inst = engine.run(engine.start(load_process(path)))
    assert inst.status == "error" and inst.error["task_id"] == "classify"
    assert "'approved'" in inst.error["message"] and "llm.outputKeys" in inst.error["message"]
    assert "approved" not in inst.main
