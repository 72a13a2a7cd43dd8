"""Compression in process shapes: a loop that rewrites its keys each pass, preserved keys
declared on one activity and compressed on another, a parallel join after compressions in
both branches, a sub-process, a multi-instance; checked through ``run --json``, ``tape``,
``rollback``, ``replay`` and the Python API."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from context_layers import (CompressTriggerDetector, Layer, LayeredContext, RuleDrivenCompressor, render)
from engine import Engine, load_process
from engine.cli import main

from engine_helpers import EXAMPLES, script_task, write_process

LOOP_BPMN = """<?xml version="1.0" encoding="UTF-8"?>
<bpmn:definitions xmlns:bpmn="http://www.omg.org/spec/BPMN/20100524/MODEL"
    xmlns:xsi="http://www.w3.org/2001/XMLSchema-instance" id="d" targetNamespace="https://layerflow.dev/tests">
  <bpmn:process id="loopc" isExecutable="true">
    <bpmn:startEvent id="start"/>
    <bpmn:scriptTask id="init"><bpmn:script>count = 0
items = []
profile = {"id": "P-1", "tags": ["a", "b"], "nested": {"x": 1}}</bpmn:script></bpmn:scriptTask>
    <bpmn:scriptTask id="work"><bpmn:script>count = count + 1
items = items + ["item number %d with some padding text to grow the context quickly" % count]
note = "pass %d note: " % count + "lorem ipsum dolor sit amet " * 10
token = "T-%d" % count</bpmn:script></bpmn:scriptTask>
    <bpmn:exclusiveGateway id="more" default="f_done"/>
    <bpmn:parallelGateway id="split"/>
    <bpmn:scriptTask id="a"><bpmn:script>a_out = "A " * 50</bpmn:script></bpmn:scriptTask>
    <bpmn:scriptTask id="b"><bpmn:script>b_out = "B " * 50</bpmn:script></bpmn:scriptTask>
    <bpmn:parallelGateway id="join"/>
    <bpmn:scriptTask id="done"><bpmn:script>result = len(items)
seen = token + "/" + profile["id"]</bpmn:script></bpmn:scriptTask>
    <bpmn:endEvent id="end"/>
    <bpmn:sequenceFlow id="f1" sourceRef="start" targetRef="init"/>
    <bpmn:sequenceFlow id="f2" sourceRef="init" targetRef="work"/>
    <bpmn:sequenceFlow id="f3" sourceRef="work" targetRef="more"/>
    <bpmn:sequenceFlow id="f_again" sourceRef="more" targetRef="work"><bpmn:conditionExpression xsi:type="bpmn:tFormalExpression">count &lt; 8</bpmn:conditionExpression></bpmn:sequenceFlow>
    <bpmn:sequenceFlow id="f_done" sourceRef="more" targetRef="split"/>
    <bpmn:sequenceFlow id="s1" sourceRef="split" targetRef="a"/>
    <bpmn:sequenceFlow id="s2" sourceRef="split" targetRef="b"/>
    <bpmn:sequenceFlow id="j1" sourceRef="a" targetRef="join"/>
    <bpmn:sequenceFlow id="j2" sourceRef="b" targetRef="join"/>
    <bpmn:sequenceFlow id="f4" sourceRef="join" targetRef="done"/>
    <bpmn:sequenceFlow id="f5" sourceRef="done" targetRef="end"/>
  </bpmn:process>
</bpmn:definitions>
"""

LOOP_CONFIG = """init:
  preserveKeys: [profile]
work:
  preserveKeys: [token]
  compressTokenThreshold: 300
  compressRules:
    - {pattern: "note*", action: summarize, maxTokens: 3}
    - {pattern: "activity", action: count_only, keepLast: 50}
a:
  compressTokenThreshold: 200
  preserveKeys: [items]
b:
  compressMessageThreshold: 3
  preserveKeys: [items]
"""

PROFILE = {"id": "P-1", "tags": ["a", "b"], "nested": {"x": 1}}


@pytest.fixture
def cli(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("LAYERFLOW_STORE", f"sqlite:///{tmp_path / 'cli.db'}")
    runner = CliRunner()

    def invoke(*args: str) -> Any:
        result = runner.invoke(main, list(args), catch_exceptions=False)
        assert result.exit_code == 0, result.output
        return json.loads(result.stdout)
    return invoke


def loop_process(tmp_path: Path) -> Path:
    path = tmp_path / "loopc.bpmn"
    path.write_text(LOOP_BPMN, encoding="utf-8")
    (tmp_path / "loopc.layerflow.yaml").write_text(LOOP_CONFIG, encoding="utf-8")
    return path


def _token_at(history: dict[str, Any]) -> Any:
    return history.get("token")


def test_loop_keeps_preserved_keys_through_every_compression_join_rollback_and_replay(tmp_path: Path, cli: Any) -> None:
    doc = cli("run", str(loop_process(tmp_path)), "--json")
    assert doc["status"] == "completed", doc["error"]
    work = [c for c in doc["compressions"] if c["activity_id"] == "work"]
    assert len(work) >= 4  # fires again and again in the loop
    assert {c["activity_id"] for c in doc["compressions"]} >= {"work", "a", "b"}
    for c in doc["compressions"]:
        assert c["snapshot_id"] and c["tokens_after"] < c["tokens_before"]
        assert set(c["triggers"]) <= {"token_threshold", "message_threshold", "density", "redundancy", "decay",
                                      "conflict", "toolEfficiency"}
    assert "message_threshold" in next(c for c in doc["compressions"] if c["activity_id"] == "b")["triggers"]
    assert "token_threshold" in next(c for c in doc["compressions"] if c["activity_id"] == "a")["triggers"]
    history = doc["layers"]["L3"]
    assert history["profile"] == PROFILE and history["token"] == "T-8" and history["result"] == 8
    assert history["seen"] == "T-8/P-1"
    # both branches folded the loop's HISTORY: the join keeps one summary of it
    assert len([k for k in history if k.startswith("compaction:")]) == 1
    assert doc["conflicts"] == []
    iid = doc["instance_id"]
    # after every compression of the main context, as replayed from its tape
    tape = cli("tape", iid, "--kind", "compression", "--json")
    events = tape["events"] if isinstance(tape, dict) else tape
    seqs = [e["seq"] for e in events if e.get("context", "main") == "main"]
    assert seqs
    for seq in seqs:
        first = cli("replay", iid, str(seq), "--json")
        again = cli("replay", iid, str(seq), "--json")
        assert first == again
        layers = first["layers"]["L3"]
        assert layers["profile"] == PROFILE
        assert str(layers["token"]).startswith("T-")
    # roll back to a snapshot taken before a compression: the preserved keys are as they were then
    snap = work[3]["snapshot_id"]
    before = cli("replay", iid, str(work[3]["event_seq"] - 1), "--json")["layers"]["L3"]
    back = cli("rollback", iid, snap, "--json")
    assert back["snapshot_id"] == snap
    now = cli("inspect", iid, "--json")
    assert now["layers"]["L3"]["token"] == before["token"]
    assert now["layers"]["L3"]["profile"] == PROFILE


def _run(path: Path, data: dict[str, Any] | None = None) -> Any:
    instance = Engine("memory://").run_process(load_process(path), data or {})
    assert instance.status == "completed", instance.error
    return instance


def test_a_key_a_rule_compressed_away_fails_the_next_step_with_an_error_naming_the_compression(tmp_path: Path) -> None:
    """A rule matching every key (count_only, keepLast 0) runs after ``count`` and removes what it
    wrote; the next step that reads it fails with an error that says which compression removed
    it and what to do, not a bare NameError. A preserved key of another activity survives."""
    tasks = [script_task("prepare", "old_log = 'prepare log line ' * 40\nsecret = {'id': 'S-1', 'inner': {'k': [1, 2]}}"),
             script_task("count", "points = 7\ncount_log = 'count log line ' * 40"),
             script_task("use", "total = points * 2")]
    cfg = ("prepare:\n  preserveKeys: [secret]\n"
           "count:\n  compressMessageThreshold: 2\n  compressRules:\n"
           "    - {pattern: '*', action: count_only, keepLast: 0}\n")
    instance = Engine("memory://").run_process(load_process(write_process(tmp_path, "gone", tasks, cfg)), {})
    assert instance.status == "error"
    message = instance.error["message"]
    assert "NameError" in message and "'points' was removed from HISTORY by the compression after activity 'count'" in message
    assert "preserveKeys" in message and instance.error["task_id"] == "use"
    assert instance.contexts["main"].layer(Layer.HISTORY)["secret"] == {"id": "S-1", "inner": {"k": [1, 2]}}
    # preserved, the key reaches the next step
    cfg2 = cfg.replace("compressMessageThreshold: 2", "preserveKeys: [points]\n  compressMessageThreshold: 2")
    (tmp_path / "gone.layerflow.yaml").write_text(cfg2, encoding="utf-8")
    done = _run(tmp_path / "gone.bpmn")
    assert done.contexts["main"].layer(Layer.HISTORY)["total"] == 14
    assert [c["activity_id"] for c in done.compressions] == ["count"]


def test_a_name_error_unrelated_to_compression_names_no_compression(tmp_path: Path) -> None:
    tasks = [script_task("use", "total = nowhere * 2")]
    instance = Engine("memory://").run_process(load_process(write_process(tmp_path, "plain", tasks, None)), {})
    assert instance.status == "error"
    message = instance.error["message"]
    assert "NameError: name 'nowhere' is not defined; the context holds no key 'nowhere' here" in message
    assert "compress" not in message and "snapshot" not in message, message


def test_compression_in_parallel_branches_of_a_sub_process(tmp_path: Path) -> None:
    text = (EXAMPLES / "subprocess_parallel.bpmn").read_text(encoding="utf-8")
    text = text.replace("base = amount // 1000",
                        'base = amount // 1000\nsecret = {"id": "S-1", "inner": {"k": [1, 2]}}\nfiller = "prep words " * 40')
    text = text.replace("credit_points = base + 5", "credit_points = base + 5\ncredit_log = \"credit log entry \" * 30")
    text = text.replace("fraud_points = base * 2", "fraud_points = base * 2\nfraud_log = \"fraud log entry \" * 30")
    path = tmp_path / "subprocess_parallel.bpmn"
    path.write_text(text, encoding="utf-8")
    (tmp_path / "subprocess_parallel.layerflow.yaml").write_text(
        "prepare:\n  preserveKeys: [secret]\n"
        "credit_check:\n  preserveKeys: [credit_log]\n  compressTokenThreshold: 60\n  compressRules:\n"
        "    - {pattern: '*_log', action: summarize, maxTokens: 2}\n"
        "fraud_check:\n  compressMessageThreshold: 2\n  compressRules:\n"
        "    - {pattern: '*_log', action: count_only, keepLast: 0}\n"
        "score:\n  compressTokenThreshold: 50\n  compressRules:\n    - {pattern: '*', action: summarize, maxTokens: 1}\n",
        encoding="utf-8")
    instance = _run(path, {"amount": 50000})
    history = instance.contexts["main"].layer(Layer.HISTORY)
    assert history["verdict"] == "review"
    assert history["secret"] == {"id": "S-1", "inner": {"k": [1, 2]}}
    assert history["credit_log"] == "credit log entry " * 30
    fired = {c["activity_id"]: c["triggers"] for c in instance.compressions}
    assert "token_threshold" in fired["credit_check"] and "message_threshold" in fired["fraud_check"]


def test_multi_instance_compression_keeps_a_preserved_key_rewritten_by_every_instance(tmp_path: Path) -> None:
    text = (EXAMPLES / "multi_instance_parallel.bpmn").read_text(encoding="utf-8")
    text = text.replace("items = [1, 2, 3]", 'items = [1, 2, 3, 4]\npad = "pad words " * 60')
    text = text.replace("sq = item * item", 'sq = item * item\nkeepme = {"a": {"b": item}}\nlog = "square log " * 30')
    path = tmp_path / "multi_instance_parallel.bpmn"
    path.write_text(text, encoding="utf-8")
    (tmp_path / "multi_instance_parallel.layerflow.yaml").write_text(
        "square:\n  preserveKeys: [keepme, log]\n  compressTokenThreshold: 40\n  compressRules:\n"
        "    - {pattern: '*', action: count_only, keepLast: 99}\n"
        "    - {pattern: 'keep*', action: extract_keys, extractKeys: [zzz]}\n"
        "total:\n  compressTokenThreshold: 20\n  compressRules:\n    - {pattern: '*', action: summarize, maxTokens: 1}\n",
        encoding="utf-8")
    instance = _run(path)
    history = instance.contexts["main"].layer(Layer.HISTORY)
    assert history["result"] == 30
    assert history["log"] == "square log " * 30
    assert history["keepme"]["a"]["b"] in {1, 2, 3, 4}
    assert instance.compressions


def _api_ctx() -> LayeredContext:
    ctx = LayeredContext(system={"policy": "p"})
    for i in range(6):
        ctx.begin_activity(f"t{i}")
        ctx.write(Layer.WORKING, f"tool_call_result_{i}",
                  {"kind": "tool_call_result", "status": "ok", "data": {"id": i, "rows": [{"id": 1}, {"id": 2}]},
                   "blob": "x " * 200}, actor=f"t{i}")
        ctx.write(Layer.WORKING, f"reasoning_{i}", {"kind": "reasoning_chain", "text": "A long sentence about the "
                  "reasoning of the model that goes on and on without any stop at all. " * 3}, actor=f"t{i}")
        ctx.write(Layer.WORKING, "keep", {"a": {"b": [1, 2, {"c": i}]}}, actor=f"t{i}")
        ctx.complete_activity(f"t{i}")
    return ctx


@pytest.mark.parametrize("rule", [
    {"pattern": "tool_call_result", "action": "extract_keys", "extractKeys": ["nope.deep.x", "data.rows.9.id", "status.x"]},
    {"pattern": "reasoning_chain", "action": "summarize", "maxTokens": 1},
    {"pattern": "tool_call_result*", "action": "count_only", "keepLast": 100},
    {"pattern": "*", "action": "count_only", "keepLast": 0},
    {"pattern": "*", "action": "summarize", "maxTokens": 2},
])
def test_api_rules_on_odd_settings_keep_preserved_keys_render_and_replay(rule: dict[str, Any]) -> None:
    ctx = _api_ctx()
    cfg = {"preserveKeys": ["keep", "tool_call_result_0"], "compressTokenThreshold": 50, "compressRules": [rule]}
    kept = {k: json.dumps(ctx.resolve(k), sort_keys=True) for k in cfg["preserveKeys"]}
    assert render(ctx, format="xml") == render(ctx, format="xml")
    decision = CompressTriggerDetector().detect(ctx, cfg)
    result = RuleDrivenCompressor().compress(ctx, cfg)
    assert result.snapshot_id and result.tokens_after < result.tokens_before
    assert list(result.triggers) == list(decision.triggers) and "token_threshold" in result.triggers
    for key, value in kept.items():
        assert json.dumps(ctx.resolve(key), sort_keys=True) == value
    text = "".join(m["content"] for m in render(ctx, format="json"))
    assert "tool_call_result_0" in text and '"c": 5' in text.replace('\\"', '"') or "keep" in text
    assert render(ctx, format="xml") == render(ctx, format="xml")
    replayed = LayeredContext.replay(ctx.tape)
    assert replayed == ctx and render(replayed, format="xml") == render(ctx, format="xml")
    RuleDrivenCompressor().decompress(ctx, result.snapshot_id)
    for key, value in kept.items():
        assert json.dumps(ctx.resolve(key), sort_keys=True) == value


@pytest.mark.parametrize("name", ["density", "redundancy"])
def test_a_configured_attention_threshold_alone_names_only_itself(name: str) -> None:
    ctx = LayeredContext(system={"policy": "p"})
    ctx.begin_activity("a")
    ctx.write(Layer.WORKING, "big", "important words " * 30, actor="a")
    ctx.write(Layer.WORKING, "x1", "alpha beta gamma", actor="a")
    ctx.write(Layer.WORKING, "x2", "alpha beta gamma", actor="a")
    ctx.complete_activity("a")
    cfg = {"preserveKeys": ["big"], "attentionThresholds": {"density": 0.99} if name == "density" else {"redundancy": 0.0}}
    assert CompressTriggerDetector().detect(ctx, cfg).triggers == [name]


def test_a_key_a_branch_compressed_away_before_the_join_is_named_in_the_error(tmp_path: Path) -> None:
    text = (EXAMPLES / "subprocess_parallel.bpmn").read_text(encoding="utf-8")
    path = tmp_path / "subprocess_parallel.bpmn"
    path.write_text(text.replace("fraud_points = base * 2", "fraud_points = base * 2\nfraud_log = 'fraud log entry ' * 30"),
                    encoding="utf-8")
    (tmp_path / "subprocess_parallel.layerflow.yaml").write_text(
        "fraud_check:\n  compressMessageThreshold: 2\n  compressRules:\n    - {pattern: '*', action: count_only, keepLast: 0}\n",
        encoding="utf-8")
    instance = Engine("memory://").run_process(load_process(path), {"amount": 50000})
    assert instance.status == "error" and instance.error["task_id"] == "score"
    message = instance.error["message"]
    assert "'fraud_points' was removed from HISTORY by the compression after activity 'fraud_check' in context" in message


FOLD_JOIN_BPMN = """<?xml version="1.0" encoding="UTF-8"?>
<bpmn:definitions xmlns:bpmn="http://www.omg.org/spec/BPMN/20100524/MODEL" id="d" targetNamespace="https://layerflow.dev/tests">
  <bpmn:process id="foldjoin" isExecutable="true">
    <bpmn:startEvent id="start"/>
    <bpmn:scriptTask id="intake"><bpmn:script>profile = {"id": "P-1", "tags": ["a", "b"]}
intake_notes = "intake notes about the applicant " * 8</bpmn:script></bpmn:scriptTask>
    <bpmn:scriptTask id="research"><bpmn:script>research = "research findings on the market " * 8</bpmn:script></bpmn:scriptTask>
    <bpmn:scriptTask id="rating"><bpmn:script>rating = "rating agency opinion text " * 8</bpmn:script></bpmn:scriptTask>
    <bpmn:parallelGateway id="split"/>
    <bpmn:scriptTask id="credit"><bpmn:script>credit_out = "credit review text " * 6</bpmn:script></bpmn:scriptTask>
    <bpmn:scriptTask id="fraud"><bpmn:script>fraud_out = "fraud review text " * 6</bpmn:script></bpmn:scriptTask>
    <bpmn:parallelGateway id="join"/>
    <bpmn:scriptTask id="done"><bpmn:script>result = profile["id"] + str(len(credit_out) + len(fraud_out))</bpmn:script></bpmn:scriptTask>
    <bpmn:endEvent id="end"/>
    <bpmn:sequenceFlow id="f1" sourceRef="start" targetRef="intake"/>
    <bpmn:sequenceFlow id="f2" sourceRef="intake" targetRef="research"/>
    <bpmn:sequenceFlow id="f3" sourceRef="research" targetRef="rating"/>
    <bpmn:sequenceFlow id="f4" sourceRef="rating" targetRef="split"/>
    <bpmn:sequenceFlow id="s1" sourceRef="split" targetRef="credit"/>
    <bpmn:sequenceFlow id="s2" sourceRef="split" targetRef="fraud"/>
    <bpmn:sequenceFlow id="j1" sourceRef="credit" targetRef="join"/>
    <bpmn:sequenceFlow id="j2" sourceRef="fraud" targetRef="join"/>
    <bpmn:sequenceFlow id="f5" sourceRef="join" targetRef="done"/>
    <bpmn:sequenceFlow id="f6" sourceRef="done" targetRef="end"/>
  </bpmn:process>
</bpmn:definitions>
"""

FOLD_JOIN_CONFIG = """intake:
  preserveKeys: [profile]
credit:
  compressTokenThreshold: 150
fraud:
  compressTokenThreshold: 150
  compressRules:
    - {pattern: "*notes", action: summarize, maxTokens: 4}
"""


def _fold_join(tmp_path: Path) -> Any:
    path = tmp_path / "foldjoin.bpmn"
    path.write_text(FOLD_JOIN_BPMN, encoding="utf-8")
    (tmp_path / "foldjoin.layerflow.yaml").write_text(FOLD_JOIN_CONFIG, encoding="utf-8")
    return _run(path)


def test_both_branches_fold_the_base_history_and_the_join_keeps_one_summary(tmp_path: Path) -> None:
    instance = _fold_join(tmp_path)
    main = instance.contexts["main"]
    [branch_a, branch_b] = [n for n, info in instance.branches.items() if info["gateway"] == "split"]
    split = main.get_snapshot(instance.branches[branch_a]["snapshot_id"])
    base = split.layer(Layer.HISTORY)
    pre_split = [k for k in base if not k.startswith("_")]
    assert {"intake_notes", "research", "rating", "activity:research"} <= set(pre_split)
    for name in (branch_a, branch_b):  # each branch folded the base into a record of its own
        history = instance.contexts[name].layer(Layer.HISTORY)
        assert [k for k in history if k.startswith("compaction:")] == ["compaction:1"]
        assert instance.contexts[name].tokens(Layer.HISTORY) < split.tokens(Layer.HISTORY)
    [join] = [e for e in main.tape if e.data.get("note") == "join"]
    at_join = LayeredContext.replay(main.tape, until=join.seq)
    history = at_join.layer(Layer.HISTORY)
    # one summary of the base, kept once; the base entries it folded are not kept whole beside it
    assert [k for k in history if k.startswith("compaction:")] == ["compaction:1"]
    assert not set(history) & (set(pre_split) - {"profile"})
    assert history["profile"] == {"id": "P-1", "tags": ["a", "b"]}
    assert history["credit_out"] and history["fraud_out"]
    assert [d["key"] for d in join.data["dropped_compactions"]] == ["compaction:1"]
    # the compression's saving survives the join: HISTORY is smaller than at the split, and the
    # second branch's summary of the same base is not there beside the first's
    tokens = at_join.tokens(Layer.HISTORY)
    assert tokens < split.tokens(Layer.HISTORY)
    a, b = (instance.contexts[n] for n in (branch_a, branch_b))
    assert tokens < a.tokens(Layer.HISTORY) + b.tokens(Layer.HISTORY) - b.key_tokens(Layer.HISTORY, "compaction:1")
    assert main.layer(Layer.HISTORY)["result"].startswith("P-1")
    assert LayeredContext.replay(main.tape) == main
    # the same run, the same merged bytes
    again = _fold_join(tmp_path).contexts["main"]
    [join_again] = [e for e in again.tape if e.data.get("note") == "join"]
    assert json.dumps(join.to_dict()["changes"], sort_keys=True) == json.dumps(join_again.to_dict()["changes"],
                                                                              sort_keys=True)


# the flow waits for a person while a non-interrupting event sub-process folds the HISTORY it
# forked with; then the flow folds the same entries, and the event sub-process merges back
ESP_FOLD_BPMN = """<?xml version="1.0" encoding="UTF-8"?>
<bpmn:definitions xmlns:bpmn="http://www.omg.org/spec/BPMN/20100524/MODEL" id="d" targetNamespace="https://layerflow.dev/tests">
  <bpmn:message id="m_docs" name="documents_received"/>
  <bpmn:process id="espfold" isExecutable="true">
    <bpmn:startEvent id="start"/>
    <bpmn:scriptTask id="intake"><bpmn:script>profile = {"id": "P-1", "tags": ["a", "b"]}
intake_notes = "intake notes about the applicant " * 8</bpmn:script></bpmn:scriptTask>
    <bpmn:scriptTask id="research"><bpmn:script>research = "research findings on the market " * 8</bpmn:script></bpmn:scriptTask>
    <bpmn:scriptTask id="rating"><bpmn:script>rating = "rating agency opinion text " * 8</bpmn:script></bpmn:scriptTask>
    <bpmn:userTask id="review"/>
    <bpmn:scriptTask id="wrap"><bpmn:script>wrap_out = "wrap up text " * 6</bpmn:script></bpmn:scriptTask>
    <bpmn:userTask id="final"/>
    <bpmn:endEvent id="end"/>
    <bpmn:sequenceFlow id="f1" sourceRef="start" targetRef="intake"/>
    <bpmn:sequenceFlow id="f2" sourceRef="intake" targetRef="research"/>
    <bpmn:sequenceFlow id="f3" sourceRef="research" targetRef="rating"/>
    <bpmn:sequenceFlow id="f4" sourceRef="rating" targetRef="review"/>
    <bpmn:sequenceFlow id="f5" sourceRef="review" targetRef="wrap"/>
    <bpmn:sequenceFlow id="f6" sourceRef="wrap" targetRef="final"/>
    <bpmn:sequenceFlow id="f7" sourceRef="final" targetRef="end"/>
    <bpmn:subProcess id="on_docs" triggeredByEvent="true">
      <bpmn:startEvent id="docs_start" isInterrupting="false"><bpmn:messageEventDefinition messageRef="m_docs"/></bpmn:startEvent>
      <bpmn:scriptTask id="note_docs"><bpmn:script>docs_note = "documents note text " * 6</bpmn:script></bpmn:scriptTask>
      <bpmn:scriptTask id="more_docs"><bpmn:script>docs_out = "documents review text " * 6</bpmn:script></bpmn:scriptTask>
      <bpmn:userTask id="check_docs"/>
      <bpmn:endEvent id="docs_end"/>
      <bpmn:sequenceFlow id="g1" sourceRef="docs_start" targetRef="note_docs"/>
      <bpmn:sequenceFlow id="g2" sourceRef="note_docs" targetRef="more_docs"/>
      <bpmn:sequenceFlow id="g3" sourceRef="more_docs" targetRef="check_docs"/>
      <bpmn:sequenceFlow id="g4" sourceRef="check_docs" targetRef="docs_end"/>
    </bpmn:subProcess>
  </bpmn:process>
</bpmn:definitions>
"""

ESP_FOLD_CONFIG = """intake:
  preserveKeys: [profile]
wrap:
  compressTokenThreshold: 150
more_docs:
  compressTokenThreshold: 150
"""


def _esp_fold(tmp_path: Path, text: str = ESP_FOLD_BPMN, config: str = ESP_FOLD_CONFIG) -> Any:
    path = tmp_path / "espfold.bpmn"
    path.write_text(text, encoding="utf-8")
    (tmp_path / "espfold.layerflow.yaml").write_text(config, encoding="utf-8")
    engine = Engine("memory://")
    instance = engine.run(engine.start(load_process(path), {}))
    instance = engine.send_event(instance, "documents_received", {"files": ["a"]})
    [side] = [n for n in instance.contexts if n != "main"]
    instance = engine.complete_user_task(engine.load(instance.id), "review", {"ok": True})
    folded = {name: instance.contexts[name].layer(Layer.HISTORY) for name in ("main", side)}
    instance = engine.complete_user_task(engine.load(instance.id), "check_docs", {"checked": True})
    return instance, side, folded


def test_an_event_sub_process_that_folded_what_the_flow_folded_merges_back_with_one_summary(tmp_path: Path) -> None:
    instance, side, folded = _esp_fold(tmp_path)
    assert instance.status == "waiting", instance.error
    for name in ("main", side):  # each folded the HISTORY the event sub-process forked with
        assert [k for k in folded[name] if k.startswith("compaction:")] == ["compaction:1"]
        assert "activity:research" in folded[name]["compaction:1"]["covers"]
    assert "activity:note_docs" in folded[side]["compaction:1"]["covers"] and "docs_note" not in folded[side]
    main = instance.contexts["main"]
    history = main.layer(Layer.HISTORY)
    # the flow's summary alone; the event sub-process's own entries its record folded come back
    assert [k for k in history if k.startswith("compaction:")] == ["compaction:1"]
    assert history["compaction:1"] == folded["main"]["compaction:1"]
    assert not {"intake_notes", "research", "rating"} & set(history)
    assert history["docs_note"] == "documents note text " * 6 and history["docs_out"] and history["checked"] is True
    assert list(history).index("docs_note") < list(history).index("docs_out")
    assert history["profile"] == {"id": "P-1", "tags": ["a", "b"]} and "profile" in main.preserved
    [merge] = [e for e in main.tape if e.data.get("note") == "side_merge"]
    assert merge.data["dropped_compactions"] == ["compaction:1"]
    assert LayeredContext.replay(main.tape) == main
    again, _, _ = _esp_fold(tmp_path)
    [merge_again] = [e for e in again.contexts["main"].tape if e.data.get("note") == "side_merge"]
    assert json.dumps(merge.to_dict()["changes"], sort_keys=True) == json.dumps(merge_again.to_dict()["changes"],
                                                                               sort_keys=True)


# each step leaves a log line too; the flow's and the event sub-process's compressions count them
ESP_COUNT_BPMN = (ESP_FOLD_BPMN
                  .replace('intake_notes = "', 'log_intake = "intake log line " * 20\nintake_notes = "')
                  .replace('research = "', 'log_research = "research log line " * 20\nresearch = "')
                  .replace('wrap_out = "', 'log_wrap = "wrap log line " * 20\nwrap_out = "')
                  .replace('docs_note = "', 'log_docs = "docs log line " * 20\ndocs_note = "'))
ESP_COUNT_CONFIG = ESP_FOLD_CONFIG.replace("compressTokenThreshold: 150", "compressTokenThreshold: 150\n  compressRules:\n"
                                           "    - {pattern: 'log_*', action: count_only, keepLast: 1}")


def test_an_event_sub_process_that_counted_what_the_flow_counted_merges_back_with_one_count(tmp_path: Path) -> None:
    instance, side, folded = _esp_fold(tmp_path, ESP_COUNT_BPMN, ESP_COUNT_CONFIG)
    assert instance.status == "waiting", instance.error
    for name, own in (("main", "log_wrap"), (side, "log_docs")):  # each counted the two base logs
        assert folded[name]["summary:count:log_*"] == {"kind": "count", "_compressed": "count_only",
                                                       "pattern": "log_*", "count": 3, "dropped": 2, "kept": [own]}
    main = instance.contexts["main"]
    history = main.layer(Layer.HISTORY)
    # one counter: the base logs once, what each kept listed
    assert [k for k in history if k.startswith("summary:count:")] == ["summary:count:log_*"]
    assert history["summary:count:log_*"] == {"kind": "count", "_compressed": "count_only", "pattern": "log_*",
                                              "count": 4, "dropped": 2, "kept": ["log_wrap", "log_docs"]}
    assert [k for k in history if k.startswith("log_")] == ["log_wrap", "log_docs"]
    assert [k for k in history if k.startswith("compaction:")] == ["compaction:1"]
    assert history["profile"] == {"id": "P-1", "tags": ["a", "b"]} and "profile" in main.preserved
    assert LayeredContext.replay(main.tape) == main


COUNT_TWO_LOGS = "\n  compressRules:\n    - {pattern: 'log_*', action: count_only, keepLast: 2}"


@pytest.mark.parametrize(("counter_in", "record"), [
    # the event sub-process counts and keeps a base log verbatim, which the flow's fold took: the
    # counter names it as folded, not as kept, and still counts it
    ("more_docs", {"kind": "count", "_compressed": "count_only", "pattern": "log_*", "count": 3, "dropped": 1,
                   "kept": ["log_docs"], "folded": ["log_research"]}),
    # the flow counts and keeps it; the event sub-process's fold of it is dropped (the flow's
    # summary covers the same entries), so it comes back: kept it is
    ("wrap", {"kind": "count", "_compressed": "count_only", "pattern": "log_*", "count": 3, "dropped": 1,
              "kept": ["log_research", "log_wrap"]}),
])
def test_an_event_sub_process_merging_back_leaves_a_counter_that_lists_as_kept_only_what_history_holds(
        tmp_path: Path, counter_in: str, record: dict[str, Any]) -> None:
    at = f"{counter_in}:\n  compressTokenThreshold: 150"
    instance, side, folded = _esp_fold(tmp_path, ESP_COUNT_BPMN, ESP_FOLD_CONFIG.replace(at, at + COUNT_TWO_LOGS))
    assert instance.status == "waiting", instance.error
    counting = side if counter_in == "more_docs" else "main"
    assert folded[counting]["summary:count:log_*"]["kept"][0] == "log_research"
    main = instance.contexts["main"]
    history = main.layer(Layer.HISTORY)
    assert history["summary:count:log_*"] == record
    assert [k for k in record["kept"] if k in history] == record["kept"]
    assert not set(record.get("folded", ())) & set(history)
    assert [k for k in history if k.startswith("compaction:")] == ["compaction:1"]
    assert LayeredContext.replay(main.tape) == main
