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
def test_parallel_instances_writing_one_key_differently_are_listed_conflicts_never_silent(
        tmp_path: Path, kind: str) -> None:
    """With no merge settings, the instance that ended last keeps its value, as SpiffWorkflow merges
    instances (a process SpiffWorkflow completes is not stopped), but every such conflict is listed
    with the reason and how to decide otherwise; before, the other instances' writes were lost without
    a word."""
    inst = _run(_process(tmp_path, kind))
    assert inst.status == "completed", inst.error
    got = variables(inst.main)
    assert got["verdict"] == "v3" and got["total"] == 3 and got["same"] == "x"
    assert {c["key"] for c in inst.conflicts} == {"verdict", "total"}  # 'same': written alike, no conflict
    for c in inst.conflicts:
        assert c["gateway_id"] == "each" and c["resolution"]["resolver"] == "strategy", c
        reason = c["resolution"]["reason"]
        for part in ("no merge settings on multi-instance activity 'each'", "ended last", "mergeStrategy",
                     "FAIL_ON_CONFLICT", "reducers", "conflictPolicy"):
            assert part in reason, (part, reason)
    assert {e["key"] for e in inst.main.resolve("_mergedConflicts")} == {"verdict", "total"}
    notes = [e.data for e in inst.main.tape if e.data.get("note") == "conflict"]
    assert {n["key"] for n in notes} == {"verdict", "total"} and all(n["gateway_id"] == "each" for n in notes)


@pytest.mark.parametrize("strategy", ["MERGE_WITH_CONFLICT_DETECT", "FAIL_ON_CONFLICT"])
@pytest.mark.parametrize("kind", KINDS)
def test_a_written_merge_strategy_that_settles_nothing_fails_the_activity_naming_every_conflict(
        tmp_path: Path, kind: str, strategy: str) -> None:
    inst = _run(_process(tmp_path, kind, config=f"each:\n  mergeStrategy: {strategy}\n"))
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


def test_a_strategy_given_at_run_time_settles_the_failed_activity_which_runs_again(tmp_path: Path) -> None:
    from engine.governance import ConfigArgs, GovernanceService

    engine = Engine(f"sqlite:///{tmp_path / 'runs.db'}")
    paths = _process(tmp_path, "subProcess", config="each:\n  mergeStrategy: FAIL_ON_CONFLICT\n")
    inst = engine.run(engine.start(load_process(paths)))
    assert inst.status == "error" and inst.error["kind"] == "merge_conflict"
    GovernanceService(engine).config(inst.id, ConfigArgs(activity_id="each", config={
        "mergeStrategy": "LAST_WRITER_WINS", "reducers": {"total": "sum"}}))
    inst = engine.resume(engine.load(inst.id))
    assert inst.status == "completed", inst.error
    assert variables(inst.main)["total"] == 6
    # the failed run's unresolved reports are replaced by the settled ones, not listed beside them
    assert [c["key"] for c in inst.conflicts] == ["verdict", "verdict"]
    assert all(c["resolution"] is not None for c in inst.conflicts)


def test_an_instance_that_set_no_output_item_is_run_again_by_resume_once_fixed(tmp_path: Path) -> None:
    """An instance's failure found as its sub-process ends (no output item; a conflict above) left no
    task in error: resume failed with "TypeError: 'NoneType' object does not support item assignment"."""
    from engine.governance import GovernanceService, InjectArgs

    loop = ('<bpmn:multiInstanceLoopCharacteristics isSequential="false">'
            '<bpmn:loopDataInputRef>numbers</bpmn:loopDataInputRef><bpmn:loopDataOutputRef>outs</bpmn:loopDataOutputRef>'
            '<bpmn:inputDataItem id="number" name="number"/><bpmn:outputDataItem id="result" name="result"/>'
            '</bpmn:multiInstanceLoopCharacteristics>')
    sub = (f'<bpmn:subProcess id="each">{loop}<bpmn:startEvent id="in_start"/>'
           + script_task("judge", "if number != 2 or fixed: result = number") + '<bpmn:endEvent id="in_end"/>'
           '<bpmn:sequenceFlow id="in1" sourceRef="in_start" targetRef="judge"/>'
           '<bpmn:sequenceFlow id="in2" sourceRef="judge" targetRef="in_end"/></bpmn:subProcess>')
    path = tmp_path / "mi.bpmn"
    path.write_text(chain_bpmn("mi", [script_task("init", "numbers = [1, 2, 3]\nfixed = False"), sub]), encoding="utf-8")
    engine = Engine(f"sqlite:///{tmp_path / 'runs.db'}")
    inst = engine.run(engine.start(load_process(path)))
    assert inst.status == "error" and "set no output item 'result'" in inst.error["message"]
    GovernanceService(engine).inject(inst.id, InjectArgs(layer="L4", key="fixed", value=True))
    inst = engine.resume(engine.load(inst.id))
    assert inst.status == "completed", inst.error
    assert variables(inst.main)["outs"] == [1, 2, 3]


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


# ----- llm.outputKeys: the keys an answer must have; an outputSchema restricts the others ----------

def _scripted(*answers: dict[str, Any]) -> tuple[list[Any], Any]:
    import json

    sent: list[Any] = []
    replies = iter(answers)

    def completion(**kw: Any) -> dict[str, Any]:
        sent.append(kw["messages"])
        return {"choices": [{"message": {"content": json.dumps(next(replies))}, "finish_reason": "stop"}],
                "usage": {"total_tokens": 3}}
    return sent, completion


def test_outputkeys_are_required_and_an_outputschema_without_additional_properties_is_the_allow_list() -> None:
    """DESIGN and the seeds say nothing of outputKeys; the contract since the first model step is a
    list of required keys, other keys being the model's data under the layer rules (README). An
    activity that must take only some keys says so with an outputSchema: an extra key is sent back
    to the model, and after its retries the step fails naming the activity and the key."""
    from context_layers import LayeredContext
    from context_layers.config import LLMConfig
    from context_layers.errors import ModelError
    from engine.llm import RetryPolicy, run_llm_activity

    ctx = LayeredContext()
    ctx.begin_activity("classify")
    _, fake = _scripted({"category": "billing", "reason": "an invoice"})
    keys = LLMConfig(model="m", instructions="Classify the ticket.", output_keys=["category"], max_retries=0)
    assert run_llm_activity(ctx, "classify", keys, completion=fake)["reason"] == "an invoice"

    only = LLMConfig(model="m", instructions="Classify the ticket.", max_retries=1, output_schema={
        "type": "object", "required": ["category"], "properties": {"category": {"type": "string"}},
        "additionalProperties": False})
    ctx = LayeredContext()
    ctx.begin_activity("classify")
    sent, fake = _scripted({"category": "billing", "approved": True}, {"category": "billing", "approved": True})
    with pytest.raises(ModelError) as failed:
        run_llm_activity(ctx, "classify", only, completion=fake, sleep=lambda s: None, retry=RetryPolicy(base=0))
    assert "'approved'" in str(sent[1][-1])  # the model was told what to correct
    assert "'classify'" in str(failed.value) and "unexpected key 'approved'" in str(failed.value)
    assert "approved" not in ctx and "category" not in ctx


# ----- validate: a conflictPolicy key that nothing writes -----------------------------------------

def _review(tmp_path: Path, policy: str) -> Path:
    from engine_helpers import flow, write_elements

    path = write_elements(tmp_path, "review", [
        '<bpmn:startEvent id="start"/>', '<bpmn:parallelGateway id="fork"/>',
        script_task("finance", "approval_status = 'approved'"), script_task("risk", "approval_status = 'rejected'"),
        '<bpmn:parallelGateway id="review_join"/>', '<bpmn:endEvent id="end"/>',
        flow("start", "fork"), flow("fork", "finance"), flow("fork", "risk"), flow("finance", "review_join"),
        flow("risk", "review_join"), flow("review_join", "end")])
    (tmp_path / "review.layerflow.yaml").write_text(f"review_join:\n  conflictPolicy:\n{policy}", encoding="utf-8")
    return path


MISSPELT_RULE = "    rules:\n      - key: aproval_status\n        value: pending\n"


def test_a_misspelt_policy_rule_key_is_a_warning_naming_file_line_join_rule_and_the_likely_key(
        tmp_path: Path) -> None:
    from engine.validate import validate_process

    path = _review(tmp_path, MISSPELT_RULE)
    report = validate_process(path)
    assert report.ok  # a warning: the key may come with the start data
    [problem] = [p for p in report.problems if p.code == "policy_key_never_written"]
    assert problem.severity == "warning" and problem.element_id == "review_join"
    assert problem.file == str(tmp_path / "review.layerflow.yaml") and problem.line == 4
    assert problem.field == "conflictPolicy.rules.0.key"
    for part in ("rule 0", "'aproval_status'", "did you mean 'approval_status'", "--data"):
        assert part in problem.message, (part, problem.message)
    # the run is not stopped by it
    engine = Engine()
    assert engine.run(engine.start(load_process(path))).status == "waiting"


@pytest.mark.parametrize("policy", [
    "    rules:\n      - key: approval_status\n        value: pending\n",
    "    rankings: {approval_status: [rejected, approved]}\n",
], ids=["rule", "ranking"])
def test_a_policy_key_the_process_writes_is_no_warning(tmp_path: Path, policy: str) -> None:
    from engine.validate import validate_process

    assert "policy_key_never_written" not in [p.code for p in validate_process(_review(tmp_path, policy)).problems]


def test_a_misspelt_ranking_key_is_named_too(tmp_path: Path) -> None:
    from engine.validate import validate_process

    path = _review(tmp_path, "    rankings: {approval_stauts: [rejected, approved]}\n")
    [problem] = [p for p in validate_process(path).problems if p.code == "policy_key_never_written"]
    assert problem.field == "conflictPolicy.rankings.approval_stauts" and "'approval_status'" in problem.message
