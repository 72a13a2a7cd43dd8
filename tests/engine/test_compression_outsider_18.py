"""An outsider's round on compression (issue #5), written from DESIGN.md ("Compression",
"Rendering"), the README and the issue's text only.

Two processes of new domains live in tests/engine/unseen18c/:

research_loop: a research assistant searches in six rounds (a loop through an XOR gateway); every
round adds a tool result with a list of hits and a reasoning note. The loop task compresses on its
token threshold only (every attention score is configured off): `extract_keys` keeps the hits' ids
(a dotted path through a list), `summarize` shortens the notes; the question is preserved.

underwriting_file: medical and financial reviews in parallel branches preserve their verdicts,
the underwriter adds seven near-duplicate notes (the redundancy score fires: `count_only`), and the
decision compresses on its message count.

The same runs are checked through the Python API, the CLI (`run --json`, `inspect`, `tape`,
`replay`, `rollback`) and REST (a real `layerflow serve` on a free port with a bearer token)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import local_http
import pytest

from context_layers import (CompressTriggerDetector, Layer, LayeredContext, RuleDrivenCompressor,
                            canonical_json, render)
from context_layers.stores import open_store
from context_layers.tokens import count_text
from engine import Engine, load_process
from gateways import ContextSplitter

from engine_helpers import cli_in_a_tmp_store, run_json
from test_unseen_processes_16 import _served_url
from test_unseen_processes_3 import assert_replays   # every snapshot of every context rebuilds byte for byte

HERE = Path(__file__).resolve().parent / "unseen18c"
ROOT = Path(__file__).resolve().parents[2]
RESEARCH = HERE / "research_loop.bpmn"
UNDERWRITING = HERE / "underwriting_file.bpmn"
TOKEN = "cp18-token"
cli = cli_in_a_tmp_store
OFF = {"density": 0.0, "redundancy": 1.0, "decay": 0.0, "conflict": 1.0, "toolEfficiency": 0.0}
DEFAULTS = {"density": 0.15, "redundancy": 0.3, "decay": 0.6, "conflict": 0.05, "toolEfficiency": 0.5}
ATTENTION = tuple(DEFAULTS)


def _layers(ctx: LayeredContext) -> str:
    return canonical_json({str(layer): dict(ctx.layer(layer)) for layer in Layer})


def _activity(ctx: LayeredContext, name: str, values: dict[str, Any], preserve: tuple[str, ...] = ()) -> None:
    ctx.begin_activity(name)
    for key, value in values.items():
        ctx.write(Layer.WORKING, key, value, actor=name)
    ctx.complete_activity(name, preserve_keys=list(preserve))


PROSE = ["The applicant runs a bakery with four employees and two delivery vans in the north of the city.",
         "Quarterly revenue rose after the second oven was installed and the catering contract was signed.",
         "A previous claim for water damage in the storage room was settled without dispute last spring.",
         "The landlord confirmed the lease runs another seven years with an option to extend for five more.",
         "Electrical wiring was inspected by a certified contractor and found compliant with current code.",
         "The owner keeps flour in sealed bins away from the ovens, which the fire brigade approved on its visit."]


def _plain(n: int = 6) -> LayeredContext:
    """Distinct prose entries in two activities, no preserved key, no tool, no duplicate."""
    ctx = LayeredContext(system={"policy": "p"})
    _activity(ctx, "notes_a", {f"fact_{i}": PROSE[i] for i in range(n // 2)})
    _activity(ctx, "notes_b", {f"fact_{i}": PROSE[i] for i in range(n // 2, n)})
    return ctx


def _fires(name: str) -> LayeredContext:
    """A context built to cross exactly the default threshold of one attention score."""
    if name == "density":
        ctx = _plain()
        _activity(ctx, "tag", {"case_ref": "C-1"}, preserve=("case_ref",))
        return ctx
    if name == "redundancy":
        ctx = _plain()
        note = "Called the broker about the missing physician statement; the broker promised it by Friday"
        _activity(ctx, "chase", {f"note_{k}": f"{note} (attempt {k})." for k in range(1, 7)})
        return ctx
    if name == "decay":
        ctx = LayeredContext(system={"policy": "p"})
        _activity(ctx, "old", {f"fact_{i}": PROSE[i] for i in range(6)})
        for k in range(3):
            _activity(ctx, f"recent_{k}", {f"flag_{k}": "ok"})
        return ctx
    if name == "conflict":
        ctx = _plain()
        _activity(ctx, "join_log", {"_mergedConflicts": [{"key": "approval_status", "baseValue": None,
                                                          "conflictingValues": ["approved", "rejected"],
                                                          "resolution": None}]})
        return ctx
    assert name == "toolEfficiency"
    ctx = _plain()
    _activity(ctx, "search", {"tool_call_result_1": {"status": "ok", "data": {"id": "D-1", "title": "found"}},
                              "tool_call_result_2": {"status": "error", "error": "timeout after 30 s"},
                              "tool_call_result_3": {"status": "failed", "error": "HTTP 502"}})
    return ctx


# ---- triggers ---------------------------------------------------------------------------------

def _history_working_tokens(ctx: LayeredContext) -> int:
    return sum(count_text(key) + count_text(canonical_json(value)) for layer in (Layer.HISTORY, Layer.WORKING)
               for key, value in ctx.layer(layer).items())


def test_the_token_threshold_fires_over_history_plus_working_and_not_at_it() -> None:
    ctx = _plain()
    ctx.begin_activity("open")
    ctx.write(Layer.WORKING, "draft", PROSE[0], actor="open")      # WORKING counts too
    detector = CompressTriggerDetector()
    tokens = detector.detect(ctx, {"compressTokenThreshold": 10**6}).values["token_threshold"]
    without_working = detector.detect(_plain(), {"compressTokenThreshold": 10**6}).values["token_threshold"]
    assert tokens > without_working
    # the count is of HISTORY and WORKING only: SYSTEM's policy is not in it
    assert abs(tokens - _history_working_tokens(ctx)) <= tokens * 0.25
    for threshold, fired in ((tokens, False), (tokens + 1, False), (tokens - 1, True)):
        decision = detector.detect(ctx, {"compressTokenThreshold": threshold, "attentionThresholds": OFF})
        assert list(decision) == (["token_threshold"] if fired else []), (threshold, decision)


def test_the_message_threshold_counts_history_entries_only() -> None:
    ctx = _plain()
    entries = len(ctx.layer(Layer.HISTORY))
    ctx.begin_activity("open")
    for k in range(5):
        ctx.write(Layer.WORKING, f"scratch_{k}", k, actor="open")   # WORKING entries are not messages
    detector = CompressTriggerDetector()
    assert detector.detect(ctx, {"compressMessageThreshold": entries}).values["message_threshold"] == entries
    for threshold, fired in ((entries, False), (entries - 1, True)):
        decision = detector.detect(ctx, {"compressMessageThreshold": threshold, "attentionThresholds": OFF})
        assert list(decision) == (["message_threshold"] if fired else []), (threshold, decision)


@pytest.mark.parametrize("name", ATTENTION)
def test_each_attention_score_fires_alone_at_its_default(name: str) -> None:
    ctx = _fires(name)
    decision = CompressTriggerDetector().detect(ctx, {"attentionThresholds": DEFAULTS})
    assert list(decision) == [name], decision
    # the plain context fires none of them
    assert list(CompressTriggerDetector().detect(_plain(), {"attentionThresholds": DEFAULTS})) == []


@pytest.mark.parametrize("name", ATTENTION)
def test_a_configured_attention_threshold_fires_across_it_not_at_it(name: str) -> None:
    ctx = _fires(name)
    value = CompressTriggerDetector().detect(ctx, {"attentionThresholds": OFF}).values[name]
    below = name in ("density", "decay", "toolEfficiency")      # these fire under their threshold
    step = 0.01
    at = {**OFF, name: value}
    across = {**OFF, name: value + step if below else value - step}
    short = {**OFF, name: value - step if below else value + step}
    detector = CompressTriggerDetector()
    assert list(detector.detect(ctx, {"attentionThresholds": at})) == []
    assert list(detector.detect(ctx, {"attentionThresholds": short})) == []
    assert list(detector.detect(ctx, {"attentionThresholds": across})) == [name]


# ---- rule actions -----------------------------------------------------------------------------

def _search_ctx() -> LayeredContext:
    ctx = LayeredContext(system={"policy": "p"})
    _activity(ctx, "frame", {"question": "Which refrigerants have a GWP below 150?"}, preserve=("question",))
    raw = " ".join(PROSE)
    for n in (1, 2, 3):
        _activity(ctx, f"search_{n}", {
            f"tool_call_result_{n}": {"status": "ok", "data": {"id": f"Q-{n}", "hits": [
                {"id": f"DOC-{n}-{k}", "score": k, "snippet": PROSE[k]} for k in range(3)]}, "raw": raw},
            f"reasoning_{n}": " ".join(PROSE[n:] + PROSE[:n]),
            f"retry_log_{n}": f"attempt {n}: the search API answered 429, backing off {2 ** n} seconds",
        })
    return ctx


@pytest.mark.parametrize("paths, expected", [
    (["status", "data.id"], {"status": "ok", "data": {"id": "Q-2"}}),
    (["data.hits.id"], {"data": {"hits": [{"id": "DOC-2-0"}, {"id": "DOC-2-1"}, {"id": "DOC-2-2"}]}}),
    # an index keeps its place in the list: the rows before it stay as nulls
    (["data.hits.1.id", "data.nothing"], {"data": {"hits": [None, {"id": "DOC-2-1"}]}}),
])
def test_extract_keys_keeps_dotted_paths_through_lists(paths: list[str], expected: dict[str, Any]) -> None:
    ctx = _search_ctx()
    result = RuleDrivenCompressor().compress(ctx, {"compressRules": [
        {"pattern": "tool_call_result", "action": "extract_keys", "extractKeys": paths}]}, triggers=[])
    entry = dict(ctx.layer(Layer.HISTORY)["tool_call_result_2"])
    assert entry.pop("_compressed") == "extract_keys"
    assert json.loads(canonical_json(entry)) == expected
    assert result.to_dict()["rules"] == [{"pattern": "tool_call_result", "action": "extract_keys", "entries": 3}]
    if "data.nothing" in paths:
        assert "data.nothing" in json.dumps(result.to_dict()["missing_paths"])


@pytest.mark.parametrize("max_tokens", [5, 12, 30])
def test_summarize_offline_respects_max_tokens(max_tokens: int) -> None:
    ctx = _search_ctx()
    before = ctx.layer(Layer.HISTORY)["reasoning_2"]
    RuleDrivenCompressor().compress(ctx, {"compressRules": [
        {"pattern": "reasoning_*", "action": "summarize", "maxTokens": max_tokens}]}, triggers=[])
    after = ctx.layer(Layer.HISTORY)["reasoning_2"]
    text = after if isinstance(after, str) else after.get("summary", "")
    assert text and text != before
    assert count_text(text) <= max_tokens, (max_tokens, text)


def test_summarize_uses_the_summarizer_given_and_cuts_it_to_max_tokens() -> None:
    ctx = _search_ctx()
    asked: list[int] = []

    def summarize(text: str, max_tokens: int) -> str:
        asked.append(max_tokens)
        return "model summary " + "word " * 200

    RuleDrivenCompressor(summarize).compress(ctx, {"compressRules": [
        {"pattern": "reasoning_*", "action": "summarize", "maxTokens": 15}]}, triggers=[])
    after = ctx.layer(Layer.HISTORY)["reasoning_3"]
    text = after if isinstance(after, str) else after.get("summary", "")
    assert asked and set(asked) == {15}
    assert text.startswith("model summary") and count_text(text) <= 15


@pytest.mark.parametrize("keep_last", [0, 1, 2])
def test_count_only_counts_and_keeps_the_last(keep_last: int) -> None:
    ctx = _search_ctx()
    for n in (4, 5, 6):    # enough long retry logs that a count is smaller than them
        _activity(ctx, f"retry_{n}", {f"retry_log_{n}": f"attempt {n}: " + PROSE[n % 6]})
    logs = [k for k in ctx.layer(Layer.HISTORY) if k.startswith("retry_log_")]
    kept_values = {k: ctx.layer(Layer.HISTORY)[k] for k in logs[len(logs) - keep_last:]} if keep_last else {}
    RuleDrivenCompressor().compress(ctx, {"compressRules": [
        {"pattern": "retry_log", "action": "count_only", "keepLast": keep_last}]}, triggers=[])
    history = ctx.layer(Layer.HISTORY)
    remaining = [k for k in history if k.startswith("retry_log_")]
    assert remaining == list(kept_values)
    assert all(history[k] == v for k, v in kept_values.items())
    counters = [v for k, v in history.items() if isinstance(v, dict) and v.get("count") == len(logs)]
    assert len(counters) == 1, dict(history)


ALL_RULES = [
    {"pattern": "*", "action": "extract_keys", "extractKeys": ["status"]},
    {"pattern": "*", "action": "summarize", "maxTokens": 3},
    {"pattern": "*", "action": "count_only", "keepLast": 0},
]


@pytest.mark.parametrize("rule", ALL_RULES, ids=lambda r: r["action"])
def test_preserved_keys_survive_every_action_and_compression_is_idempotent(rule: dict[str, Any]) -> None:
    ctx = _search_ctx()
    # a key preserved by an earlier activity and one preserved in config only
    _activity(ctx, "tag", {"verdict": {"status": "novel", "reason": PROSE[1]}}, preserve=("verdict",))
    preserved = {k: ctx.layer(Layer.HISTORY)[k] for k in ("question", "verdict")}
    config = {"compressRules": [rule], "preserveKeys": ["tool_call_result_1"]}
    tool_1 = ctx.layer(Layer.HISTORY)["tool_call_result_1"]
    compressor = RuleDrivenCompressor()
    first = compressor.compress(ctx, config, triggers=[])
    history = ctx.layer(Layer.HISTORY)
    assert {k: history[k] for k in preserved} == preserved
    assert history["tool_call_result_1"] == tool_1
    assert first.to_dict()["tokens_after"] <= first.to_dict()["tokens_before"]
    assert compressor.evaluate(ctx, first).to_dict()["preserved_intact"] is True
    layers = _layers(ctx)
    again = compressor.compress(ctx, config, triggers=[])
    assert _layers(ctx) == layers
    assert again.to_dict()["snapshot_id"] is None


def test_keys_preserved_inside_branches_survive_after_the_join() -> None:
    ctx = _search_ctx()
    medical, finance = ContextSplitter().split(ctx, {"gatewayId": "reviews", "branches": [
        {"id": "medical"}, {"id": "finance"}]})
    _activity(medical.context, "medical", {"medical_class": {"class": "standard_plus", "flags": ["bmi_ok"]},
                                           "medical_memo": PROSE[2]}, preserve=("medical_class",))
    _activity(finance.context, "finance", {"income_verified": True, "finance_memo": PROSE[3]},
              preserve=("income_verified",))
    # the finance branch compresses before the join
    RuleDrivenCompressor().compress(finance.context, {"compressRules": ALL_RULES[1:2]}, triggers=[])
    ContextSplitter().join(ctx, [medical, finance], {"mergeStrategy": "MERGE_WITH_CONFLICT_DETECT"})
    expected = {"medical_class": {"class": "standard_plus", "flags": ["bmi_ok"]}, "income_verified": True}
    for rule in ALL_RULES:
        RuleDrivenCompressor().compress(ctx, {"compressRules": [rule]}, triggers=[])
        assert {k: ctx.resolve(k) for k in expected} == expected, rule
    # the cliff too, with no rule at all
    RuleDrivenCompressor().compress(ctx, {"compressTokenThreshold": 50})
    assert {k: ctx.resolve(k) for k in expected} == expected


@pytest.mark.parametrize("rule", [
    {"pattern": "tool_call_result", "action": "extract_keys", "extractKeys": ["status"]},
    {"pattern": "tool_call_result", "action": "summarize", "maxTokens": 3},
], ids=["extract_keys", "summarize"])
def test_a_compression_does_not_fire_the_next_one_by_itself(rule: dict[str, Any]) -> None:
    """Four distinct, useful tool results: nothing fires. A rule cuts them down to what it keeps
    (`status: ok`); the scores of what it left must not call them useless or duplicates, or the
    next activity compresses again because of this compression (a sliding window, not a cliff)."""
    ctx = LayeredContext(system={"policy": "p"})
    for n in range(4):
        _activity(ctx, f"search_{n}", {f"tool_call_result_{n}": {"status": "ok", "data": {
            "id": f"DOC-{n}", "text": PROSE[n]}}})
    detector = CompressTriggerDetector()
    assert list(detector.detect(ctx, {"attentionThresholds": DEFAULTS})) == []
    result = RuleDrivenCompressor().compress(ctx, {"compressRules": [rule]}, triggers=[])
    doc = result.to_dict()
    assert doc["entries_affected"] == 4
    assert doc["attention_after"]["toolEfficiency"] == 1.0
    assert doc["attention_after"]["redundancy"] == 0.0
    assert list(detector.detect(ctx, {"attentionThresholds": DEFAULTS})) == []


# ---- evaluate, decompress, the cliff ----------------------------------------------------------

def test_evaluate_and_decompress_restore_the_snapshot_exactly() -> None:
    ctx = _search_ctx()
    before = _layers(ctx)
    tokens = CompressTriggerDetector().detect(ctx, {}).values["token_threshold"]
    compressor = RuleDrivenCompressor()
    result = compressor.compress(ctx, {"compressTokenThreshold": tokens - 1, "compressRules": [
        {"pattern": "tool_call_result", "action": "extract_keys", "extractKeys": ["data.hits.id"]},
        {"pattern": "reasoning_*", "action": "summarize", "maxTokens": 10}]})
    doc = result.to_dict()
    assert doc["triggers"][0] == "token_threshold" and doc["tokens_before"] == tokens
    assert doc["tokens_after"] < doc["tokens_before"]
    assert doc["ratio"] == pytest.approx(doc["tokens_after"] / doc["tokens_before"])
    assert doc["tokens_after"] == CompressTriggerDetector().detect(ctx, {}).values["token_threshold"]
    report = compressor.evaluate(ctx, result).to_dict()
    assert (report["tokens_before"], report["tokens_after"]) == (doc["tokens_before"], doc["tokens_after"])
    assert report["attention_before"] == doc["attention_before"]
    assert report["attention_after"] == doc["attention_after"]
    assert report["preserved_intact"] is True
    snapshot = ctx.get_snapshot(doc["snapshot_id"])
    assert canonical_json({str(layer): dict(snapshot.layer(layer)) for layer in Layer}) == before
    compressor.decompress(ctx, result)
    assert _layers(ctx) == before
    # the compressed version and the undo both stay on the tape
    notes = [event.data.get("note") for event in ctx.tape.filter(kind="compression")]
    assert notes == ["compress", "decompress"]
    assert LayeredContext.replay(ctx.tape) == ctx


def _prefix(messages: list[dict[str, str]]) -> str:
    """The stable part: everything up to the end of the rendered HISTORY."""
    text = "".join(m["role"] + "\x00" + m["content"] + "\x01" for m in messages)
    return text[:text.index("</history>")]


def test_the_rendered_prefix_is_byte_stable_between_cliffs_and_moves_at_one() -> None:
    ctx = _search_ctx()
    threshold = CompressTriggerDetector().detect(ctx, {}).values["token_threshold"] + 150
    config = {"compressTokenThreshold": threshold, "attentionThresholds": OFF}
    compressor = RuleDrivenCompressor()
    prefixes, cliffs = [], []
    for n in range(4, 10):
        _activity(ctx, f"search_{n}", {f"note_{n}": PROSE[n % 6] + f" (round {n})"})
        result = compressor.compress(ctx, config)
        cliffs.append(result.to_dict()["snapshot_id"] is not None)
        prefixes.append(_prefix(render(ctx, format="xml")))
        assert _prefix(render(ctx, format="xml")) == prefixes[-1]          # same input, same bytes
    assert any(cliffs) and not all(cliffs), cliffs
    assert sum(cliffs) <= 2                                               # a cliff, not a sliding window
    for k in range(1, len(prefixes)):
        if cliffs[k]:
            assert not prefixes[k].startswith(prefixes[k - 1])              # the cursor moved
            assert "compaction" in prefixes[k]
        else:
            assert prefixes[k].startswith(prefixes[k - 1]), k              # appended, nothing rewritten


# ---- config errors ----------------------------------------------------------------------------

BAD_RULES = [
    ({"pattern": "x", "action": "shred"}, "action"),
    ({"pattern": "[unclosed", "action": "count_only"}, "pattern"),
    ({"pattern": "x", "action": "summarize", "maxTokens": 0}, "maxTokens"),
    ({"pattern": "x", "action": "summarize", "maxTokens": -5}, "maxTokens"),
    ({"pattern": "x", "action": "count_only", "keepLast": -1}, "keepLast"),
]


@pytest.mark.parametrize("rule, field", BAD_RULES, ids=[f"{r['action']}-{f}" for r, f in BAD_RULES])
def test_bad_compress_rules_are_config_errors_naming_file_element_and_field(
        cli: Any, tmp_path: Path, rule: dict[str, Any], field: str) -> None:
    for name in ("research_loop.bpmn", "research_handlers.py"):
        (tmp_path / name).write_text((HERE / name).read_text())
    config = tmp_path / "research_loop.layerflow.yaml"
    config.write_text("search_round_task:\n  handler: research_handlers.py:search_round\n"
                      f"  compressRules:\n    - {json.dumps(rule)}\n")
    for args in (("validate", str(tmp_path / "research_loop.bpmn")),
                 ("run", str(tmp_path / "research_loop.bpmn"))):
        result = cli(*args)
        assert result.exit_code == 2, (args, result.stdout, result.stderr)
        said = result.stdout + result.stderr
        assert "research_loop.layerflow.yaml" in said and "search_round_task" in said, said
        assert field in said, said


# ---- the processes through the engine, the CLI and REST -----------------------------------------

def _copy(tmp_path: Path, stem: str, handlers: str) -> Path:
    for name in (f"{stem}.bpmn", f"{stem}.layerflow.yaml", handlers):
        (tmp_path / name).write_text((HERE / name).read_text())
    return tmp_path / f"{stem}.bpmn"


def _activity_ends(tape: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [e for e in tape if e["kind"] == "complete"]


def _check_triggers_against_the_tape(store: str, iid: str, doc: dict[str, Any], configs: dict[str, Any]) -> None:
    """Replay the tape to the end of every activity and ask the detector what should have fired; the
    run's compressions are exactly those, with the tokens the context had there."""
    tape = open_store(store).read_tape(iid, "main")
    by_seq = {c["event_seq"]: c for c in doc["compressions"]}
    expected = []
    for end in _activity_ends(tape):
        activity = end.get("activity")
        config = configs.get(activity)
        if not config:
            continue
        ctx = LayeredContext.replay([e for e in tape if e["seq"] <= end["seq"]])
        decision = CompressTriggerDetector().detect(ctx, config)
        if decision.fired:
            expected.append((activity, list(decision), decision.values["token_threshold"]))
    got = [(c["activity_id"], c["triggers"], c["tokens_before"]) for c in doc["compressions"]]
    assert got == expected
    for seq, comp in by_seq.items():
        ctx = LayeredContext.replay([e for e in tape if e["seq"] <= seq])
        assert CompressTriggerDetector().detect(ctx, {}).values["token_threshold"] == comp["tokens_after"]
        assert comp["snapshot_id"] in {e.get("snapshot_id") for e in tape} | {
            (e.get("data") or {}).get("snapshot_id") for e in tape}


def test_the_research_loop_compresses_on_its_token_threshold_only(cli: Any, tmp_path: Path) -> None:
    bpmn = _copy(tmp_path, "research_loop", "research_handlers.py")
    store = f"sqlite:///{tmp_path / 'r.db'}"
    doc = run_json(cli, "run", str(bpmn), "--store", store)
    assert doc["status"] == "completed"
    comps = doc["compressions"]
    assert [c["activity_id"] for c in comps] == ["search_round_task"] * len(comps) and 1 <= len(comps) <= 3
    assert all(c["triggers"] == ["token_threshold"] and c["tokens_before"] > 900 > c["tokens_after"]
               for c in comps)
    config = {"compressTokenThreshold": 900, "attentionThresholds": OFF}
    _check_triggers_against_the_tape(store, doc["instance_id"], doc, {"search_round_task": config})
    assert_replays(doc, store)
    history = doc["layers"]["L3"]
    assert history["research_question"].startswith("Which heat pump refrigerants")
    assert doc["layers"]["L3"]["answer"].endswith(history["research_question"])
    # the latest round's result was written after the last cliff: whole; an earlier one kept its ids
    compressed = [v for k, v in history.items() if k.startswith("tool_call_result_") and "_compressed" in v]
    for value in compressed:
        assert [set(h) for h in value["data"]["hits"]] == [{"id"}] * 3
        assert all(h["id"].startswith("DOC-") for h in value["data"]["hits"])
        assert set(value) == {"_compressed", "status", "data"} and set(value["data"]) <= {"query", "hits"}

    summaries = [v["summary"] for k, v in history.items() if k.startswith("reasoning_") and isinstance(v, dict)]
    assert summaries and all(count_text(text) <= 12 for text in summaries)
    iid = doc["instance_id"]
    # the tape: one compression per entry of --json, replay byte-identical to inspect
    tape = json.loads(cli("tape", iid, "--store", store, "--kind", "compression", "--json").stdout)
    events = tape["events"] if isinstance(tape, dict) else tape
    assert len(events) == len(comps)
    inspected = run_json(cli, "inspect", iid, "--store", store)
    replayed = run_json(cli, "replay", iid, "--store", store)
    assert canonical_json(replayed["layers"]) == canonical_json(inspected["layers"]) == canonical_json(doc["layers"])
    # the context as it was just before the first cliff, replayed, equals the cliff's snapshot
    first = comps[0]
    before = run_json(cli, "replay", iid, str(first["event_seq"] - 1), "--store", store)
    rolled = run_json(cli, "rollback", iid, first["snapshot_id"], "--layers", "L3", "--store", store)
    assert rolled is not None
    after = run_json(cli, "inspect", iid, "--store", store, "--layer", "L3")
    assert canonical_json(after["layers"]["L3"]) == canonical_json(before["layers"]["L3"])
    # the rollback is on the tape, and the whole tape still replays to what inspect shows
    replayed = run_json(cli, "replay", iid, "--store", store)
    assert canonical_json(replayed["layers"]["L3"]) == canonical_json(after["layers"]["L3"])


def test_the_underwriting_file_fires_redundancy_then_the_message_count() -> None:
    engine = Engine("memory://")
    instance = engine.run(engine.start(load_process(UNDERWRITING), {}))
    assert instance.status == "completed"
    ctx = instance.main
    assert len(ctx.tape.filter(kind="compression")) == 2
    history = ctx.layer(Layer.HISTORY)
    # preserved inside the branches, before the join: untouched by both compressions after it
    assert history["medical_class"] == {"class": "standard_plus", "flags": ["bmi_ok", "non_smoker"]}
    assert history["income_verified"] is True and history["decision"] == "accept"
    counters = {k: v for k, v in history.items() if k.startswith("summary:count:uw_note")}
    assert [v["count"] for v in counters.values()] == [7]
    assert not any(k.startswith("uw_note_") and k != "uw_note_7" for k in history)
    assert LayeredContext.replay(ctx.tape) == ctx


def test_the_underwriting_compressions_in_run_json_match_the_detector(cli: Any, tmp_path: Path) -> None:
    bpmn = _copy(tmp_path, "underwriting_file", "underwriting_handlers.py")
    store = f"sqlite:///{tmp_path / 'u.db'}"
    doc = run_json(cli, "run", str(bpmn), "--store", store)
    assert [(c["activity_id"], c["triggers"]) for c in doc["compressions"]] == [
        ("chase_documents", ["redundancy"]), ("decide", ["message_threshold"])]
    configs = {"chase_documents": {"attentionThresholds": {**OFF, "redundancy": 0.3}},
               "decide": {"compressMessageThreshold": 8, "attentionThresholds": OFF},
               "medical_review": {}, "financial_review": {}, "intake": {}}
    _check_triggers_against_the_tape(store, doc["instance_id"], {
        "compressions": doc["compressions"]}, {k: v for k, v in configs.items() if v})
    assert_replays(doc, store)
    for comp in doc["compressions"]:
        memo = comp["rules"]
        assert all(set(r) == {"pattern", "action", "entries"} for r in memo)


@pytest.fixture()
def served(tmp_path: Path) -> Iterator[tuple[httpx.Client, str]]:
    catalog = tmp_path / "catalog"
    catalog.mkdir()
    _copy(catalog, "research_loop", "research_handlers.py")
    store = f"sqlite:///{tmp_path / 'served.db'}"
    env = {**os.environ, "LAYERFLOW_API_TOKEN": TOKEN, "PYTHONPATH": str(ROOT)}
    server = subprocess.Popen([sys.executable, "-m", "engine.cli", "serve", "--port", "0", "--catalog",
                               str(catalog), "--store", store, "--log-level", "warning"],
                              stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True, env=env)
    try:
        url = _served_url(server)
        with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {TOKEN}"}, timeout=30) as api:
            yield api, store
    finally:
        server.terminate()
        server.wait(timeout=10)


def test_compress_evaluate_decompress_and_rollback_over_rest(served: tuple[httpx.Client, str]) -> None:
    api, _store = served
    assert local_http.post(str(api.base_url) + "/api/context-governance/inspect",
                      json={"instance_id": "x"}).status_code == 401
    started = api.post("/api/instances", json={"process_id": "research_loop", "data": {}})
    assert started.status_code in (200, 201), started.text
    iid = started.json()["instance_id"]
    before = api.get(f"/api/instances/{iid}").json()["layers"]["L3"]
    rules = [{"pattern": "tool_call_result", "action": "extract_keys", "extractKeys": ["data.hits.id"]},
             {"pattern": "reasoning_*", "action": "summarize", "maxTokens": 8}]
    compressed = api.post("/api/context-governance/compress", json={
        "instance_id": iid, "action": "compress", "compressRules": rules, "preserveKeys": ["answer"]})
    assert compressed.status_code == 200, compressed.text
    result = compressed.json()
    body = result.get("result", result)
    assert body["tokens_after"] < body["tokens_before"] and body["snapshot_id"]
    inspected = api.post("/api/context-governance/inspect", json={"instance_id": iid})
    assert inspected.status_code == 200, inspected.text
    history = api.get(f"/api/instances/{iid}").json()["layers"]["L3"]
    assert canonical_json(history) != canonical_json(before)
    assert history["answer"] == before["answer"]                       # preserved by the request
    evaluated = api.post("/api/context-governance/compress", json={
        "instance_id": iid, "action": "evaluate", "snapshot_id": body["snapshot_id"]})
    assert evaluated.status_code == 200, evaluated.text
    report = evaluated.json()
    report = report.get("result", report)
    assert (report["tokens_before"], report["tokens_after"]) == (body["tokens_before"], body["tokens_after"])
    assert report["preserved_intact"] is True
    undone = api.post("/api/context-governance/compress", json={
        "instance_id": iid, "action": "decompress", "snapshot_id": body["snapshot_id"]})
    assert undone.status_code == 200, undone.text
    doc = api.get(f"/api/instances/{iid}").json()
    assert canonical_json(doc["layers"]["L3"]) == canonical_json(before)
    # compress again, then roll back to its snapshot: HISTORY as before the compression
    again = api.post("/api/context-governance/compress", json={
        "instance_id": iid, "action": "compress", "compressRules": rules}).json()
    again = again.get("result", again)
    rolled = api.post("/api/context-governance/rollback", json={"instance_id": iid, "snapshot_id": again["snapshot_id"]})
    assert rolled.status_code == 200, rolled.text
    after = api.get(f"/api/instances/{iid}").json()
    assert canonical_json(after["layers"]["L3"]) == canonical_json(doc["layers"]["L3"])
    for rule, field in BAD_RULES:
        refused = api.post("/api/context-governance/compress", json={
            "instance_id": iid, "action": "compress", "compressRules": [rule]})
        assert refused.status_code in (400, 422), (rule, refused.text)
        assert field in refused.text, (rule, refused.text)
    tape = api.get(f"/api/instances/{iid}/tape", params={"kind": "compression"}).json()
    events = tape["events"] if isinstance(tape, dict) else tape
    assert len(events) >= 2


def test_decompress_after_later_activities_restores_the_entries_and_keeps_the_later_writes() -> None:
    ctx = _search_ctx()
    before = dict(ctx.layer(Layer.HISTORY))
    compressor = RuleDrivenCompressor()
    result = compressor.compress(ctx, {"compressRules": [
        {"pattern": "reasoning_*", "action": "summarize", "maxTokens": 5}]}, triggers=[])
    _activity(ctx, "later", {"later_fact": PROSE[4]})
    compressor.decompress(ctx, result)
    history = dict(ctx.layer(Layer.HISTORY))
    assert {k: history[k] for k in before} == before
    assert history["later_fact"] == PROSE[4] and "activity:later" in history
    assert LayeredContext.replay(ctx.tape) == ctx
