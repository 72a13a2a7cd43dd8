"""Gateways in the engine, offline: the seed's conflict path through the CLI, human_confirm
deadlines (a fake clock), the terminal prompt, and natural-language XOR conditions with a
deterministic fake model. The same paths through litellm's real client: test_arbiter_stub.py."""

from __future__ import annotations

import io
import json
import shlex
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from context_layers.config import HumanConfirmConfig
from engine import Engine, TimedOut, load_process
from engine.cli import main
from engine.confirm import TerminalPrompt, stdin_is_terminal
from gateways import BranchAnswer, BranchAnswerError, BranchQuestion

from engine_helpers import BPMN_HEAD, LOAN, LOAN_CONFLICT, LOAN_FAST, LOAN_FULL, ROOT, path_of

CONFIRM_ID = "review_join/approval_status"
DUAL_REASON = "high risk and high amount need dual approval"


@pytest.fixture
def cli(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("LAYERFLOW_STORE", f"sqlite:///{tmp_path / 'cli.db'}")
    runner = CliRunner()

    def invoke(*args: str) -> tuple[int, dict[str, Any]]:
        result = runner.invoke(main, list(args), catch_exceptions=False)
        return result.exit_code, json.loads(result.stdout)
    return invoke


def notes(instance: Any, note: str, context: str = "main") -> list[dict[str, Any]]:
    return [e.data for e in instance.contexts[context].tape if (e.data or {}).get("note") == note]


# ----- the seed walk-through, end to end through `--json` ---------------------------------------

def test_seed_conflict_path_through_the_cli(cli, tmp_path: Path) -> None:
    code, doc = cli("demo", "loan", "--scenario", "conflict", "--json")
    assert code == 3 and doc["status"] == "waiting"
    # exactly one conflict, on approval_status, with both branch values and their sources
    assert doc["conflicts"] == [{"gateway_id": "review_join", "layer": "L4", "key": "approval_status",
                                 "base_value": "pending",
                                 "values": {"finance_review": "approved", "risk_review": "rejected"},
                                 "resolution": None, "context": "main"}]
    [asked] = doc["confirmations"]
    assert asked["id"] == CONFIRM_ID and asked["answer"] is None and asked["timed_out"] is False
    assert (asked["suggested"], asked["suggested_by"], asked["suggested_reason"]) == \
        ("pending_dual_approval", "policy", DUAL_REASON)
    assert [o["value"] for o in asked["options"]] == ["approved", "rejected", "pending_dual_approval", "$escalate"]
    assert asked["deadline"] - asked["created"] == pytest.approx(300)
    assert doc["waiting_for"] == [{"kind": "confirmation", "id": CONFIRM_ID, "task_id": "review_join",
                                   "key": "approval_status", "context": "main",
                                   "due": datetime.fromtimestamp(asked["deadline"], timezone.utc).isoformat()}]

    code, done = cli("resume", doc["instance_id"], "--answer", f"{CONFIRM_ID}=pending_dual_approval", "--json")
    assert code == 0 and done["status"] == "completed"
    [conflict] = done["conflicts"]
    assert conflict["values"] == {"finance_review": "approved", "risk_review": "rejected"}
    assert conflict["resolution"] == {"value": "pending_dual_approval", "resolver": "human",
                                      "reason": f"a person confirmed the policy suggestion: {DUAL_REASON}"}
    [confirmation] = done["confirmations"]
    assert confirmation["answer"] == "pending_dual_approval" and confirmation["timed_out"] is False
    [merged] = done["layers"]["L3"]["_mergedConflicts"]
    assert merged["key"] == "approval_status" and merged["sourceBranches"] == ["finance_review", "risk_review"]
    assert merged["conflictingValues"] == ["approved", "rejected"] and merged["baseValue"] == "pending"
    assert merged["values"] == {"finance_review": "approved", "risk_review": "rejected"}
    assert merged["resolution"]["resolver"] == "human" and merged["time"]
    assert done["layers"]["L3"]["disbursement"] == "hold_for_second_approval"

    # every step of the chain is on the tape: the policy suggested, a person was asked, then answered
    result = CliRunner().invoke(main, ["tape", doc["instance_id"], "--kind", "resolution", "--json"])
    steps = [(e["data"]["resolver"], e["data"]["outcome"]) for e in json.loads(result.stdout)]
    assert steps == [("policy", "suggested"), ("human", "pending"), ("human", "answered")]
    # the conflict once, though the join ran again once answered
    result = CliRunner().invoke(main, ["tape", doc["instance_id"], "--kind", "conflict", "--json"])
    assert [(e["data"]["key"], e["data"]["conflicting_values"]) for e in json.loads(result.stdout)] == [
        ("approval_status", {"finance_review": "approved", "risk_review": "rejected"})]


def test_without_dual_approval_the_ranking_settles_it(cli, tmp_path: Path) -> None:
    data = tmp_path / "data.json"
    data.write_text(json.dumps({**LOAN_CONFLICT, "amount": 80000}))
    code, doc = cli("demo", "loan", "--data", str(data), "--json")
    assert code == 0, doc["error"]
    [conflict] = doc["conflicts"]
    assert conflict["resolution"] == {"value": "rejected", "resolver": "policy",
                                      "reason": "policy ranking for 'approval_status': \"rejected\" ranks above \"approved\""}
    assert doc["confirmations"] == []


@pytest.mark.parametrize("stdin", ["closed", "devnull"])
def test_the_cli_never_waits_on_a_stdin_that_is_not_a_terminal(tmp_path: Path, stdin: str) -> None:
    command = [sys.executable, "-m", "engine.cli", "demo", "loan", "--scenario", "conflict", "--json",
               "--store", f"sqlite:///{tmp_path / 'x.db'}"]
    if stdin == "closed":
        done = subprocess.run(["sh", "-c", shlex.join(command) + " 0<&-"], capture_output=True, text=True,
                              cwd=ROOT, timeout=120)
    else:
        done = subprocess.run(command, capture_output=True, text=True, cwd=ROOT, timeout=120, stdin=subprocess.DEVNULL)
    assert done.returncode == 3, done.stderr
    assert json.loads(done.stdout)["status"] == "waiting"


def test_stdin_is_terminal() -> None:
    closed = io.StringIO()
    closed.close()
    assert not stdin_is_terminal(closed)
    assert not stdin_is_terminal(io.StringIO("x"))
    assert not stdin_is_terminal(object())


# ----- deadlines ------------------------------------------------------------------------------

class Clock:
    def __init__(self, now: float = 1_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


@pytest.fixture(scope="module")
def loan():
    return load_process(LOAN)


def waiting_loan(loan, clock: Clock, **confirm: Any) -> tuple[Engine, Any]:
    engine = Engine(clock=clock)
    if confirm:
        cfg = loan.config("review_join")
        loan = load_process(LOAN)
        loan.configs = {**loan.configs, "review_join": cfg.model_copy(
            update={"human_confirm": HumanConfirmConfig(**confirm)})}
    instance = engine.run(engine.start(loan, LOAN_CONFLICT))
    assert instance.status == "waiting"
    [entry] = instance.confirmations
    assert entry["deadline"] == clock.now + entry["timeout"]
    return engine, instance


def test_after_the_deadline_resume_takes_the_default(loan) -> None:
    clock = Clock()
    engine, instance = waiting_loan(loan, clock)
    clock.now += 299
    instance = engine.resume(engine.load(instance.id))
    assert instance.status == "waiting" and not instance.confirmations[0]["timed_out"]

    clock.now += 2
    instance = engine.resume(engine.load(instance.id))
    assert instance.status == "completed", instance.error
    assert instance.main.resolve("approval_status") == "pending_dual_approval"
    [entry] = instance.confirmations
    assert entry["timed_out"] is True and entry["answer"] == "pending_dual_approval"
    [conflict] = instance.conflicts
    # round 18 changed this deliberately: nobody answered, so the resolver is the join's policy
    # (its configured default), no longer "human", and the reason says so plainly
    assert conflict["resolution"]["resolver"] == "policy"
    assert conflict["resolution"]["reason"] == ("no answer within 300s, nobody answered: the timeout took the "
                                                'configured default "pending_dual_approval" '
                                                f"(the policy suggestion: {DUAL_REASON})")
    [event] = notes(instance, "confirmation_timed_out")
    assert event["action"] == "default" and event["value"] == "pending_dual_approval"
    assert event["deadline"] == entry["deadline"]


def test_an_explicit_answer_beats_the_deadline(loan) -> None:
    clock = Clock()
    engine, instance = waiting_loan(loan, clock)
    clock.now += 10_000
    instance = engine.resume(instance, answers={"confirmations": {CONFIRM_ID: "rejected"}})
    assert instance.status == "completed" and instance.main.resolve("approval_status") == "rejected"
    assert instance.confirmations[0]["timed_out"] is False and not notes(instance, "confirmation_timed_out")


def test_escalation_on_timeout_keeps_the_instance_waiting_for_a_person(loan) -> None:
    clock = Clock()
    engine, instance = waiting_loan(loan, clock, timeout=60, on_timeout="escalate", default="pending_dual_approval")
    clock.now += 61
    instance = engine.resume(engine.load(instance.id))
    assert instance.status == "waiting"
    assert instance.waiting_for == [{"kind": "confirmation", "id": CONFIRM_ID, "task_id": "review_join",
                                     "key": "approval_status", "context": "main", "escalated": True}]
    [entry] = instance.confirmations
    assert entry["timed_out"] is True and entry["escalated"] is True and entry["escalated_at"] == clock.now
    clock.now += 1000
    instance = engine.resume(engine.load(instance.id))  # escalated once, not again
    [event] = notes(instance, "confirmation_timed_out")
    assert event["action"] == "escalated" and event["reason"] == "onTimeout is escalate"

    instance = engine.answer_confirmation(instance, CONFIRM_ID, "rejected")  # the supervisor decides
    assert instance.status == "completed"
    assert instance.conflicts[0]["resolution"]["reason"] == 'a person chose "rejected" (from risk_review)'
    assert instance.confirmations[0]["timed_out"] is True and instance.confirmations[0]["answer"] == "rejected"


def test_timeout_through_the_cli_with_a_short_timeout(cli, tmp_path: Path) -> None:
    config = tmp_path / "short.yaml"
    text = LOAN.with_name("loan_approval.layerflow.yaml").read_text(encoding="utf-8")
    config.write_text(text.replace("    timeout: 300\n", "    timeout: 2\n"), encoding="utf-8")
    data = tmp_path / "data.json"
    data.write_text(json.dumps(LOAN_CONFLICT))
    code, doc = cli("run", str(LOAN), "--config", str(config), "--data", str(data), "--json")
    assert code == 3, doc
    [entry] = doc["confirmations"]
    time.sleep(max(0.0, entry["deadline"] - time.time()) + 0.05)
    code, done = cli("resume", doc["instance_id"], "--json")
    assert code == 0 and done["status"] == "completed"
    assert done["confirmations"][0]["timed_out"] is True
    assert done["conflicts"][0]["resolution"]["reason"].startswith("no answer within 2s")


# ----- the terminal prompt -------------------------------------------------------------------------

ITEM = {"kind": "confirmation", "id": CONFIRM_ID, "message": "Which value?", "default": "pending_dual_approval",
        "on_timeout": "default", "timeout": 300,
        "options": [{"label": '"approved" (from finance_review)', "value": "approved"},
                    {"label": '"rejected" (from risk_review)', "value": "rejected"},
                    {"label": "escalate", "value": "$escalate"}]}


def prompt(lines: str, clock: Clock | None = None, ready: bool = True) -> tuple[TerminalPrompt, io.StringIO]:
    out = io.StringIO()
    clock = clock or Clock()

    def wait(stream: Any, seconds: float) -> bool:
        clock.now += 0 if ready else seconds
        return ready
    return TerminalPrompt(io.StringIO(lines), out, clock=clock, wait=wait), out


@pytest.mark.parametrize(("lines", "answer"), [
    ("2\n", "rejected"),
    ("rejected\n", "rejected"),
    ('"approved" (from finance_review)\n', "approved"),
    ("9\n1\n", "approved"),
    ("\n", "pending_dual_approval"),  # empty: the default
    ("", None),                       # end of input: leave it waiting
])
def test_prompt_answers(lines: str, answer: Any) -> None:
    ask, out = prompt(lines)
    assert ask({**ITEM, "deadline": 1_000_300.0}) == answer
    shown = out.getvalue()
    assert "Which value?" in shown and '  1. "approved" (from finance_review)' in shown and "  3. escalate" in shown
    if lines.startswith("9"):
        assert "please answer with a number from 1 to 3" in shown


def test_prompt_counts_down_to_the_persisted_deadline() -> None:
    clock = Clock()
    ask, out = prompt("", clock, ready=False)
    result = ask({**ITEM, "deadline": clock.now + 3})
    assert isinstance(result, TimedOut) and result.value == "pending_dual_approval"
    shown = out.getvalue()
    assert 'choose 1-3 [Enter: "pending_dual_approval"]    3s left: ' in shown and "   1s left" in shown
    assert 'no answer before the deadline: the default "pending_dual_approval" is taken' in shown


def test_prompt_for_escalation_and_for_an_escalated_confirmation() -> None:
    ask, out = prompt("", ready=False)
    assert isinstance(ask({**ITEM, "on_timeout": "escalate", "deadline": 1_000_001.0}), TimedOut)
    assert ": it is escalated)" in out.getvalue()
    ask, out = prompt("\n")
    assert ask({**ITEM, "escalated": True}) is None  # no countdown; empty leaves it waiting
    assert "escalated: nobody answered before the deadline" in out.getvalue()


def test_a_prompt_that_times_out_applies_the_configured_rule(loan) -> None:
    clock = Clock()
    engine = Engine(clock=clock)
    ask = TerminalPrompt(io.StringIO(""), io.StringIO(), clock=clock,
                         wait=lambda stream, seconds: setattr(clock, "now", clock.now + seconds) or False)
    instance = engine.run(engine.start(loan, LOAN_CONFLICT), ask=ask)
    assert instance.status == "completed"
    assert instance.confirmations[0]["timed_out"] is True
    assert instance.main.resolve("approval_status") == "pending_dual_approval"


# ----- natural-language XOR conditions ----------------------------------------------------------------

class FakeChooser:
    """Replies from a script: a branch id, an exception to raise, or a malformed reply."""

    def __init__(self, *replies: str | Exception) -> None:
        self.replies = list(replies)
        self.questions: list[BranchQuestion] = []

    def choose(self, question: BranchQuestion) -> BranchAnswer:
        self.questions.append(question)
        reply = self.replies.pop(0)
        if isinstance(reply, Exception):
            raise reply
        return BranchAnswer(branch=reply, rationale=f"the sentences say {reply}")


MALFORMED = BranchAnswerError("the reply is not JSON", text="sure")


@pytest.mark.parametrize(("data", "replies", "taken", "model", "disagrees", "failures", "decided_by"), [
    (LOAN_FAST, ["fast_track"], "fast_track", "fast_track", False, 0, "model"),
    (LOAN_FAST, ["full_review"], "full_review", "full_review", True, 0, "model"),  # the model decides
    (LOAN_FULL, ["fast_track"], "fast_track", "fast_track", True, 0, "model"),     # whatever the expression says
    (LOAN_FAST, [MALFORMED, "fast_track"], "fast_track", "fast_track", False, 1, "model"),
    (LOAN_FAST, [MALFORMED, MALFORMED], "fast_track", None, False, 2, "expression"),  # the fallback
    (LOAN_FAST, [ConnectionError("refused")], "fast_track", None, False, 1, "expression"),
], ids=["agree", "disagree-expression-holds", "disagree-expression-fails", "malformed-then-valid",
        "malformed-twice", "unreachable"])
def test_natural_language_conditions_are_decided_by_the_model(loan, data, replies, taken, model, disagrees,
                                                             failures, decided_by) -> None:
    chooser = FakeChooser(*replies)
    engine = Engine(chooser=chooser)
    instance = engine.run(engine.start(loan, data))
    assert instance.status == "completed", instance.error
    assert taken in path_of(instance.workflow)
    [decision] = notes(instance, "condition_decision")
    assert decision["branch"] == taken and decision["model_configured"] is True
    assert decision["decided_by"] == decided_by
    assert (decision["model"] or {}).get("branch") == model
    disagreement = notes(instance, "condition_disagreement")
    assert bool(disagreement) is disagrees
    if disagrees:
        assert disagreement[0]["followed"] == taken and disagreement[0]["model_branch"] == model
        assert disagreement[0]["conditions"][model].startswith(("If the risk", "Otherwise"))
    assert len(notes(instance, "condition_model_failed")) == failures
    fallbacks = instance.to_document()["model_fallbacks"]
    if decided_by == "model":
        assert fallbacks == []
    else:  # the run completed without the model: the document says where and why
        assert [(f["element_id"], f["purpose"], f["fallback"]) for f in fallbacks] == [
            ("approval_split", "condition", "expression")]
        assert ("refused" if failures == 1 else "not JSON") in fallbacks[0]["error"]
    question = chooser.questions[0]
    assert question.gateway_id == "approval_split" and question.ids == ["fast_track", "full_review"]
    assert question.branches[0].condition.startswith("If the risk level is low")
    assert question.branches[1].default and question.context["amount"] == data["amount"]
    assert not any(k.startswith(("kb:", "activity:", "_")) for k in question.context)


def test_offline_the_expression_decides_and_litellm_is_not_imported() -> None:
    code = ("import sys\nsys.path.insert(0, 'tests/engine')\nfrom engine import Engine, load_process\n"
            "from engine_helpers import LOAN, LOAN_FAST\n"
            "e = Engine()\ni = e.run(e.start(load_process(LOAN), LOAN_FAST))\n"
            "assert i.status == 'completed', i.error\n"
            "[d] = [x.data for x in i.main.tape if (x.data or {}).get('note') == 'condition_decision']\n"
            "assert d['decided_by'] == 'expression' and d['model'] is None and not d['model_configured'], d\n"
            "assert 'litellm' not in sys.modules and 'engine.llm' not in sys.modules\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert done.returncode == 0, done.stderr


SPOKEN_XOR = BPMN_HEAD.format(pid="spoken") + """
    <bpmn:startEvent id="start"/>
    <bpmn:exclusiveGateway id="route" default="f_manual">
      <bpmn:extensionElements><layerflow:config>{"branches": [
        {"id": "auto", "condition": "take the automatic path when the request is routine"},
        {"id": "manual", "condition": "otherwise a person handles it"}]}</layerflow:config></bpmn:extensionElements>
    </bpmn:exclusiveGateway>
    <bpmn:scriptTask id="auto"><bpmn:script>path = "auto"</bpmn:script></bpmn:scriptTask>
    <bpmn:scriptTask id="manual"><bpmn:script>path = "manual"</bpmn:script></bpmn:scriptTask>
    <bpmn:endEvent id="end"/>
    <bpmn:sequenceFlow id="f0" sourceRef="start" targetRef="route"/>
    <bpmn:sequenceFlow id="f_auto" sourceRef="route" targetRef="auto">
      <bpmn:conditionExpression>take the automatic path when the request is routine</bpmn:conditionExpression>
    </bpmn:sequenceFlow>
    <bpmn:sequenceFlow id="f_manual" sourceRef="route" targetRef="manual"/>
    <bpmn:sequenceFlow id="f1" sourceRef="auto" targetRef="end"/>
    <bpmn:sequenceFlow id="f2" sourceRef="manual" targetRef="end"/>
  </bpmn:process>
</bpmn:definitions>
"""


@pytest.mark.parametrize(("chooser", "path", "decided_by"), [
    (FakeChooser("auto"), "auto", "model"),
    (FakeChooser("manual"), "manual", "model"),  # the model named the default flow
    (None, "manual", "default"),  # offline, a flow with only a sentence is not taken
])
def test_a_flow_with_only_a_sentence_follows_the_model(tmp_path: Path, chooser, path, decided_by) -> None:
    bpmn = tmp_path / "spoken.bpmn"
    bpmn.write_text(SPOKEN_XOR, encoding="utf-8")
    process = load_process(bpmn, validate=False)  # the validator refuses a sentence as a BPMN condition
    engine = Engine(chooser=chooser)
    instance = engine.run(engine.start(process, {"request": "password reset"}))
    assert instance.status == "completed", instance.error
    assert instance.main.resolve("path") == path
    [decision] = notes(instance, "condition_decision")
    assert decision["decided_by"] == decided_by and not notes(instance, "condition_disagreement")


# ----- branch conditions given by the config only (the seed's designer sentences) ---------------------

UNCONDITIONED_XOR = """<?xml version="1.0" encoding="UTF-8"?>
<bpmn:definitions xmlns:bpmn="http://www.omg.org/spec/BPMN/20100524/MODEL"
                  xmlns:spiffworkflow="http://spiffworkflow.org/bpmn/schema/1.0/core"
                  id="defs" targetNamespace="https://layerflow.dev/tests">
  <bpmn:process id="triage" isExecutable="true">
    <bpmn:startEvent id="start"/>
    <bpmn:exclusiveGateway id="route"{default}>{ext}</bpmn:exclusiveGateway>
    <bpmn:scriptTask id="fast"><bpmn:script>path = 'fast'</bpmn:script></bpmn:scriptTask>
    <bpmn:scriptTask id="full"><bpmn:script>path = 'full'</bpmn:script></bpmn:scriptTask>
    <bpmn:endEvent id="end"/>
    <bpmn:sequenceFlow id="f0" sourceRef="start" targetRef="route"/>
    <bpmn:sequenceFlow id="to_fast" sourceRef="route" targetRef="fast"/>
    <bpmn:sequenceFlow id="to_full" sourceRef="route" targetRef="full"/>
    <bpmn:sequenceFlow id="f1" sourceRef="fast" targetRef="end"/>
    <bpmn:sequenceFlow id="f2" sourceRef="full" targetRef="end"/>
  </bpmn:process>
</bpmn:definitions>
"""
SENTENCES = [{"id": "fast", "condition": "If the risk is low and the amount small, take the fast track"},
             {"id": "full", "condition": "Otherwise take the full review"}]


def _unconditioned(tmp_path: Path, *, default: bool = True, in_bpmn: bool = False,
                   branches: list[dict[str, str]] = SENTENCES) -> Path:
    ext = ('<bpmn:extensionElements><spiffworkflow:activityConfig>'
           f'{json.dumps({"branches": branches})}</spiffworkflow:activityConfig></bpmn:extensionElements>')
    bpmn = tmp_path / "triage.bpmn"
    bpmn.write_text(UNCONDITIONED_XOR.replace("{default}", ' default="to_full"' if default else "")
                    .replace("{ext}", ext if in_bpmn else ""), encoding="utf-8")
    if not in_bpmn:
        (tmp_path / "triage.layerflow.yaml").write_text(json.dumps({"route": {"branches": branches}}),
                                                        encoding="utf-8")
    return bpmn


@pytest.mark.parametrize("in_bpmn", [False, True], ids=["config-file", "extension-element"])
@pytest.mark.parametrize(("reply", "path", "decided_by"), [
    ("fast", "fast", "model"),
    ("full", "full", "model"),  # the model named the default flow
    (None, "full", "default"),  # offline: the sentence's flow is not taken, the default is
])
def test_flows_without_conditions_take_the_configs_sentences(tmp_path: Path, in_bpmn, reply, path,
                                                             decided_by) -> None:
    """The seed's designer writes the branch conditions as sentences in the gateway's config and
    none on the flows: the process loads (SpiffWorkflow alone refuses a non-default flow with no
    condition) and the model decides the sentence's flow."""
    bpmn = _unconditioned(tmp_path, in_bpmn=in_bpmn)
    code, doc = _validate_json(bpmn)
    assert code == 0 and [p["code"] for p in doc["problems"]] == ["condition_natural_language"], doc
    assert doc["problems"][0]["element_id"] == "to_fast"
    engine = Engine(chooser=FakeChooser(reply) if reply else None)
    instance = engine.run(engine.start(load_process(bpmn), {"amount": 9000}))
    assert instance.status == "completed", instance.error
    assert instance.main.resolve("path") == path
    [decision] = notes(instance, "condition_decision")
    assert decision["decided_by"] == decided_by and decision["conditions"]["fast"].startswith("If the risk")
    assert not notes(instance, "condition_model_failed")


def test_a_configured_expression_stands_in_for_the_missing_flow_condition(tmp_path: Path) -> None:
    bpmn = _unconditioned(tmp_path, default=True, branches=[{"id": "fast", "condition": "amount < 10000"}])
    engine = Engine()
    for amount, path in ((9000, "fast"), (20000, "full")):
        instance = engine.run(engine.start(load_process(bpmn), {"amount": amount}))
        assert instance.status == "completed" and instance.main.resolve("path") == path, instance.error


def test_without_a_default_or_a_model_a_sentence_only_gateway_stops_naming_it(tmp_path: Path) -> None:
    bpmn = _unconditioned(tmp_path, default=False)
    engine = Engine()
    instance = engine.run(engine.start(load_process(bpmn), {"amount": 9000}))
    assert instance.status == "error" and "route" in (instance.error["task_id"] or "") + instance.error["message"]


def test_a_flow_without_a_condition_and_no_config_for_its_branch_is_still_refused(tmp_path: Path) -> None:
    bpmn = _unconditioned(tmp_path, default=False, branches=[SENTENCES[0]])
    code, doc = _validate_json(bpmn)
    assert code == 2
    [problem] = [p for p in doc["problems"] if p["severity"] == "error"]
    assert problem["code"] == "gateway_flow_without_condition" and problem["element_id"] == "to_full"


def _validate_json(bpmn: Path) -> tuple[int, dict[str, Any]]:
    result = CliRunner().invoke(main, ["validate", str(bpmn), "--json"])
    return result.exit_code, json.loads(result.stdout)


# ----- a key two branches write to different layers -----------------------------------------------

def test_branches_writing_one_key_to_different_layers_conflict_at_the_join(cli, tmp_path: Path) -> None:
    from engine_helpers import flow, script_task, write_elements

    path = write_elements(tmp_path, "cross_layer", [
        '<bpmn:startEvent id="start"/>', '<bpmn:parallelGateway id="split"/>',
        script_task("fix", "ctx.write('L1', 'decision', 'approve')"),  # fixed for the process
        script_task("review", "decision = 'reject'"),  # WORKING, HISTORY once the task ends
        '<bpmn:parallelGateway id="join"/>', '<bpmn:endEvent id="end"/>',
        flow("start", "split"), flow("split", "fix"), flow("split", "review"),
        flow("fix", "join"), flow("review", "join"), flow("join", "end")])
    code, doc = cli("run", str(path), "--json")
    assert code == 3 and doc["status"] == "waiting"
    assert doc["conflicts"] == [{"gateway_id": "join", "layer": "L1", "key": "decision", "base_value": None,
                                 "values": {"fix": "approve", "review": "reject"}, "resolution": None, "context": "main",
                                 "base_absent": True}]
    code, doc = cli("resume", doc["instance_id"], "--answer", "join/decision=reject", "--json")
    assert code == 0 and doc["status"] == "completed"
    assert doc["layers"]["L1"]["decision"] == "reject" and doc["layers"]["L3"]["decision"] == "reject"
    assert doc["conflicts"][0]["resolution"]["resolver"] == "human"
