"""Work the engine no longer does on every run (issue 3, under 2x plain SpiffWorkflow): each
test stubs out the work that was removed so that doing it fails, and checks the run still
gives what it gave."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest

import gateways.conditions
import gateways.join
from engine import Engine, load_process
from engine.knowledge import BM25Retriever

from engine_helpers import EXAMPLES, LOAN, LOAN_FULL


def _refuse(what: str) -> Any:
    def refused(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError(f"{what} ran")
    return refused


def _retrieval_notes(instance: Any) -> list[dict[str, Any]]:
    return [dict(e.data) for e in instance.contexts["main"].tape if e.data and e.data.get("note") == "retrieval"]


@pytest.mark.parametrize("compress", [False, True], ids=["no-compression", "compression-after-the-join"])
def test_a_join_walks_no_tape_for_folds_when_nothing_was_folded(monkeypatch: Any, compress: bool) -> None:
    # the loan's parallel review compresses nothing before its join (its one compression is the
    # last activity's): the join merges without reading any branch's or the parent's folds
    expected = Engine(compress=compress).run_process(load_process(LOAN), LOAN_FULL)
    monkeypatch.setattr(gateways.join, "_walk_folds", _refuse("a walk of a tape for folds"))
    instance = Engine(compress=compress).run_process(load_process(LOAN), LOAN_FULL)
    assert instance.status == "completed", instance.error
    joined = [e for e in instance.contexts["main"].tape if e.data and e.data.get("note") == "join"]
    assert len(joined) == 1
    assert instance.contexts["main"].to_dict()["tape"][-1]["seq"] == expected.contexts["main"].to_dict()["tape"][-1]["seq"]
    assert instance.contexts["main"].resolved() == expected.contexts["main"].resolved()


def test_retrieval_lists_no_knowledge_folder_per_activity(monkeypatch: Any) -> None:
    monkeypatch.setattr(BM25Retriever, "collections", _refuse("a listing of the knowledge folder"))
    instance = Engine().run_process(load_process(LOAN), LOAN_FULL)
    assert instance.status == "completed", instance.error
    (note,) = _retrieval_notes(instance)
    assert note["kept"] > 0 and "missing" not in note


def test_a_misspelt_collection_is_still_named_on_the_tape(tmp_path: Path) -> None:
    for name in ("loan_approval.bpmn", "loan_approval.layerflow.yaml", "loan_handlers.py"):
        shutil.copy(EXAMPLES / name, tmp_path / name)
    shutil.copytree(EXAMPLES / "knowledge", tmp_path / "knowledge")
    config = tmp_path / "loan_approval.layerflow.yaml"
    text = config.read_text(encoding="utf-8")
    assert "ragCollections: [risk_rules, industry_blacklist]" in text
    config.write_text(text.replace("ragCollections: [risk_rules, industry_blacklist]",
                                   "ragCollections: [risk_rules, industry_blacklistt]"), encoding="utf-8")
    engine = Engine()
    first = engine.run_process(load_process(tmp_path / "loan_approval.bpmn"), LOAN_FULL)
    assert [n.get("missing") for n in _retrieval_notes(first)] == [["industry_blacklistt"]]
    # the folder made while the engine runs is seen once its read stands no longer
    (tmp_path / "knowledge" / "industry_blacklistt").mkdir()
    engine.retriever_for(load_process(tmp_path / "loan_approval.bpmn")).recheck_seconds = 0.0
    again = engine.run_process(load_process(tmp_path / "loan_approval.bpmn"), LOAN_FULL)
    assert [n.get("missing") for n in _retrieval_notes(again)] == [None]


def test_a_conditions_text_is_parsed_once(monkeypatch: Any) -> None:
    process = load_process(LOAN)
    engine = Engine(compress=False)
    first = engine.run_process(process, LOAN_FULL)
    parsed: list[str] = []
    real = gateways.conditions.ast.parse

    def counting(source: str, *args: Any, **kwargs: Any) -> Any:
        parsed.append(source)
        return real(source, *args, **kwargs)

    monkeypatch.setattr(gateways.conditions.ast, "parse", counting)
    again = engine.run_process(process, LOAN_FULL)
    assert parsed == []
    assert again.contexts["main"].resolved() == first.contexts["main"].resolved()
    decisions = [dict(e.data) for e in again.contexts["main"].tape if e.data and e.data.get("note") == "condition_decision"]
    assert decisions and all(not d.get("natural_language") for d in decisions)


def test_a_retriever_that_lists_collections_of_its_own_is_asked(tmp_path: Path) -> None:
    class Listed(BM25Retriever):
        def collections(self) -> list[str]:
            return ["risk_rules"]  # industry_blacklist is not one of its collections

    process = load_process(LOAN)
    instance = Engine(retriever=Listed(process.knowledge_dir)).run_process(process, LOAN_FULL)
    assert [n.get("missing") for n in _retrieval_notes(instance)] == [["industry_blacklist"]]
