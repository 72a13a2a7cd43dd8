"""Features combined in one process that their own tests exercise apart: LLM activities in
parallel branches whose answers conflict at the join (settled by policy, by the model through
litellm's real client against the stub server, by a person through the API and the CLI);
compression inside a branch and again after the join; a user task in one branch while another
waits on a confirmation, resumed in a new Python process; a multi-instance task and a
sub-process inside branches with ``contextInject``; an error in one branch fixed and resumed.

Each run is checked against the documented contract: the ``run --json`` document's shape,
every context's tape replays to its saved layers, and no branch changed SYSTEM or PROCESS."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from context_layers import Layer, LayeredContext
from engine import Engine, load_process
from engine.cli import main

from engine_helpers import BPMN_HEAD, script_task
from stub_llm import Reply, StubLLM
from tape_helpers import Clock, instance_doc

HERE = Path(__file__).resolve().parent
MODEL = "openai/stub"
SYSTEM_POLICY = "Prefer caution when the reviews disagree."
DATA = {"applicant_id": "APP-42", "amount": 50000}

DOC_KEYS = {"instance_id", "process_id", "status", "error", "layers", "tokens", "conflicts", "compressions",
            "confirmations", "waiting_for", "tape_length"}


def flow(a: str, b: str) -> str:
    return f'<bpmn:sequenceFlow id="{a}__{b}" sourceRef="{a}" targetRef="{b}"/>'


def write_bpmn(tmp_path: Path, pid: str, elements: list[str], flows: list[tuple[str, str]],
               config: str | None = None) -> Path:
    body = "".join(f"    {e}\n" for e in elements) + "".join(f"    {flow(a, b)}\n" for a, b in flows)
    path = tmp_path / f"{pid}.bpmn"
    path.write_text(BPMN_HEAD.format(pid=pid) + body + "  </bpmn:process>\n</bpmn:definitions>\n", encoding="utf-8")
    if config is not None:
        (tmp_path / f"{pid}.layerflow.yaml").write_text(config, encoding="utf-8")
    return path


def chain(*ids: str) -> list[tuple[str, str]]:
    return list(zip(ids, ids[1:]))


def check_contract(instance: Any, *, system: dict[str, Any] | None = None) -> dict[str, Any]:
    """The ``run --json`` document's documented fields; every context replays from its tape to
    the layers it holds (also as saved and loaded); SYSTEM and PROCESS of every branch are those
    of the main line, PROCESS only grew (no branch changed a key of either)."""
    doc = json.loads(json.dumps(instance.to_document()))
    assert DOC_KEYS <= set(doc), DOC_KEYS - set(doc)
    assert doc["status"] in ("completed", "waiting", "error")
    assert set(doc["layers"]) == {f"L{i}" for i in range(6)}
    assert set(doc["tokens"]) == {f"L{i}" for i in range(6)} | {"total"}
    assert doc["tape_length"] == instance.tape_length()
    for c in doc["conflicts"]:
        assert {"gateway_id", "layer", "key", "base_value", "values", "resolution"} <= set(c), c
        if c["resolution"] is not None:
            assert c["resolution"]["resolver"] in ("policy", "model", "human", "strategy")
            assert {"value", "resolver", "reason"} <= set(c["resolution"])
    for c in doc["compressions"]:
        assert {"activity_id", "triggers", "tokens_before", "tokens_after", "snapshot_id"} <= set(c), c
    for c in doc["confirmations"]:
        assert {"id", "type", "message", "options", "answer", "timed_out"} <= set(c), c
    for w in doc["waiting_for"]:
        assert {"kind", "id", "task_id"} <= set(w), w
    main_ctx = instance.main
    for name, ctx in instance.contexts.items():
        assert LayeredContext.replay(list(ctx.tape)) == ctx, f"context {name!r} does not replay from its tape"
        assert dict(ctx.layer(Layer.SYSTEM)) == dict(main_ctx.layer(Layer.SYSTEM)), name
        for key, value in DATA.items():  # the initial data in PROCESS: the same in every context
            if key in main_ctx.layer(Layer.PROCESS):
                assert ctx.layer(Layer.PROCESS)[key] == value, (name, key)
    if system is not None:
        assert dict(main_ctx.layer(Layer.SYSTEM)) == system
    return doc


def branch_of(instance: Any, branch_id: str) -> str:
    [name] = [n for n, info in instance.branches.items() if info["branch_id"] == branch_id]
    return name


def play_in_a_new_process(tmp_path: Path, store: str, instance_id: str, calls: list[Any]) -> list[dict[str, Any]]:
    """Load the saved instance in a new Python process, make ``calls`` there (tape_helpers.py),
    and give what each call returned."""
    jobs = tmp_path / "jobs.json"
    jobs.write_text(json.dumps({"job": {"store": store, "instance_id": instance_id, "calls": calls}}), encoding="utf-8")
    child = subprocess.run([sys.executable, str(HERE / "tape_helpers.py"), str(jobs)], capture_output=True, text=True,
                           cwd=HERE.parents[1], timeout=120)
    assert child.returncode == 0, child.stderr
    resumed: list[dict[str, Any]] = json.loads(child.stdout)["job"]
    assert "crash" not in resumed, resumed
    return resumed


def check_saved(engine: Engine, instance: Any) -> None:
    """As loaded from the store, the instance is what ran: same document, and each context replays."""
    loaded = engine.load(instance.id)
    assert instance_doc(loaded) == instance_doc(instance)
    for ctx in loaded.contexts.values():
        assert LayeredContext.replay(list(ctx.tape)) == ctx


# ===== 1. LLM activities in parallel branches, conflicting at the join ===========================

def llm_task(tid: str, offline: str) -> str:
    return script_task(tid, offline)


VOTE_ELEMENTS = ['<bpmn:startEvent id="start"/>', '<bpmn:parallelGateway id="fork"/>',
                 llm_task("finance", 'decision = "approve"\nfinance_note = "income verified"'),
                 llm_task("risk", 'decision = "reject"\nrisk_note = "debt ratio too high"'),
                 '<bpmn:parallelGateway id="join"/>', script_task("close", "outcome = decision"),
                 '<bpmn:endEvent id="end"/>']
VOTE_FLOWS = [("start", "fork"), ("fork", "finance"), ("fork", "risk"), ("finance", "join"), ("risk", "join"),
              ("join", "close"), ("close", "end")]


def vote_config(resolution: str) -> str:
    text = (f"system:\n  policy: {SYSTEM_POLICY}\n"
            "fork:\n  branches:\n    - {id: finance, reasonKey: finance_note}\n    - {id: risk, reasonKey: risk_note}\n")
    for tid, who in (("finance", "finance"), ("risk", "risk")):
        text += (f"{tid}:\n  llm:\n    instructions: You are the {who} reviewer. Decide approve or reject.\n"
                 f"    outputKeys: [decision, {who}_note]\n    maxRetries: 1\n    timeout: 5\n")
    text += "join:\n  conflictPolicy:\n    policyText: Prefer caution.\n"
    if resolution == "policy":
        text += "    rankings: {decision: [reject, approve]}\n"
    if resolution == "human":
        text += "  humanConfirm: {timeout: 600}\n"
    return text


class RoutingStub(StubLLM):
    """Answers each reviewer by the instructions it was sent (branch order does not matter), and
    the conflict arbiter with a scripted reply."""

    def __init__(self, arbiter: Reply | None = None) -> None:
        super().__init__()
        self.arbiter = arbiter

    def _next(self, body: dict[str, Any]) -> Reply:
        with self._lock:
            self.requests.append(body)
        text = json.dumps(body["messages"])
        if "finance reviewer" in text:
            return Reply.json({"decision": "approve", "finance_note": "income verified by the model"})
        if "risk reviewer" in text:
            return Reply.json({"decision": "reject", "risk_note": "debt ratio too high by the model"})
        return self.arbiter or Reply.error(500, "no arbiter reply scripted")


@pytest.fixture
def model_env(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("LAYERFLOW_MODEL_API_KEY", "test-key")
    monkeypatch.setenv("LAYERFLOW_RETRY_BASE_DELAY", "0.01")

    def serve(arbiter: Reply | None = None) -> RoutingStub:
        stub = RoutingStub(arbiter)
        stub.__enter__()
        monkeypatch.setenv("LAYERFLOW_MODEL_API_BASE", stub.url)
        started.append(stub)
        return stub
    started: list[RoutingStub] = []
    yield serve
    for s in started:
        s.__exit__(None, None, None)


def arbiter(value: Any, escalate: bool = False) -> Reply:
    return Reply.json({"final_value": value, "rationale": "caution wins", "escalate": escalate})


@pytest.mark.parametrize("resolution, model", [("policy", True), ("policy", False), ("model", True), ("human", True),
                                               ("human", False)],
                         ids=["policy-stub-model", "policy-offline", "model-stub-model", "human-stub-model",
                              "human-offline"])
def test_llm_branches_conflict_at_the_join(tmp_path: Path, model_env: Any, model: bool, resolution: str) -> None:
    path = write_bpmn(tmp_path, "vote", VOTE_ELEMENTS, VOTE_FLOWS, vote_config(resolution))
    # with a model, the arbiter comes before a person: it escalates when a person is to decide
    stub = model_env(arbiter("reject", escalate=resolution == "human")) if model else None
    engine = Engine(f"sqlite:///{tmp_path / 'vote.db'}", model=MODEL if model else None)
    instance = engine.run(engine.start(load_process(path), DATA))
    if resolution == "human":
        assert instance.status == "waiting", instance.error
        [waiting] = instance.waiting_for
        assert waiting["kind"] == "confirmation" and waiting["id"] == "join/decision"
        check_contract(instance)
        instance = engine.answer_confirmation(engine.load(instance.id), "join/decision", "reject")
    assert instance.status == "completed", instance.error
    doc = check_contract(instance, system={"policy": SYSTEM_POLICY})
    conflicts = [c for c in doc["conflicts"] if c["key"] == "decision"]
    assert len(conflicts) == 1, doc["conflicts"]
    [conflict] = conflicts
    assert conflict["gateway_id"] == "join" and conflict["values"] == {"finance": "approve", "risk": "reject"}
    assert conflict["resolution"]["value"] == "reject"
    assert conflict["resolution"]["resolver"] == resolution
    assert doc["layers"]["L3"]["outcome"] == "reject"
    # each branch's own note (its reason) survives the join
    history = doc["layers"]["L3"]
    assert "finance_note" in history and "risk_note" in history
    if model:
        assert stub is not None
        assert "by the model" in history["finance_note"] and "by the model" in history["risk_note"]
        calls = [e for ctx in instance.contexts.values() for e in ctx.tape if (e.data or {}).get("note") == "llm_call"]
        assert len([c for c in calls if c.data.get("purpose") is None]) == 2
    if resolution == "human":
        [asked] = doc["confirmations"]
        assert asked["id"] == "join/decision" and asked["answer"] == "reject" and asked["timed_out"] is False
    check_saved(engine, instance)


@pytest.mark.parametrize("model", [True, False], ids=["stub-model", "offline"])
def test_llm_branch_conflict_answered_with_cli_resume(tmp_path: Path, model_env: Any, monkeypatch: Any,
                                                      model: bool) -> None:
    path = write_bpmn(tmp_path, "vote", VOTE_ELEMENTS, VOTE_FLOWS, vote_config("human"))
    store = f"sqlite:///{tmp_path / 'cli.db'}"
    monkeypatch.setenv("LAYERFLOW_STORE", store)
    if model:
        model_env(arbiter("hold", escalate=True))  # the model is unsure: a person decides

    def cli(*args: str) -> tuple[int, dict[str, Any]]:
        result = CliRunner().invoke(main, list(args), catch_exceptions=False)
        return result.exit_code, json.loads(result.stdout)

    code, doc = cli("run", str(path), "--data", json.dumps(DATA), "--json", *(("--model", MODEL) if model else ()))
    assert code == 3 and doc["status"] == "waiting", doc["error"]
    assert [w["id"] for w in doc["waiting_for"]] == ["join/decision"]
    code, doc = cli("resume", doc["instance_id"], "--answer", "join/decision=reject", "--json",
                    *(("--model", MODEL) if model else ()))
    assert code == 0 and doc["status"] == "completed", doc["error"]
    assert DOC_KEYS <= set(doc)
    [conflict] = [c for c in doc["conflicts"] if c["key"] == "decision"]
    assert conflict["resolution"]["resolver"] == "human" and conflict["resolution"]["value"] == "reject"
    assert doc["layers"]["L3"]["outcome"] == "reject"
    assert doc["layers"]["L0"] == {"policy": SYSTEM_POLICY}
    check_contract(Engine(store).load(doc["instance_id"]), system={"policy": SYSTEM_POLICY})


# ===== 2. compression inside a branch, the join, compression again after it ======================

def text(tag: str, n: int = 40) -> str:
    return " ".join(f"{tag} sentence {i} about the customer file and its many details." for i in range(n))


KEPT_A = {"score": 42, "factors": ["new business", "cross border"], "memo": text("kept-a", 8)}
KEPT_B = text("kept-b", 6)
COMPRESS_ELEMENTS = [
    '<bpmn:startEvent id="start"/>',
    script_task("prep", f"case_id = 'C-9'\nbackground = {text('background')!r}"),
    '<bpmn:parallelGateway id="fork"/>',
    script_task("a1", f"risk = {KEPT_A!r}\nthoughts_a = {{'kind': 'reasoning_chain', 'text': {text('thoughts-a')!r}}}"),
    script_task("a2", f"notes_a = {text('notes-a')!r}\nrisk_label = 'medium'"),
    script_task("b1", f"kept_b = {KEPT_B!r}\nthoughts_b = {{'kind': 'reasoning_chain', 'text': {text('thoughts-b')!r}}}"),
    '<bpmn:parallelGateway id="join"/>',
    script_task("after1", f"late = {text('late')!r}"),
    script_task("after2", "final = risk['score'] + 1"),
    '<bpmn:endEvent id="end"/>',
]
COMPRESS_FLOWS = [*chain("start", "prep", "fork"), *chain("fork", "a1", "a2", "join"), *chain("fork", "b1", "join"),
                  *chain("join", "after1", "after2", "end")]
GREEDY = ("  compressRules:\n    - {pattern: '*', action: summarize, maxTokens: 12}\n"
          "  attentionThresholds: {density: 0, redundancy: 1, decay: 0, conflict: 1, toolEfficiency: 0}\n")
COMPRESS_CONFIG = ("a2:\n  compressTokenThreshold: 300\n  preserveKeys: [risk, risk_label]\n" + GREEDY
                   + "b1:\n  preserveKeys: [kept_b]\n"
                   + "after2:\n  compressTokenThreshold: 300\n  preserveKeys: [final]\n" + GREEDY)


def test_compression_in_a_branch_then_the_join_then_again(tmp_path: Path) -> None:
    path = write_bpmn(tmp_path, "squeeze", COMPRESS_ELEMENTS, COMPRESS_FLOWS, COMPRESS_CONFIG)
    engine = Engine(f"sqlite:///{tmp_path / 'squeeze.db'}")
    instance = engine.run(engine.start(load_process(path), DATA))
    assert instance.status == "completed", instance.error
    doc = check_contract(instance)
    assert [c["activity_id"] for c in doc["compressions"]] == ["a2", "after2"], doc["compressions"]
    for entry in doc["compressions"]:
        assert entry["tokens_after"] < entry["tokens_before"] and entry["triggers"] == ["token_threshold"]
    assert doc["conflicts"] == []
    history = doc["layers"]["L3"]
    # preserved in a branch (compressed there, or beside a compression in the other branch):
    # intact after the join and after the compression that followed it
    assert history["risk"] == KEPT_A and history["risk_label"] == "medium" and history["kept_b"] == KEPT_B
    assert history["final"] == 43
    assert {"risk", "risk_label", "kept_b", "final"} <= instance.main.preserved
    # what was not preserved was compressed: in the branch, and after the join
    first, second = instance.compressions
    assert "thoughts_a" in first["folded"] and first["context"] == branch_of(instance, "a1")
    assert "late" in second["folded"] and second["context"] == "main"
    assert not {"thoughts_a", "late", "thoughts_b"} & set(history)
    assert [k for k in history if k.startswith("compaction:")] == [second["compaction_key"]]
    check_saved(engine, instance)


@pytest.mark.parametrize("other", ["rewrites", "also-compresses"])
def test_a_compression_in_one_branch_is_not_a_change_against_another_branch(tmp_path: Path, other: str) -> None:
    """Branch a's compression folds ``background`` (a key of the split's base) into a summary;
    branch b writes a new value of it, or compresses it its own way. A compression is not a
    decision about the value: the join takes b's value (or keeps the base) and asks nobody.
    (It was a conflict, ``{'$deleted': True}`` against b's value, waiting for a person.)"""
    elements = list(COMPRESS_ELEMENTS)
    b1 = ("background = 'rewritten by b'\nkept_b = 'x'" if other == "rewrites"
          else f"kept_b = 'x'\nthoughts_b = {{'kind': 'reasoning_chain', 'text': {text('thoughts-b')!r}}}")
    elements[5] = script_task("b1", b1)
    config = COMPRESS_CONFIG
    if other == "also-compresses":
        config = config.replace("b1:\n  preserveKeys: [kept_b]\n",
                                "b1:\n  compressTokenThreshold: 300\n  preserveKeys: [kept_b]\n"
                                "  compressRules:\n    - {pattern: '*', action: extract_keys, extractKeys: [kind]}\n"
                                "  attentionThresholds: {density: 0, redundancy: 1, decay: 0, conflict: 1, "
                                "toolEfficiency: 0}\n")
    path = write_bpmn(tmp_path, "squeeze", elements, COMPRESS_FLOWS, config)
    engine = Engine("memory://")
    instance = engine.run(engine.start(load_process(path), DATA))
    assert instance.status == "completed", (instance.error, instance.waiting_for)
    doc = check_contract(instance)
    assert [c for c in doc["conflicts"] if c["key"] == "background"] == []
    joined = [e for e in instance.main.tape if e.kind == "changes" and (e.data or {}).get("gateway_id") == "join"]
    assert joined, "the join event is on the main tape"
    if other == "rewrites":
        [event] = joined
        assert (int(Layer.HISTORY), "background", "rewritten by b") in [tuple(c) for c in event.changes]
    else:
        assert {"a2", "b1"} <= {c["activity_id"] for c in doc["compressions"]}


# ===== 3. a user task in one branch, a confirmation in another; resumed in a new process ==========

WAIT_ELEMENTS = [
    '<bpmn:startEvent id="start"/>', script_task("prep", "case_id = 'C-7'"), '<bpmn:parallelGateway id="fork"/>',
    '<bpmn:userTask id="approve_form" name="Approve the form"/>', script_task("after_form", "form_done = approved"),
    '<bpmn:parallelGateway id="inner_fork"/>',
    llm_task("finance", 'decision = "approve"\nfinance_note = "income verified"'),
    llm_task("risk", 'decision = "reject"\nrisk_note = "debt ratio too high"'),
    '<bpmn:parallelGateway id="inner_join"/>', script_task("after_vote", "voted = decision"),
    '<bpmn:parallelGateway id="join"/>', script_task("close", "outcome = [form_done, voted]"),
    '<bpmn:endEvent id="end"/>',
]
WAIT_FLOWS = [*chain("start", "prep", "fork"), *chain("fork", "approve_form", "after_form", "join"),
              *chain("fork", "inner_fork"), *chain("inner_fork", "finance", "inner_join"),
              *chain("inner_fork", "risk", "inner_join"), *chain("inner_join", "after_vote", "join"),
              *chain("join", "close", "end")]
WAIT_CONFIG = (f"system:\n  policy: {SYSTEM_POLICY}\n"
               "inner_join:\n  humanConfirm: {timeout: 600}\n")
USER = {"op": "complete_user_task", "args": {"task_id": "approve_form", "data": {"approved": True}}}
CONFIRM = {"op": "answer_confirmation", "args": {"confirmation_id": "inner_join/decision", "value": "reject"}}


@pytest.mark.parametrize("order", [(USER, CONFIRM), (CONFIRM, USER)], ids=["form-first", "confirmation-first"])
def test_user_task_and_confirmation_in_branches_resumed_in_a_new_process(tmp_path: Path,
                                                                       order: tuple[dict[str, Any], ...]) -> None:
    path = write_bpmn(tmp_path, "waits", WAIT_ELEMENTS, WAIT_FLOWS, WAIT_CONFIG)
    process = load_process(path)
    calls = [{**call, "clock": 2000.0 + 100 * i} for i, call in enumerate(order)]

    def started(store: str) -> tuple[Engine, Clock, Any]:
        clock = Clock()
        clock.now = 1000.0
        engine = Engine(store, clock=clock)
        instance = engine.run(engine.start(process, DATA, instance_id="waits-1"))
        assert instance.status == "waiting", instance.error
        assert sorted((w["kind"], w["task_id"]) for w in instance.waiting_for) == \
            [("confirmation", "inner_join"), ("user_task", "approve_form")]
        check_contract(instance, system={"policy": SYSTEM_POLICY})
        return engine, clock, instance

    # uninterrupted, in this process
    engine, clock, instance = started("memory://")
    from tape_helpers import play
    instance, steps = play(engine, clock, instance, calls, reload=False)
    assert [s["raised"] for s in steps] == [None, None]
    assert instance.status == "completed", instance.error
    doc = check_contract(instance, system={"policy": SYSTEM_POLICY})
    assert doc["layers"]["L3"]["outcome"] == [True, "reject"]
    [asked] = doc["confirmations"]
    assert asked["answer"] == "reject" and asked["id"] == "inner_join/decision"

    # saved at the wait, loaded and answered in a new Python process
    store = f"sqlite:///{tmp_path / 'waits.db'}"
    started(store)
    resumed = play_in_a_new_process(tmp_path, store, "waits-1", calls)
    assert [s["raised"] for s in resumed[1:]] == [None, None]
    assert resumed[-1]["doc"] == instance_doc(instance)
    assert resumed[-1]["doc"] == steps[-1]["doc"]
    check_contract(Engine(store).load("waits-1"), system={"policy": SYSTEM_POLICY})


# ===== 4. multi-instance and sub-processes inside branches, contextInject at the split =============

MI_TASK = ('<bpmn:scriptTask id="each"><bpmn:multiInstanceLoopCharacteristics isSequential="{seq}">'
           "<bpmn:loopDataInputRef>items</bpmn:loopDataInputRef><bpmn:loopDataOutputRef>scaled</bpmn:loopDataOutputRef>"
           '<bpmn:inputDataItem id="item" name="item"/><bpmn:outputDataItem id="res" name="res"/>'
           "</bpmn:multiInstanceLoopCharacteristics><bpmn:script>res = item * factor</bpmn:script></bpmn:scriptTask>")
SQUARES = ('<bpmn:subProcess id="square"><bpmn:multiInstanceLoopCharacteristics isSequential="{seq}">'
           "<bpmn:loopDataInputRef>items</bpmn:loopDataInputRef><bpmn:loopDataOutputRef>squares</bpmn:loopDataOutputRef>"
           '<bpmn:inputDataItem id="number" name="number"/><bpmn:outputDataItem id="result" name="result"/>'
           '</bpmn:multiInstanceLoopCharacteristics><bpmn:startEvent id="square_start"/>'
           + script_task("twice", "partial = number * number") + script_task("hand_back", "result = partial")
           + '<bpmn:endEvent id="square_end"/>' + "".join(flow(a, b) for a, b in chain(
               "square_start", "twice", "hand_back", "square_end")) + "</bpmn:subProcess>")
REVIEW = ('<bpmn:subProcess id="review"><bpmn:startEvent id="review_start"/>'
          + script_task("r1", "sub_seen = [track, _branch_id]") + script_task("r2", "sub_note = 'checked ' + case_id")
          + '<bpmn:endEvent id="review_end"/>'
          + "".join(flow(a, b) for a, b in chain("review_start", "r1", "r2", "review_end")) + "</bpmn:subProcess>")
NEST_CONFIG = ("fork:\n  branches:\n"
               "    - {id: each, contextInject: {factor: 10, track: mi}}\n"
               "    - {id: review, contextInject: {track: sub}}\n"
               "    - {id: square, contextInject: {track: squares}}\n"
               "r2:\n  preserveKeys: [sub_note]\n")


@pytest.mark.parametrize("seq", ["false", "true"], ids=["parallel-mi", "sequential-mi"])
def test_multi_instance_and_sub_processes_inside_branches(tmp_path: Path, seq: str) -> None:
    elements = ['<bpmn:startEvent id="start"/>', script_task("prep", "items = [1, 2, 3]\ncase_id = 'C-3'"),
                '<bpmn:parallelGateway id="fork"/>', MI_TASK.format(seq=seq),
                script_task("sum_mi", "mi_total = sum(scaled)\nmi_track = track"), REVIEW,
                SQUARES.format(seq=seq), script_task("sum_sq", "sq_total = sum(squares)\nsq_track = track"),
                '<bpmn:parallelGateway id="join"/>', script_task("close", "summary = [mi_total, sq_total, sub_note]"),
                '<bpmn:endEvent id="end"/>']
    flows = [*chain("start", "prep", "fork"), *chain("fork", "each", "sum_mi", "join"), *chain("fork", "review", "join"),
             *chain("fork", "square", "sum_sq", "join"), *chain("join", "close", "end")]
    path = write_bpmn(tmp_path, "nest", elements, flows, NEST_CONFIG)
    engine = Engine(f"sqlite:///{tmp_path / 'nest.db'}")
    instance = engine.run(engine.start(load_process(path), DATA))
    assert instance.status == "completed", instance.error
    doc = check_contract(instance)
    assert doc["conflicts"] == []
    history = doc["layers"]["L3"]
    assert history["scaled"] == [10, 20, 30] and history["squares"] == [1, 4, 9]
    assert history["summary"] == [60, 14, "checked C-3"]
    assert history["sub_seen"] == ["sub", "review"]
    assert (history["mi_track"], history["sq_track"]) == ("mi", "squares")
    # what the split injected belongs to its branch: not left behind after the join
    merged = {**doc["layers"]["L3"], **doc["layers"]["L4"]}
    assert not {"factor", "track", "_branch_id", "_snapshot_id"} & set(merged), sorted(merged)
    assert "sub_note" in instance.main.preserved
    # the sub-processes' and the instances' scopes never leak their own keys into the main line
    assert not {"item", "res", "number", "result", "partial"} & set(merged), sorted(merged)
    check_saved(engine, instance)


# ===== 5. an error in one branch, fixed by an injection, resumed ===================================

FAIL_ELEMENTS = [
    '<bpmn:startEvent id="start"/>', script_task("prep", "case_id = 'C-5'"), '<bpmn:parallelGateway id="fork"/>',
    script_task("a1", "a_work = 'gathered'"), script_task("a2", "ratio = amount / divisor"),
    script_task("b1", "b_work = 'reviewed ' + case_id"), '<bpmn:userTask id="b2" name="Sign off"/>',
    script_task("b3", "b_signed = signed"),
    '<bpmn:parallelGateway id="join"/>', script_task("close", "outcome = [a_work, ratio, b_work, b_signed]"),
    '<bpmn:endEvent id="end"/>',
]
FAIL_FLOWS = [*chain("start", "prep", "fork"), *chain("fork", "a1", "a2", "join"),
              *chain("fork", "b1", "b2", "b3", "join"), *chain("join", "close", "end")]


@pytest.mark.parametrize("sign_off", ["before-the-fix", "after-the-fix"])
def test_an_error_in_one_branch_fixed_and_resumed_keeps_the_other_branch(tmp_path: Path, sign_off: str) -> None:
    path = write_bpmn(tmp_path, "fail", FAIL_ELEMENTS, FAIL_FLOWS, "a2:\n  preserveKeys: [ratio]\n")
    store = f"sqlite:///{tmp_path / 'fail.db'}"
    engine = Engine(store)
    instance = engine.run(engine.start(load_process(path), DATA))
    assert instance.status == "error", instance.waiting_for
    doc = check_contract(instance)
    assert doc["error"]["task_id"] == "a2" and "divisor" in doc["error"]["message"], doc["error"]
    b_context = branch_of(instance, "b1")
    assert instance.contexts[b_context].resolve("b_work") == "reviewed C-5"
    if sign_off == "before-the-fix":
        # an instance in error takes no answer until it is resumed; nothing changes
        before = instance_doc(engine.load(instance.id))
        with pytest.raises(Exception, match="resume"):
            engine.complete_user_task(engine.load(instance.id), "b2", {"signed": True})
        assert instance_doc(engine.load(instance.id)) == before
    instance = engine.inject(engine.load(instance.id), {"divisor": 4})
    assert instance.contexts[branch_of(instance, "a1")].resolve("divisor") == 4
    assert "divisor" not in instance.main, "the fix went to the failed branch's context"
    instance = engine.resume(engine.load(instance.id))
    assert instance.status == "waiting", instance.error
    assert [w["task_id"] for w in instance.waiting_for] == ["b2"]
    instance = engine.complete_user_task(engine.load(instance.id), "b2", {"signed": True})
    assert instance.status == "completed", instance.error
    doc = check_contract(instance)
    history = doc["layers"]["L3"]
    # the other branch's work, done before the failure, is kept; so is the failed branch's, done before it
    assert history["outcome"] == ["gathered", 12500.0, "reviewed C-5", True]
    assert history["b_work"] == "reviewed C-5" and history["ratio"] == 12500.0
    assert doc["error"] is None and doc["conflicts"] == []
    tape = [e for ctx in instance.contexts.values() for e in ctx.tape]
    assert [e.actor for e in tape if e.kind == "write" and e.changes and e.changes[0][1] == "divisor"] == ["operator"]
    check_saved(engine, instance)


# ===== 3b. a model's human_confirm (LLM tools) in one branch, a user task in the other ================

def tool_call(name: str, arguments: dict[str, Any]) -> Reply:
    body = {"id": "chatcmpl-tools-1", "object": "chat.completion", "created": 1700000000, "model": "stub-model",
            "choices": [{"index": 0, "finish_reason": "tool_calls", "message": {
                "role": "assistant", "content": None,
                "tool_calls": [{"id": "call_1", "type": "function",
                                "function": {"name": name, "arguments": json.dumps(arguments)}}]}}],
            "usage": {"prompt_tokens": 50, "completion_tokens": 10, "total_tokens": 60}}
    return Reply(body=json.dumps(body))


TOOLS_ELEMENTS = ['<bpmn:startEvent id="start"/>', script_task("prep", "case_id = 'C-8'"),
                  '<bpmn:parallelGateway id="fork"/>', '<bpmn:task id="review" name="Review the case"/>',
                  '<bpmn:userTask id="sign" name="Sign off"/>', '<bpmn:parallelGateway id="join"/>',
                  script_task("close", "outcome = [decision, signed]"), '<bpmn:endEvent id="end"/>']
TOOLS_FLOWS = [*chain("start", "prep", "fork"), *chain("fork", "review", "join"), *chain("fork", "sign", "join"),
               *chain("join", "close", "end")]
TOOLS_CONFIG = (f"system:\n  policy: {SYSTEM_POLICY}\n"
                "review:\n  llm:\n    model: openai/stub\n    tools: true\n    instructions: Decide on the case.\n"
                "    outputKeys: [decision]\n    maxRetries: 1\n    timeout: 5\n")
ASK = {"type": "decision_review", "message": "Approve the case?",
       "options": [{"label": "approve it", "value": "approve"}, {"label": "reject it", "value": "reject"}],
       "timeout": 600, "default": "reject"}


def test_model_confirmation_in_one_branch_user_task_in_the_other_resumed_in_a_new_process(
        tmp_path: Path, model_env: Any) -> None:
    stub = model_env()
    path = write_bpmn(tmp_path, "tools", TOOLS_ELEMENTS, TOOLS_FLOWS, TOOLS_CONFIG)
    store = f"sqlite:///{tmp_path / 'tools.db'}"
    stub.arbiter = tool_call("human_confirm", ASK)  # the routing stub's fallback: the review's first turn
    clock = Clock()
    clock.now = 1000.0
    engine = Engine(store, clock=clock)
    instance = engine.run(engine.start(load_process(path), DATA, instance_id="tools-1"))
    assert instance.status == "waiting", instance.error
    assert sorted(w["kind"] for w in instance.waiting_for) == ["confirmation", "user_task"], instance.waiting_for
    confirmation = next(w["id"] for w in instance.waiting_for if w["kind"] == "confirmation")
    check_contract(instance, system={"policy": SYSTEM_POLICY})
    stub.arbiter = Reply.json({"decision": "approve"})  # the review's answer once the person said yes

    calls = [{"op": "complete_user_task", "args": {"task_id": "sign", "data": {"signed": True}}, "clock": 1100.0},
             {"op": "answer_confirmation", "args": {"confirmation_id": confirmation, "value": "approve"},
              "clock": 1200.0}]
    resumed = play_in_a_new_process(tmp_path, store, "tools-1", calls)
    assert [s["raised"] for s in resumed[1:]] == [None, None], resumed
    final = Engine(store).load("tools-1")
    assert final.status == "completed", final.error
    doc = check_contract(final, system={"policy": SYSTEM_POLICY})
    assert doc["layers"]["L3"]["outcome"] == ["approve", True]
    [asked] = doc["confirmations"]
    assert asked["answer"] == "approve" and asked["timed_out"] is False
    assert not final.suspended
    # the new process reached the model (the stub, here) with the person's answer as the tool's result
    told = json.loads(stub.requests[-1]["messages"][-1]["content"])
    assert told == {"confirmation_id": confirmation, "status": "answered", "answer": "approve", "timed_out": False}


def _stable(doc: dict[str, Any]) -> dict[str, Any]:
    """A ``--json`` document without what differs between two runs of one process: ids, wall-clock times and
    the version (how many saves it took)."""
    text = json.dumps({k: v for k, v in doc.items() if k not in ("instance_id", "version")}, sort_keys=True)
    text = re.sub(r'"(created|deadline|answered_at|time|at|resolved_at)": ([0-9.e+]+|"[0-9T:.Z-]+")', r'"\1": 0', text)
    text = re.sub(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}", "<task id>", text)
    return json.loads(text)  # type: ignore[no-any-return]


def test_cli_resume_answers_a_user_task_and_a_confirmation_in_a_new_process(tmp_path: Path) -> None:
    """`layerflow run` stops at both waits; `layerflow resume ID --answer ... --answer ...`, in a
    new Python process, answers both; the result is the run given both answers in advance."""
    path = write_bpmn(tmp_path, "waits", WAIT_ELEMENTS, WAIT_FLOWS, WAIT_CONFIG)
    store = f"sqlite:///{tmp_path / 'cli.db'}"

    def cli(*args: str) -> tuple[int, dict[str, Any]]:
        child = subprocess.run([sys.executable, "-c", "from engine.cli import main; main()", *args, "--store", store,
                                "--json"], capture_output=True, text=True, cwd=HERE.parents[1], timeout=120,
                               env={**os.environ, "PYTHONPATH": str(HERE.parents[1])}, stdin=subprocess.DEVNULL)
        return child.returncode, json.loads(child.stdout)

    code, doc = cli("run", str(path), "--data", json.dumps(DATA))
    assert code == 3 and doc["status"] == "waiting", doc["error"]
    assert sorted(w["task_id"] for w in doc["waiting_for"]) == ["approve_form", "inner_join"]
    code, resumed = cli("resume", doc["instance_id"], "--answer", 'approve_form={"approved": true}',
                        "--answer", "inner_join/decision=reject")
    assert code == 0 and resumed["status"] == "completed", resumed["error"]
    assert resumed["layers"]["L3"]["outcome"] == [True, "reject"]
    check_contract(Engine(store).load(doc["instance_id"]), system={"policy": SYSTEM_POLICY})

    answers = tmp_path / "answers.json"
    answers.write_text(json.dumps({"user_tasks": {"approve_form": {"approved": True}},
                                   "confirmations": {"inner_join/decision": "reject"}}), encoding="utf-8")
    code, direct = cli("run", str(path), "--data", json.dumps(DATA), "--answers", str(answers))
    assert code == 0, direct["error"]
    assert _stable(resumed) == _stable(direct)


# ===== 2b. governance on a branch's context once its join has merged it ==============================

@pytest.mark.parametrize("op", ["inject", "decompress", "rollback"])
def test_a_merged_branch_context_takes_no_more_changes(tmp_path: Path, op: str) -> None:
    """After the join, a branch's context is history: a change there (an injected fix, the undoing
    of the compression that ran in the branch, a rollback) would reach nothing the process reads.
    It is refused with where to make it instead; it used to succeed and change nothing."""
    from engine.governance import CompressArgs, GovernanceService, InjectArgs, InstanceStateError, RollbackArgs

    elements = list(COMPRESS_ELEMENTS)
    elements[8] = '<bpmn:userTask id="after2" name="Look at it"/>'
    path = write_bpmn(tmp_path, "squeeze", elements, COMPRESS_FLOWS, COMPRESS_CONFIG.split("after2:")[0])
    engine = Engine(f"sqlite:///{tmp_path / 'squeeze.db'}")
    instance = engine.run(engine.start(load_process(path), DATA))
    assert instance.status == "waiting", instance.error
    [compression] = instance.compressions
    branch = compression["context"]
    assert instance.branches[branch]["status"] == "joined"
    service = GovernanceService(engine)
    before = instance_doc(engine.load(instance.id))
    change = {
        "inject": lambda: service.inject(instance.id, InjectArgs(values={"fix": 1}, context="a1")),
        "decompress": lambda: service.compress(instance.id, CompressArgs(
            action="decompress", snapshot_id=compression["snapshot_id"], context=branch)),
        "rollback": lambda: service.rollback(instance.id, RollbackArgs(snapshot_id=compression["snapshot_id"],
                                                                       context=branch)),
    }[op]
    with pytest.raises(InstanceStateError, match="merged") as refused:
        change()
    assert "'main'" in str(refused.value), refused.value
    assert instance_doc(engine.load(instance.id)) == before
    # the main line itself still takes the change
    if op == "inject":
        loaded = engine.load(instance.id)
        with pytest.raises(InstanceStateError, match="merged"):  # the Python API refuses it the same way
            engine.inject(loaded, {"fix": 1}, context=branch)
        assert instance_doc(engine.load(instance.id)) == before
        service.inject(instance.id, InjectArgs(values={"fix": 1}))
        assert engine.load(instance.id).main.resolve("fix") == 1


class ScalingStub(StubLLM):
    """Answers a multi-instance LLM activity: its output item, from the input item it was sent."""

    def _next(self, body: dict[str, Any]) -> Reply:
        with self._lock:
            self.requests.append(body)
        found = re.search(r'key="item"[^>]*><!\[CDATA\[(\d+)\]\]>', body["messages"][-1]["content"])
        return Reply.json({"res": int(found.group(1)) * 100}) if found else Reply.error(500, "no item sent")


@pytest.mark.parametrize("tools", [False, True], ids=["plain", "tools"])
@pytest.mark.parametrize("seq", ["false", "true"], ids=["parallel-mi", "sequential-mi"])
def test_multi_instance_llm_activity_inside_a_branch(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                     seq: str, tools: bool) -> None:
    """Each instance's model answer is its output item, scoped to the instance: it reaches the
    output collection only. (The answer was also written to the activity's WORKING: the next
    instance's request showed the previous instance's output, and the last one's was left in
    HISTORY after the activity, in the branch and, after the join, in the main line.)"""
    monkeypatch.setenv("LAYERFLOW_MODEL_API_KEY", "test-key")
    monkeypatch.setenv("LAYERFLOW_RETRY_BASE_DELAY", "0.01")
    elements = ['<bpmn:startEvent id="start"/>', script_task("prep", "items = [1, 2, 3]\ncase_id = 'C-3'"),
                '<bpmn:parallelGateway id="fork"/>', MI_TASK.format(seq=seq),
                script_task("sum_mi", "mi_total = sum(scaled)"), REVIEW, '<bpmn:parallelGateway id="join"/>',
                script_task("close", "summary = [mi_total, sub_note]"), '<bpmn:endEvent id="end"/>']
    flows = [*chain("start", "prep", "fork"), *chain("fork", "each", "sum_mi", "join"),
             *chain("fork", "review", "join"), *chain("join", "close", "end")]
    config = (NEST_CONFIG.replace("    - {id: square, contextInject: {track: squares}}\n", "")
              + "each:\n  llm:\n    instructions: Scale the item.\n    outputKeys: [res]\n    maxRetries: 1\n"
                f"    timeout: 5\n    tools: {str(tools).lower()}\n")
    path = write_bpmn(tmp_path, "nest", elements, flows, config)
    with ScalingStub() as stub:
        monkeypatch.setenv("LAYERFLOW_MODEL_API_BASE", stub.url)
        engine = Engine(f"sqlite:///{tmp_path / 'nest.db'}", model=MODEL)
        instance = engine.run(engine.start(load_process(path), DATA))
    assert instance.status == "completed", instance.error
    doc = check_contract(instance)
    assert doc["layers"]["L3"]["scaled"] == [100, 200, 300] and doc["layers"]["L3"]["summary"] == [600, "checked C-3"]
    assert len(stub.requests) == 3
    for request in stub.requests:  # no instance was shown another's output
        assert 'key="res"' not in request["messages"][-1]["content"]
    for name in ("main", branch_of(instance, "each")):
        ctx = instance.contexts[name]
        assert "res" not in ctx.layer(Layer.HISTORY) and "res" not in ctx.layer(Layer.WORKING), name
    check_saved(engine, instance)


def test_compression_in_a_branch_then_a_wait_in_the_other_resumed_in_a_new_process(tmp_path: Path) -> None:
    """Branch a compresses; branch b stops at a user task; the instance, saved there, is loaded and
    finished in a new Python process (sqlite), and equals the run that never stopped."""
    elements = [*COMPRESS_ELEMENTS, '<bpmn:userTask id="b2" name="Check"/>']
    flows = [f for f in COMPRESS_FLOWS if f != ("b1", "join")] + [("b1", "b2"), ("b2", "join")]
    path = write_bpmn(tmp_path, "squeeze", elements, flows, COMPRESS_CONFIG)
    calls = [{"op": "complete_user_task", "args": {"task_id": "b2", "data": {"b_ok": True}}, "clock": 2000.0}]

    def started(store: str) -> tuple[Engine, Clock, Any]:
        clock = Clock()
        clock.now = 1000.0
        engine = Engine(store, clock=clock)
        instance = engine.run(engine.start(load_process(path), DATA, instance_id="squeeze-1"))
        assert instance.status == "waiting" and [c["activity_id"] for c in instance.compressions] == ["a2"]
        check_contract(instance)
        return engine, clock, instance

    from tape_helpers import play
    instance = play(*started("memory://"), calls, reload=False)[0]
    assert instance.status == "completed" and [c["activity_id"] for c in instance.compressions] == ["a2", "after2"]
    assert instance.main.resolve("risk") == KEPT_A and instance.contexts[branch_of(instance, "b1")].resolve("b_ok")
    store = f"sqlite:///{tmp_path / 'squeeze.db'}"
    started(store)
    resumed = play_in_a_new_process(tmp_path, store, "squeeze-1", calls)
    assert resumed[-1]["doc"] == instance_doc(instance)
    check_contract(Engine(store).load("squeeze-1"))


FAILING_REVIEW = ('<bpmn:subProcess id="review"><bpmn:startEvent id="review_start"/>'
                  + script_task("r1", "sub_seen = track") + script_task("r2", "sub_note = 'ratio ' + str(amount / divisor)")
                  + '<bpmn:endEvent id="review_end"/>'
                  + "".join(flow(a, b) for a, b in chain("review_start", "r1", "r2", "review_end")) + "</bpmn:subProcess>")


@pytest.mark.parametrize("reload", [False, True], ids=["same-process", "loaded"])
def test_an_error_inside_a_sub_process_inside_a_branch_fixed_and_resumed(tmp_path: Path, reload: bool) -> None:
    """The retry of a task inside a sub-process makes SpiffWorkflow reset the sub-process task too,
    and its reset clears the task's internal data: the sub-process, first task of its branch,
    lost the tag naming the branch's context. It then ran on in the main context, and the join
    failed ("received branches of different splits (main/a@3, main)"), the branch's work lost."""
    elements = ['<bpmn:startEvent id="start"/>', '<bpmn:parallelGateway id="fork"/>', script_task("a", "a_work = 1"),
                FAILING_REVIEW, '<bpmn:parallelGateway id="join"/>',
                script_task("close", "summary = [a_work, sub_seen, sub_note]"), '<bpmn:endEvent id="end"/>']
    flows = [*chain("start", "fork"), *chain("fork", "a", "join"), *chain("fork", "review", "join"),
             *chain("join", "close", "end")]
    config = "fork:\n  branches:\n    - {id: review, contextInject: {track: sub}}\n"
    path = write_bpmn(tmp_path, "subfail", elements, flows, config)
    engine = Engine(f"sqlite:///{tmp_path / 'subfail.db'}")
    instance = engine.run(engine.start(load_process(path), DATA))
    assert instance.status == "error" and instance.error["task_id"] == "r2", instance.error
    branch = branch_of(instance, "review")
    again = (lambda i: engine.load(i.id)) if reload else (lambda i: i)
    instance = engine.inject(again(instance), {"divisor": 5})
    assert instance.contexts[branch].resolve("divisor") == 5
    instance = engine.resume(again(instance))
    assert instance.status == "completed", instance.error
    doc = check_contract(instance)
    assert doc["layers"]["L3"]["summary"] == [1, "sub", "ratio 10000.0"]
    assert instance.branches[branch]["status"] == "joined"
    check_saved(engine, instance)


@pytest.mark.parametrize("event_first", [True, False], ids=["event-first", "confirmation-first"])
def test_a_message_in_one_branch_and_a_confirmation_in_another(tmp_path: Path, event_first: bool) -> None:
    elements = list(WAIT_ELEMENTS)
    elements[3] = ('<bpmn:intermediateCatchEvent id="approve_form"><bpmn:messageEventDefinition messageRef="m_docs"/>'
                   "</bpmn:intermediateCatchEvent>")
    elements[4] = script_task("after_form", "form_done = files")
    path = write_bpmn(tmp_path, "ev", elements, WAIT_FLOWS, WAIT_CONFIG)
    path.write_text(path.read_text(encoding="utf-8").replace(
        '  <bpmn:process id="ev"', '  <bpmn:message id="m_docs" name="documents_received"/>\n  <bpmn:process id="ev"'),
        encoding="utf-8")
    engine = Engine(f"sqlite:///{tmp_path / 'ev.db'}")
    instance = engine.run(engine.start(load_process(path), DATA))
    assert sorted(w["kind"] for w in instance.waiting_for) == ["confirmation", "event"]
    steps = [lambda i: engine.send_event(i, "documents_received", {"files": ["a.pdf"]}),
             lambda i: engine.answer_confirmation(i, "inner_join/decision", "reject")]
    for step in steps if event_first else steps[::-1]:
        instance = step(engine.load(instance.id))
        check_contract(instance)
    assert instance.status == "completed", instance.error
    assert instance.main.layer(Layer.HISTORY)["outcome"] == [["a.pdf"], "reject"]
    check_saved(engine, instance)
