"""The glue: spec twins and their serialization, subprocesses, pre/post scripts,
incremental records, the BM25 retriever."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from context_layers.stores.base import encode_record
from engine import BM25Retriever, Engine, load_process, spiff
from engine.runtime import _RecordCache

from engine_helpers import EXAMPLES, LOAN, LOAN_CONFLICT

SUBPROCESS = """<?xml version="1.0" encoding="UTF-8"?>
<bpmn:definitions xmlns:bpmn="http://www.omg.org/spec/BPMN/20100524/MODEL"
  xmlns:spiffworkflow="http://spiffworkflow.org/bpmn/schema/1.0/core" id="d" targetNamespace="t">
  <bpmn:process id="outer" isExecutable="true">
    <bpmn:startEvent id="start"/>
    <bpmn:task id="before">
      <bpmn:extensionElements>
        <spiffworkflow:preScript>seed = 1</spiffworkflow:preScript>
        <spiffworkflow:postScript>x_checked = x &gt; seed</spiffworkflow:postScript>
      </bpmn:extensionElements>
    </bpmn:task>
    <bpmn:subProcess id="sub">
      <bpmn:startEvent id="sub_start"/>
      <bpmn:scriptTask id="inside"><bpmn:script>y = x + 1</bpmn:script></bpmn:scriptTask>
      <bpmn:endEvent id="sub_end"/>
      <bpmn:sequenceFlow id="s1" sourceRef="sub_start" targetRef="inside"/>
      <bpmn:sequenceFlow id="s2" sourceRef="inside" targetRef="sub_end"/>
    </bpmn:subProcess>
    <bpmn:scriptTask id="after"><bpmn:script>z = y * 10</bpmn:script></bpmn:scriptTask>
    <bpmn:endEvent id="end"/>
    <bpmn:sequenceFlow id="f1" sourceRef="start" targetRef="before"/>
    <bpmn:sequenceFlow id="f2" sourceRef="before" targetRef="sub"/>
    <bpmn:sequenceFlow id="f3" sourceRef="sub" targetRef="after"/>
    <bpmn:sequenceFlow id="f4" sourceRef="after" targetRef="end"/>
  </bpmn:process>
</bpmn:definitions>
"""


def test_subprocess_tasks_share_the_context_and_pre_post_scripts_run_inside_the_activity(tmp_path: Path) -> None:
    path = tmp_path / "outer.bpmn"
    path.write_text(SUBPROCESS, encoding="utf-8")
    engine = Engine(handlers={"before": lambda actx: {"x": actx["seed"] + 1}})
    instance = engine.run(engine.start(load_process(path)))
    assert instance.status == "completed", instance.error
    ctx = instance.main
    assert (ctx.resolve("x"), ctx.resolve("x_checked"), ctx.resolve("y"), ctx.resolve("z")) == (2, True, 3, 30)
    # preScript, handler and postScript are one activity
    assert ctx.layer("L3")["activity:before"]["keys"] == ["seed", "x", "x_checked"]
    assert engine.load(instance.id).main == ctx


def test_every_spec_is_a_layerflow_twin_and_survives_serialization() -> None:
    process = load_process(LOAN)
    kinds = {ts.bpmn_id: type(ts).__name__ for ts in spiff.iter_user_specs(process.spec)}
    assert kinds["risk_assessment"] == "LayerflowServiceTask"
    assert kinds["approval_split"] == "LayerflowExclusiveGateway"
    assert kinds["review_join"] == "LayerflowParallelGateway"
    engine = Engine()
    instance = engine.run(engine.start(process, LOAN_CONFLICT))
    wf = spiff.SERIALIZER.deserialize_json(spiff.SERIALIZER.serialize_json(instance.workflow))
    assert type(wf.spec.task_specs["review_join"]).__name__ == "LayerflowParallelGateway"
    tags = {t.task_spec.name: t.internal_data.get(spiff.CTX_KEY) for t in wf.get_tasks()}
    assert tags["finance_review"].endswith("finance_review@" + tags["finance_review"].rsplit("@", 1)[1])
    assert tags["submit_application"] == "main"
    assert wf.get_tasks(spec_name="risk_review")[0].data == {}  # no context in task.data


def test_incremental_record_equals_to_dict() -> None:
    engine = Engine()
    instance = engine.run(engine.start(load_process(EXAMPLES / "nested_parallel.bpmn")))
    cache = _RecordCache()

    def stored(ctx):  # the record part as the store encodes it, read back
        return json.loads(encode_record(cache.context_part(ctx), "context"))

    for ctx in instance.contexts.values():
        assert stored(ctx) == ctx.to_dict()
    ctx = instance.main
    ctx.write("L4", "later", 1, actor="test")
    assert stored(ctx) == ctx.to_dict()  # only the new event was converted


@pytest.mark.parametrize(("collection", "query", "first", "min_confidence"), [
    ("industry_blacklist", "gambling industry blacklist", "industry_blacklist/blacklist.md#1", 1.0),
    ("risk_rules", "dual approval high risk", "risk_rules/credit_risk_rules.md#3", 0.9),
    ("risk_rules", "disbursed second officer", "risk_rules/disbursement_policy.md#2", 0.4),
])
def test_bm25_hits_have_source_and_confidence(collection, query, first, min_confidence) -> None:
    hits = BM25Retriever(EXAMPLES / "knowledge").retrieve(collection, query, top_k=3)
    assert hits[0].source == first and hits[0].confidence >= min_confidence
    assert all(0 <= h.confidence <= 1 for h in hits)
    assert [h.score for h in hits] == sorted((h.score for h in hits), reverse=True)


def test_bm25_knows_nothing_about_an_unknown_collection_or_query() -> None:
    r = BM25Retriever(EXAMPLES / "knowledge")
    assert r.retrieve("no_such_collection", "anything") == []
    assert r.retrieve("risk_rules", "zebra quantum") == []
