"""Follow-ups of round 16.

(1) ``layerflow validate`` warns (``join_reentered_in_loop``) of a parallel join inside a loop whose flow
    back re-enters the section between a parallel split and that join (a second split feeding the
    branches again, or a flow into one branch): the join cannot pair its tokens with one split, and the
    run stops there after running the steps of the wrong pass. A loop around the whole split/join pair,
    and a loop inside one branch, are fine and get no warning.
(2) A model that cannot be reached (a refused connection, a timeout) is asked for the first conflict of a join
    only: the join's other conflicts go on to a person at once, with a ``skipped`` step naming the failure,
    and ``model_fallbacks`` lists each; a malformed answer keeps its retry per key.
(3) The config-change notice on ``resume`` names a changed ``system:`` (frozen at start: the instance keeps its
    own values) and ``process:`` section too.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from engine import Engine, load_process
from engine.validate import validate_process

from engine_helpers import ROOT, flow, write_elements
from engine_helpers import script_task as script


def _reentered(tmp_path: Path, shape: str) -> Path:
    """A parallel section split -> (manual | backbone) -> join -> plan -> gate, and a way back."""
    head = [
        '<bpmn:startEvent id="start"/>', script("init", "runs = 0"), '<bpmn:exclusiveGateway id="round"/>',
        '<bpmn:parallelGateway id="split"/>',
        script("backbone", "b = 1"), '<bpmn:exclusiveGateway id="merge_manual" default="merge_manual_to_join"/>',
        '<bpmn:exclusiveGateway id="merge_backbone" default="merge_backbone_to_join"/>',
        '<bpmn:parallelGateway id="join"/>', script("plan", "runs = runs + 1"),
        '<bpmn:exclusiveGateway id="gate" default="gate_to_end"/>', '<bpmn:endEvent id="end"/>',
        flow("start", "init"), flow("init", "round"), flow("round", "split"), flow("split", "merge_manual"), flow("split", "backbone"),
        flow("backbone", "merge_backbone"), flow("merge_manual", "join"), flow("merge_backbone", "join"),
        flow("join", "plan"), flow("plan", "gate"), flow("gate", "end"),
    ]
    back = {
        # SpiffWorkflow's parallel_join_in_loop: a second split feeds both branches again
        "second split": ['<bpmn:parallelGateway id="again"/>', '<bpmn:userTask id="assess"/>',
                         flow("gate", "again", "runs < 3"), flow("again", "assess"), flow("again", "merge_backbone"),
                         flow("assess", "merge_manual")],
        # the loop goes back into one branch only: the join waits for the other for ever
        "one branch": [flow("gate", "merge_backbone", "runs < 3")],
        # fine: round the whole split/join pair
        "whole pair": [flow("gate", "round", "runs < 3")],
    }[shape]
    return write_elements(tmp_path, "rounds", [*head, *back]).resolve()


@pytest.mark.parametrize(("shape", "flow_id"), [("second split", "again_to_merge_backbone"),
                                                ("one branch", "gate_to_merge_backbone")])
def test_a_loop_back_into_a_parallel_section_is_a_validate_warning(tmp_path: Path, shape: str, flow_id: str) -> None:
    path = _reentered(tmp_path, shape)
    report = validate_process([path])
    found = [p for p in report.problems if p.code == "join_reentered_in_loop"]

    assert report.ok
    assert [(p.severity, p.file, p.element_id) for p in found] == [("warning", str(path), "join")], report.problems
    message = found[0].message
    assert repr(flow_id) in message and "'split'" in message, message
    assert "move the flow back" in message, message


def test_a_loop_round_the_whole_parallel_section_is_no_warning_and_runs(tmp_path: Path) -> None:
    path = _reentered(tmp_path, "whole pair")
    assert [p for p in validate_process([path]).problems if p.code == "join_reentered_in_loop"] == []
    engine = Engine()
    instance = engine.run(engine.start(load_process(path)))
    assert instance.status == "completed", instance.error


def test_the_shipped_examples_get_no_reentered_join_warning() -> None:
    for path in sorted((ROOT / "bpmn_examples").rglob("*.bpmn")):
        found = [p for p in validate_process([path]).problems if p.code == "join_reentered_in_loop"]
        assert found == [], (path, found)


# ----- (2) a model that cannot be reached is asked once per join ------------------------------------------

def _three_conflicts() -> list[Any]:
    from gateways import MergedConflict

    return [MergedConflict(key, None, {"finance": f"{key}-f", "risk": f"{key}-r"}, ("finance", "risk"))
            for key in ("decision", "risk_level", "note")]


def _resolve(arbiter: Any, **kwargs: Any) -> Any:
    from context_layers.config import config_from_dict
    from gateways import resolve_conflicts

    return resolve_conflicts(_three_conflicts(), config=config_from_dict({"gatewayId": "merge"}), variables={},
                             gateway_id="merge", arbiter=arbiter, **kwargs)


class _DownCompletion:
    """litellm's ``completion`` against a model server that refuses every connection."""

    def __init__(self, error: Exception) -> None:
        self.error = error
        self.calls = 0

    def __call__(self, **_: Any) -> Any:
        self.calls += 1
        raise self.error


@pytest.mark.parametrize("error", [ConnectionRefusedError(111, "Connection refused"), TimeoutError("timed out")],
                         ids=["refused", "timeout"])
def test_an_unreachable_model_is_not_asked_again_for_the_other_conflicts_of_the_join(error: Exception) -> None:
    from engine.llm import LiteLLMArbiter, RetryPolicy

    down = _DownCompletion(error)
    arbiter = LiteLLMArbiter("openai/fake", api_base="http://127.0.0.1:9", max_retries=2, completion=down,
                             retry=RetryPolicy(base=0, cap=0), sleep=lambda _: None)
    out = _resolve(arbiter, human_available=True)

    assert down.calls == 3  # one key's attempts (1 + 2 retries), not 3 keys x 3
    assert [r.key for r in out.pending] == ["decision", "risk_level", "note"]  # all go on to a person
    model_steps = [(s.key, s.outcome) for s in out.steps if s.resolver == "model"]
    assert model_steps == [("decision", "failed"), ("risk_level", "skipped"), ("note", "skipped")], out.steps
    for step in out.steps[1:]:
        if step.resolver == "model":
            assert "'decision'" in step.detail and "could not be reached" in step.detail, step.detail
            assert type(error).__name__ in step.detail, step.detail


def test_a_malformed_answer_keeps_its_retry_for_each_key() -> None:
    from gateways import ArbitrationAnswer, parse_arbiter_answer

    calls: list[str] = []

    class Malformed:
        def arbitrate(self, request: Any) -> ArbitrationAnswer:
            calls.append(request.key)
            return parse_arbiter_answer("not json")

    out = _resolve(Malformed(), human_available=True)
    assert calls == ["decision", "decision", "risk_level", "risk_level", "note", "note"]
    assert len(out.pending) == 3


def test_a_join_run_against_a_down_model_asks_it_once_and_lists_every_key_it_went_without(
        monkeypatch: pytest.MonkeyPatch) -> None:
    import types

    import engine.llm
    from test_model_paths_16 import SUPPLIER, SUPPLIER_DATA

    down = _DownCompletion(ConnectionRefusedError(111, "Connection refused"))
    monkeypatch.setattr(engine.llm, "load_litellm", lambda: types.SimpleNamespace(completion=down))
    monkeypatch.setenv("LAYERFLOW_RETRY_BASE_DELAY", "0")
    instance = Engine("memory://", model="fake/model").run_process(load_process(SUPPLIER), SUPPLIER_DATA)

    assert instance.status == "waiting", instance.error
    assert sorted(c["id"] for c in instance.confirmations) == ["onboarding_join/contact_email",
                                                               "onboarding_join/supplier_tier"]
    assert down.calls == 3, down.calls  # the first key's attempts only (llm.maxRetries 2)
    fallbacks = instance.model_fallbacks()
    assert sorted(f["key"] for f in fallbacks) == ["contact_email", "supplier_tier"], fallbacks
    assert all("Connection refused" in f["error"] for f in fallbacks), fallbacks


# ----- (3) the config-change notice on resume covers process: and system: -----------------------------------

def _waiting_with_config(tmp_path: Path) -> tuple[Engine, str, Path]:
    path = write_elements(tmp_path, "desk", ['<bpmn:startEvent id="start"/>', '<bpmn:userTask id="review"/>',
                                             '<bpmn:endEvent id="end"/>', flow("start", "review"),
                                             flow("review", "end")])
    config = tmp_path / "desk.layerflow.yaml"
    config.write_text("system:\n  policy: two reviews\nprocess:\n  redact: true\n", encoding="utf-8")
    engine = Engine(f"sqlite:///{tmp_path / 'runs.db'}")
    instance = engine.run(load_process(path), {})
    assert instance.status == "waiting", instance.error
    return engine, instance.id, config


def _desk_notices(instance: Any) -> list[str]:
    return [n for n in instance.notices if "desk.layerflow.yaml" in n]


def test_a_changed_system_or_process_section_is_named_on_resume_and_not_applied(tmp_path: Path) -> None:
    engine, iid, config = _waiting_with_config(tmp_path)
    assert _desk_notices(engine.resume(iid)) == []  # the file as the instance started with it
    config.write_text("system:\n  policy: one review\n  region: EU\nprocess:\n  redact: [iban]\n", encoding="utf-8")
    instance = engine.resume(iid)

    notices = _desk_notices(instance)
    [system] = [n for n in notices if "system:" in n]
    assert "policy 'two reviews' -> 'one review'" in system and "region (unset) -> 'EU'" in system, system
    assert "SYSTEM" in system and "keeps its own values" in system, system
    [process] = [n for n in notices if "process:" in n]
    assert "redact True -> ['iban']" in process and "keeps" in process, process
    assert instance.main.resolve("policy") == "two reviews"  # SYSTEM frozen at start
    assert engine.load(iid).process.redact is True
