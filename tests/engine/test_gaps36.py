"""Round 36 gaps: a `summary:count:` key (the compressor's count_only counter) is refused from outside
the process as the other engine keys are; REST replay's negative `until` says what a sequence number
is, as the CLI does; `layerflow worker --model` loads the model client before it claims an entry."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import local_http
import pytest

from context_layers import ContextWriteDenied
from engine import AnswerWriteDenied, Engine, load_process
from engine.api import create_app

import test_unseen_processes_4
from engine_helpers import chain_bpmn, cli_in_a_tmp_store, run_json
from governance_helpers import TOKEN, ServerThread

cli = cli_in_a_tmp_store  # the "cli" fixture: the CLI in this process, on the test's own sqlite store
fake_model = test_unseen_processes_4.fake_model  # the "fake_model" fixture: engine.llm's model replaced

ROOT = Path(__file__).resolve().parents[2]
UNSEEN10 = Path(__file__).resolve().parent / "unseen10"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
COUNTER_KEY = "summary:count:tool:*"
# what a compressor's counter looks like: the compressor and a join take such a value for a real count
FORGED_COUNTER = {"kind": "count", "_compressed": "count_only", "pattern": "tool:*", "count": 40, "kept": []}


def two_steps(folder: Path) -> Path:
    """draft -> approve, two people's steps."""
    folder.mkdir(exist_ok=True)
    path = folder / "two_steps.bpmn"
    path.write_text(chain_bpmn("two_steps", ['<bpmn:userTask id="draft"/>', '<bpmn:userTask id="approve"/>']),
                    encoding="utf-8")
    return path


def assert_names_the_counter(err: BaseException) -> None:
    """The refusal names the key and its prefix, and says what to write instead."""
    text = str(err)
    assert COUNTER_KEY in text and "'summary:count:'" in text and "count_only" in text, text


def no_counter(instance: Any) -> bool:
    return all(COUNTER_KEY not in ctx.layer(layer) for ctx in instance.contexts.values() for layer in range(6))


# ----------------------------------------------------------------------------- 1. counters from outside


def test_a_persons_answer_cannot_write_a_compressors_counter(tmp_path: Path) -> None:
    engine = Engine("memory://")
    waiting = engine.run(load_process(two_steps(tmp_path)), {})
    with pytest.raises(AnswerWriteDenied) as refused:
        engine.resume(waiting.id, answers={"user_tasks": {"draft": {"text": "v1", COUNTER_KEY: FORGED_COUNTER}}})
    assert_names_the_counter(refused.value)
    still = engine.load(waiting.id)
    assert still.status == "waiting" and no_counter(still) and "text" not in still.main
    assert [e.data["key"] for e in still.main.tape.filter(kind="denied")] == [COUNTER_KEY]


def test_an_inject_cannot_write_a_compressors_counter_python_cli_and_rest(cli: Any, tmp_path: Path) -> None:
    """`Engine.inject`, `resume --set` and REST `inject`: refused naming the key, nothing written (the
    Python API and `--set` refused no engine key at all: `_mergedConflicts` went in as data)."""
    engine = Engine("memory://")
    waiting = engine.run(load_process(two_steps(tmp_path)), {})
    for key, value in ((COUNTER_KEY, FORGED_COUNTER), ("_mergedConflicts", [])):
        with pytest.raises(ContextWriteDenied) as refused:
            engine.inject(waiting.id, {"note": "x", key: value})
        assert refused.value.key == key and key in str(refused.value)
    assert_names_the_counter(pytest.raises(ContextWriteDenied, engine.inject, waiting.id,
                                           {COUNTER_KEY: FORGED_COUNTER}).value)
    still = engine.load(waiting.id)
    assert no_counter(still) and "note" not in still.main and "_mergedConflicts" not in still.main

    catalog = tmp_path / "catalog"
    iid = run_json(cli, "run", str(two_steps(catalog)), code=3)["instance_id"]
    refused_cli = run_json(cli, "resume", iid, "--set", f"{COUNTER_KEY}={json.dumps(FORGED_COUNTER)}", code=2)
    assert refused_cli["error"]["kind"] == "permission_denied", refused_cli["error"]
    assert_names_the_counter(AssertionError(refused_cli["error"]["message"]))
    assert COUNTER_KEY not in json.dumps(refused_cli["layers"])

    with ServerThread(create_app(os.environ["LAYERFLOW_STORE"], catalog, TOKEN)) as server:
        answer = local_http.post(f"{server.url}/api/context-governance/inject", headers=AUTH, json={
            "instance_id": iid, "values": {COUNTER_KEY: FORGED_COUNTER}})
    assert answer.status_code == 403, answer.text
    assert_names_the_counter(AssertionError(answer.json()["error"]["message"]))
    assert COUNTER_KEY not in json.dumps(run_json(cli, "inspect", iid)["layers"])


def test_a_message_payload_cannot_write_a_compressors_counter() -> None:
    engine = Engine("memory://")
    waiting = engine.run(load_process(UNSEEN10 / "supplier_dispute.bpmn"), {"deduction": 400})
    with pytest.raises(ContextWriteDenied) as refused:
        engine.send_event(waiting.id, "supplier_reply", {"reply": "we object", COUNTER_KEY: FORGED_COUNTER})
    assert refused.value.key == COUNTER_KEY
    assert_names_the_counter(refused.value)
    still = engine.load(waiting.id)
    assert still.status == "waiting" and no_counter(still)
    notes = [e.data["key"] for ctx in still.contexts.values() for e in ctx.tape if e.data.get("note") == "event_refused"]
    assert notes == [COUNTER_KEY]


def test_a_models_answer_cannot_write_a_compressors_counter(fake_model: Any) -> None:
    model = fake_model(lambda request: json.dumps({"letter": "Dear supplier", COUNTER_KEY: FORGED_COUNTER}))
    failed = Engine("memory://").run(load_process(UNSEEN10 / "deduction_review.bpmn"),
                                     {"deduction": 400, "complaint": "please"})
    assert len(model.requests) == 1 and failed.status == "error"
    assert failed.error["task_id"] == "draft_letter" and COUNTER_KEY in failed.error["message"], failed.error
    assert "'summary:count:'" in failed.error["message"]
    assert no_counter(failed) and "letter" not in failed.main
    assert [e.data["key"] for e in failed.main.tape if e.data.get("note") == "model_answer_refused"] == [COUNTER_KEY]


def test_start_data_cannot_set_a_compressors_counter(tmp_path: Path) -> None:
    with pytest.raises(ContextWriteDenied) as refused:
        Engine("memory://").run(load_process(two_steps(tmp_path)), {COUNTER_KEY: FORGED_COUNTER})
    assert refused.value.key == COUNTER_KEY and "summary:count:" in str(refused.value)


# ----------------------------------------------------------------------------- 2. REST replay's until


def test_rest_replay_with_no_sequence_number_says_what_one_is_as_the_cli(cli: Any, tmp_path: Path) -> None:
    """`layerflow replay ID --until -1` explains a sequence number and where to find them; REST's
    `?until=-1` answered pydantic's "Input should be greater than or equal to 0" only (422 still, as
    every invalid query parameter; the OpenAPI schema still says `minimum: 0`)."""
    catalog = tmp_path / "catalog"
    iid = run_json(cli, "run", str(two_steps(catalog)), code=3)["instance_id"]
    said = run_json(cli, "replay", iid, "--until", "-1", code=2)["error"]["message"]
    assert "a tape sequence number counts from 1 (0: before the first event)" in said
    with ServerThread(create_app(os.environ["LAYERFLOW_STORE"], catalog, TOKEN)) as server:
        replay = f"{server.url}/api/instances/{iid}/replay"
        answers = {until: local_http.get(replay, params={"until": until}, headers=AUTH) for until in ("-1", "first")}
        whole = local_http.get(replay, params={"until": "0"}, headers=AUTH)
        schema = local_http.get(f"{server.url}/openapi.json").json()
    for until, answer in answers.items():
        assert answer.status_code == 422, answer.text
        error = answer.json()["error"]
        assert error["kind"] == "validation_error" and [p["field"] for p in error["problems"]] == ["query.until"]
        assert (f"until {until!r}: a tape sequence number counts from 1 (0: before the first event); "
                f"GET /api/instances/{iid}/tape lists them") in error["message"], error["message"]
    assert whole.status_code == 200 and whole.json()["until"] == 0
    (param,) = [p for p in schema["paths"]["/api/instances/{instance_id}/replay"]["get"]["parameters"]
                if p["name"] == "until"]
    assert param["schema"]["anyOf"][0]["minimum"] == 0, param
