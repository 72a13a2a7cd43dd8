"""Every BPMN in bpmn_examples runs; the SpiffWorkflow-shaped examples take the same path
and end with the same variables as under plain SpiffWorkflow, except at a join, where
plain SpiffWorkflow loses a branch's change and layerflow keeps it."""

from __future__ import annotations

import time
from typing import Any

import pytest

from engine import Engine, load_process

from engine_helpers import EXAMPLES, path_of, variables


def run_plain(path: Any, data: dict[str, Any], user_tasks: dict[str, dict[str, Any]]) -> tuple[Any, dict[str, Any]]:
    """Stock SpiffWorkflow on a BPMN file, timers refreshed (``engine_helpers.run_plain`` plus timers)."""
    from SpiffWorkflow.bpmn.workflow import BpmnWorkflow
    from SpiffWorkflow.spiff.parser.process import SpiffBpmnParser
    from SpiffWorkflow.util.task import TaskState

    parser = SpiffBpmnParser()
    parser.add_bpmn_file(str(path))
    parser.add_dmn_files([str(p) for p in path.parent.glob("*.dmn")])  # as layerflow finds them beside
    pid = parser.get_process_ids()[0]
    wf = BpmnWorkflow(parser.get_spec(pid), parser.get_subprocess_specs(pid))
    wf.task_tree.data.update(data)
    for _ in range(100):
        wf.do_engine_steps()
        wf.refresh_timers()
        wf.do_engine_steps()
        if wf.is_completed():
            break
        ready = wf.get_tasks(state=TaskState.READY, manual=True)
        if not ready:
            continue  # a timer about to be due
        task = ready[0]
        task.data.update(user_tasks[task.task_spec.bpmn_id])
        task.run()
    assert wf.is_completed(), "plain run is stuck"
    return wf, dict(wf.last_task.data)


# (file, initial data, user task answers)
CASES: list[tuple[str, dict[str, Any], dict[str, dict[str, Any]]]] = [
    ("parallel_scripts", {}, {}),
    ("nested_parallel", {}, {}),
    ("inclusive_gateway", {"need_credit": True, "need_identity": False, "need_address": True}, {}),
    ("inclusive_gateway", {"need_credit": False, "need_identity": True, "need_address": False}, {}),
    ("inclusive_gateway", {"need_credit": False, "need_identity": False, "need_address": False}, {}),
    ("exclusive_default", {"amount": 120000}, {}),
    ("exclusive_default", {"amount": 60000}, {}),
    ("exclusive_default", {"amount": 1000}, {}),
    ("xor_loop", {"batch_size": 4}, {}),
    ("xor_loop", {"batch_size": 1}, {}),
    ("parallel_user_task", {"title": "Q3 report"}, {"review": {"approved": True, "reviewer": "ann"}}),
    ("parallel_user_task", {"title": "Q3 report"}, {"review": {"approved": False, "reviewer": "bob"}}),
    ("multi_instance_parallel", {}, {}),
    ("multi_instance_sequential", {}, {}),
    ("multi_instance_cardinality", {"copies": 3, "title": "box"}, {}),
    ("multi_instance_cardinality", {"copies": 0, "title": "box"}, {}),
    ("multi_instance_completion", {"amounts": [2, 4, 6, 8], "limit": 10}, {}),
    ("multi_instance_completion", {"amounts": [1, 2], "limit": 10}, {}),
    ("standard_loop", {"limit": 3}, {}),
    ("standard_loop", {"limit": 9}, {}),
    ("timer_boundary", {}, {"approve": {"approved": True}}),
    ("timer_boundary", {}, {"approve": {"approved": False}}),
    ("data_object", {}, {}),
    ("subprocess_parallel", {"amount": 120000}, {}),
    ("subprocess_parallel", {"amount": 20000}, {}),
    ("error_boundary", {"years_in_business": 12}, {}),
    ("call_activity", {"amount": 120000}, {}),
    ("call_activity", {"amount": 5000}, {}),
    ("business_rules", {"claim_type": "glass", "amount": 800}, {}),
    ("business_rules", {"claim_type": "theft", "amount": 25000}, {"adjuster_review": {"approved": True}}),
    ("business_rules", {"claim_type": "glass", "amount": 3000}, {"adjuster_review": {"approved": False}}),
]

# Keys layerflow adds on purpose (a branch's contextInject) and what plain SpiffWorkflow
# gets wrong at a join (the last branch to arrive overwrites the other's change).
LAYERFLOW_ONLY = {"exclusive_default": {"queue"},
                  # a data object is a context key (plain SpiffWorkflow keeps it in workflow.data_objects)
                  "data_object": {"obj"}}
PLAIN_SPIFF_LOSES = {"parallel_scripts": {"total": (0, 60), "summary": ("A-1: 0 via post in 4 days",
                                                                       "A-1: 60 via post in 4 days")}}


def test_every_example_is_run_by_a_test() -> None:
    tested = {name for name, _, _ in CASES} | {"loan_approval",  # the loan demo: test_loan.py
                                               "message_wait",   # needs a message: the tests below
                                               "purchase_collaboration"}  # two pools: test_collaboration.py
    assert {p.stem for p in EXAMPLES.glob("*.bpmn")} == tested


@pytest.mark.parametrize(("name", "data", "user_tasks"), CASES, ids=lambda v: v if isinstance(v, str) else None)
def test_same_path_and_variables_as_plain_spiffworkflow(name: str, data: dict[str, Any],
                                                        user_tasks: dict[str, dict[str, Any]]) -> None:
    path = EXAMPLES / f"{name}.bpmn"
    plain_wf, plain_vars = run_plain(path, data, user_tasks)
    engine = Engine()
    instance = engine.run(engine.start(load_process(path), data), answers={"user_tasks": user_tasks})

    assert instance.status == "completed", instance.error
    assert path_of(instance.workflow) == path_of(plain_wf)
    ours = variables(instance.main)
    for key in LAYERFLOW_ONLY.get(name, set()):
        ours.pop(key)
    for key, (plain_value, our_value) in PLAIN_SPIFF_LOSES.get(name, {}).items():
        assert plain_vars.pop(key) == plain_value
        assert ours.pop(key) == our_value
    assert ours == plain_vars


def test_error_boundary_keeps_what_the_subprocess_completed() -> None:
    """The sub-process ends in a BPMN error; the boundary event takes the rejection path.
    Plain SpiffWorkflow drops the sub-process's data with the error; layerflow keeps what
    its completed activities wrote (``compute_score`` completed, and its record says so)."""
    path = EXAMPLES / "error_boundary.bpmn"
    data = {"years_in_business": 3}
    plain_wf, plain_vars = run_plain(path, data, {})
    engine = Engine()
    instance = engine.run(engine.start(load_process(path), data))

    assert instance.status == "completed", instance.error
    assert path_of(instance.workflow) == path_of(plain_wf)
    assert "reject" in path_of(plain_wf) and "approve" not in path_of(plain_wf)
    ours = variables(instance.main)
    assert ours.pop("score") == 330 and "score" not in plain_vars
    assert ours == plain_vars == {"years_in_business": 3, "decision": "rejected", "reason": "score under 400"}
    assert instance.main.get("activity:compute_score")["status"] == "completed"


def test_layerflow_keeps_a_branch_change_that_plain_spiffworkflow_loses() -> None:
    path = EXAMPLES / "parallel_scripts.bpmn"
    _, plain_vars = run_plain(path, {}, {})
    engine = Engine()
    instance = engine.run(engine.start(load_process(path)))
    # "price" set total=60 in one branch; "ship" arrived last carrying the old total=0.
    assert plain_vars["total"] == 0
    assert instance.main.resolve("total") == 60
    join = [e for e in instance.main.tape if e.data.get("note") == "join"]
    assert len(join) == 1 and join[0].data["gateway_id"] == "join"


def test_branch_contexts_are_isolated_until_the_join() -> None:
    engine = Engine()
    instance = engine.run(engine.start(load_process(EXAMPLES / "nested_parallel.bpmn")))
    branches = instance.branches
    assert {info["branch_id"] for info in branches.values()} == {"branch_a", "b1", "a1", "a2"}
    assert all(info["status"] == "joined" for info in branches.values())
    a1 = next(n for n, i in branches.items() if i["branch_id"] == "a1")
    # a1's context never saw a2's write, b1's or the outer result
    assert "a2_value" not in instance.contexts[a1] and "b_value" not in instance.contexts[a1]
    # the inner join merged into branch A, not into main
    inner = next(n for n, i in branches.items() if i["branch_id"] == "branch_a")
    assert branches[a1]["parent"] == inner
    assert instance.main.resolve("grand_total") == 11 * 2 + 11 * 3 + 50


def test_exclusive_gateway_injects_the_taken_branch_in_place() -> None:
    engine = Engine()
    instance = engine.run(engine.start(load_process(EXAMPLES / "exclusive_default.bpmn"), {"amount": 60000}))
    ctx = instance.main
    assert (ctx.resolve("queue"), ctx.resolve("_branch_id")) == ("standard", "medium_tier")
    assert instance.branches == {}  # an XOR forks nothing: the context goes on with the branch
    split = [e for e in ctx.tape if e.data.get("note") == "split"]
    assert split[0].data["branches"] == ["medium_tier"]


def test_loop_records_each_pass() -> None:
    engine = Engine()
    instance = engine.run(engine.start(load_process(EXAMPLES / "xor_loop.bpmn"), {"batch_size": 3}))
    history = instance.main.layer("L3")
    assert [k for k in history if k.startswith("activity:work")] == ["activity:work", "activity:work#2", "activity:work#3"]
    assert instance.main.resolve("result") == 1 + 4 + 9


def test_user_task_in_a_branch_waits_and_resumes() -> None:
    engine = Engine()
    instance = engine.run(engine.start(load_process(EXAMPLES / "parallel_user_task.bpmn"), {"title": "T"}))
    assert instance.status == "waiting"
    [waiting] = instance.waiting_for
    assert (waiting["kind"], waiting["task_id"]) == ("user_task", "review")
    instance = engine.complete_user_task(instance, "review", {"approved": True, "reviewer": "ann"})
    assert instance.status == "completed"
    assert instance.main.resolve("outcome") == "published by ann, cost 120"


def test_a_layerflow_parsed_spec_still_runs_under_plain_spiffworkflow() -> None:
    from SpiffWorkflow.bpmn.workflow import BpmnWorkflow

    process = load_process(EXAMPLES / "parallel_scripts.bpmn")
    wf = BpmnWorkflow(process.spec, process.subprocess_specs)  # no driver attached: stock behaviour
    wf.do_engine_steps()
    assert wf.is_completed() and wf.last_task.data["carrier"] == "post"


DOCUMENTS = {"files": ["police_report.pdf", "repair_invoice.pdf"], "sender": "claimant"}


def test_message_wait_takes_the_same_path_as_plain_spiffworkflow_once_the_message_arrives() -> None:
    """The claim waits for the documents. Plain SpiffWorkflow needs the message delivered too
    (``BpmnWorkflow.send_event``); it keeps the payload in task data under the
    messageVariable, layerflow in the context under the same name."""
    from SpiffWorkflow.bpmn.util import BpmnEvent
    from SpiffWorkflow.bpmn.workflow import BpmnWorkflow
    from SpiffWorkflow.spiff.parser.process import SpiffBpmnParser

    path = EXAMPLES / "message_wait.bpmn"
    data = {"claim_id": "CL-1042"}
    parser = SpiffBpmnParser()
    parser.add_bpmn_file(str(path))
    plain = BpmnWorkflow(parser.get_spec("message_wait"))
    plain.task_tree.data.update(data)
    plain.do_engine_steps()
    [receive] = [t for t in plain.event_manager.tasks.values() if t.task_spec.bpmn_id == "receive_documents"]
    plain.send_event(BpmnEvent(receive.task_spec.event_definition, payload=DOCUMENTS))
    plain.do_engine_steps()
    assert plain.is_completed()

    engine = Engine()
    instance = engine.run(engine.start(load_process(path), data))
    assert instance.status == "waiting"
    instance = engine.send_event(instance, "documents_received", DOCUMENTS)

    assert instance.status == "completed", instance.error
    assert path_of(instance.workflow) == path_of(plain) == ["start", "open_claim", "receive_documents", "assess", "end"]
    assert variables(instance.main) == dict(plain.last_task.data)
    assert instance.main.resolve("event:receive_documents")["keys"] == ["documents"]


def test_message_wait_closes_the_claim_when_no_documents_come() -> None:
    now = [time.time()]  # a SpiffWorkflow timer also fires by the wall clock: start from now
    engine = Engine(clock=lambda: now[0])
    instance = engine.run(engine.start(load_process(EXAMPLES / "message_wait.bpmn"), {"claim_id": "CL-9"}))
    assert [w["kind"] for w in instance.waiting_for] == ["timer", "event"]
    now[0] += 15 * 24 * 3600
    instance = engine.resume(engine.load(instance.id))
    assert instance.status == "completed", instance.error
    assert instance.main.resolve("status") == "closed: no documents within 14 days"
    assert "receive_documents" not in path_of(instance.workflow)


_STATES = ("MAYBE", "LIKELY", "FUTURE", "WAITING", "READY", "STARTED", "COMPLETED", "ERROR", "CANCELLED",
           "FINISHED_MASK", "DEFINITE_MASK", "PREDICTED_MASK", "NOT_FINISHED_MASK", "ANY_MASK")


@pytest.mark.parametrize(("name", "data", "user_tasks"), [*CASES, ("loan_approval", {"amount": 120000, "applicant_id": "APP002", "purpose": "warehouse expansion",
                                              "industry": "logistics"}, {})],
                         ids=lambda v: v if isinstance(v, str) else None)
def test_tasks_in_state_finds_what_get_tasks_finds(monkeypatch: pytest.MonkeyPatch, name: str, data: dict[str, Any],
                                                   user_tasks: dict[str, dict[str, Any]]) -> None:
    """``spiff.tasks_in_state`` (the engine's search for READY tasks after every task) gives the
    tasks SpiffWorkflow's ``get_tasks(state=..., spec_name=...)`` gives, in its order, for every
    state and mask, at every point the engine asks, sub-processes and multi-instance tasks included."""
    from SpiffWorkflow.util.task import TaskState

    from engine import spiff

    ours = spiff.tasks_in_state
    checked = []

    def checking(wf: Any, state: int = TaskState.ANY_MASK, spec_name: str | None = None) -> list[Any]:
        for each in _STATES:
            mask = getattr(TaskState, each)
            for spec in {None, spec_name}:
                assert [t.id for t in ours(wf, mask, spec)] == [t.id for t in wf.get_tasks(state=mask, spec_name=spec)], \
                    (name, each, spec)
        checked.append(state)
        return ours(wf, state, spec_name)

    monkeypatch.setattr(spiff, "tasks_in_state", checking)
    engine = Engine()
    instance = engine.run(engine.start(load_process(EXAMPLES / f"{name}.bpmn"), data),
                          answers={"user_tasks": user_tasks, "confirmations": {"*": "approve"}})
    assert instance.status in ("completed", "waiting"), instance.error
    assert checked
