"""Gaps closed in round 17.

(a) A signal or escalation thrown inside a called process, or inside an instance of a multi-instance
    sub-process, that an interrupting boundary event of that call activity / multi-instance sub-process
    catches interrupts it at once, as for an embedded sub-process (``spiff.interrupts_around``): no step of
    it that was ready beside the thrower runs (and writes) after the throw.
(b) A late answer to a confirmation its timeout settled is 409 ``already_answered`` on every REST path,
    also by the confirmation's id alone (no ``instance_id``), which gave 404.
(c) ``--yes`` takes what the policy or the model proposed (or the configured default) without asking anyone:
    the resolution names that resolver (``policy`` / ``model``), not ``human``, and says no person was asked.
(d) A model asked to resolve a conflict, pick a branch by a sentence, summarize, or plan a compression is told,
    in one fixed sentence (``REDACTED_NOTE``), what ``[REDACTED]`` in its request means, only when its request
    shows one (requests without secrets keep their bytes); the compression-plan prompt, which was sent
    unredacted (activity summaries hold text), is redacted.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from engine import Engine, load_process

import test_unseen_processes_4
from engine_helpers import cli_in_a_tmp_store, flow, run_json, write_elements

cli = cli_in_a_tmp_store
fake_model = test_unseen_processes_4.fake_model  # the deterministic fake model, shared

SIGNAL = ('<bpmn:signalEventDefinition signalRef="sig"/>', '  <bpmn:signal id="sig" name="alarm"/>\n')
ESCALATION = ('<bpmn:escalationEventDefinition escalationRef="sig"/>',
              '  <bpmn:escalation id="sig" name="alarm" escalationCode="alarm"/>\n')


def _inner(definition: str) -> list[str]:
    """Two branches: ``a`` writes x, throws ``alarm``, then ``b`` would write y; beside it ``w`` writes w,
    then ``w2`` would write w2 (ready after ``w``, while the throw is caught)."""
    return ['<bpmn:startEvent id="s_start"/>', '<bpmn:parallelGateway id="s_fork"/>',
            '<bpmn:scriptTask id="a"><bpmn:script>x = 1</bpmn:script></bpmn:scriptTask>',
            f'<bpmn:intermediateThrowEvent id="shout">{definition}</bpmn:intermediateThrowEvent>',
            '<bpmn:scriptTask id="b"><bpmn:script>y = 2</bpmn:script></bpmn:scriptTask>',
            '<bpmn:scriptTask id="w"><bpmn:script>w = 3</bpmn:script></bpmn:scriptTask>',
            '<bpmn:scriptTask id="w2"><bpmn:script>w2 = 4</bpmn:script></bpmn:scriptTask>',
            '<bpmn:parallelGateway id="s_join"/>', '<bpmn:endEvent id="s_end"/>',
            flow("s_start", "s_fork"), flow("s_fork", "a"), flow("a", "shout"), flow("shout", "b"),
            flow("b", "s_join"), flow("s_fork", "w"), flow("w", "w2"), flow("w2", "s_join"), flow("s_join", "s_end")]


def _outer(activity: str, definition: str) -> list[str]:
    return ['<bpmn:startEvent id="start"/>', activity,
            f'<bpmn:boundaryEvent id="alarm" attachedToRef="act">{definition}</bpmn:boundaryEvent>',
            '<bpmn:scriptTask id="handle"><bpmn:script>handled = True</bpmn:script></bpmn:scriptTask>',
            '<bpmn:scriptTask id="after"><bpmn:script>normal = True</bpmn:script></bpmn:scriptTask>',
            '<bpmn:endEvent id="end"/>', '<bpmn:endEvent id="end2"/>',
            flow("start", "act"), flow("act", "after"), flow("after", "end"), flow("alarm", "handle"),
            flow("handle", "end2")]


def _shouting(tmp_path: Path, event: tuple[str, str], shape: str) -> Path:
    definition, declaration = event
    inner = "".join(_inner(definition))
    if shape == "sub":
        return write_elements(tmp_path, "p_shout", _outer(f'<bpmn:subProcess id="act">{inner}</bpmn:subProcess>',
                                                          definition), extra=declaration)
    if shape == "call":
        called = f'  <bpmn:process id="called" isExecutable="true">{inner}</bpmn:process>\n'
        return write_elements(tmp_path, "p_shout", _outer('<bpmn:callActivity id="act" calledElement="called"/>',
                                                          definition), extra=called + declaration)
    seq = "true" if shape == "mi-sequential" else "false"
    loop = (f'<bpmn:multiInstanceLoopCharacteristics isSequential="{seq}">'
            '<bpmn:loopCardinality>2</bpmn:loopCardinality></bpmn:multiInstanceLoopCharacteristics>')
    if shape == "mi-call":
        called = f'  <bpmn:process id="called" isExecutable="true">{inner}</bpmn:process>\n'
        return write_elements(tmp_path, "p_shout", _outer(f'<bpmn:callActivity id="act" calledElement="called">{loop}'
                                                          '</bpmn:callActivity>', definition), extra=called + declaration)
    return write_elements(tmp_path, "p_shout", _outer(f'<bpmn:subProcess id="act">{loop}{inner}</bpmn:subProcess>',
                                                      definition), extra=declaration)


def _done(instance: Any) -> list[str]:
    return [e.activity for ctx in instance.contexts.values() for e in ctx.tape if e.kind == "complete"]


@pytest.mark.parametrize("event", [SIGNAL, ESCALATION], ids=["signal", "escalation"])
@pytest.mark.parametrize("shape", ["sub", "call", "mi-parallel", "mi-sequential", "mi-call"])
def test_a_throw_inside_the_activity_interrupts_it_at_once(tmp_path: Path, event: Any, shape: str) -> None:
    instance = Engine("memory://").run(load_process(_shouting(tmp_path, event, shape)), {})
    assert instance.status == "completed", instance.error
    done = _done(instance)
    # BPMN: the activity is interrupted as the event is caught: nothing after the throw runs in it
    assert "b" not in done and "w2" not in done and "after" not in done and "handle" in done, done
    history = dict(instance.main.layer(3))
    assert history.get("handled") is True, history
    assert "y" not in history and "w2" not in history and "normal" not in history, history
    if shape in ("sub", "call"):
        # what finished in the activity before the interrupt stays (the throwing branch ends with it)
        assert history.get("x") == 1, history
    else:
        # an interrupted multi-instance activity closes with its writes undone, as any interrupt of it does
        assert "x" not in history and "w" not in history, history
        assert [e.activity for e in instance.main.tape if e.kind == "abort"] == ["act"]


# ----- (b) a late answer to a confirmation its timeout settled: 409 on every REST path -------------------------

def _late_paths(iid: str) -> list[tuple[str, dict[str, Any]]]:
    resolve = {"resolution": "high", "reason": "late"}
    branch = {"action": "resolve_conflict", "resolution": "high", "reason": "late"}
    return [
        ("/api/confirmations/merge/risk_level", {"instance_id": iid, "value": "high"}),
        ("/api/confirmations/merge/risk_level", {"value": "high"}),  # found by its id alone
        ("/api/context-governance/resolve", {"instance_id": iid, "conflict_key": "risk_level", **resolve}),
        ("/api/context-governance/resolve", {"instance_id": iid, "confirmation_id": "merge/risk_level", **resolve}),
        (f"/api/context-governance/resolve?instance_id={iid}", {"conflict_key": "risk_level", **resolve}),
        (f"/api/instances/{iid}/resume", {"answers": {"confirmations": {"merge/risk_level": "high"}}}),
        ("/api/context-governance/tools/context_branch",
         {"instance_id": iid, "arguments": {**branch, "confirmation_id": "merge/risk_level"}}),
        ("/api/tools/context_branch", {"instance_id": iid, "conflict_key": "risk_level", **branch}),
    ]


@pytest.mark.parametrize("review", [True, False], ids=["still-waiting", "completed"])
def test_a_late_answer_is_409_naming_the_timeout_on_every_rest_path(tmp_path: Path, review: bool) -> None:
    from fastapi.testclient import TestClient

    from engine.api import create_app

    from test_known_gaps_16 import _assert_names_the_timeout, _timed_out

    catalog = tmp_path / "catalog"
    catalog.mkdir()
    store = f"sqlite:///{tmp_path / 'rest.db'}"
    engine, _, iid = _timed_out(catalog, store, review=review)
    version = engine.load(iid).version
    client = TestClient(create_app(store, catalog, token="late"))
    for path, body in _late_paths(iid):
        r = client.post(path, json=body, headers={"Authorization": "Bearer late"})
        assert r.status_code == 409, (path, body, r.text)
        error = r.json()["error"]
        assert error["kind"] == "already_answered", (path, body, error)
        _assert_names_the_timeout(error["message"])
        assert (error["instance_id"], error["answer"]) == (iid, "needs_review"), (path, body, error)
    instance = engine.load(iid)
    assert instance.version == version and instance.main.resolve("risk_level") == "needs_review"


def test_an_answer_by_id_alone_that_no_instance_has_is_still_404(tmp_path: Path) -> None:
    from fastapi.testclient import TestClient

    from engine.api import create_app

    catalog = tmp_path / "catalog"
    catalog.mkdir()
    client = TestClient(create_app(f"sqlite:///{tmp_path / 'rest.db'}", catalog, token="t"))
    r = client.post("/api/confirmations/merge/nothing", json={"value": "x"}, headers={"Authorization": "Bearer t"})
    assert r.status_code == 404, r.text
    assert "merge/nothing" in r.json()["error"]["message"]


def test_an_answer_by_id_alone_answered_in_several_instances_is_409_naming_them(tmp_path: Path) -> None:
    from engine.governance import AnswerArgs, ConfirmationAnswered, GovernanceService

    from test_known_gaps_16 import _go, Clock

    clock = Clock()
    engine = Engine(f"sqlite:///{tmp_path / 'two.db'}", clock=clock)
    process = load_process(_go(tmp_path))
    ids = sorted(engine.run(process, {}).id for _ in range(2))
    clock.now += 61
    for iid in ids:
        engine.resume(iid)
    with pytest.raises(ConfirmationAnswered) as caught:
        GovernanceService(engine).answer("merge/risk_level", AnswerArgs(value="high"))
    assert caught.value.kind == "already_answered"
    assert all(iid in str(caught.value) for iid in ids) and "instance_id" in str(caught.value), caught.value


# ----- (c) --yes answers no person gave are not recorded as a person's -----------------------------------------

def _decisions(iid: str) -> list[Any]:
    import os

    instance = Engine(os.environ["LAYERFLOW_STORE"]).load(iid)
    return [e for ctx in instance.contexts.values() for e in ctx.tape if (e.data or {}).get("note") == "human_decision"]


def test_yes_in_the_demo_says_it_took_the_policy_suggestion_unattended(cli: Any) -> None:
    doc = run_json(cli, "demo", "loan", "--scenario", "conflict", "--yes")
    [conflict] = doc["conflicts"]
    resolution = conflict["resolution"]
    assert (resolution["value"], resolution["resolver"]) == ("pending_dual_approval", "human"), resolution
    reason = resolution["reason"]
    assert reason == ("layerflow --yes took the policy's suggestion \"pending_dual_approval\" without asking a "
                      "person: high risk and high amount need dual approval"), reason
    [decision] = _decisions(doc["instance_id"])
    assert decision.actor == "layerflow --yes" and decision.data["unattended"] is True, decision


def test_yes_that_takes_the_configured_default_says_so(cli: Any, tmp_path: Path) -> None:
    from test_join_shapes import inclusive_process

    path = inclusive_process(tmp_path)
    (tmp_path / "inclusive_some.layerflow.yaml").write_text("meet: {humanConfirm: {timeout: 60, default: A}}",
                                                            encoding="utf-8")
    doc = run_json(cli, "run", str(path), "--data", json.dumps({"go_a": True, "go_b": True}), "--yes")
    resolution = doc["conflicts"][0]["resolution"]
    assert (resolution["value"], resolution["resolver"]) == ("A", "human"), resolution
    assert resolution["reason"] == 'layerflow --yes took the configured default "A" without asking a person', resolution


def test_an_answer_a_person_gives_is_still_a_persons(cli: Any, tmp_path: Path) -> None:
    waiting = run_json(cli, "demo", "loan", "--scenario", "conflict", code=3)
    doc = run_json(cli, "resume", waiting["instance_id"], "--answer", "review_join/approval_status=pending_dual_approval")
    resolution = doc["conflicts"][0]["resolution"]
    assert resolution["resolver"] == "human" and resolution["reason"].startswith("a person confirmed"), resolution
    [decision] = _decisions(doc["instance_id"])
    assert decision.actor == "person" and "unattended" not in decision.data


# ----- (d) a model shown [REDACTED] is told what it means; the compression-plan prompt is redacted -------------

BEARER = "Bearer abcdefghijklmnopqrstuvwx0123"


def _conflict_request(related: dict[str, Any]) -> Any:
    from gateways.arbiter import ArbitrationRequest

    return ArbitrationRequest(gateway_id="join", key="tier", base_value="basic", values={"a": "gold", "b": "silver"},
                              reasons={"a": "contract", "b": "usage"}, related=related, policy_text=None, layer="L4")


def _branch_question(context: dict[str, Any]) -> Any:
    from gateways.conditions import BranchOption, BranchQuestion

    return BranchQuestion(gateway_id="route", branches=(BranchOption("grant", "the vendor is trusted"),
                                                        BranchOption("deny", default=True)), context=context)


def _note_in(messages: list[dict[str, str]]) -> int:
    from context_layers.hooks import REDACTED_NOTE

    return sum(m["content"].count(REDACTED_NOTE) for m in messages)


@pytest.mark.parametrize("secret", [True, False], ids=["redacted", "nothing-hidden"])
def test_the_conflict_and_condition_prompts_say_what_redacted_means_only_when_shown(secret: bool) -> None:
    from context_layers.hooks import REDACTED_NOTE, redact_for_model
    from gateways import arbiter, conditions

    shown = redact_for_model({"api_key" if secret else "vendor": "acme-key-9f8e7d6c5b4a"})
    for build, request, system in [(arbiter.build_conflict_prompt, _conflict_request(shown), arbiter._SYSTEM),
                                   (conditions.build_branch_prompt, _branch_question(shown), conditions._SYSTEM)]:
        messages = build(request)
        if secret:
            assert messages[0]["content"] == f"{system}\n\n{REDACTED_NOTE}", messages[0]
            assert _note_in(messages) == 1
        else:  # byte for byte what it was: the system text alone
            assert messages[0]["content"] == system and _note_in(messages) == 0


@pytest.mark.parametrize("where", ["text", "prefix", "nowhere"])
def test_the_summary_request_says_what_redacted_means_only_when_shown(where: str) -> None:
    from context_layers.hooks import REDACTED, REDACTED_NOTE
    from context_layers.summarize import SUMMARY_INSTRUCTION, build_summary_request

    prefix = [{"role": "system", "content": "You assess risk."},
              {"role": "user", "content": f"api_key: {REDACTED}" if where == "prefix" else "vendor: Acme"}]
    text = f"password: {REDACTED}" if where == "text" else "checked: all clean"
    messages = build_summary_request(prefix, text, 40)
    assert messages[:2] == prefix  # the cached prefix is never changed
    instruction = SUMMARY_INSTRUCTION.format(max_tokens=40)
    expected = f"{instruction} {REDACTED_NOTE}" if where != "nowhere" else instruction
    assert messages[-1]["content"].startswith(f"{expected}\n\n<entries>"), messages[-1]
    assert _note_in(messages) == (0 if where == "nowhere" else 1)


def _planned_context(summary: str) -> Any:
    from context_layers import Layer, LayeredContext

    ctx = LayeredContext(system={"policy": "p"})
    for i in range(3):
        ctx.begin_activity(f"step{i}")
        ctx.write(Layer.WORKING, f"notes{i}", "checked the file " * 30, actor=f"step{i}")
        ctx.complete_activity(f"step{i}", summary=summary if i == 0 else f"step {i} done")
    return ctx


@pytest.mark.parametrize("secret", [True, False], ids=["redacted", "nothing-hidden"])
def test_the_compression_plan_prompt_is_redacted_and_says_what_redacted_means(secret: bool) -> None:
    from context_layers.compression_plan import PROMPT_SYSTEM, build_compression_prompt
    from context_layers.hooks import REDACTED_NOTE

    summary = f"called the vendor with Authorization: {BEARER}" if secret else "called the vendor"
    ctx = _planned_context(summary)
    messages = build_compression_prompt(ctx, {"compressTokenThreshold": 50})
    text = json.dumps(messages)
    assert "abcdefghijklmnopqrstuvwx0123" not in text
    if secret:
        assert "Authorization: Bearer [REDACTED]" in text
        assert messages[0]["content"] == f"{PROMPT_SYSTEM}\n\n{REDACTED_NOTE}"
    else:
        assert messages[0]["content"] == PROMPT_SYSTEM and "called the vendor" in text
    # redact: false (the activity's config) sends it as it is, and says nothing
    plain = build_compression_prompt(ctx, {"compressTokenThreshold": 50}, redact=False)
    assert plain[0]["content"] == PROMPT_SYSTEM and (BEARER in json.dumps(plain)) is secret


def test_the_engine_asks_its_planner_with_the_secrets_hidden(tmp_path: Path) -> None:
    """The model-planned compression after an activity (``compressionPlanner: model``) sends the redacted
    prompt (the activity's ``redact`` config), and the tape's llm_call keeps what was sent."""
    from context_layers.config import ActivityExtensionConfig
    from engine.model_compression import compress_after_activity

    sent: list[Any] = []

    def fake(**kwargs: Any) -> dict[str, Any]:
        sent.append(kwargs["messages"])
        plan = {"summarize": ["step0"], "keep_points": ["vendor called"], "drop": []}
        return {"choices": [{"message": {"role": "assistant", "content": json.dumps(plan)},
                             "finish_reason": "stop"}]}

    ctx = _planned_context(f"called the vendor with Authorization: {BEARER}")
    config = ActivityExtensionConfig.model_validate(
        {"compressTokenThreshold": 50, "contextStrategy": {"compressionPlanner": "model"}})
    compress_after_activity(ctx, config, task_id="step2", model="fake/model", completion=fake)
    assert sent, "the planner was not asked"
    assert "abcdefghijklmnopqrstuvwx0123" not in json.dumps(sent)
    assert "Bearer [REDACTED]" in sent[0][1]["content"] and _note_in(sent[0]) == 1


def test_every_engine_prompt_that_shows_redacted_says_what_it_means(fake_model: Any, tmp_path: Path) -> None:
    """The vendor-access process (test_redaction_16): its condition, conflict and summary prompts show
    redacted values and carry the sentence once; the activity requests are rendered as they were."""
    import test_redaction_16 as r16
    from test_model_paths_16 import _purpose

    config = r16._config(tmp_path, review={"compressTokenThreshold": 60})
    model = fake_model(lambda kw: "The checks ran." if _purpose(kw) == "summary" else r16._answer(kw))
    instance = Engine("memory://", model="fake/model").run_process(load_process(tmp_path / r16.BPMN.name,
                                                                                config=config), r16.DATA,
                                                                   answers=r16.ANSWERS)
    assert instance.status == "completed", instance.error
    seen: dict[str, list[int]] = {}
    for kwargs in model.requests:
        seen.setdefault(_purpose(kwargs), []).append(_note_in(kwargs["messages"]))
    assert set(seen) == {"activity", "condition", "conflict", "summary"}, seen
    assert all(n == 1 for purpose in ("condition", "conflict", "summary") for n in seen[purpose]), seen
    assert set(seen["activity"]) == {0}, seen
