"""Configuration drives behaviour as DESIGN.md and the README document it, checked on
processes written here (not the examples), run through ``load_process`` / ``Engine`` and
the CLI: merge strategies and reducers at AND and inclusive joins, policy rules before
rankings, human_confirm timeouts, contextInject, preserveKeys across compressions and a
reload, compression rules and triggers, evaluate/decompress, knowledge retrieval, the
``system:`` mapping, ``data_layers``, and what ``layerflow validate`` rejects."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from context_layers import (AttentionScore, CompressTriggerDetector, Layer, LayeredContext, RuleDrivenCompressor)
from context_layers.config import config_from_dict
from context_layers.tokens import count_text
from engine import Engine, load_process
from governance_bpmn import USER, chain, cli, data_keys, fork, write

# A quiet attention config: no score fires (each test opens the one it checks).
QUIET = {"density": 0, "redundancy": 1, "decay": 0, "conflict": 1, "toolEfficiency": 0}


def para(i: int, lines: int = 15) -> str:
    return " ".join(f"paragraph {i} line {j} describes item {i * 100 + j} of the ledger." for j in range(lines))


def run(tmp_path: Path, xml: str, yaml_text: str | None = None, data: dict[str, Any] | None = None,
        **engine_kw: Any) -> Any:
    bpmn = write(tmp_path, "proc", xml, yaml_text)
    engine = Engine("memory://", **engine_kw)
    return engine, engine.run(engine.start(load_process(bpmn), data or {}))


# ----- joins: strategies, reducers, deletions ----------------------------------------------------------

PREPARE = ('cfg = {"a": {"x": 1, "y": [1, 2]}, "b": 2}\ntags = ["base"]\nscore = 5\nstatus = "open"\n'
           'tmp = 1\nnote = "n"')
THREE = [("b1", 'cfg = {"a": {"x": 2, "y": [1, 2]}, "b": 2}\ntags = tags + ["one"]\nscore = 7\nstatus = "approved"'),
         ("b2", 'cfg = {"a": {"x": 3, "y": [1, 2]}, "b": 2}\ntags = tags + ["two"]\nscore = 9\ndel tmp'),
         ("b3", 'status = "rejected"\ntags = tags + ["one"]\nscore = 3\nnote = "n"')]
CONFLICTING = {"cfg": {"b1", "b2"}, "score": {"b1", "b2", "b3"}, "status": {"b1", "b3"}, "tags": {"b1", "b2", "b3"}}


def test_merge_with_conflict_detect_offline_asks_people_for_every_conflicting_key(tmp_path: Path) -> None:
    rc, doc, err = cli("run", str(write(tmp_path, "m", fork("m", PREPARE, THREE))), "--json", "--store", "memory://")
    assert rc == 3, err
    assert doc["status"] == "waiting"
    assert {c["key"]: set(c["values"]) for c in doc["conflicts"]} == CONFLICTING
    assert all(c["gateway_id"] == "join" and c["resolution"] is None for c in doc["conflicts"])
    nested = next(c for c in doc["conflicts"] if c["key"] == "cfg")
    assert nested["base_value"] == {"a": {"x": 1, "y": [1, 2]}, "b": 2}
    assert {w["id"] for w in doc["waiting_for"]} == {f"join/{k}" for k in CONFLICTING}


@pytest.mark.parametrize("strategy, extra, expected", [
    ("LAST_WRITER_WINS", {}, {"cfg": {"a": {"x": 3, "y": [1, 2]}, "b": 2}, "score": 3, "status": "rejected",
                              "tags": ["base", "one"]}),
    ("BRANCH_PRIORITY", {"branchPriority": ["b3", "b1", "b2"]},
     {"cfg": {"a": {"x": 2, "y": [1, 2]}, "b": 2}, "score": 3, "status": "rejected", "tags": ["base", "one"]}),
])
def test_strategies_resolve_every_conflict_with_the_strategy(tmp_path: Path, strategy: str, extra: dict[str, Any],
                                                              expected: dict[str, Any]) -> None:
    _, inst = run(tmp_path, fork("m", PREPARE, THREE, configs={"join": {"mergeStrategy": strategy, **extra}}))
    assert inst.status == "completed"
    history = data_keys(dict(inst.main.layer(Layer.HISTORY)))
    for key, value in expected.items():
        assert history[key] == value
    assert "tmp" not in history and history["note"] == "n"     # deleted by one branch; rewritten unchanged
    assert {c["key"] for c in inst.conflicts} == set(CONFLICTING)
    assert all(c["resolution"]["resolver"] == "strategy" and strategy in c["resolution"]["reason"]
               for c in inst.conflicts)


def test_fail_on_conflict_names_every_conflict(tmp_path: Path) -> None:
    _, inst = run(tmp_path, fork("m", PREPARE, THREE, configs={"join": {"mergeStrategy": "FAIL_ON_CONFLICT"}}))
    assert inst.status == "error" and inst.error["kind"] == "merge_conflict" and inst.error["task_id"] == "join"
    for key in CONFLICTING:
        assert repr(key) in inst.error["message"]


REDUCE_PREPARE = 'tags = ["base"]\nscore = 5\nhi = 5\nlo = 5\nlog = ["start"]'
REDUCE_BRANCHES = [("b1", 'tags = tags + ["one"]\nscore = score + 2\nhi = 7\nlo = 4\nlog = log + ["b1"]'),
                   ("b2", 'tags = tags + ["two"]\nscore = score + 4\nhi = 9\nlo = 2\nlog = log + ["b2"]'),
                   ("b3", 'tags = tags + ["one"]\nscore = score - 1\nhi = 6\nlo = 3\nlog = log + ["b3"]')]


@pytest.mark.parametrize("kind, conditions, expected", [
    ("parallel", None, {"tags": ["base", "one", "two"], "score": 10, "hi": 9, "lo": 2, "log": ["start", "b1", "b2", "b3"]}),
    ("inclusive", {"b1": "score > 0", "b2": "score > 100", "b3": "score > 0"},
     {"tags": ["base", "one"], "score": 6, "hi": 7, "lo": 3, "log": ["start", "b1", "b3"]}),
])
def test_reducers_at_and_and_inclusive_joins(tmp_path: Path, kind: str, conditions: dict[str, str] | None,
                                             expected: dict[str, Any]) -> None:
    join = {"mergeStrategy": "FAIL_ON_CONFLICT",
            "reducers": {"tags": "union", "score": "sum", "hi": "max", "lo": "min", "log": "append"}}
    _, inst = run(tmp_path, fork("r", REDUCE_PREPARE, REDUCE_BRANCHES, kind=kind, conditions=conditions,
                                 configs={"join": join}))
    assert inst.status == "completed", inst.error
    assert {k: v for k, v in data_keys(dict(inst.main.layer(Layer.HISTORY))).items() if k in expected} == expected
    assert inst.conflicts == []


def test_deletions_at_a_two_branch_join(tmp_path: Path) -> None:
    branches = [("b1", 'del a\ndel b\nc = {"x": [1, 2, 3]}\ne = 5'), ("b2", "b = 20\ndel c\ndel d\ne = 6\ndel a")]
    join = {"mergeStrategy": "BRANCH_PRIORITY", "branchPriority": ["b1", "b2"]}
    _, inst = run(tmp_path, fork("d", 'a = 1\nb = 2\nc = {"x": [1, 2]}\nd = 4\ne = 5', branches,
                                 configs={"join": join}))
    history = data_keys(dict(inst.main.layer(Layer.HISTORY)))
    # a: deleted by both (same change); d: deleted by one; e: b1 rewrote the base value
    assert history == {"c": {"x": [1, 2, 3]}, "e": 6, "done": True}
    assert sorted(c["key"] for c in inst.conflicts) == ["b", "c"]   # a delete against a change is a conflict


# ----- resolution: policy rules, rankings, people -----------------------------------------------------

POLICY_PREPARE = 'amount = 200000\nrisk = "high"\ndecision = "pending"\nlevel = 1'
POLICY_BRANCHES = [("fin", 'decision = "approve"\nlevel = 2'), ("rsk", 'decision = "reject"\nlevel = 3')]


@pytest.mark.parametrize("when, expected", [
    ('risk == "high" and amount > 100000', ("escalate", "big and risky")),
    ('risk == "high" and amount > 900000', ("approve", None)),
])
def test_policy_rules_come_before_rankings(tmp_path: Path, when: str, expected: tuple[str, str | None]) -> None:
    join = {"conflictPolicy": {"rules": [{"key": "decision", "when": when, "value": "escalate",
                                          "reason": "big and risky"}],
                               "rankings": {"decision": ["approve", "reject"], "level": [3, 2]}}}
    _, inst = run(tmp_path, fork("p", POLICY_PREPARE, POLICY_BRANCHES, configs={"join": join}))
    assert inst.status == "completed"
    resolved = {c["key"]: c["resolution"] for c in inst.conflicts}
    assert resolved["decision"]["value"] == expected[0] and resolved["decision"]["resolver"] == "policy"
    if expected[1]:
        assert resolved["decision"]["reason"] == expected[1]
    assert resolved["level"]["value"] == 3
    assert inst.main.resolve("decision") == expected[0]


def test_human_confirm_takes_the_default_when_the_timeout_passes(tmp_path: Path) -> None:
    now = [1000.0]
    join = {"conflictPolicy": {"rules": [{"key": "decision", "when": 'risk == "high"', "value": "escalate",
                                          "reason": "risky", "confirm": True}]},
            "humanConfirm": {"timeout": 60, "default": "reject"}}
    branches = [("fin", 'decision = "approve"'), ("rsk", 'decision = "reject"')]
    engine, inst = run(tmp_path, fork("h", POLICY_PREPARE, branches, configs={"join": join}), clock=lambda: now[0])
    assert inst.status == "waiting" and [w["id"] for w in inst.waiting_for] == ["join/decision"]
    asked = inst.confirmations[0]
    assert asked["timeout"] == 60 and asked["default"] == "reject"
    assert "escalate" in [o["value"] for o in asked["options"]]
    now[0] += 59
    assert engine.resume(engine.load(inst.id)).status == "waiting"
    now[0] += 2
    inst = engine.resume(engine.load(inst.id))
    assert inst.status == "completed"
    assert inst.main.resolve("decision") == "reject"
    assert inst.to_document()["confirmations"][0]["timed_out"] is True


# ----- branches: contextInject -----------------------------------------------------------------------

@pytest.mark.parametrize("kind, conditions, ran", [
    ("parallel", None, {"b1", "b2", "b3"}),
    ("inclusive", {"b1": "amount > 10", "b2": "amount > 1000", "b3": "amount > 10"}, {"b1", "b3"}),
])
def test_context_inject_reaches_each_branch(tmp_path: Path, kind: str, conditions: dict[str, str] | None,
                                            ran: set[str]) -> None:
    split = {"branches": [{"id": "b1", "contextInject": {"track": "fast", "flags": {"fast": True}}},
                          {"id": "b2", "contextInject": {"track": "full"}},
                          {"id": "b3", "contextInject": {"track": "audit"}}]}
    branches = [(b, f"seen_{b} = [track, _branch_id, _snapshot_id is not None]") for b in ("b1", "b2", "b3")]
    _, inst = run(tmp_path, fork("i", "amount = 100", branches, kind=kind, conditions=conditions,
                                 configs={"split": split}), )
    assert inst.status == "completed", inst.error
    history = dict(inst.main.layer(Layer.HISTORY))
    tracks = {"b1": "fast", "b2": "full", "b3": "audit"}
    assert {k for k in history if k.startswith("seen_")} == {f"seen_{b}" for b in ran}
    for b in ran:
        assert history[f"seen_{b}"] == [tracks[b], b, True]


# ----- compression -----------------------------------------------------------------------------------

LONG = " ".join(f"word{i} clause number {i} explains the reasoning of the reviewer in detail." for i in range(60))
RULES = [{"pattern": "tool_call_result", "action": "extract_keys", "extractKeys": ["status", "data.id", "data.summary"]},
         {"pattern": "reasoning_chain", "action": "summarize", "maxTokens": 40},
         {"pattern": "error_retry_log", "action": "count_only", "keepLast": 1}]
RULE_STEPS = [
    ("a1", 'risk_level = "medium"\nassessment = {"id": "RA-1", "factors": ["new", "cross"]}\n'
           f'search1 = {{"kind": "tool_call_result", "status": "ok", "data": {{"id": "X1", "summary": "short", '
           f'"blob": "{LONG}"}}, "extra": "{LONG[:300]}"}}'),
    ("a2", f'thoughts = {{"kind": "reasoning_chain", "text": "{LONG}"}}'),
    ("a3", 'r1 = {"kind": "error_retry_log", "attempt": 1, "err": "timeout talking to bureau"}\n'
           'r2 = {"kind": "error_retry_log", "attempt": 2, "err": "timeout again"}\n'
           'r3 = {"kind": "error_retry_log", "attempt": 3, "err": "connection reset"}'),
    ("decide", 'decision = "ok"'),
]


def test_compress_rules_through_the_cli(tmp_path: Path) -> None:
    cfg = {"preserveKeys": ["risk_level", "assessment"], "compressTokenThreshold": 1500,
           "attentionThresholds": QUIET, "compressRules": RULES}
    bpmn = write(tmp_path, "c", chain("c", RULE_STEPS, {"decide": cfg}))
    rc, doc, err = cli("run", str(bpmn), "--json", "--store", "memory://")
    assert rc == 0, err
    [entry] = doc["compressions"]
    assert entry["activity_id"] == "decide" and entry["triggers"] == ["token_threshold"]
    assert isinstance(entry["snapshot_id"], str) and entry["tokens_after"] < 1500 / 2 < entry["tokens_before"]
    history = doc["layers"]["L3"]
    assert history["risk_level"] == "medium"
    assert history["assessment"] == {"id": "RA-1", "factors": ["new", "cross"]}
    assert history["search1"] == {"kind": "tool_call_result", "_compressed": "extract_keys", "status": "ok",
                                  "data": {"id": "X1", "summary": "short"}}
    assert history["thoughts"]["_compressed"] == "summarize"
    assert 0 < count_text(history["thoughts"]["summary"]) <= 40
    assert "r1" not in history and "r2" not in history and history["r3"]["attempt"] == 3
    assert history["summary:count:error_retry_log"]["count"] == 3


def test_evaluate_and_decompress_a_compression_of_a_run(tmp_path: Path) -> None:
    cfg = {"preserveKeys": ["risk_level", "assessment"], "compressTokenThreshold": 1500,
           "attentionThresholds": QUIET, "compressRules": RULES}
    bpmn = write(tmp_path, "c", chain("c", RULE_STEPS, {"decide": cfg}))
    process = load_process(bpmn)
    engine = Engine("memory://")
    inst = engine.run(engine.start(process, {}))
    snapshot_id = inst.compressions[0]["snapshot_id"]
    compressor = RuleDrivenCompressor()
    report = compressor.evaluate(inst.main, snapshot_id, process.config("decide"))
    assert report.preserved_intact and report.tokens_after < report.tokens_before
    assert set(report.checked_preserved) == {"risk_level", "assessment"}
    tape_length = len(inst.main.tape)
    undone = compressor.decompress(inst.main, snapshot_id)
    assert undone.tokens_after == report.tokens_before and len(inst.main.tape) > tape_length
    assert "_compressed" not in inst.main.layer(Layer.HISTORY)["search1"]
    assert LayeredContext.replay(inst.main.tape) == inst.main


def test_preserved_keys_survive_several_compressions_and_a_reload(tmp_path: Path) -> None:
    text = " ".join(f"sentence {i} about the customer file and its many details." for i in range(40))
    kept = {"kind": "reasoning_chain", "text": text, "nested": {"a": [1, 2, {"b": text[:200]}]}}
    greedy = {"compressTokenThreshold": 400, "compressRules": [
        {"pattern": "*", "action": "summarize", "maxTokens": 10},
        {"pattern": "reasoning_chain", "action": "count_only", "keepLast": 0},
        {"pattern": "*", "action": "extract_keys", "extractKeys": ["text"]}]}
    steps: list[tuple[str, Any]] = [("a0", f"keep = {json.dumps(kept)}\nkeep2 = {json.dumps(text[:400])}")]
    configs = {"a0": {"preserveKeys": ["keep", "keep2"]}}
    for i in range(1, 7):
        steps.append((f"w{i}", f'note{i} = {{"kind": "reasoning_chain", "text": "{text} {i}"}}'))
        configs[f"w{i}"] = greedy
        if i == 3:
            steps.append(("pause", USER))
    process = load_process(write(tmp_path, "p", chain("p", steps, configs)))
    store = f"sqlite:///{tmp_path / 'runs.db'}"
    first = Engine(store)
    inst = first.run(first.start(process, {}))
    assert inst.status == "waiting" and len(inst.compressions) >= 2
    second = Engine(store)
    inst = second.complete_user_task(second.load(inst.id), "pause", {})
    inst = second.run(inst) if inst.status == "running" else inst
    assert inst.status == "completed" and len(inst.compressions) >= 5
    assert inst.main.resolve("keep") == kept and inst.main.resolve("keep2") == text[:400]
    assert inst.main.layer(Layer.HISTORY)["keep"] == kept


NEUTRAL_STEPS_TOKENS = [("a1", f'big = "{para(1)}"'), ("a2", "d = 4")]


@pytest.mark.parametrize("name, steps, config, fires", [
    ("token_threshold", NEUTRAL_STEPS_TOKENS, {"compressTokenThreshold": 100}, True),
    ("token_threshold", NEUTRAL_STEPS_TOKENS, {"compressTokenThreshold": 5000}, False),
    ("message_threshold", [(f"a{i}", f'k{i} = {i}\nm{i} = "v{i}"') for i in range(1, 5)],
     {"compressMessageThreshold": 5}, True),
    ("message_threshold", [(f"a{i}", f'k{i} = {i}\nm{i} = "v{i}"') for i in range(1, 5)],
     {"compressMessageThreshold": 12}, False),
    # a few small entries over the threshold: folding them adds a token or two, and the
    # entry count is what the threshold limits
    ("message_threshold", [("a1", "a = 1\nb = 2\nc = 3"), ("a2", "d = 4")], {"compressMessageThreshold": 5}, True),
    ("density", [("a1", f'big = "{para(1)}"\nid_ = "{para(2)[:200]}"'), ("a2", f'big2 = "{para(3)}"'), ("a3", "x = 1")],
     {"preserveKeys": ["id_"], "attentionThresholds": {**QUIET, "density": 0.15}}, True),
    ("density", [("a1", f'big = "{para(1)}"\nid_ = "{para(2)[:200]}"'), ("a2", f'big2 = "{para(3)}"'), ("a3", "x = 1")],
     {"preserveKeys": ["id_"], "attentionThresholds": {**QUIET, "density": 0.05}}, False),
    ("redundancy", [("a1", f'n1 = "{para(3)}"'), ("a2", f'n2 = "{para(3)} again"'), ("a3", f'n3 = "{para(5)}"'),
                    ("a4", "x = 1")], {"attentionThresholds": {**QUIET, "redundancy": 0.1}}, True),
    ("redundancy", [("a1", f'n1 = "{para(3)}"'), ("a2", f'n2 = "{para(3)} again"'), ("a3", f'n3 = "{para(5)}"'),
                    ("a4", "x = 1")], {"attentionThresholds": {**QUIET, "redundancy": 0.9}}, False),
    ("decay", [*((f"a{i}", f'v{i} = "{para(i)}"') for i in range(1, 5)), ("a5", "x = 1"), ("a6", "y = 2"),
               ("a7", "z = 3")], {"attentionThresholds": {**QUIET, "decay": 0.6}}, True),
    ("decay", [*((f"a{i}", f'v{i} = "{para(i)}"') for i in range(1, 5)), ("a5", "x = 1"), ("a6", "y = 2"),
               ("a7", "z = 3")], {"attentionThresholds": {**QUIET, "decay": 0.0001}}, False),
    ("toolEfficiency", [("a1", 't1 = {"kind": "tool_call_result", "tool": "search", "status": "error", "error": "'
                         + para(1) + '"}\nt2 = {"kind": "tool_call_result", "tool": "search", "data": {}}\n'
                         't3 = {"kind": "tool_call_result", "tool": "search", "data": {"hits": [1]}}'), ("a2", "x = 1")],
     {"attentionThresholds": {**QUIET, "toolEfficiency": 0.5}}, True),
    ("toolEfficiency", [("a1", 't1 = {"kind": "tool_call_result", "tool": "search", "status": "error", "error": "'
                         + para(1) + '"}\nt2 = {"kind": "tool_call_result", "tool": "search", "data": {}}\n'
                         't3 = {"kind": "tool_call_result", "tool": "search", "data": {"hits": [1]}}'), ("a2", "x = 1")],
     {"attentionThresholds": {**QUIET, "toolEfficiency": 0.2}}, False),
])
def test_each_trigger_fires_and_stays_quiet_as_configured(tmp_path: Path, name: str, steps: list[tuple[str, str]],
                                                          config: dict[str, Any], fires: bool) -> None:
    config = {"attentionThresholds": QUIET, **config}
    last = steps[-1][0]
    rc, doc, err = cli("run", str(write(tmp_path, "t", chain("t", steps, {last: config}))), "--json",
                       "--store", "memory://")
    assert rc == 0, err
    if not fires:
        assert doc["compressions"] == []
        return
    [entry] = doc["compressions"]
    assert entry["activity_id"] == last and entry["triggers"] == [name]
    assert isinstance(entry["snapshot_id"], str) and isinstance(entry["tokens_before"], int)
    if name == "message_threshold":
        entries = [k for k in doc["layers"]["L3"]]
        assert len(entries) <= config["compressMessageThreshold"]
    else:
        assert entry["tokens_after"] < entry["tokens_before"]


@pytest.mark.parametrize("threshold, fires", [(0.05, True), (0.2, False)])
def test_conflict_trigger_on_unresolved_merged_conflicts(threshold: float, fires: bool) -> None:
    ctx = LayeredContext(system={})
    ctx.begin_activity("a1")
    for key in "abcdefghij":
        ctx.write(Layer.WORKING, key, 1, actor="a1")
    ctx.complete_activity("a1")
    ctx.begin_activity("a2")
    ctx.write(Layer.WORKING, "_mergedConflicts", [{"key": "b", "baseValue": 1, "conflictingValues": [2, 3],
                                                   "resolution": None}], actor="a2")
    assert AttentionScore.compute(ctx).conflict == pytest.approx(0.1)
    decision = CompressTriggerDetector().detect(ctx, config_from_dict({"attentionThresholds": {"conflict": threshold}}))
    assert ("conflict" in decision.triggers) is fires


# ----- knowledge ---------------------------------------------------------------------------------------

FAQ = ("# Returns\n\nCustomers may return hardware within 30 days of delivery with the original receipt.\n\n"
       "# Warranty\n\nLaptops carry a two year warranty covering battery defects and screen failures.\n")


@pytest.mark.parametrize("threshold, kept", [(0.0, 2), (0.5, 2), (0.6, 0)])
def test_knowledge_hits_and_confidence_threshold(tmp_path: Path, threshold: float, kept: int) -> None:
    (tmp_path / "knowledge" / "faq").mkdir(parents=True)
    (tmp_path / "knowledge" / "faq" / "returns.md").write_text(FAQ)
    cfg = {"knowledgeConfig": {"ragCollections": ["faq"], "query": "warranty returns", "confidenceThreshold": threshold}}
    _, inst = run(tmp_path, chain("k", [("prep", "x = 1"), ("lookup", "y = 2")], {"lookup": cfg}))
    hits = dict(inst.main.layer(Layer.KNOWLEDGE))
    assert len(hits) == kept
    for value in hits.values():
        assert value["collection"] == "faq" and value["source"].startswith("faq/returns.md")
        assert value["confidence"] >= threshold


# ----- system: and data_layers ---------------------------------------------------------------------------

SYSTEM_YAML = """system:
  policy: two reviews above 100
  limits: {max: 5}
data_layers:
  notes: WORKING
  facts: KNOWLEDGE
  prior: HISTORY
"""


def test_system_is_frozen_at_start_and_data_goes_to_its_layers(tmp_path: Path) -> None:
    steps = [("a1", 'seen = [policy, limits["max"], notes, amount]'), ("pause", USER), ("a2", 'seen2 = [policy, limits["max"]]')]
    bpmn = write(tmp_path, "s", chain("s", steps), SYSTEM_YAML)
    (tmp_path / "data.json").write_text(json.dumps({"amount": 7, "notes": "draft", "facts": {"x": 1}, "prior": [1]}))
    store = f"sqlite:///{tmp_path / 'runs.db'}"
    rc, doc, err = cli("run", str(bpmn), "--json", "--store", store, "--data", str(tmp_path / "data.json"))
    assert rc == 3, err
    assert doc["layers"]["L0"] == {"policy": "two reviews above 100", "limits": {"max": 5}}
    assert doc["layers"]["L1"] == {"amount": 7}
    assert doc["layers"]["L2"] == {"facts": {"x": 1}}
    assert doc["layers"]["L3"]["prior"] == [1] and doc["layers"]["L3"]["notes"] == "draft"
    assert doc["layers"]["L3"]["seen"] == ["two reviews above 100", 5, "draft", 7]
    # the config changes while the instance waits: the instance keeps what it started with
    (tmp_path / "s.layerflow.yaml").write_text(SYSTEM_YAML.replace("two reviews above 100", "CHANGED"))
    (tmp_path / "answers.json").write_text(json.dumps({"user_tasks": {"pause": {}}}))
    rc, doc, err = cli("resume", doc["instance_id"], "--json", "--store", store, "--answers", str(tmp_path / "answers.json"))
    assert rc == 0, err
    assert doc["layers"]["L0"]["policy"] == "two reviews above 100"
    assert doc["layers"]["L3"]["seen2"] == ["two reviews above 100", 5]


@pytest.mark.parametrize("script", ['policy = "hacked"', 'limits["max"] = 99'])
def test_an_activity_cannot_change_system(tmp_path: Path, script: str) -> None:
    bpmn = write(tmp_path, "s", chain("s", [("a1", script)]), SYSTEM_YAML)
    _, inst = Engine("memory://"), None
    engine = Engine("memory://")
    inst = engine.run(engine.start(load_process(bpmn), {}))
    assert inst.status == "error" and inst.error["kind"] == "permission_denied" and inst.error["task_id"] == "a1"
    assert dict(inst.main.layer(Layer.SYSTEM)) == {"policy": "two reviews above 100", "limits": {"max": 5}}


@pytest.mark.parametrize("in_branch", [False, True])
def test_changing_a_start_data_key_says_how_to_map_it_to_working(tmp_path: Path, in_branch: bool) -> None:
    """A counter passed in with the start data and updated by the process (plain SpiffWorkflow runs
    it): refused, since start data goes to append-only PROCESS, with the config line that allows it;
    with that line the same process completes. In a parallel branch too (the start data is on the
    main context's tape, not the branch's)."""
    xml = (fork("c", "x = 1", [("b1", "tries = tries + 1"), ("b2", "y = 2")]) if in_branch
           else chain("c", [("a1", "tries = tries + 1")]))
    bpmn = write(tmp_path, "c", xml)
    engine = Engine("memory://")
    failed = engine.run(engine.start(load_process(bpmn), {"tries": 1}))
    assert failed.status == "error" and failed.error["kind"] == "permission_denied"
    assert ("'tries' came with the instance's start data, which goes to L1 PROCESS" in failed.error["message"]
            and "data_layers: {tries: WORKING}" in failed.error["message"]), failed.error["message"]
    # a key an activity itself put in PROCESS gets no such advice
    other = write(tmp_path, "d", chain("d", [("a0", 'ctx.write("PROCESS", "z", 1)'), ("a1", "z = 2")]))
    own = engine.run(engine.start(load_process(other), {"tries": 1}))
    assert own.status == "error" and own.error["task_id"] == "a1", own.error
    assert "PROCESS is append-only" in own.error["message"] and "data_layers" not in own.error["message"]
    (tmp_path / "c.layerflow.yaml").write_text("data_layers:\n  tries: WORKING\n")
    done = engine.run(engine.start(load_process(bpmn), {"tries": 1}))
    assert done.status == "completed", done.error
    assert done.context.resolve("tries") == 2


# ----- layerflow validate --------------------------------------------------------------------------------

def test_validate_names_file_id_and_field_of_every_problem(tmp_path: Path) -> None:
    bpmn = write(tmp_path, "v", fork("v", "x = 1", [("b1", "y = 1"), ("b2", "z = 1")]), """
lookupp:
  preserveKeys: [a]
b1:
  knowledgeConfig: {ragCollections: [faq], confidenceThreshold: 1.5}
  compressRules:
    - {pattern: x, action: squash}
join:
  mergeStrategy: FIRST_WINS
  reducers: {a: avg}
  attentionThresholds: {densty: 0.1}
split:
  branches: [{id: zz, contextInject: {t: 1}}]
""")
    rc, doc, err = cli("validate", str(bpmn), "--json")
    assert rc == 2, err
    found = {(p["element_id"], p["field"]) for p in doc["problems"] if p["severity"] == "error"}
    assert found == {("lookupp", None), ("b1", "knowledgeConfig.confidenceThreshold"),
                     ("b1", "compressRules.0.action"), ("join", "mergeStrategy"), ("join", "reducers.a"),
                     ("join", "attentionThresholds.densty"), ("split", "branches.0.id")}
    assert all(Path(p["file"]).name == "v.layerflow.yaml" and p["line"] for p in doc["problems"])


def test_validate_warns_about_join_settings_where_no_join_reads_them(tmp_path: Path) -> None:
    bpmn = write(tmp_path, "j", fork("j", "x = 1", [("b1", "y = 1"), ("b2", "z = 1")]), """
split:
  mergeStrategy: FAIL_ON_CONFLICT
prepare:
  reducers: {tags: union}
  conflictPolicy: {rankings: {x: [1, 2]}}
  mergeStrategy: MERGE_WITH_CONFLICT_DETECT    # the default, as the seed writes it on an activity
join:
  mergeStrategy: LAST_WRITER_WINS
  reducers: {score: sum}
""")
    rc, doc, err = cli("validate", str(bpmn), "--json")
    assert rc == 0, err    # warnings: the process still runs
    warned = {(p["element_id"], p["field"]) for p in doc["problems"]
              if p["code"] == "join_config_on_non_join" and p["severity"] == "warning"}
    assert warned == {("split", "mergeStrategy"), ("prepare", "reducers"), ("prepare", "conflictPolicy")}
    message = next(p["message"] for p in doc["problems"] if p["element_id"] == "split")
    assert "'join'" in message


def test_a_knowledge_collection_that_is_not_there_is_reported(tmp_path: Path) -> None:
    (tmp_path / "knowledge" / "faq").mkdir(parents=True)
    (tmp_path / "knowledge" / "faq" / "returns.md").write_text(FAQ)
    cfg = {"knowledgeConfig": {"ragCollections": ["faq", "fqa"], "query": "warranty"}}
    bpmn = write(tmp_path, "k", chain("k", [("prep", "x = 1"), ("lookup", "y = 2")], {"lookup": cfg}))
    rc, doc, err = cli("validate", str(bpmn), "--json")
    assert rc == 0, err
    [problem] = [p for p in doc["problems"] if p["code"] == "knowledge_collection_not_found"]
    assert problem["element_id"] == "lookup" and problem["field"] == "knowledgeConfig.ragCollections.1"
    assert problem["severity"] == "warning" and "'fqa'" in problem["message"] and "'faq'" in problem["message"]
    engine = Engine("memory://")
    inst = engine.run(engine.start(load_process(bpmn), {}))
    [event] = [e for e in inst.main.tape if e.data.get("note") == "retrieval"]
    assert event.data["missing"] == ["fqa"] and event.data["kept"] == 1


@pytest.mark.parametrize("prepare, branches, reducer, words", [
    ('s = "a"', [("b1", 's = "ab"'), ("b2", 's = "ac"')], {"s": "sum"}, ["'sum'", "'s'", "(string)", "not a number"]),
    ('d = {"a": 1}', [("b1", 'd = {"a": 2}'), ("b2", 'd = {"a": 3}')], {"d": "max"}, ["'max'", "'d'", "(object)"]),
    ("u = 1", [("b1", "u = 2"), ("b2", "u = 3")], {"u": "union"}, ["'union'", "'u'", "(number)", "not a list"]),
    ("l = [1]", [("b1", "l = l + [2]"), ("b2", "del l")], {"l": "append"}, ["'append'", "'l'", "deleted"]),
])
def test_a_reducer_that_cannot_combine_stops_the_join_with_key_and_json_type(
        tmp_path: Path, prepare: str, branches: list[tuple[str, str]], reducer: dict[str, str], words: list[str]) -> None:
    _, inst = run(tmp_path, fork("r", prepare, branches, configs={"join": {"reducers": reducer}}))
    assert inst.status == "error" and inst.error["task_id"] == "join"
    for word in words:
        assert word in inst.error["message"]
    assert "FrozenDict" not in inst.error["message"]


REDUNDANT_STEPS = [("a1", f'n1 = "{para(3)}"'), ("a2", f'n2 = "{para(3)} again"'), ("a3", f'n3 = "{para(5)}"'),
                   ("a4", "x = 1")]


@pytest.mark.parametrize("config, fires", [
    # written out, a threshold fires as written, whatever compressTokenThreshold says
    ({"compressTokenThreshold": 4000, "attentionThresholds": {**QUIET, "redundancy": 0.1}}, True),
    ({"contextStrategy": {"compressTokenThreshold": 4000, "attentionThresholds": {"redundancy": 0.1}}}, True),
    # DESIGN.md's defaults wait until the context reaches the cliff target (ratio x threshold)
    ({"compressTokenThreshold": 4000}, False),
])
def test_written_attention_thresholds_fire_beside_a_token_threshold(tmp_path: Path, config: dict[str, Any],
                                                                    fires: bool) -> None:
    _, inst = run(tmp_path, chain("r", REDUNDANT_STEPS, {"a4": config}))
    assert inst.status == "completed"
    assert [c["triggers"] for c in inst.compressions] == ([["redundancy"]] if fires else [])
    if fires:
        assert "n1" not in inst.main.layer(Layer.HISTORY) and "n2" in inst.main.layer(Layer.HISTORY)


@pytest.mark.parametrize("kind, conditions", [
    ("parallel", None), ("inclusive", {"b1": "x > 0", "b2": "x > 0", "b3": "x > 100"})])
def test_keys_preserved_in_a_branch_stay_preserved_after_the_join(tmp_path: Path, kind: str,
                                                                  conditions: dict[str, str] | None) -> None:
    text = " ".join(f"sentence {i} about the customer file and its many details." for i in range(40))
    greedy = {"compressTokenThreshold": 200, "compressRules": [{"pattern": "*", "action": "summarize", "maxTokens": 10}]}
    branches = [("b1", f'big1 = {{"kind": "reasoning_chain", "text": "{text}"}}'), ("b2", f"big2 = {json.dumps(text)}"),
                ("b3", "small = 1")]
    configs = {"b1": {"preserveKeys": ["big1"]}, "b2": {"preserveKeys": ["big2"]}, "after": greedy}
    _, inst = run(tmp_path, fork("p", "x = 1", branches, kind=kind, conditions=conditions, configs=configs,
                                 after=f"late = {json.dumps(text)}"))
    assert inst.status == "completed" and len(inst.compressions) == 1
    history = inst.main.layer(Layer.HISTORY)
    assert history["big1"] == {"kind": "reasoning_chain", "text": text} and history["big2"] == text
    assert {"big1", "big2"} <= inst.main.preserved
    assert history["late"]["_compressed"] == "summarize"      # the rule did run on what is not preserved
    assert LayeredContext.replay(inst.main.tape) == inst.main


def test_an_activity_id_inside_a_config_that_names_another_element_is_reported(tmp_path: Path) -> None:
    steps = [("prep", "x = 1"), ("lookup", "y = 2")]
    bpmn = write(tmp_path, "i", chain("i", steps, {"prep": {"activityId": "risk_assessment", "preserveKeys": ["x"]}}),
                 "lookup:\n  activityId: lookupz\nprep:\n  activityId: prep\n")
    rc, doc, err = cli("validate", str(bpmn), "--json")
    assert rc == 0, err
    found = {(Path(p["file"]).name, p["element_id"], p["field"]) for p in doc["problems"]
             if p["code"] == "config_id_mismatch" and p["severity"] == "warning"}
    assert found == {("i.layerflow.yaml", "lookup", "activityId"), ("i.bpmn", "prep", "activityId")}


# ----- reducers: merge ------------------------------------------------------------------------------------

APPROVALS = fork("approvals", 'approvals = {"finance": None, "risk": None, "legal": None}',
                 [("finance", 'approvals["finance"] = True'), ("risk", 'approvals["risk"] = False'),
                  ("legal", "note = 1")], after="decided = [k for k, v in approvals.items() if v is not None]")


@pytest.mark.parametrize("reducer", [None, "merge"])
def test_branches_that_each_set_their_own_entry_merge_with_the_merge_reducer(tmp_path: Path, reducer) -> None:
    """Parallel approvals, each branch setting its entry of one dict (as SpiffArena's samples
    draw them): a conflict on the whole key by default (the key's value differs per branch),
    one object with every branch's entry with ``reducers: {approvals: merge}``."""
    bpmn = write(tmp_path, "approvals", APPROVALS,
                 None if reducer is None else f"join:\n  reducers: {{approvals: {reducer}}}\n")
    engine = Engine("memory://")
    inst = engine.run(engine.start(load_process(bpmn), {}))
    if reducer is None:
        assert inst.status == "waiting" and [c["key"] for c in inst.conflicts] == ["approvals"]
        (asked,) = inst.confirmations
        merged = {"finance": True, "risk": False, "legal": None}
        assert [o["value"] for o in asked["options"]][2] == merged  # offered beside each branch's object
        assert "reducers: {approvals: merge}" in asked["message"]
        done = engine.answer_confirmation(inst, asked["id"], merged)
        assert done.status == "completed", done.error
        assert done.context.resolve("approvals") == merged
        return
    assert inst.status == "completed", inst.error
    assert inst.context.resolve("approvals") == {"finance": True, "risk": False, "legal": None}
    assert inst.context.resolve("decided") == ["finance", "risk"]
    assert inst.conflicts == []


def test_a_merge_of_one_entry_changed_twice_is_a_conflict_the_strategy_resolves(tmp_path: Path) -> None:
    xml = fork("twice", 'approvals = {"finance": None, "risk": None}',
               [("a", 'approvals["finance"] = "yes"'), ("b", 'approvals["finance"] = "no"')])
    bpmn = write(tmp_path, "twice", xml, "join:\n  reducers: {approvals: merge}\n"
                                         "  mergeStrategy: BRANCH_PRIORITY\n  branchPriority: [b, a]\n")
    engine = Engine("memory://")
    inst = engine.run(engine.start(load_process(bpmn), {}))
    assert inst.status == "completed", inst.error
    (conflict,) = inst.conflicts
    assert conflict["key"] == "approvals" and conflict["resolution"]["resolver"] == "strategy"
    assert conflict["values"] == {"a": {"finance": "yes", "risk": None}, "b": {"finance": "no", "risk": None}}
    assert inst.context.resolve("approvals") == {"finance": "no", "risk": None}


def test_validate_offers_merge_among_the_reducers(tmp_path: Path) -> None:
    bpmn = write(tmp_path, "approvals", APPROVALS, "join:\n  reducers: {approvals: deep}\n")
    rc, doc, err = cli("validate", str(bpmn), "--json")
    assert rc == 2, err
    (problem,) = [p for p in doc["problems"] if p["field"] == "reducers.approvals"]
    assert "merge" in problem["message"], problem["message"]
