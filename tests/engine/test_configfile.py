"""load_config_file / find_config_beside: the config file beside a process."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import yaml

from context_layers.errors import ConfigError
from context_layers.layers import Layer
from engine.configfile import ProcessConfigFile, find_config_beside, load_config_file

FIXTURES = Path(__file__).parent / "fixtures" / "validate"


def test_loads_the_fixture_config() -> None:
    cfg = load_config_file(FIXTURES / "valid.layerflow.yaml")
    assert cfg.ok and cfg.problems == ()
    assert cfg.path == FIXTURES / "valid.layerflow.yaml"
    assert cfg.system == {"policy": "Loans over 100,000 need two reviews.", "model_limits": {"max_tokens": 4000}}
    assert cfg.data_layers == {"draft_notes": Layer.WORKING}
    assert cfg.process_id == "loan_approval"
    assert cfg.element_ids == ("risk_assessment", "route")
    assert cfg.elements["risk_assessment"].effective_preserve_keys == ["assessment_id"]
    assert cfg.elements["route"].branch("fast_track").context_inject == {"track_type": "fast", "requires_approval": False}
    lines = (FIXTURES / "valid.layerflow.yaml").read_text().splitlines()
    assert cfg.line_of("route") == lines.index("route:") + 1
    assert cfg.line_of("route", "branches", 1, "id") == lines.index("    - id: full_review") + 1
    assert cfg.line_of("route", "branches", 1, "no_such_key") == lines.index("    - id: full_review") + 1
    cfg.raise_for_problems()


def test_json_config_has_the_same_shape_and_lines(tmp_path: Path) -> None:
    data = yaml.safe_load((FIXTURES / "valid.layerflow.yaml").read_text())
    path = tmp_path / "loan.layerflow.json"
    path.write_text(json.dumps(data, indent=2))
    cfg = load_config_file(path)
    assert cfg.ok
    assert cfg.system == load_config_file(FIXTURES / "valid.layerflow.yaml").system
    assert cfg.elements.keys() == {"risk_assessment", "route"}
    assert cfg.line_of("route") == next(i for i, line in enumerate(path.read_text().splitlines(), 1) if '"route"' in line)


def test_result_is_immutable() -> None:
    cfg = load_config_file(FIXTURES / "valid.layerflow.yaml")
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.system = {}  # type: ignore[misc]
    with pytest.raises(TypeError):
        cfg.system["policy"] = "x"  # type: ignore[index]


@pytest.mark.parametrize(
    ("name", "text", "code", "line", "element_id", "field", "says"),
    [
        ("yaml_syntax", "route:\n  branches: [a\n", "config_syntax", 3, None, None, "invalid YAML"),
        ("json_syntax", '{"route": {"branches": [}}', "config_syntax", 1, None, None, "invalid JSON: Expecting value"),
        ("not_a_mapping", "- route\n- merge\n", "config_not_mapping", 1, None, None, "got a list"),
        ("duplicate_element", "route: {}\nmerge: {}\nroute:\n  preserveKeys: [a]\n", "config_duplicate_key", 3,
         "route", None, "element 'route' appears twice (first on line 1)"),
        ("duplicate_field", "route:\n  preserveKeys: [a]\n  preserveKeys: [b]\n", "config_duplicate_key", 3,
         "route", "preserveKeys", "key 'preserveKeys' appears twice"),
        ("system_not_mapping", "system: be careful\n", "config_invalid_system", 1, None, "system", "must be a mapping"),
        ("system_date", "system:\n  cutoff: 2024-01-31\n", "config_invalid_system", 2, None, "system.cutoff",
         "not JSON-compatible (date"),
        ("unknown_layer", "data_layers:\n  notes: L9\n", "config_invalid_data_layers", 2, None, "data_layers.notes",
         "unknown layer 'L9'"),
        ("data_to_system", "data_layers:\n  notes: SYSTEM\n", "config_invalid_data_layers", 2, None,
         "data_layers.notes", "put fixed values under system:"),
        ("unknown_process_option", "process:\n  process_id: p\n  engine: fast\n", "config_invalid_process", 3, None,
         "process.engine", "known options: process_id"),
        ("process_id_not_string", "process:\n  process_id: [a]\n", "config_invalid_process", 2, None,
         "process.process_id", "must be the id of a bpmn:process"),
        ("boolean_element_id", "yes:\n  preserveKeys: [a]\n", "config_element_id", 1, None, None, "quote the id"),
        ("unknown_field", "route:\n  mergeStrategy: LAST_WRITER_WINS\n  mergeStrategi: x\n", "invalid_config_field",
         3, "route", "mergeStrategi", "unknown field; did you mean 'mergeStrategy'?"),
        ("unknown_field_nothing_close", "route:\n  colour: red\n", "invalid_config_field", 2, "route", "colour",
         "unknown field; check the spelling"),
        ("misplaced_field", "review:\n  contextInject: {kind: finance}\n", "invalid_config_field", 2, "review",
         "contextInject", "'contextInject' is a field of one branch of a split gateway: put it under the "
         "gateway's branches"),
        ("misplaced_nested_field", "review:\n  llm:\n    ragCollections: [rules]\n", "invalid_config_field", 3,
         "review", "llm.ragCollections", "'ragCollections' is a field of knowledgeConfig"),
        ("misspelt_nested_field", "route:\n  branches:\n    - id: a\n      reasonkey: why\n", "invalid_config_field",
         4, "route", "branches.0.reasonkey", "did you mean 'reasonKey'?"),
        ("nested_field", "route:\n  branches:\n    - id: a\n      contextInject: 3\n", "invalid_config_field", 4,
         "route", "branches.0.contextInject", "valid dictionary"),
        ("model_rule", "join:\n  mergeStrategy: BRANCH_PRIORITY\n", "invalid_config_field", 1, "join", "(config)",
         "needs branchPriority"),
        ("element_not_mapping", "route: [a, b]\n", "invalid_config_field", 1, "route", "(config)", "must be an object"),
    ],
    ids=lambda v: v if isinstance(v, str) and "\n" not in v and " " not in v else None,
)
def test_every_problem_names_file_line_element_and_field(
    tmp_path: Path, name: str, text: str, code: str, line: int, element_id: str | None, field: str | None, says: str
) -> None:
    path = tmp_path / ("p.layerflow.json" if name.startswith("json") else "p.layerflow.yaml")
    path.write_text(text)
    cfg = load_config_file(path)
    assert [p.code for p in cfg.problems] == [code], [str(p) for p in cfg.problems]
    (problem,) = cfg.problems
    assert (problem.file, problem.line, problem.element_id, problem.field) == (str(path), line, element_id, field)
    assert says in problem.message
    assert str(problem).startswith(f"{path}:{line}")
    assert not cfg.ok
    with pytest.raises(ConfigError) as caught:
        cfg.raise_for_problems()
    assert caught.value.problems[0]["code"] == code and caught.value.problems[0]["id"] == element_id


def test_valid_parts_survive_a_bad_neighbour(tmp_path: Path) -> None:
    path = tmp_path / "p.layerflow.yaml"
    path.write_text("system: {policy: p}\nroute:\n  bogus: 1\nmerge:\n  mergeStrategy: LAST_WRITER_WINS\n")
    cfg = load_config_file(path)
    assert [p.element_id for p in cfg.problems] == ["route"]
    assert cfg.system == {"policy": "p"}
    assert set(cfg.elements) == {"merge"}
    assert cfg.element_ids == ("route", "merge")


@pytest.mark.parametrize("text", ["", "# only a comment\n", "{}\n"])
def test_an_empty_file_is_an_empty_config(tmp_path: Path, text: str) -> None:
    path = tmp_path / "p.layerflow.yaml"
    path.write_text(text)
    cfg = load_config_file(path)
    assert cfg.ok and not cfg.elements and not cfg.system and cfg.process_id is None


def test_an_element_with_nothing_under_it_gets_the_default_config(tmp_path: Path) -> None:
    path = tmp_path / "p.layerflow.yaml"
    path.write_text("review:\n")
    cfg = load_config_file(path)
    assert cfg.ok and cfg.elements["review"].merge_strategy == "MERGE_WITH_CONFLICT_DETECT"


@pytest.mark.parametrize(
    ("name", "code"),
    [("missing.layerflow.yaml", "config_file_not_found"), ("p.layerflow.toml", "config_file_type")],
)
def test_unreadable_files_are_problems(tmp_path: Path, name: str, code: str) -> None:
    if name.endswith(".toml"):
        (tmp_path / name).write_text("x = 1")
    cfg = load_config_file(tmp_path / name)
    assert isinstance(cfg, ProcessConfigFile)
    assert [p.code for p in cfg.problems] == [code]
    assert cfg.problems[0].file == str(tmp_path / name)


def test_find_config_beside(tmp_path: Path) -> None:
    bpmn = tmp_path / "loan.bpmn"
    bpmn.write_text("<x/>")
    assert find_config_beside(bpmn) is None
    (tmp_path / "loan.layerflow.json").write_text("{}")
    assert find_config_beside(bpmn) == tmp_path / "loan.layerflow.json"
    (tmp_path / "loan.layerflow.yml").write_text("")
    assert find_config_beside(bpmn) == tmp_path / "loan.layerflow.yml"
    (tmp_path / "loan.layerflow.yaml").write_text("")
    assert find_config_beside(str(bpmn)) == tmp_path / "loan.layerflow.yaml"
    (tmp_path / "other.layerflow.yaml").write_text("")
    assert find_config_beside(tmp_path / "other.bpmn") == tmp_path / "other.layerflow.yaml"


def test_start_data_mapped_to_ephemeral_is_warned_about(tmp_path: Path) -> None:
    """EPHEMERAL is cleared at the end of every activity: start data there reaches the first
    activity only. Allowed (a one-shot token), but said, naming the key and what to write."""
    path = tmp_path / "p.layerflow.yaml"
    path.write_text("data_layers:\n  otp: EPHEMERAL\n  notes: WORKING\n")
    cfg = load_config_file(path)
    assert cfg.ok and cfg.data_layers == {"otp": Layer.EPHEMERAL, "notes": Layer.WORKING}
    [p] = cfg.problems
    assert (p.code, p.severity, p.line, p.field) == ("config_ephemeral_data", "warning", 2, "data_layers.otp")
    assert "only the first activity sees it" in p.message and "WORKING" in p.message
