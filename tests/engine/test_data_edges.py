"""Data at the edges of the ``run --json`` contract: keys the engine uses itself, odd keys, odd values."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from engine.cli import main

from engine_helpers import flow, write_elements

PARALLEL = [
    '<bpmn:startEvent id="start"/>',
    '<bpmn:parallelGateway id="split"/>',
    '<bpmn:userTask id="a"/>',
    '<bpmn:userTask id="b"/>',
    '<bpmn:parallelGateway id="join"/>',
    '<bpmn:endEvent id="end"/>',
    flow("start", "split"), flow("split", "a"), flow("split", "b"), flow("a", "join"), flow("b", "join"),
    flow("join", "end"),
]


def _run(tmp_path: Path, *args: str) -> tuple[int, dict]:
    result = CliRunner().invoke(main, [*args, "--store", f"sqlite:///{tmp_path / 'edges.db'}", "--json"],
                                catch_exceptions=False)
    return result.exit_code, json.loads(result.stdout)


@pytest.mark.parametrize("key", ["_branch_id", "_snapshot_id"])
def test_initial_data_holding_an_engine_marker_still_splits_in_parallel(tmp_path: Path, key: str) -> None:
    """A process's own data that happens to use a marker's name stays in PROCESS, as at an XOR
    split; the parallel split does not fail blaming a contextInject nobody wrote."""
    path = write_elements(tmp_path, "par", PARALLEL)
    answers = tmp_path / "answers.json"
    answers.write_text(json.dumps({"user_tasks": {"a": {"x": 1}, "b": {"y": 2}}}), encoding="utf-8")
    code, doc = _run(tmp_path, "run", str(path), "--data", json.dumps({key: "mine"}), "--answers", str(answers))
    assert doc["error"] is None, doc["error"]
    assert code == 0 and doc["status"] == "completed"
    assert doc["layers"]["L1"] == {key: "mine"}
    assert doc["layers"]["L3"]["x"] == 1 and doc["layers"]["L3"]["y"] == 2


@pytest.mark.parametrize("layers", ["", "data_layers:\n  _mergedConflicts: WORKING\n"])
def test_initial_data_cannot_set_the_joins_conflict_log(tmp_path: Path, layers: str) -> None:
    """``_mergedConflicts`` is where every join logs its conflicts: set by the data, the log
    would be lost (PROCESS keeps the data's value), so the run is refused before it starts."""
    path = write_elements(tmp_path, "par", PARALLEL)
    if layers:
        (tmp_path / "par.layerflow.yaml").write_text(layers, encoding="utf-8")
    code, doc = _run(tmp_path, "run", str(path), "--data", json.dumps({"_mergedConflicts": [], "x": 1}))
    assert code == 2 and doc["status"] == "error" and doc["instance_id"] is None
    assert doc["error"]["kind"] == "permission_denied"
    assert "'_mergedConflicts'" in doc["error"]["message"] and "rename the key" in doc["error"]["message"]


USER_TASK = ['<bpmn:startEvent id="start"/>', '<bpmn:userTask id="ask"/>',
             '<bpmn:scriptTask id="work"><bpmn:script>n = amount + 1</bpmn:script></bpmn:scriptTask>',
             '<bpmn:endEvent id="end"/>', flow("start", "ask"), flow("ask", "work"), flow("work", "end")]


def test_json_files_saved_with_a_byte_order_mark_are_read(tmp_path: Path) -> None:
    """Notepad and PowerShell's Out-File write a UTF-8 byte order mark before the JSON: the data,
    answers and config files are read all the same (RFC 8259 lets a parser ignore it)."""
    path = write_elements(tmp_path, "bom", USER_TASK)
    bom = b"\xef\xbb\xbf"
    (tmp_path / "bom.layerflow.json").write_bytes(bom + json.dumps({"work": {"preserveKeys": ["n"]}}).encode())
    data, answers = tmp_path / "data.json", tmp_path / "answers.json"
    data.write_bytes(bom + json.dumps({"amount": 41}).encode())
    answers.write_bytes(bom + json.dumps({"user_tasks": {"ask": {"ok": True}}}).encode())
    code, doc = _run(tmp_path, "run", str(path), "--data", str(data), "--answers", str(answers))
    assert doc["error"] is None, doc["error"]
    assert code == 0 and doc["layers"]["L1"] == {"amount": 41} and doc["layers"]["L3"]["n"] == 42
    assert doc["layers"]["L3"]["ok"] is True


def test_a_refused_inline_data_object_is_named_inline_data_not_a_file(tmp_path: Path) -> None:
    path = write_elements(tmp_path, "inline", USER_TASK)
    code, doc = _run(tmp_path, "run", str(path), "--data", '{"amount": 1, "_bad": 1e400}')
    assert code == 2 and doc["status"] == "error"
    assert doc["error"]["message"].startswith("inline data: ") and "'_bad'" in doc["error"]["message"]


@pytest.mark.parametrize(("copies", "summary", "says"), [
    (3.0, "t-1, t-2, t-3", None),     # JSON has one number type: 3.0 is 3
    (2, "t-1, t-2", None),
    ("3", None, "'3' (str)"),
    (2.5, None, "2.5 (float)"),
])
def test_a_loop_cardinality_is_a_whole_number_however_json_spells_it(tmp_path: Path, copies, summary, says) -> None:
    """A cardinality of 3.0 ran no instance: "TypeError: 'float' object cannot be interpreted as an
    integer", kind engine_error, naming neither the field nor what to do."""
    from engine_helpers import EXAMPLES

    code, doc = _run(tmp_path, "run", str(EXAMPLES / "multi_instance_cardinality.bpmn"),
                     "--data", json.dumps({"copies": copies, "title": "t"}))
    if summary is not None:
        assert doc["error"] is None and code == 0, doc["error"]
        assert doc["layers"]["L3"]["summary"] == summary
    else:
        assert code == 1 and doc["error"]["kind"] == "activity_failed" and doc["error"]["task_id"] == "label"
        assert "loopCardinality 'copies'" in doc["error"]["message"] and says in doc["error"]["message"]


@pytest.mark.parametrize("items", [5, None, 2.5, True])
def test_a_multi_instance_input_collection_that_is_no_collection_names_task_key_and_fix(tmp_path: Path, items) -> None:
    """It stopped with kind engine_error: "TypeError: 'int' object is not iterable"."""
    from engine_helpers import EXAMPLES

    text = (EXAMPLES / "multi_instance_parallel.bpmn").read_text(encoding="utf-8")
    path = tmp_path / "squares.bpmn"
    path.write_text(text.replace("<bpmn:script>items = [1, 2, 3]</bpmn:script>", "<bpmn:script>pass</bpmn:script>"),
                    encoding="utf-8")
    code, doc = _run(tmp_path, "run", str(path), "--data", json.dumps({"items": items}))
    assert code == 1 and doc["error"]["kind"] == "activity_failed" and doc["error"]["task_id"] == "square"
    message = doc["error"]["message"]
    assert "input collection 'items' (loopDataInputRef)" in message and "give it a list" in message


def test_the_plain_summary_shows_a_resolved_unicode_value_as_written(tmp_path: Path) -> None:
    path = write_elements(tmp_path, "par", PARALLEL)
    answers = tmp_path / "answers.json"
    answers.write_text(json.dumps({"user_tasks": {"a": {"结果": "同意"}, "b": {"结果": "拒绝"}},
                                   "confirmations": {"join/结果": "同意"}}, ensure_ascii=False), encoding="utf-8")
    result = CliRunner().invoke(main, ["run", str(path), "--answers", str(answers),
                                       "--store", f"sqlite:///{tmp_path / 'plain.db'}"], catch_exceptions=False)
    assert result.exit_code == 0, result.stderr
    assert 'conflict join/结果: {"a": "同意", "b": "拒绝"} -> "同意" by human' in result.stdout + result.stderr


def test_resume_answers_a_conflict_on_a_key_that_holds_an_equals_sign(tmp_path: Path) -> None:
    """``--answer join/k=v=2``: the instance waits for ``join/k=v``, so that is the KEY and 2 the
    VALUE; the answer was kept "for a later step" under ``join/k`` and the instance kept waiting."""
    path = write_elements(tmp_path, "par", PARALLEL)
    answers = tmp_path / "answers.json"
    answers.write_text(json.dumps({"user_tasks": {"a": {"k=v": 1}, "b": {"k=v": 2}}}), encoding="utf-8")
    code, doc = _run(tmp_path, "run", str(path), "--answers", str(answers))
    assert code == 3 and [w["id"] for w in doc["waiting_for"]] == ["join/k=v"]
    code, done = _run(tmp_path, "resume", doc["instance_id"], "--answer", "join/k=v=2")
    assert done["error"] is None, done["error"]
    assert code == 0 and done["layers"]["L3"]["k=v"] == 2
    assert done["conflicts"][0]["resolution"]["resolver"] == "human"


def test_the_waiting_hints_quote_names_with_spaces_so_they_can_be_pasted(tmp_path: Path) -> None:
    """Camunda message names have spaces ("Documents received"), context keys may too: the hint
    `layerflow send ID Documents received ...` ran `send` with the wrong name when pasted."""
    path = write_elements(tmp_path, "par", PARALLEL, extra='  <bpmn:message id="m" name="Documents received"/>\n')
    answers = tmp_path / "answers.json"
    answers.write_text(json.dumps({"user_tasks": {"a": {"due date": 1}, "b": {"due date": 2}}}), encoding="utf-8")
    store = f"sqlite:///{tmp_path / 'hints.db'}"
    result = CliRunner().invoke(main, ["run", str(path), "--answers", str(answers), "--store", store],
                                catch_exceptions=False)
    assert result.exit_code == 3
    assert "--answer 'join/due date=VALUE'" in result.stdout

    catch = write_elements(tmp_path, "docs", [
        '<bpmn:startEvent id="start"/>',
        '<bpmn:intermediateCatchEvent id="wait"><bpmn:messageEventDefinition messageRef="m"/>'
        '</bpmn:intermediateCatchEvent>',
        '<bpmn:endEvent id="end"/>', flow("start", "wait"), flow("wait", "end")],
        extra='  <bpmn:message id="m" name="Documents received"/>\n')
    result = CliRunner().invoke(main, ["run", str(catch), "--store", store], catch_exceptions=False)
    assert result.exit_code == 3
    assert " 'Documents received' --json-payload" in result.stdout


def test_a_value_nested_too_deep_is_refused_naming_the_key_not_a_recursion_traceback(tmp_path: Path) -> None:
    """JSON 500 lists deep parses, and the run ended in a RecursionError traceback (no JSON document)."""
    from context_layers import ContextValueError, Layer, LayeredContext
    from context_layers.canonical import MAX_DEPTH

    path = write_elements(tmp_path, "deep", USER_TASK)
    deep = "[" * 500 + "]" * 500
    code, doc = _run(tmp_path, "run", str(path), "--data", '{"amount": 1, "deep": ' + deep + "}")
    assert code == 2 and doc["error"]["kind"] == "invalid_value"
    assert "key 'deep'" in doc["error"]["message"] and f"nested more than {MAX_DEPTH}" in doc["error"]["message"]
    ctx = LayeredContext()
    with pytest.raises(ContextValueError, match="nested more than"):
        ctx.write(Layer.WORKING, "deep", json.loads(deep), actor="t")
    ok = json.loads("[" * MAX_DEPTH + "]" * MAX_DEPTH)
    ctx.write(Layer.WORKING, "fine", ok, actor="t")
    assert ctx.resolve("fine") == ok


def test_inline_data_longer_than_a_file_name_may_be_is_read_as_json(tmp_path: Path) -> None:
    """`--data '{...}'` of more than 255 characters: checking whether a file of that name exists
    raised "OSError: File name too long", a traceback instead of a run."""
    path = write_elements(tmp_path, "long_inline", USER_TASK)
    note = "x" * 400
    code, doc = _run(tmp_path, "run", str(path), "--data", json.dumps({"amount": 1, "note": note}),
                     "--answers", json.dumps({"user_tasks": {"ask": {"reply": note}}}))
    assert doc["error"] is None, doc["error"]
    assert code == 0 and doc["layers"]["L1"]["note"] == note and doc["layers"]["L3"]["reply"] == note


def test_a_yaml_data_file_with_an_unquoted_date_says_to_quote_it(tmp_path: Path) -> None:
    """The message was "value is of type date, which is not JSON-compatible; write None, bool, ..."."""
    path = write_elements(tmp_path, "dated", USER_TASK)
    data = tmp_path / "data.yaml"
    data.write_text("amount: 1\nclaim: {filed: 2024-01-05}\n", encoding="utf-8")
    code, doc = _run(tmp_path, "run", str(path), "--data", str(data))
    assert code == 2 and doc["error"]["kind"] == "bad_input"
    assert "'claim.filed' is 2024-01-05, which YAML reads as a date" in doc["error"]["message"]
    assert "quote it ('2024-01-05')" in doc["error"]["message"]
