"""Collaborations: two executable pools that exchange messages run as one instance (engine.collaboration)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from SpiffWorkflow.bpmn.workflow import BpmnWorkflow
from SpiffWorkflow.spiff.parser.process import SpiffBpmnParser
from SpiffWorkflow.util.task import TaskState

from context_layers import Layer, LayeredContext, thaw
from engine import Engine, load_process
from engine.cli import main
from engine.validate import validate_process

from engine_helpers import ROOT

HERE = Path(__file__).parent / "collab"
ORDER = HERE / "order_reply.bpmn"
PURCHASE = HERE / "quote_approval.bpmn"


def _plain_spiff(path: Path, collaboration: str, data: dict[str, Any], answers: dict[str, Any]) -> dict[str, Any]:
    """The collaboration under plain SpiffWorkflow: the application delivers the messages a pool threw
    before the other waited (SpiffWorkflow keeps them in ``bpmn_events``). Per pool: path and data."""
    parser = SpiffBpmnParser()
    parser.add_bpmn_file(str(path))
    spec, subprocesses = parser.get_collaboration(collaboration)
    wf = BpmnWorkflow(spec, subprocesses)
    wf.task_tree.data.update(data)
    while True:
        wf.do_engine_steps()
        for task in wf.get_tasks(state=TaskState.READY, manual=True):
            task.data.update(answers[task.task_spec.bpmn_id])
            task.run()
        pending = wf.get_events()
        caught = sum(wf.event_manager.catch(e, internal=False) for e in pending)
        if not caught and not wf.get_tasks(state=TaskState.READY):
            break
    assert wf.is_completed()
    out = {}
    for sp in wf.subprocesses.values():
        end = next(t for t in sp.get_tasks() if t.task_spec.name == "End")
        out[sp.spec.name] = {"path": [t.task_spec.bpmn_id for t in sp.get_tasks(state=TaskState.COMPLETED)
                                      if t.task_spec.bpmn_id],
                             "data": {k: v for k, v in end.data.items() if k not in data}}
    return out


def _pools(instance: Any) -> dict[str, Any]:
    """Per pool: the path it took and what its context holds (no records, no branch markers, no --data)."""
    out = {}
    for sp in instance.workflow.subprocesses.values():
        top = instance.workflow.get_task_from_id(sp.parent_task_id)
        ctx = instance.contexts[top.internal_data["lf_ctx"]]
        values = {k: thaw(v) for k, v in ctx.resolved().items()
                  if not k.startswith(("_", "activity:", "event:")) and k not in ctx.layer(Layer.PROCESS)}
        out[sp.spec.name] = {"path": [t.task_spec.bpmn_id for t in sp.get_tasks(state=TaskState.COMPLETED)
                                      if t.task_spec.bpmn_id], "data": values}
    return out


def _assert_replays(instance: Any) -> None:
    for ctx in instance.contexts.values():
        again = LayeredContext.replay(ctx.tape)
        assert again == ctx
        assert json.dumps({str(l): thaw(dict(again.layer(l).items())) for l in Layer}, sort_keys=True) == \
            json.dumps({str(l): thaw(dict(ctx.layer(l).items())) for l in Layer}, sort_keys=True)


def test_two_pools_exchange_an_order_and_a_reply_with_their_payloads() -> None:
    process = load_process(ORDER)
    assert process.id == "order_collab" and process.name == "Order and quote"
    engine = Engine()
    instance = engine.run_process(process)
    assert instance.status == "completed", instance.error
    pools = _pools(instance)
    assert pools == _plain_spiff(ORDER, "order_collab", {}, {})
    # each pool saw its own keys and the payload it was sent, nothing of the other's
    assert pools["customer"]["data"] == {"item": "widget", "qty": 3, "quote": {"item": "widget", "price": 5},
                                         "total": 15}
    assert pools["supplier"]["data"] == {"order": {"item": "widget", "qty": 3}, "unit": 5,
                                         "offer": {"item": "widget", "price": 5}}
    # the payload came through the context's write path: a record of the catch in the receiver's HISTORY
    supplier = next(c for n, c in instance.contexts.items() if n.startswith("main/supplier"))
    record = thaw(supplier.layer(Layer.HISTORY)["event:receive_order"])
    assert record["event"] == "order" and record["keys"] == ["order"]
    # the end join merged the pools into the instance's context
    main_history = instance.context.layer(Layer.HISTORY)
    assert main_history["total"] == 15 and main_history["unit"] == 5
    _assert_replays(instance)


def test_pool_started_by_a_message_waits_for_a_person_and_data_goes_to_process(tmp_path: Path) -> None:
    process = load_process(PURCHASE)
    engine = Engine(store=f"sqlite:///{tmp_path / 'p.db'}")
    instance = engine.run_process(process, {"part": "gear"})
    assert instance.status == "waiting"
    assert [w["task_id"] for w in instance.waiting_for if w["kind"] == "user_task"] == ["approve_offer"]
    # the --data is PROCESS, shared; the seller (started by the buyer's request) never sees the buyer's WORKING/HISTORY
    seller = next(c for n, c in instance.contexts.items() if n.startswith("main/seller") and n.count("/") == 1)
    assert seller.layer(Layer.PROCESS)["part"] == "gear"
    assert "need" not in seller and "note" not in seller and thaw(seller.resolve("request")) == {"part": "gear",
                                                                                                 "count": 2}
    buyer = next(c for n, c in instance.contexts.items() if n.startswith("main/buyer"))
    assert "price" not in buyer and thaw(buyer.resolve("offer")) == {"price": 40, "in_stock": True}
    task = next(w for w in instance.waiting_for if w["kind"] == "user_task")
    engine.complete_user_task(engine.load(instance.instance_id), task["id"], {"approved": True})
    done = engine.load(instance.instance_id)
    assert done.status == "completed", done.error
    assert _pools(done) == _plain_spiff(PURCHASE, "purchase", {"part": "gear"}, {"approve_offer": {"approved": True}})
    assert done.context.resolve("booked") == 80
    _assert_replays(done)


def _cli(*args: str, store: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "LAYERFLOW_STORE": store}
    return subprocess.run([sys.executable, "-m", "engine.cli", *args], capture_output=True, text=True, cwd=ROOT,
                          env=env, stdin=subprocess.DEVNULL, timeout=300)


def test_cli_run_waits_in_one_pool_and_resume_in_a_new_process_completes(tmp_path: Path) -> None:
    store = f"sqlite:///{tmp_path / 'cli.db'}"
    (tmp_path / "data.json").write_text(json.dumps({"part": "gear"}))
    (tmp_path / "answers.json").write_text(json.dumps({"user_tasks": {"approve_offer": {"approved": True}}}))
    first = _cli("run", str(PURCHASE), "--data", str(tmp_path / "data.json"), "--json", store=store)
    assert first.returncode == 3, first.stderr
    doc = json.loads(first.stdout)
    assert doc["process_id"] == "purchase" and doc["status"] == "waiting"
    second = _cli("resume", doc["instance_id"], "--answers", str(tmp_path / "answers.json"), "--json", store=store)
    assert second.returncode == 0, second.stderr
    done = json.loads(second.stdout)
    assert done["status"] == "completed" and done["process_id"] == "purchase"
    assert done["layers"]["L1"] == {"part": "gear"}
    assert done["layers"]["L3"]["booked"] == 80 and done["layers"]["L3"]["decision"] == {"approved": True, "total": 80}
    tape = json.loads(_cli("tape", doc["instance_id"], "--json", store=store).stdout)
    replayed = json.loads(_cli("replay", doc["instance_id"], "--until", str(tape[-1]["seq"]), "--json",
                               store=store).stdout)
    assert replayed["layers"] == done["layers"]


def test_cli_run_json_names_the_collaboration(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LAYERFLOW_STORE", f"sqlite:///{tmp_path / 'c.db'}")
    result = CliRunner().invoke(main, ["run", str(ORDER), "--json"], catch_exceptions=False)
    doc = json.loads(result.stdout)
    assert result.exit_code == 0 and doc["status"] == "completed" and doc["process_id"] == "order_collab"
    assert doc["layers"]["L3"]["total"] == 15
    # one pool alone still runs when asked for: it waits for the reply nobody sends
    alone = json.loads(CliRunner().invoke(main, ["run", str(ORDER), "--process", "customer", "--json"]).stdout)
    assert alone["process_id"] == "customer" and alone["status"] == "waiting"
    assert [w.get("event") for w in alone["waiting_for"]] == ["quote"]


def _variant(tmp_path: Path, *edits: tuple[str, str]) -> Path:
    text = ORDER.read_text()
    for old, new in edits:
        assert old in text
        text = text.replace(old, new)
    out = tmp_path / "variant.bpmn"
    out.write_text(text)
    return out


@pytest.mark.parametrize(("edits", "process_id", "code", "words"), [
    ([('<bpmn:messageEventDefinition id="receive_order_def" messageRef="order_msg">',
       '<bpmn:messageEventDefinition id="receive_order_def" messageRef="quote_msg">')],
     None, "message_flow_mismatch", ["flow_order", "'order'", "'quote'", "same bpmn:message"]),
    ([('sourceRef="send_order" targetRef="receive_order" />', 'sourceRef="prepare_order" targetRef="receive_order" />')],
     None, "message_flow_sends_nothing", ["flow_order", "prepare_order", "send task"]),
    ([('sourceRef="send_order" targetRef="receive_order" />', 'sourceRef="send_order" targetRef="price_order" />')],
     None, "message_flow_receives_nothing", ["flow_order", "price_order", "waits for no message", "'order'"]),
    ([('sourceRef="send_order" targetRef="receive_order" />', 'sourceRef="send_order" targetRef="supplier_pool" />'),
      ('<bpmn:messageEventDefinition id="receive_order_def" messageRef="order_msg">',
       '<bpmn:messageEventDefinition id="receive_order_def" messageRef="quote_msg">')],
     None, "message_flow_receives_nothing", ["flow_order", "'order'", "'Supplier'", "nothing waits"]),
    ([('<bpmn:messageFlow id="flow_quote"', '<bpmn:correlationKey id="order_key" name="order" />\n'
       '    <bpmn:messageFlow id="flow_quote"')],
     None, "collaboration_correlation", ["order_collab", "'order_key'", "--process"]),
    ([('id="customer" name="Customer" isExecutable="true"', 'id="customer" name="Customer" isExecutable="false"'),
      ('id="supplier" name="Supplier" isExecutable="true"', 'id="supplier" name="Supplier" isExecutable="false"')],
     "order_collab", "collaboration_not_executable", ["order_collab", "isExecutable"]),
])
def test_validate_names_the_message_flow_and_what_to_do(tmp_path: Path, edits: list[tuple[str, str]],
                                                        process_id: str | None, code: str, words: list[str]) -> None:
    report = validate_process(_variant(tmp_path, *edits), process_id=process_id)
    found = [p for p in report.problems if p.code == code]
    assert found and not report.ok, [str(p) for p in report.problems]
    for word in words:
        assert word in found[0].message
    result = CliRunner().invoke(main, ["validate", str(tmp_path / "variant.bpmn"),
                                       *(["--process", process_id] if process_id else [])])
    assert result.exit_code == 2 and found[0].message in result.stdout + result.stderr


def test_a_message_flow_drawn_to_the_receiving_pools_border_is_carried(tmp_path: Path) -> None:
    path = _variant(tmp_path, ('sourceRef="send_order" targetRef="receive_order" />',
                               'sourceRef="send_order" targetRef="supplier_pool" />'))
    report = validate_process(path)
    assert report.ok and not report.problems, [str(p) for p in report.problems]
    assert Engine().run_process(load_process(path)).context.resolve("total") == 15


def test_a_pool_that_does_not_run_is_a_warning_naming_its_flows(tmp_path: Path) -> None:
    path = _variant(tmp_path, ('id="supplier" name="Supplier" isExecutable="true"',
                               'id="supplier" name="Supplier" isExecutable="false"'))
    # alone, the one executable process runs (as before); asked for, the collaboration says what is lost
    assert validate_process(path).process_id == "customer"
    report = validate_process(path, process_id="order_collab")
    assert report.ok and report.process_id == "order_collab"
    codes = {p.code: p for p in report.problems}
    assert "flow_order" in codes["message_flow_not_run"].message and "Supplier" in codes["message_flow_not_run"].message
    assert "layerflow send" in codes["message_flow_from_outside"].message


def test_a_message_from_a_pool_that_does_not_run_is_sent_from_outside_into_its_receivers_context(
        tmp_path: Path) -> None:
    path = _variant(tmp_path, ('id="supplier" name="Supplier" isExecutable="true"',
                               'id="supplier" name="Supplier" isExecutable="false"'))
    engine = Engine()
    instance = engine.run_process(load_process(path, "order_collab"))
    assert instance.status == "waiting"
    assert [(w["task_id"], w["event"]) for w in instance.waiting_for] == [("receive_quote", "quote")]
    instance = engine.send_event(instance, "quote", {"item": "widget", "price": 7})
    assert instance.status == "completed", instance.error
    customer = next(c for n, c in instance.contexts.items() if n.startswith("main/customer"))
    assert customer.resolve("total") == 21
    assert thaw(customer.layer(Layer.HISTORY)["event:receive_quote"])["sent_by"] != "process"
    _assert_replays(instance)


def test_a_pools_message_event_subprocess_is_a_warning_and_indeed_never_starts() -> None:
    path = HERE / "pool_event_subprocess.bpmn"
    report = validate_process(path)
    assert report.ok and report.pools == ("customer", "supplier")
    warning = next(p for p in report.problems if p.code == "pool_event_subprocess_never_starts")
    assert warning.element_id == "note_in" and "'supplier'" in warning.message
    instance = Engine().run_process(load_process(path))
    assert instance.status == "completed" and "noted" not in instance.context
    assert instance.context.resolve("total") == 15


def test_every_pool_waiting_for_a_message_to_start_is_refused(tmp_path: Path) -> None:
    path = _variant(tmp_path, ('<bpmn:startEvent id="c_start"><bpmn:outgoing>c1</bpmn:outgoing></bpmn:startEvent>',
                               '<bpmn:startEvent id="c_start"><bpmn:outgoing>c1</bpmn:outgoing>'
                               '<bpmn:messageEventDefinition id="c_start_def" messageRef="quote_msg" />'
                               '</bpmn:startEvent>'),
                    ('<bpmn:startEvent id="s_start"><bpmn:outgoing>s1</bpmn:outgoing></bpmn:startEvent>',
                     '<bpmn:startEvent id="s_start"><bpmn:outgoing>s1</bpmn:outgoing>'
                     '<bpmn:messageEventDefinition id="s_start_def" messageRef="order_msg" />'
                     '</bpmn:startEvent>'))
    report = validate_process(path)
    problem = next(p for p in report.problems if p.code == "collaboration_never_starts")
    assert not report.ok and problem.element_id == "order_collab" and "plain start event" in problem.message


def test_the_catalog_lists_a_collaboration_and_loads_it() -> None:
    from engine.governance import Catalog

    catalog = Catalog(HERE)
    assert catalog.entries()["purchase"] == {"id": "purchase", "name": "Purchase with approval",
                                             "file": "quote_approval.bpmn"}
    assert catalog.load("purchase").id == "purchase" and catalog.load("buyer").id == "buyer"


def test_a_key_both_pools_set_is_their_own_until_the_end_join_where_it_is_a_conflict(tmp_path: Path) -> None:
    path = _variant(tmp_path, ('qty = 3</bpmn:script>', 'qty = 3\nstatus = "ordered"</bpmn:script>'),
                    ('offer = {"item": order["item"], "price": unit}</bpmn:script>',
                     'offer = {"item": order["item"], "price": unit}\nstatus = "quoted"</bpmn:script>'),
                    ('<bpmn:script>total = quote["price"] * qty</bpmn:script>',
                     '<bpmn:script>total = quote["price"] * qty if status == "ordered" else -1</bpmn:script>'))
    engine = Engine()
    instance = engine.run_process(load_process(path))
    # the supplier's status never reached the customer, who read its own
    customer = next(c for n, c in instance.contexts.items() if n.startswith("main/customer"))
    assert customer.resolve("total") == 15
    assert instance.status == "waiting"
    assert [w["id"] for w in instance.waiting_for] == ["order_collab.EndJoin/status"]
    assert instance.conflicts[0]["values"] == {"customer": "ordered", "supplier": "quoted"}
    instance = engine.answer_confirmation(instance, "order_collab.EndJoin/status", "quoted")
    assert instance.status == "completed", instance.error
    assert instance.context.resolve("status") == "quoted"
    _assert_replays(instance)


def test_a_message_sent_before_its_pool_waits_for_it_waits_across_a_save_and_a_load(tmp_path: Path) -> None:
    """The supplier opens its shop (a person) before it takes orders: the customer's order, sent
    meanwhile, waits for it (SpiffWorkflow keeps it in ``bpmn_events``, saved with the workflow)."""
    path = _variant(tmp_path, (
        '<bpmn:sequenceFlow id="s1" sourceRef="s_start" targetRef="receive_order" />',
        '<bpmn:sequenceFlow id="s1" sourceRef="s_start" targetRef="open_shop" />'
        '<bpmn:userTask id="open_shop" name="Open shop"><bpmn:incoming>s1</bpmn:incoming>'
        '<bpmn:outgoing>s0</bpmn:outgoing></bpmn:userTask>'
        '<bpmn:sequenceFlow id="s0" sourceRef="open_shop" targetRef="receive_order" />'),
        ('<bpmn:incoming>s1</bpmn:incoming><bpmn:outgoing>s2</bpmn:outgoing>\n      <bpmn:messageEventDefinition '
         'id="receive_order_def"', '<bpmn:incoming>s0</bpmn:incoming><bpmn:outgoing>s2</bpmn:outgoing>\n      '
         '<bpmn:messageEventDefinition id="receive_order_def"'))
    store = f"sqlite:///{tmp_path / 'pending.db'}"
    first = Engine(store=store).run_process(load_process(path))
    assert first.status == "waiting"
    assert [w["task_id"] for w in first.waiting_for if w["kind"] == "user_task"] == ["open_shop"]
    later = Engine(store=store)
    again = later.load(first.instance_id)
    assert [e.event_definition.name for e in again.workflow.bpmn_events] == ["order"]
    task = next(w for w in again.waiting_for if w["kind"] == "user_task")
    done = later.complete_user_task(again, task["id"], {})
    assert done.status == "completed", done.error
    assert done.context.resolve("total") == 15 and not done.workflow.bpmn_events
    _assert_replays(done)


def test_the_diagram_of_a_collaboration_draws_both_pools_and_the_message_flows() -> None:
    from engine.diagram import marks_of, parse_bpmn, render_svg

    diagram = parse_bpmn(PURCHASE, "purchase")
    assert diagram.name == "Purchase with approval"
    assert {"write_request", "book_sale", "s_split"} <= set(diagram.nodes)
    assert sorted(e.id for e in diagram.edges if e.kind == "message") == ["flow_decision", "flow_offer", "flow_request"]
    instance = Engine().run_process(load_process(PURCHASE), {"part": "gear"})
    svg = render_svg(diagram, marks_of(instance))
    assert 'data-kind="message"' in svg and "3 message flows" in svg
    assert "approve_offer" in marks_of(instance).current


def _configured(tmp_path: Path, config: str) -> Path:
    path = _variant(tmp_path, ('qty = 3</bpmn:script>', 'qty = 3\nstatus = "ordered"</bpmn:script>'),
                    ('offer = {"item": order["item"], "price": unit}</bpmn:script>',
                     'offer = {"item": order["item"], "price": unit}\nstatus = "quoted by " + shop</bpmn:script>'))
    (tmp_path / "variant.layerflow.yaml").write_text(config)
    return path


def test_the_collaborations_config_injects_into_a_pool_and_settles_its_end_join(tmp_path: Path) -> None:
    path = _configured(tmp_path, "order_collab:\n  mergeStrategy: BRANCH_PRIORITY\n  branchPriority: [supplier, customer]\n"
                                 "  branches:\n    - id: supplier\n      contextInject: {shop: north}\n")
    assert validate_process(path).ok
    instance = Engine().run_process(load_process(path))
    assert instance.status == "completed", instance.error
    supplier = next(c for n, c in instance.contexts.items() if n.startswith("main/supplier"))
    customer = next(c for n, c in instance.contexts.items() if n.startswith("main/customer"))
    assert supplier.resolve("shop") == "north" and "shop" not in customer
    assert instance.context.resolve("status") == "quoted by north"
    assert instance.conflicts[0]["resolution"]["resolver"] == "strategy"
    _assert_replays(instance)


def test_the_collaborations_config_names_pools(tmp_path: Path) -> None:
    path = _configured(tmp_path, "order_collab:\n  branchPriority: [suplier]\n"
                                 "  branches:\n    - id: supplier_pool\n      contextInject: {shop: north}\n")
    report = validate_process(path)
    problems = {p.code: p for p in report.problems}
    assert not report.ok
    assert "'supplier_pool'" in problems["branch_not_outgoing"].message
    assert "'customer', 'supplier'" in problems["branch_not_outgoing"].message
    assert "did you mean 'supplier'" in problems["branch_priority_unknown_id"].message.lower()


def test_the_example_collaboration_runs_with_answers(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LAYERFLOW_STORE", f"sqlite:///{tmp_path / 'e.db'}")
    (tmp_path / "answers.json").write_text(json.dumps({"user_tasks": {"approve_offer": {"approved": False}}}))
    result = CliRunner().invoke(main, ["run", str(ROOT / "bpmn_examples" / "purchase_collaboration.bpmn"), "--data",
                                       '{"part": "bolt"}', "--answers", str(tmp_path / "answers.json"), "--json"])
    doc = json.loads(result.stdout)
    assert (result.exit_code, doc["status"], doc["process_id"]) == (0, "completed", "purchase"), result.stdout
    assert doc["layers"]["L3"]["offer"] == {"price": 70, "in_stock": True} and doc["layers"]["L3"]["booked"] == 0


def test_the_rest_api_starts_a_collaboration_from_the_catalog_and_completes_its_user_task() -> None:
    from fastapi.testclient import TestClient

    from engine.api import create_app

    auth = {"Authorization": "Bearer collab-token"}
    with TestClient(create_app("memory://", HERE, "collab-token")) as client:
        listed = {p["id"] for p in client.get("/api/processes", headers=auth).json()}
        assert {"purchase", "order_collab", "buyer"} <= listed
        started = client.post("/api/instances", json={"process_id": "purchase", "data": {"part": "gear"}},
                              headers=auth)
        assert started.status_code == 201, started.text
        doc = started.json()
        assert (doc["process_id"], doc["status"]) == ("purchase", "waiting")
        task = next(w for w in doc["waiting_for"] if w["kind"] == "user_task")
        done = client.post(f"/api/instances/{doc['instance_id']}/user-tasks/{task['id']}",
                           json={"data": {"approved": True}}, headers=auth)
        assert done.status_code == 200, done.text
        assert done.json()["status"] == "completed" and done.json()["layers"]["L3"]["booked"] == 80


# ----- the receiver's record names its sender; extension config inside pools ---------------------

def _event_record(instance: Any, pool: str, catch_id: str) -> dict[str, Any]:
    ctx = next(c for n, c in instance.contexts.items() if n.startswith(f"main/{pool}") and n.count("/") == 1)
    return dict(thaw(ctx.layer(Layer.HISTORY)[f"event:{catch_id}"]))


def test_the_receivers_record_and_tape_name_the_sending_pool_and_message_flow() -> None:
    instance = Engine().run_process(load_process(ORDER))
    assert instance.status == "completed", instance.error

    received = _event_record(instance, "supplier", "receive_order")
    assert received["sent_from"] == {"participant": "customer_pool", "process": "customer", "element": "send_order",
                                     "message_flow": "flow_order"}
    assert received["sent_by"] == "process"  # (as before)
    assert received["summary"] == "message 'order' caught at receive_order from 'send_order' of pool 'customer_pool': order"
    assert _event_record(instance, "customer", "receive_quote")["sent_from"] == {
        "participant": "supplier_pool", "process": "supplier", "element": "send_quote", "message_flow": "flow_quote"}
    # on the receiver's tape: the event that completes the catch carries the record
    supplier = next(c for n, c in instance.contexts.items() if n.startswith("main/supplier") and n.count("/") == 1)
    (complete,) = [e for e in supplier.tape if e.kind.value == "complete" and e.activity == "receive_order"]
    records = [value for _layer, key, value in complete.changes if key == "event:receive_order"]
    assert [thaw(r)["sent_from"]["participant"] for r in records] == ["customer_pool"]
    _assert_replays(instance)


def test_a_message_flow_to_the_pools_border_is_named_and_a_sender_survives_a_save(tmp_path: Path) -> None:
    """The order waits (the supplier's person first opens the shop) across a save and a load; its
    message flow is drawn to the supplier's pool, not to the catch event."""
    path = _variant(tmp_path, (
        '<bpmn:sequenceFlow id="s1" sourceRef="s_start" targetRef="receive_order" />',
        '<bpmn:sequenceFlow id="s1" sourceRef="s_start" targetRef="open_shop" />'
        '<bpmn:userTask id="open_shop" name="Open shop"><bpmn:incoming>s1</bpmn:incoming>'
        '<bpmn:outgoing>s0</bpmn:outgoing></bpmn:userTask>'
        '<bpmn:sequenceFlow id="s0" sourceRef="open_shop" targetRef="receive_order" />'),
        ('<bpmn:incoming>s1</bpmn:incoming><bpmn:outgoing>s2</bpmn:outgoing>\n      <bpmn:messageEventDefinition '
         'id="receive_order_def"', '<bpmn:incoming>s0</bpmn:incoming><bpmn:outgoing>s2</bpmn:outgoing>\n      '
         '<bpmn:messageEventDefinition id="receive_order_def"'),
        ('sourceRef="send_order" targetRef="receive_order" />', 'sourceRef="send_order" targetRef="supplier_pool" />'))
    store = f"sqlite:///{tmp_path / 'sender.db'}"
    first = Engine(store=store).run_process(load_process(path))
    assert first.status == "waiting"
    later = Engine(store=store)
    again = later.load(first.instance_id)
    assert [getattr(e, "lf_sent_from", None) for e in again.workflow.bpmn_events] == [
        {"element": "send_order", "process": "customer"}]
    task = next(w for w in again.waiting_for if w["kind"] == "user_task")
    done = later.complete_user_task(again, task["id"], {})

    assert done.status == "completed", done.error
    assert done.context.resolve("event:receive_order")["sent_from"] == {
        "participant": "customer_pool", "process": "customer", "element": "send_order", "message_flow": "flow_order"}


def test_a_message_sent_from_outside_names_no_pool(tmp_path: Path) -> None:
    path = _variant(tmp_path, ('id="supplier" name="Supplier" isExecutable="true"',
                               'id="supplier" name="Supplier" isExecutable="false"'))
    engine = Engine()
    instance = engine.send_event(engine.run_process(load_process(path, "order_collab")), "quote",
                                 {"item": "widget", "price": 7})
    assert instance.status == "completed", instance.error
    assert "sent_from" not in _event_record(instance, "customer", "receive_quote")


def test_extension_config_on_elements_inside_a_pool_works_as_in_a_single_process(tmp_path: Path) -> None:
    """A gateway's layerflow:config (a branch's contextInject) and a task's spiffworkflow:activityConfig
    (preserveKeys) inside the seller's pool, as they work in a process of its own."""
    text = PURCHASE.read_text().replace('xmlns:spiffworkflow=', 'xmlns:layerflow="https://layerflow.dev/bpmn" '
                                        'xmlns:spiffworkflow=', 1)
    edits = [('<bpmn:parallelGateway id="s_split">',
              '<bpmn:parallelGateway id="s_split"><bpmn:extensionElements><layerflow:config>{"branches": [{"id": '
              '"check_stock", "contextInject": {"max_count": 1}}]}</layerflow:config></bpmn:extensionElements>'),
             ('in_stock = request["count"] &lt;= 5', 'in_stock = request["count"] &lt;= max_count'),
             ('<bpmn:scriptTask id="set_price" name="Set price">',
              '<bpmn:scriptTask id="set_price" name="Set price"><bpmn:extensionElements><spiffworkflow:activityConfig>'
              '{"preserveKeys": ["price"]}</spiffworkflow:activityConfig></bpmn:extensionElements>')]
    for old, new in edits:
        assert old in text
        text = text.replace(old, new)
    path = tmp_path / "configured.bpmn"
    path.write_text(text)
    assert validate_process(path).ok
    process = load_process(path)
    assert process.config("set_price").effective_preserve_keys == ["price"]
    instance = Engine().run_process(process, {"part": "gear"})

    seller = next(c for n, c in instance.contexts.items() if n.startswith("main/seller") and n.count("/") == 1)
    assert seller.resolve("in_stock") is False  # 2 parts ordered, max_count 1 injected into the branch
    branch = next(c for n, c in instance.contexts.items() if n.startswith("main/seller") and "/check_stock" in n)
    assert branch.resolve("max_count") == 1
    assert not any("max_count" in c for n, c in instance.contexts.items() if "/check_stock" not in n)
    pricing = next(c for n, c in instance.contexts.items() if n.startswith("main/seller") and "/set_price" in n)
    (complete,) = [e for e in pricing.tape if e.kind.value == "complete" and e.activity == "set_price"]
    assert complete.data["preserve"] == ["price"]


def test_config_on_the_collaboration_element_says_where_it_goes(tmp_path: Path) -> None:
    path = _variant(tmp_path, ('<bpmn:collaboration id="order_collab" name="Order and quote">',
                               '<bpmn:collaboration id="order_collab" name="Order and quote"><bpmn:extensionElements>'
                               '<spiffworkflow:activityConfig>{"mergeStrategy": "LAST_WRITER_WINS"}'
                               '</spiffworkflow:activityConfig></bpmn:extensionElements>'))
    report = validate_process(path)
    (problem,) = [p for p in report.problems if p.code == "config_not_a_flow_node"]
    assert problem.element_id == "order_collab"
    assert "bpmn:collaboration" in problem.message
    assert "put them under 'order_collab:' in the config file" in problem.message
