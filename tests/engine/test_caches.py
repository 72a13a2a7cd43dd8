"""The shortcuts taken for speed give what the long way gives.

* ``engine.spiff.serialize_json`` (spec and unchanged tasks kept as JSON text) loads to
  the same JSON value as SpiffWorkflow's own ``serialize_json``, at every save of every
  example, and the text loads back into a workflow.
* The compression hook (scope built once, attention skipped under the detector's floor)
  fires exactly when ``detect`` says a trigger fired.
* Shingles cached per frozen value are the shingles of the value; a mutable value is
  never served from the cache.
* BM25 indexes shared by the retrievers of one Python process follow edits of the
  documents.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from context_layers import ActivityExtensionConfig, Layer, LayeredContext, freeze
from context_layers.attention import CompressTriggerDetector
from context_layers.compression import after_activity
from context_layers.similarity import entry_words, shingles, word_sets
from engine import Engine, load_process, spiff
from engine.knowledge import BM25Retriever

from engine_helpers import EXAMPLES, LOAN, LOAN_CONFLICT, LOAN_FAST, LOAN_FULL

RUNS: list[tuple[str, dict[str, Any], dict[str, Any]]] = [
    ("loan_approval", LOAN_FAST, {}),
    ("loan_approval", LOAN_FULL, {}),
    ("loan_approval", LOAN_CONFLICT, {"confirmations": {"*": "pending_dual_approval"}}),
    ("parallel_scripts", {}, {}),
    ("nested_parallel", {}, {}),
    ("inclusive_gateway", {"need_credit": True, "need_identity": False, "need_address": True}, {}),
    ("xor_loop", {"batch_size": 4}, {}),
    ("multi_instance_parallel", {}, {}),
    ("multi_instance_sequential", {}, {}),
    ("multi_instance_completion", {"amounts": [2, 4, 6, 8], "limit": 10}, {}),
    ("parallel_user_task", {"title": "Q3 report"},
     {"user_tasks": {"review": {"approved": True, "reviewer": "ann"}}}),
]


class _CheckingEngine(Engine):
    """Compares the fast workflow JSON with SpiffWorkflow's at every save."""

    saves = 0

    def save(self, instance: Any, **kw: Any) -> None:
        wf = instance.workflow
        ours = spiff.serialize_json(wf)
        assert json.loads(ours) == json.loads(spiff.SERIALIZER.serialize_json(wf))
        assert json.loads(spiff.SERIALIZER.serialize_json(spiff.SERIALIZER.deserialize_json(ours))) == json.loads(ours)
        type(self).saves += 1
        super().save(instance, **kw)

    _save = save


@pytest.mark.parametrize(("name", "data", "answers"), RUNS, ids=lambda v: v if isinstance(v, str) else None)
def test_workflow_json_is_spiffworkflows_at_every_save(name: str, data: dict[str, Any],
                                                       answers: dict[str, Any]) -> None:
    path = LOAN if name == "loan_approval" else EXAMPLES / f"{name}.bpmn"
    engine = _CheckingEngine()
    before = _CheckingEngine.saves
    instance = engine.run(engine.start(load_process(path), data), answers=answers)
    assert instance.status == "completed", instance.error
    assert _CheckingEngine.saves - before >= instance.activities


def test_plain_tasks_are_written_without_the_registry() -> None:
    """The shortcut for plain tasks builds what SpiffWorkflow's converter builds (it checks
    itself once per form and falls back otherwise: a SpiffWorkflow upgrade that changes the
    task format shows up here, not as wrong records)."""
    engine = Engine()
    engine.run(engine.start(load_process(EXAMPLES / "parallel_scripts.bpmn")))
    # the instances of a multi-instance activity: their items, and the keys of the activity's data
    engine.run(engine.start(load_process(EXAMPLES / "multi_instance_parallel.bpmn")))
    # forms: (has a parent, has data or a parent with data)
    assert spiff._PLAIN_TASKS == {(False, False): True, (True, False): True, (True, True): True}
    # the multi-instance activity's own task (its collections are no scalars) is written from its fields
    assert spiff._ENCODED_TASKS == {"checked": True}


def test_a_task_with_data_is_converted_every_time() -> None:
    engine = Engine()
    instance = engine.start(load_process(EXAMPLES / "parallel_scripts.bpmn"))
    wf = instance.workflow
    spiff.serialize_json(wf)  # fills the cache
    wf.task_tree.data["note"] = {"nested": [1, 2]}
    assert json.loads(spiff.serialize_json(wf)) == json.loads(spiff.SERIALIZER.serialize_json(wf))
    wf.task_tree.data.clear()
    assert json.loads(spiff.serialize_json(wf)) == json.loads(spiff.SERIALIZER.serialize_json(wf))


def _context(history_tokens: int) -> LayeredContext:
    ctx = LayeredContext(name="main")
    for i in range(history_tokens // 40):
        ctx.begin_activity(f"a{i}")
        ctx.write(Layer.WORKING, f"note_{i}", f"entry {i}: " + " ".join(f"word{i}x{j}" for j in range(30)), actor="t")
        ctx.complete_activity(f"a{i}")
    return ctx


@pytest.mark.parametrize("threshold", [None, 400, 4000, 40000])
@pytest.mark.parametrize("size", [0, 200, 1200, 4000])
def test_the_hook_fires_when_detect_fires(threshold: int | None, size: int) -> None:
    config = ActivityExtensionConfig.model_validate(
        {"compressTokenThreshold": threshold, "preserveKeys": ["note_0"]} if threshold else {"preserveKeys": ["note_0"]})
    ctx = _context(size)
    decision = CompressTriggerDetector().detect(ctx, config)
    seq = ctx.tape.next_seq
    result = after_activity(ctx, config, actor="t")
    if not decision.fired:
        assert result is None and ctx.tape.next_seq == seq
    elif result is not None:
        assert result.triggers == decision.triggers
        assert result.attention_before == decision.attention


def test_shingles_of_frozen_values_come_from_the_cache_and_equal_the_long_way() -> None:
    value = freeze({"text": "the applicant runs a small bakery in the old town", "n": 3})
    first = word_sets([("k", value)])[0]
    assert first == shingles(entry_words("k", value))
    assert word_sets([("k", value)])[0] is first
    mutable = {"text": "one two three four"}
    before = word_sets([("k", mutable)])[0]
    mutable["text"] = "five six seven eight"
    assert word_sets([("k", mutable)])[0] != before


def test_the_engines_retriever_sees_a_collection_added_or_edited_while_it_runs(tmp_path: Any, monkeypatch: Any) -> None:
    # an Engine keeps one retriever per knowledge folder for as long as it runs (a server, a
    # worker): a collection asked for before its folder existed, or a document edited since,
    # is read again, not remembered empty or old
    # (a read stands for ``recheck_seconds``: a clock steps past it here)
    retriever = BM25Retriever(tmp_path)
    clock = [1000.0]
    monkeypatch.setattr("engine.knowledge.time.monotonic", lambda: clock[0])
    assert retriever.retrieve("rules", "second signature", top_k=3) == []
    folder = tmp_path / "rules"
    folder.mkdir()
    doc = folder / "a.md"
    doc.write_text("# Limits\n\nLoans above fifty thousand need a second signature.\n", encoding="utf-8")
    assert retriever.retrieve("rules", "second signature", top_k=3) == []  # read less than a second ago
    clock[0] += retriever.recheck_seconds
    assert [h.source for h in retriever.retrieve("rules", "second signature", top_k=3)] == ["rules/a.md#1"]
    doc.write_text("# Limits\n\nEvery loan needs a collateral register entry.\n", encoding="utf-8")
    (folder / "b.md").write_text("A second signature is kept for ten years.\n", encoding="utf-8")
    clock[0] += retriever.recheck_seconds
    assert [h.source for h in retriever.retrieve("rules", "second signature", top_k=3)] == ["rules/b.md#1"]


def test_a_new_retriever_sees_an_edited_document(tmp_path: Any) -> None:
    folder = tmp_path / "rules"
    folder.mkdir()
    doc = folder / "a.md"
    doc.write_text("# Limits\n\nLoans above fifty thousand need a second signature.\n", encoding="utf-8")
    first = BM25Retriever(tmp_path).retrieve("rules", "second signature", top_k=3)
    assert [h.source for h in first] == ["rules/a.md#1"]
    assert BM25Retriever(tmp_path).retrieve("rules", "second signature", top_k=3)[0].text == first[0].text
    doc.write_text("# Limits\n\nEvery loan needs a collateral register entry.\n", encoding="utf-8")
    (folder / "b.md").write_text("A second signature is kept for ten years.\n", encoding="utf-8")
    again = BM25Retriever(tmp_path).retrieve("rules", "second signature", top_k=3)
    assert [h.source for h in again] == ["rules/b.md#1"]
