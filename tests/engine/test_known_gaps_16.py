"""Gaps closed in round 16.

(a) A late answer against a timeout: once a join's ``humanConfirm`` timeout settled a conflict with its
    default, an answer that comes afterwards (``Engine.answer_confirmation``, ``Engine.resume(answers=)``,
    ``layerflow resume --answer``, REST) is refused (``AnsweredByTimeout``, kind ``already_answered``: exit 2,
    409), naming the join, the key, when the timeout settled it and with what, and what to do; an answer that
    comes after the deadline but before anything applied the timeout wins, and the timeout then does nothing.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from engine import Engine, load_process
from engine.governance import AnsweredByTimeout

from engine_helpers import cli_in_a_tmp_store, flow, write_elements
from test_human_confirm_defaults import GO as JOIN_GO

cli = cli_in_a_tmp_store

START = 1_700_000_000.0  # 2023-11-14T22:13:20Z


class Clock:
    def __init__(self) -> None:
        self.now = START

    def __call__(self) -> float:
        return self.now


# finance and risk disagree on two texts and a score (test_human_confirm_defaults); a person reviews after the join
GO = [*JOIN_GO[:5], '<bpmn:userTask id="review"/>', *JOIN_GO[5:11], flow("merge", "review"), flow("review", "end")]
CONFIG = "merge:\n  humanConfirm: {timeout: 60, default: needs_review, defaults: {score: 5}}\n"
CONFLICTS = {"merge/go_decision", "merge/risk_level", "merge/score"}


def _go(tmp_path: Path, *, review: bool = True) -> Path:
    path = write_elements(tmp_path, "go", GO if review else JOIN_GO)
    (tmp_path / "go.layerflow.yaml").write_text(CONFIG, encoding="utf-8")
    return path


def _timed_out(tmp_path: Path, store: str = "memory://", *, review: bool = True) -> tuple[Engine, Clock, str]:
    """An instance whose join's conflicts were both settled by the timeout (at START + 61)."""
    clock = Clock()
    engine = Engine(store, clock=clock)
    instance = engine.run(load_process(_go(tmp_path, review=review)), {})
    assert {w["id"] for w in instance.waiting_for} == CONFLICTS
    clock.now += 61
    instance = engine.resume(instance.id)
    assert instance.main.resolve("risk_level") == "needs_review"
    assert instance.status == ("waiting" if review else "completed"), instance.error
    return engine, clock, instance.id


def _assert_names_the_timeout(message: str) -> None:
    assert "'merge'" in message and "'risk_level'" in message, message
    assert "timeout" in message and "2023-11-14T22:14:21" in message, message   # when it was settled
    assert '"needs_review"' in message and '"high"' in message, message        # with what (as JSON); what came late
    assert "rollback" in message, message                                      # what the user can do


# ----- (a) a late answer is refused, everywhere ---------------------------------------------------------------

@pytest.mark.parametrize("review", [True, False], ids=["still-waiting", "completed"])
def test_a_late_answer_to_answer_confirmation_is_refused(tmp_path: Path, review: bool) -> None:
    engine, _, iid = _timed_out(tmp_path, review=review)
    version = engine.load(iid).version
    with pytest.raises(AnsweredByTimeout) as caught:
        engine.answer_confirmation(iid, "merge/risk_level", "high")
    err = caught.value
    assert err.kind == "already_answered"
    _assert_names_the_timeout(str(err))
    assert (err.gateway_id, err.key, err.answer) == ("merge", "risk_level", "needs_review")
    instance = engine.load(iid)
    assert instance.version == version and instance.main.resolve("risk_level") == "needs_review"


@pytest.mark.parametrize("review", [True, False], ids=["still-waiting", "completed"])
@pytest.mark.parametrize("key", ["merge/risk_level", "merge/go_decision"])
def test_a_late_answer_to_resume_is_refused(tmp_path: Path, review: bool, key: str) -> None:
    engine, _, iid = _timed_out(tmp_path, review=review)
    version = engine.load(iid).version
    with pytest.raises(AnsweredByTimeout) as caught:
        engine.resume(iid, answers={"confirmations": {key: "high" if "risk" in key else "go"}})
    assert key.split("/")[1] in str(caught.value)
    assert engine.load(iid).version == version


def test_a_late_answer_that_agrees_with_the_timeout_is_no_conflict(tmp_path: Path) -> None:
    """The same value the timeout gave: nothing is lost, the resume goes on (a script's answers file
    reused for every resume)."""
    engine, _, iid = _timed_out(tmp_path)
    instance = engine.resume(iid, answers={"confirmations": {"merge/risk_level": "needs_review", "*": "go"},
                                           "user_tasks": {"review": {"ok": True}}})
    assert instance.status == "completed", instance.error


def test_a_late_answer_on_the_cli_exits_2_naming_the_timeout(cli: Any, tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    import os

    engine, _, iid = _timed_out(tmp_path, os.environ["LAYERFLOW_STORE"])
    result = cli("resume", iid, "--answer", "merge/risk_level=high")
    assert result.exit_code == 2, (result.stdout, result.stderr)
    _assert_names_the_timeout(result.stderr)
    result = cli("resume", iid, "--answer", "merge/risk_level=high", "--json")
    assert result.exit_code == 2
    doc = json.loads(result.stdout)
    assert doc["error"]["kind"] == "already_answered", doc
    assert engine.load(iid).main.resolve("risk_level") == "needs_review"


def test_a_late_answer_over_rest_is_409_naming_the_timeout(tmp_path: Path) -> None:
    from fastapi.testclient import TestClient

    from engine.api import create_app

    catalog = tmp_path / "catalog"
    catalog.mkdir()
    store = f"sqlite:///{tmp_path / 'rest.db'}"
    engine, _, iid = _timed_out(catalog, store)
    auth = {"Authorization": "Bearer late"}
    client = TestClient(create_app(store, catalog, token="late"))
    for path, body in [("/api/confirmations/merge/risk_level", {"instance_id": iid, "value": "high"}),
                       ("/api/context-governance/resolve", {"instance_id": iid, "conflict_key": "risk_level",
                                                            "resolution": "high", "reason": "late"}),
                       (f"/api/instances/{iid}/resume", {"answers": {"confirmations": {"merge/risk_level": "high"}}})]:
        r = client.post(path, json=body, headers=auth)
        assert r.status_code == 409, (path, r.text)
        error = r.json()["error"]
        assert error["kind"] == "already_answered", (path, error)
        _assert_names_the_timeout(error["message"])
    assert engine.load(iid).main.resolve("risk_level") == "needs_review"


# ----- (a) the reverse race: an answer after the deadline, before the timeout ran, wins ---------------------------

def _overdue(tmp_path: Path, store: str = "memory://") -> tuple[Engine, Clock, str]:
    clock = Clock()
    engine = Engine(store, clock=clock)
    instance = engine.run(load_process(_go(tmp_path)), {})
    clock.now += 61  # due, and nothing applied the timeout yet
    assert "merge/risk_level" in {w["id"] for w in engine.due_timers()}
    return engine, clock, instance.id


def _no_timeout_for(instance: Any, cid: str) -> bool:
    events = [e for ctx in instance.contexts.values() for e in ctx.tape if e.kind == "confirmation_timed_out"]
    return not any((e.data or {}).get("confirmation_id") == cid for e in events)


def test_an_answer_before_the_timeout_ran_wins_and_the_timeout_does_nothing(tmp_path: Path) -> None:
    engine, clock, iid = _overdue(tmp_path)
    instance = engine.answer_confirmation(iid, "merge/risk_level", "high")
    # the other conflict had no answer: the run after the answer applied its timeout
    assert instance.main.resolve("risk_level") == "high"
    assert instance.main.resolve("go_decision") == "needs_review"
    conf = next(c for c in instance.confirmations if c["id"] == "merge/risk_level")
    assert conf["answer"] == "high" and not conf.get("answered_by_timeout")
    assert _no_timeout_for(instance, "merge/risk_level")
    clock.now += 3600
    version = instance.version
    instance = engine.resume(iid)  # what a worker or `timers --fire` does later
    assert instance.version == version and instance.main.resolve("risk_level") == "high"
    assert not any(w["id"].startswith("merge/") for w in engine.due_timers())


def test_an_answer_to_resume_before_the_timeout_ran_wins(tmp_path: Path) -> None:
    engine, _, iid = _overdue(tmp_path)
    instance = engine.resume(iid, answers={"confirmations": {"merge/risk_level": "high"}})
    assert instance.main.resolve("risk_level") == "high"
    assert instance.main.resolve("go_decision") == "needs_review"  # no answer: its timeout
    assert _no_timeout_for(instance, "merge/risk_level")


def test_an_answer_on_the_cli_before_the_timeout_ran_wins(cli: Any, tmp_path: Path) -> None:
    import os

    engine, _, iid = _overdue(tmp_path, os.environ["LAYERFLOW_STORE"])
    result = cli("resume", iid, "--answer", "merge/risk_level=high")
    assert result.exit_code == 3, (result.stdout, result.stderr)  # waits for the review now
    instance = engine.load(iid)
    assert instance.main.resolve("risk_level") == "high"
    assert _no_timeout_for(instance, "merge/risk_level")


# ----- (b) a signal (an escalation) thrown inside a sub-process that an interrupting boundary event catches -----

SIGNAL = ('<bpmn:signalEventDefinition signalRef="sig"/>', '  <bpmn:signal id="sig" name="alarm"/>\n')
ESCALATION = ('<bpmn:escalationEventDefinition escalationRef="sig"/>',
              '  <bpmn:escalation id="sig" name="alarm" escalationCode="alarm"/>\n')


def _shouting_sub(tmp_path: Path, event: tuple[str, str], *, parallel: bool) -> Path:
    """Sub-process ``sub``: ``a`` writes x, then throws ``alarm``, then ``b`` would write y (with
    ``parallel``, a person's task ``wait`` waits beside it, in a branch that wrote w); an interrupting
    boundary event on ``sub`` catches ``alarm`` and goes to ``handle``."""
    definition, declaration = event
    inner = ['<bpmn:startEvent id="s_start"/>',
             '<bpmn:scriptTask id="a"><bpmn:script>x = 1</bpmn:script></bpmn:scriptTask>',
             f'<bpmn:intermediateThrowEvent id="shout">{definition}</bpmn:intermediateThrowEvent>',
             '<bpmn:scriptTask id="b"><bpmn:script>y = 2</bpmn:script></bpmn:scriptTask>',
             '<bpmn:endEvent id="s_end"/>', flow("a", "shout"), flow("shout", "b"), flow("b", "s_end")]
    if parallel:
        inner += ['<bpmn:parallelGateway id="s_fork"/>', '<bpmn:parallelGateway id="s_join"/>',
                  '<bpmn:scriptTask id="w"><bpmn:script>w = 3</bpmn:script></bpmn:scriptTask>',
                  '<bpmn:userTask id="wait"/>', flow("s_start", "s_fork"), flow("s_fork", "a"), flow("s_fork", "w"),
                  flow("w", "wait"), flow("wait", "s_join")]
        inner = [e.replace('targetRef="s_end"', 'targetRef="s_join"') for e in inner]
        inner.append(flow("s_join", "s_end"))
    else:
        inner.append(flow("s_start", "a"))
    elements = ['<bpmn:startEvent id="start"/>', f'<bpmn:subProcess id="sub">{"".join(inner)}</bpmn:subProcess>',
                f'<bpmn:boundaryEvent id="alarm" attachedToRef="sub">{definition}</bpmn:boundaryEvent>',
                '<bpmn:scriptTask id="handle"><bpmn:script>handled = True</bpmn:script></bpmn:scriptTask>',
                '<bpmn:scriptTask id="after"><bpmn:script>normal = True</bpmn:script></bpmn:scriptTask>',
                '<bpmn:endEvent id="end"/>', '<bpmn:endEvent id="end2"/>',
                flow("start", "sub"), flow("sub", "after"), flow("after", "end"), flow("alarm", "handle"),
                flow("handle", "end2")]
    return write_elements(tmp_path, "p_shout", elements, extra=declaration)


@pytest.mark.parametrize("event", [SIGNAL, ESCALATION], ids=["signal", "escalation"])
@pytest.mark.parametrize("parallel", [False, True], ids=["sequence", "parallel"])
def test_a_throw_inside_a_sub_process_its_interrupting_boundary_event_catches(tmp_path: Path, event: Any,
                                                                               parallel: bool) -> None:
    instance = Engine("memory://").run(load_process(_shouting_sub(tmp_path, event, parallel=parallel)), {})
    assert instance.status == "completed", instance.error
    done = [e.activity for e in instance.main.tape if e.kind == "complete"]
    # BPMN: the sub-process is interrupted as the event is caught: nothing after the throw runs in it
    assert "b" not in done and "after" not in done and "handle" in done, done
    history = dict(instance.main.layer(3))
    assert history.get("handled") is True and "y" not in history and "normal" not in history
    assert history.get("x") == 1  # what finished in the sub-process before the interrupt stays
    assert not instance.waiting_for  # the person's task in the interrupted sub-process is cancelled


def test_a_signal_thrown_beside_an_activity_whose_interrupting_boundary_event_catches_it(tmp_path: Path) -> None:
    """Inside the sub-process, the signal interrupts the person's task ``wait`` beside the thrower (its
    boundary event's path goes on to the join), not the thrower's path nor the sub-process."""
    definition, declaration = SIGNAL
    inner = ['<bpmn:startEvent id="s_start"/>', '<bpmn:parallelGateway id="s_fork"/>',
             '<bpmn:scriptTask id="a"><bpmn:script>x = 1</bpmn:script></bpmn:scriptTask>',
             f'<bpmn:intermediateThrowEvent id="shout">{definition}</bpmn:intermediateThrowEvent>',
             '<bpmn:scriptTask id="b"><bpmn:script>y = 2</bpmn:script></bpmn:scriptTask>',
             '<bpmn:userTask id="wait"/>',
             f'<bpmn:boundaryEvent id="poke" attachedToRef="wait">{definition}</bpmn:boundaryEvent>',
             '<bpmn:scriptTask id="poked"><bpmn:script>p = 4</bpmn:script></bpmn:scriptTask>',
             '<bpmn:exclusiveGateway id="w_merge"/>', '<bpmn:parallelGateway id="s_join"/>',
             '<bpmn:endEvent id="s_end"/>',
             flow("s_start", "s_fork"), flow("s_fork", "a"), flow("a", "shout"), flow("shout", "b"),
             flow("b", "s_join"), flow("s_fork", "wait"), flow("wait", "w_merge"), flow("poke", "poked"),
             flow("poked", "w_merge"), flow("w_merge", "s_join"), flow("s_join", "s_end")]
    elements = ['<bpmn:startEvent id="start"/>', f'<bpmn:subProcess id="sub">{"".join(inner)}</bpmn:subProcess>',
                '<bpmn:scriptTask id="after"><bpmn:script>normal = True</bpmn:script></bpmn:scriptTask>',
                '<bpmn:endEvent id="end"/>', flow("start", "sub"), flow("sub", "after"), flow("after", "end")]
    path = write_elements(tmp_path, "beside", elements, extra=declaration)
    instance = Engine("memory://").run(load_process(path), {})
    assert instance.status == "completed", (instance.error, instance.waiting_for)
    history = dict(instance.main.layer(3))
    assert (history.get("x"), history.get("y"), history.get("p"), history.get("normal")) == (1, 2, 4, True)


# ----- (c) the config file changed while an instance waits at a join ---------------------------------------------

def _config_notices(instance: Any) -> list[str]:
    return [n for n in instance.notices if "go.layerflow.yaml" in n]


def test_a_changed_config_file_is_named_and_not_mixed_into_a_waiting_instance(tmp_path: Path) -> None:
    clock = Clock()
    engine = Engine(f"sqlite:///{tmp_path / 'c.db'}", clock=clock)
    iid = engine.run(load_process(_go(tmp_path)), {}).id
    (tmp_path / "go.layerflow.yaml").write_text(
        "merge:\n  humanConfirm: {timeout: 600, default: hold, message: Pick one}\n", encoding="utf-8")
    instance = engine.resume(iid)
    [notice] = _config_notices(instance)
    assert "'merge'" in notice and "waits" in notice, notice
    assert "humanConfirm.timeout 60 -> 600" in notice and "humanConfirm.default 'needs_review' -> 'hold'" in notice
    assert "humanConfirm.message" in notice and "keeps the config it started with" in notice, notice
    assert "/api/context-governance/config" in notice, notice
    # nothing of the new file is used: the old timeout and default settle the conflicts
    clock.now += 61
    instance = engine.resume(iid)
    assert instance.main.resolve("risk_level") == "needs_review"
    assert engine.load(iid).process.configs["merge"].human_confirm.timeout == 60


def test_an_unchanged_or_missing_config_file_gives_no_notice(tmp_path: Path) -> None:
    engine = Engine("memory://")
    iid = engine.run(load_process(_go(tmp_path)), {}).id
    assert _config_notices(engine.resume(iid)) == []
    (tmp_path / "go.layerflow.yaml").unlink()  # a worker on another machine: no file there
    assert _config_notices(engine.resume(iid)) == []


def test_the_cli_prints_the_config_notice_on_resume(cli: Any, tmp_path: Path) -> None:
    import os

    iid = Engine(os.environ["LAYERFLOW_STORE"]).run(load_process(_go(tmp_path)), {}).id
    (tmp_path / "go.layerflow.yaml").write_text("merge:\n  humanConfirm: {timeout: 60, default: hold}\n",
                                                encoding="utf-8")
    result = cli("resume", iid)
    assert result.exit_code == 3, (result.stdout, result.stderr)
    assert "go.layerflow.yaml" in result.stderr and "humanConfirm.default 'needs_review' -> 'hold'" in result.stderr
