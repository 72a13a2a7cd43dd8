"""Gaps closed in round 29.

(1) A confirmation nobody will answer any more (its line of a multi-instance cancelled by a
    boundary timer) closed its join's conflict by gateway, key and values only: two lines that
    met the same conflict were both marked ``cancelled`` while the other line still waited for its
    answer, and once that answer came the cancelled line's report was dropped from ``conflicts``.
    Conflicts and questions name the context (the line) they merge into; both now match on it.
    Found on the way: a join whose sub-process a boundary timer cancelled and whose path loops back
    into it (a retry) asked nothing on its second pass (the first pass's question, not yet closed,
    counted as asked) and the instance waited for the timer alone; the retry now asks again.
(2) Inspecting one context (``layerflow inspect ID --context``, REST ``context-governance/inspect``
    with ``context``, ``GovernanceService.inspect``) listed every open conflict of the instance; now
    the ones of the joins merging into that context. Without a context, the instance's. A cancelled
    conflict is open no more: inspect and the console's instance row leave it out.
(3) The REST models of an instance's document passed ``context`` of a conflict, a confirmation
    and a waiting item through without declaring it: /openapi.json and /docs did not show it.
(4) The timers the lines of a parallel multi-instance wait on were listed in ``waiting_for`` under one
    ``task_id`` with nothing to tell whose line each is: each names its ``context`` now.
(5) A key named like a Python keyword read by its bare name (``class == 'gold'``) got only "fix the
    condition" from validate; read as a path (``from.name``) it got the rewrite: now both do.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import local_http
import pytest
from click.testing import CliRunner

from engine import Engine, load_process
from engine.api import create_app
from engine.cli import main
from engine.console import summary_of
from engine.governance import GovernanceService, InspectArgs
from engine.validate import validate_process

from engine_helpers import flow, script_task, variables, write_elements
from governance_helpers import TOKEN, ServerThread
from test_public_27 import condition_process

T0 = 1_800_000_000.0


class Clock:
    """An engine clock that stands still until the test moves it."""

    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> float:
        return self.now


def chain(*ids: str) -> list[str]:
    return [flow(a, b) for a, b in zip(ids, ids[1:])]


def mi_lines(tmp_path: Path) -> Path:
    """A parallel multi-instance sub-process over ``items = [1, 2]``; in each line a sub-process
    ``review`` whose join meets the same conflict on ``x`` (1 against 2) and asks a person, and an
    interrupting boundary timer on ``review`` due after one hour for line 1, 100 hours for line 2."""
    review = "\n".join([
        '<bpmn:startEvent id="rs"/>', '<bpmn:parallelGateway id="fork"/>', script_task("m1", "x = 1"),
        script_task("m2", "x = 2"), '<bpmn:parallelGateway id="meet"/>', '<bpmn:endEvent id="re"/>',
        *chain("rs", "fork", "m1", "meet", "re"), *chain("fork", "m2", "meet")])
    line = "\n".join([
        '<bpmn:startEvent id="ls"/>', f'<bpmn:subProcess id="review">{review}</bpmn:subProcess>',
        '<bpmn:boundaryEvent id="deadline" attachedToRef="review"><bpmn:timerEventDefinition>'
        '<bpmn:timeDuration>"PT1H" if item == 1 else "PT100H"</bpmn:timeDuration>'
        '</bpmn:timerEventDefinition></bpmn:boundaryEvent>',
        script_task("lapsed", "late = item"), '<bpmn:endEvent id="le"/>', '<bpmn:endEvent id="le2"/>',
        *chain("ls", "review", "le"), *chain("deadline", "lapsed", "le2")])
    return write_elements(tmp_path, "mi_lines", [
        '<bpmn:startEvent id="start"/>', script_task("init", "items = [1, 2]\nx = 0"),
        '<bpmn:subProcess id="each"><bpmn:multiInstanceLoopCharacteristics isSequential="false">'
        '<bpmn:loopDataInputRef>items</bpmn:loopDataInputRef><bpmn:inputDataItem id="item"/>'
        f'</bpmn:multiInstanceLoopCharacteristics>{line}</bpmn:subProcess>',
        '<bpmn:endEvent id="end"/>', *chain("start", "init", "each", "end")])


def _by_line(items: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {item["context"]: item for item in items}


# ===================================================== (1) a cancelled line closes only its own conflict

def test_a_cancelled_line_closes_its_own_conflict_not_the_equal_one_another_line_still_asks(tmp_path: Path) -> None:
    clock = Clock()
    engine = Engine("memory://", clock=clock)
    waiting = engine.run(engine.start(load_process(mi_lines(tmp_path)), {}))
    asked = _by_line([w for w in waiting.waiting_for if w["kind"] == "confirmation"])
    assert len(asked) == 2
    first, second = sorted(asked, key=lambda name: asked[name]["id"])  # meet/x, meet/x#2: line 1, line 2
    conflicts = _by_line(waiting.to_document()["conflicts"])
    assert set(conflicts) == {first, second}
    assert conflicts[first]["values"] == conflicts[second]["values"] == {"m1": 1, "m2": 2}

    clock.now += 3601  # line 1's deadline: its review (and the question its join asked) is cancelled
    lapsed = engine.resume(waiting.id)
    doc = lapsed.to_document()
    assert doc["status"] == "waiting"
    assert [w["context"] for w in doc["waiting_for"] if w["kind"] == "confirmation"] == [second]
    questions = _by_line(doc["confirmations"])
    assert questions[first]["cancelled"] is True and "cancelled" not in questions[second]
    conflicts = _by_line(doc["conflicts"])
    assert conflicts[first]["cancelled"] is True and conflicts[first]["resolution"] is None
    assert "cancelled" not in conflicts[second] and conflicts[second]["resolution"] is None

    # line 2's person answers: its conflict is settled; line 1's stays listed, cancelled
    done = engine.resume(lapsed.id, answers={"confirmations": {asked[second]["id"]: 2}})
    clock.now += 100 * 3600  # line 2's deadline passes after its review ended: nothing to cancel
    done = engine.resume(done.id)
    doc = done.to_document()
    assert doc["status"] == "completed", doc["error"]
    conflicts = _by_line(doc["conflicts"])
    assert set(conflicts) == {first, second}, doc["conflicts"]
    assert conflicts[first]["cancelled"] is True and conflicts[first]["resolution"] is None
    assert "cancelled" not in conflicts[second]
    assert conflicts[second]["resolution"]["value"] == 2 and conflicts[second]["resolution"]["resolver"] == "human"


def test_a_retry_after_the_deadline_cancelled_the_question_asks_again(tmp_path: Path) -> None:
    """``review`` (its join asks about ``x``) has a one-hour boundary timer whose path loops back
    into it: the second pass asks its own question, the first stays listed as cancelled."""
    review = "\n".join([
        '<bpmn:startEvent id="rs"/>', '<bpmn:parallelGateway id="fork"/>', script_task("m1", "x = 1"),
        script_task("m2", "x = 2"), '<bpmn:parallelGateway id="meet"/>', '<bpmn:endEvent id="re"/>',
        *chain("rs", "fork", "m1", "meet", "re"), *chain("fork", "m2", "meet")])
    path = write_elements(tmp_path, "retry", [
        '<bpmn:startEvent id="start"/>', script_task("init", "x = 0\ntries = 0"), '<bpmn:exclusiveGateway id="again"/>',
        f'<bpmn:subProcess id="review">{review}</bpmn:subProcess>',
        '<bpmn:boundaryEvent id="deadline" attachedToRef="review"><bpmn:timerEventDefinition>'
        '<bpmn:timeDuration>"PT1H"</bpmn:timeDuration></bpmn:timerEventDefinition></bpmn:boundaryEvent>',
        script_task("bump", "tries = tries + 1"), '<bpmn:endEvent id="end"/>',
        *chain("start", "init", "again", "review", "end"), *chain("deadline", "bump", "again")])
    clock = Clock()
    engine = Engine("memory://", clock=clock)
    waiting = engine.run(engine.start(load_process(path), {}))
    assert [w["kind"] for w in waiting.waiting_for] == ["confirmation", "timer"]
    clock.now += 3601
    retried = engine.resume(waiting.id)
    assert retried.main.resolve("tries") == 1
    assert [(w["kind"], w.get("key")) for w in retried.waiting_for] == [("confirmation", "x"), ("timer", None)]
    doc = retried.to_document()
    assert [(c.get("cancelled", False), c["resolution"]) for c in doc["conflicts"]] == [(True, None), (False, None)]
    assert [(c["id"], c.get("cancelled", False)) for c in doc["confirmations"]] == [("meet/x", True), ("meet/x", False)]
    done = engine.resume(retried.id, answers={"confirmations": {"meet/x": 2}})
    doc = done.to_document()
    assert doc["status"] == "completed", doc["error"]
    assert [(c.get("cancelled", False), (c["resolution"] or {}).get("value")) for c in doc["conflicts"]] == [
        (True, None), (False, 2)]
    assert done.main.resolve("x") == 2


# ===================================================== (2) inspecting one context: its conflicts only

def test_inspecting_one_line_lists_that_lines_open_conflict_the_instance_view_both(tmp_path: Path) -> None:
    store = f"sqlite:///{tmp_path / 'lines.db'}"
    clock = Clock()
    engine = Engine(store, clock=clock)
    waiting = engine.run(engine.start(load_process(mi_lines(tmp_path)), {}))
    lines = sorted(c["context"] for c in waiting.to_document()["conflicts"])
    assert len(lines) == 2
    service = GovernanceService(engine)

    def contexts(conflicts: list[dict[str, Any]]) -> list[str]:
        return sorted(c["context"] for c in conflicts)

    # the Python API
    for line in lines:
        assert contexts(service.inspect(waiting.id, InspectArgs(context=line))["conflicts"]) == [line]
    assert contexts(service.inspect(waiting.id, InspectArgs(context="main"))["conflicts"]) == []
    assert contexts(service.inspect(waiting.id, InspectArgs())["conflicts"]) == lines
    # REST, over HTTP
    with ServerThread(create_app(store, tmp_path, TOKEN)) as server:
        def rest(**body: Any) -> dict[str, Any]:
            r = local_http.post(f"{server.url}/api/context-governance/inspect", json={"instance_id": waiting.id, **body},
                                headers={"Authorization": f"Bearer {TOKEN}"})
            assert r.status_code == 200, r.text
            return dict(r.json())
        one = rest(context=lines[1])
        assert contexts(one["conflicts"]) == contexts(one["merged_conflicts"]) == [lines[1]]
        whole = rest()
        assert contexts(whole["conflicts"]) == contexts(whole["merged_conflicts"]) == lines
    # the CLI: open_conflicts of the context; the run document's conflicts stay the instance's
    runner = CliRunner()

    def cli(*args: str) -> dict[str, Any]:
        result = runner.invoke(main, ["inspect", waiting.id, "--store", store, "--json", *args], catch_exceptions=False)
        assert result.exit_code == 0, result.output
        return dict(json.loads(result.stdout))
    one = cli("--context", lines[0])
    assert contexts(one["open_conflicts"]) == [lines[0]] and contexts(one["conflicts"]) == lines
    assert contexts(cli()["open_conflicts"]) == lines
    assert contexts(cli("--context", "main")["open_conflicts"]) == []
    # a conflict whose question was cancelled with its line is open no more
    clock.now += 3601
    lapsed = engine.resume(waiting.id)
    [cancelled] = [c["context"] for c in lapsed.to_document()["conflicts"] if c.get("cancelled")]
    assert service.inspect(waiting.id, InspectArgs(context=cancelled))["conflicts"] == []
    assert contexts(service.inspect(waiting.id, InspectArgs())["conflicts"]) == [l for l in lines if l != cancelled]
    assert summary_of(lapsed)["open_conflicts"] == 1  # the console's row counts the open one alone


# ===================================================== (3) /openapi.json declares each item's context

def test_openapi_declares_the_context_of_conflicts_confirmations_and_waiting_items(tmp_path: Path) -> None:
    store = f"sqlite:///{tmp_path / 'lines.db'}"
    engine = Engine(store, clock=Clock())
    waiting = engine.run(engine.start(load_process(mi_lines(tmp_path)), {}))
    with ServerThread(create_app(store, tmp_path, TOKEN)) as server:
        schemas = local_http.get(f"{server.url}/openapi.json").json()["components"]["schemas"]
        doc = local_http.get(f"{server.url}/api/instances/{waiting.id}",
                             headers={"Authorization": f"Bearer {TOKEN}"}).json()
    for model, items in (("Conflict", doc["conflicts"]), ("Confirmation", doc["confirmations"]),
                         ("WaitingItem", doc["waiting_for"])):
        declared = schemas[model]["properties"]["context"]
        assert {"type": "string"} in declared["anyOf"] and declared["description"], (model, declared)
        assert "context" not in schemas[model].get("required", [])
        # what the server answers carries what the document declares
        assert all(isinstance(item["context"], str) for item in items if item.get("kind") != "user_task"), items


# ===================================================== (4) each line's timer names its line

def test_each_lines_timer_names_the_line_it_waits_in(tmp_path: Path) -> None:
    clock = Clock()
    engine = Engine("memory://", clock=clock)
    waiting = engine.run(engine.start(load_process(mi_lines(tmp_path)), {}))
    timers = [w for w in waiting.waiting_for if w["kind"] == "timer"]
    asked = {w["context"]: w["id"] for w in waiting.waiting_for if w["kind"] == "confirmation"}
    assert [t["task_id"] for t in timers] == ["deadline", "deadline"]  # the BPMN id, as DESIGN has it
    # the one due in an hour is line 1's, the one whose question is meet/x
    assert [asked[t["context"]] for t in timers] == ["meet/x", "meet/x#2"], timers
    assert {t["context"] for t in timers} == set(asked)
    clock.now += 3601
    lapsed = engine.resume(waiting.id)
    [left] = [w for w in lapsed.waiting_for if w["kind"] == "timer"]
    assert (left["id"], left["context"]) == (timers[1]["id"], timers[1]["context"])
    # a timer in the process's own flow waits in main
    path = write_elements(tmp_path, "plain_timer", [
        '<bpmn:startEvent id="s"/>', '<bpmn:intermediateCatchEvent id="wait"><bpmn:timerEventDefinition>'
        '<bpmn:timeDuration>"PT1H"</bpmn:timeDuration></bpmn:timerEventDefinition></bpmn:intermediateCatchEvent>',
        '<bpmn:endEvent id="e"/>', *chain("s", "wait", "e")])
    [item] = engine.run(engine.start(load_process(path), {})).waiting_for
    assert (item["kind"], item["task_id"], item["context"]) == ("timer", "wait", "main")


# ===================================================== (5) a bare key named like a keyword: the rewrite

@pytest.mark.parametrize(("condition", "rewritten"), [
    ("class == 'gold'", "globals()['class'] == 'gold'"),
    ("amount > 10 and from != 'bank'", "amount > 10 and globals()['from'] != 'bank'"),
    ("class == 'gold' and from.name == 'Peggy'", "globals()['class'] == 'gold' and globals()['from']['name'] == 'Peggy'"),
])
def test_a_condition_reading_a_bare_keyword_key_gets_the_rewrite_and_the_rewrite_runs(
        tmp_path: Path, condition: str, rewritten: str) -> None:
    [said] = [str(p) for p in validate_process([condition_process(tmp_path, condition.replace("'", "&apos;"))]).problems]
    assert f"write {rewritten!r}" in said and "Python keyword" in said, said
    assert "a key named 'class'" in said or "a key named 'from'" in said
    assert "fix the condition" not in said
    fixed = condition_process(tmp_path, rewritten.replace("'", "&apos;"))
    assert list(validate_process([fixed]).problems) == []
    engine = Engine(store="memory://")
    data = {"class": "gold", "from": {"name": "Peggy"}, "amount": 20}
    instance = engine.run(engine.start(load_process([fixed]), data))
    assert (instance.status, variables(instance.context)["went"]) == ("completed", "a")


def test_a_keyword_an_expression_uses_as_python_is_no_key() -> None:
    from engine.validate import _keyword_names_instead

    # not, in, is, if/else, for, lambda are Python's own in an expression: nothing to rewrite there
    for text in ("x if not y else z", "a in [i for i in b]", "(lambda v: v)(1) is None"):
        assert _keyword_names_instead(text) is None, text


# ===================================================== (6) an optional field left out is not written; null is

def test_an_optional_field_left_out_stays_unwritten_and_a_null_given_is_written() -> None:
    form = Path(__file__).resolve().parent / "fixtures" / "forms" / "camunda_approval.bpmn"
    engine = Engine("memory://")
    for answer, comment in (({"amount": 250}, "absent"), ({"amount": 250, "comment": None}, None)):
        waiting = engine.run(engine.start(load_process(form)))
        done = engine.complete_user_task(waiting, "approve_invoice", answer)
        assert done.status == "completed", done.to_document()["error"]
        assert done.main.get("comment", "absent") == comment
        assert (done.main.resolve("amount"), done.main.resolve("approved")) == (250, False)  # given; its default
