"""A join's per-key ``humanConfirm.defaults: {KEY: VALUE}``: for a conflict on KEY its value is the
default offered and taken on timeout, over the join's one ``default`` (which stays as it was for the
keys not listed); type fit (``gateways.policy.default_fits``) applies to each."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from context_layers.config import config_from_dict
from context_layers.errors import ConfigError
from engine import Engine, load_process
from engine.validate import validate_process
from gateways.conflicts import MergedConflict
from gateways.policy import ESCALATE, build_human_request

from engine_helpers import cli_in_a_tmp_store, flow, run_json, write_elements
from test_known_gaps_13 import Clock, _confirmation

cli = cli_in_a_tmp_store

# finance and risk disagree on two texts (go_decision, risk_level) and a number (score)
GO = [
    '<bpmn:startEvent id="start"/>',
    '<bpmn:parallelGateway id="fork"/>',
    '<bpmn:scriptTask id="finance"><bpmn:script>go_decision = "go"\nrisk_level = "low"\nscore = 3'
    '</bpmn:script></bpmn:scriptTask>',
    '<bpmn:scriptTask id="risk"><bpmn:script>go_decision = "hold"\nrisk_level = "high"\nscore = 7'
    '</bpmn:script></bpmn:scriptTask>',
    '<bpmn:parallelGateway id="merge"/>',
    '<bpmn:endEvent id="end"/>',
    flow("start", "fork"), flow("fork", "finance"), flow("fork", "risk"), flow("finance", "merge"),
    flow("risk", "merge"), flow("merge", "end"),
]


def _go(tmp_path: Path, config: str) -> Path:
    path = write_elements(tmp_path, "go", GO)
    (tmp_path / "go.layerflow.yaml").write_text(config, encoding="utf-8")
    return path


def _values(confirmation: dict[str, Any]) -> list[Any]:
    return [o["value"] for o in confirmation["options"]]


# ----- the engine: offered per key, taken per key on timeout -------------------------------------------------

def test_a_per_key_default_is_offered_and_taken_for_its_key_only(tmp_path: Path) -> None:
    clock = Clock()
    engine = Engine("memory://", clock=clock)
    config = ("merge:\n  humanConfirm:\n    timeout: 60\n    default: needs_review\n"
              "    defaults: {go_decision: no_go, score: 5}\n")
    instance = engine.run(load_process(_go(tmp_path, config)), {})
    go, risk, score = (_confirmation(instance, f"merge/{k}") for k in ("go_decision", "risk_level", "score"))
    assert go["default"] == "no_go" and "no_go" in _values(go) and "needs_review" not in _values(go)
    assert risk["default"] == "needs_review" and "no_go" not in _values(risk)       # the join's default stays
    assert score["default"] == 5 and 5 in _values(score) and score["on_timeout"] == "default"
    clock.now += 61
    instance = engine.resume(instance.id)
    assert instance.status == "completed", instance.error
    assert instance.main.resolve("go_decision") == "no_go"
    assert instance.main.resolve("risk_level") == "needs_review"
    assert instance.main.resolve("score") == 5


def test_a_per_key_default_that_does_not_fit_falls_back_as_with_no_default(tmp_path: Path) -> None:
    clock = Clock()
    engine = Engine("memory://", clock=clock)
    # a text for a score fits nowhere: not offered, and the join's default (a text) does not fit either
    config = "merge:\n  humanConfirm: {timeout: 60, default: needs_review, defaults: {score: high, go_decision: $escalate}}\n"
    instance = engine.run(load_process(_go(tmp_path, config)), {})
    score, go = _confirmation(instance, "merge/score"), _confirmation(instance, "merge/go_decision")
    assert score["default"] is None and score["on_timeout"] == "escalate" and "high" not in _values(score)
    assert go["default"] == ESCALATE and "needs_review" not in _values(go)
    clock.now += 61
    instance = engine.resume(instance.id)
    assert _confirmation(instance, "merge/score")["escalated"] is True
    go = _confirmation(instance, "merge/go_decision")
    assert go["answer"] == ESCALATE and go["answered_by_timeout"] is True    # as `default: $escalate` would
    assert _confirmation(instance, "merge/risk_level")["answer"] == "needs_review"
    assert instance.status == "waiting"


def test_run_json_shows_the_default_offered_per_conflict(cli: Any, tmp_path: Path) -> None:
    config = "merge:\n  humanConfirm: {default: needs_review, defaults: {go_decision: no_go}}\n"
    doc = run_json(cli, "run", str(_go(tmp_path, config)), code=3)
    assert [w["id"] for w in doc["waiting_for"]] == ["merge/go_decision", "merge/risk_level", "merge/score"]
    by_id = {c["id"]: c for c in doc["confirmations"]}
    assert by_id["merge/go_decision"]["default"] == "no_go"
    assert by_id["merge/risk_level"]["default"] == "needs_review"
    assert by_id["merge/score"]["default"] is None


def test_rest_shows_the_default_offered_per_conflict(tmp_path: Path) -> None:
    from fastapi.testclient import TestClient

    from engine.api import create_app

    catalog = tmp_path / "catalog"
    catalog.mkdir()
    _go(catalog, "merge:\n  humanConfirm: {default: needs_review, defaults: {go_decision: no_go}}\n")
    auth = {"Authorization": "Bearer defaults"}
    client = TestClient(create_app("memory://", catalog, token="defaults"))
    started = client.post("/api/instances", json={"process_id": "go"}, headers=auth)
    assert started.status_code == 201, started.text
    iid = started.json()["instance_id"]
    shown = client.get(f"/api/instances/{iid}", headers=auth).json()
    by_id = {c["id"]: c for c in shown["confirmations"]}
    assert by_id["merge/go_decision"]["default"] == "no_go"
    assert by_id["merge/risk_level"]["default"] == "needs_review"


# ----- gateways: build_human_request ---------------------------------------------------------------------------

def _conflict(key: str, a: Any, b: Any) -> MergedConflict:
    return MergedConflict(key=key, base_value="", conflicting_values={"finance": a, "risk": b},
                          source_branches=["finance", "risk"])


@pytest.mark.parametrize(("key", "a", "b", "default"), [
    ("go_decision", "go", "hold", "no_go"),         # listed: its own default
    ("risk_level", "low", "high", "needs_review"),   # not listed: the join's default
    ("score", 3, 7, None),                           # the join's default does not fit a number
    ("amount", 1, 2, 0),                             # listed, a number
])
def test_build_human_request_takes_the_keys_default_over_the_joins(key: str, a: Any, b: Any, default: Any) -> None:
    config = config_from_dict({"humanConfirm": {"default": "needs_review", "defaults": {"go_decision": "no_go",
                                                                                         "amount": 0}}})
    request = build_human_request(_conflict(key, a, b), gateway_id="merge", config=config)
    assert request.default == default
    values = [o["value"] for o in request.options]
    assert (default in values) == (default is not None)
    if key == "go_decision":
        assert "needs_review" not in values     # the join's default is not this key's
    if key == "risk_level":
        assert "no_go" not in values            # go_decision's default is not offered for another key


def test_without_defaults_the_request_is_as_before() -> None:
    plain = config_from_dict({"humanConfirm": {"default": "needs_review"}})
    empty = config_from_dict({"humanConfirm": {"default": "needs_review", "defaults": {}}})
    conflict = _conflict("risk_level", "low", "high")
    assert (build_human_request(conflict, gateway_id="merge", config=plain).to_dict()
            == build_human_request(conflict, gateway_id="merge", config=empty).to_dict())
    assert plain.dump() == empty.dump() == {"humanConfirm": {"default": "needs_review"}}


# ----- config errors -------------------------------------------------------------------------------------------

@pytest.mark.parametrize(("defaults", "says"), [
    (["no_go"], "must be a mapping of context key to its default"),
    ("no_go", "must be a mapping of context key to its default"),
    ({"go_decision": None}, "'go_decision'"),
    ({"": "no_go"}, "empty key"),
])
def test_bad_defaults_are_config_errors_naming_file_element_and_field(defaults: Any, says: str) -> None:
    with pytest.raises(ConfigError) as caught:
        config_from_dict({"humanConfirm": {"defaults": defaults}}, source="go.layerflow.yaml", element_id="merge")
    [problem] = caught.value.problems
    assert problem["file"] == "go.layerflow.yaml" and problem["id"] == "merge"
    assert problem["field"] == "humanConfirm.defaults"
    assert says in problem["message"] and "humanConfirm.default" in problem["message"]


def test_a_bad_defaults_in_a_file_fails_the_load_naming_the_file(tmp_path: Path) -> None:
    path = _go(tmp_path, "merge:\n  humanConfirm: {defaults: [no_go]}\n")
    with pytest.raises(ConfigError) as caught:
        load_process(path)
    text = str(caught.value)
    assert "go.layerflow.yaml" in text and "merge" in text and "humanConfirm.defaults" in text


# ----- validate ------------------------------------------------------------------------------------------------

def test_a_per_key_default_of_another_type_than_its_keys_values_is_a_validate_warning(tmp_path: Path) -> None:
    path = _go(tmp_path, "merge:\n  humanConfirm: {defaults: {score: high, go_decision: no_go}}\n"
                         "  conflictPolicy:\n    rankings: {score: [7, 3], go_decision: [hold, go]}\n")
    report = validate_process(path)
    [problem] = [p for p in report.problems if p.code == "human_confirm_default_unfit"]
    assert problem.severity == "warning" and problem.element_id == "merge"
    assert problem.field == "humanConfirm.defaults.score" and "'high'" in problem.message
    fits = _go(tmp_path, "merge:\n  humanConfirm: {defaults: {score: 5, go_decision: $escalate}}\n"
                         "  conflictPolicy:\n    rankings: {score: [7, 3]}\n")
    assert not [p for p in validate_process(fits).problems if p.code == "human_confirm_default_unfit"]


def test_the_joins_default_is_judged_by_the_keys_it_serves(tmp_path: Path) -> None:
    """The ranking of a key with its own default says nothing of the join's one default."""
    own = _go(tmp_path, "merge:\n  humanConfirm: {default: needs_review, defaults: {score: 5}}\n"
                        "  conflictPolicy:\n    rankings: {score: [7, 3]}\n")
    assert not [p for p in validate_process(own).problems if p.code == "human_confirm_default_unfit"]
    other = _go(tmp_path, "merge:\n  humanConfirm: {default: needs_review, defaults: {go_decision: no_go}}\n"
                          "  conflictPolicy:\n    rankings: {score: [7, 3]}\n")
    [problem] = [p for p in validate_process(other).problems if p.code == "human_confirm_default_unfit"]
    assert problem.field == "humanConfirm.default" and "'needs_review'" in problem.message
