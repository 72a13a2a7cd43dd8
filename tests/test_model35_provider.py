"""A provider that misbehaves in production, through litellm's real HTTP client against the local
OpenAI-compatible stub (tests/stub_llm.py), never a real provider.

claim_triage (tests/model35/): ``intake`` (a script) -> ``assess`` (a model step with the governance tools
and an ``outputSchema``) -> ``decide`` (a model step with ``outputKeys``). SYSTEM holds a vendor token that
no error message may carry.

For every misbehaviour: retries are bounded and each attempt's reason is on the tape (``llm_call``); a
step that fails for good leaves the instance in ``error`` naming the step, the attempts and what to do,
without a secret or the prompt; nothing of a refused answer is written; the tape says what the model asked
and what was refused (``tool_call``); and ``resume`` once the provider behaves again goes on from the failed
step without running a finished one again.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from context_layers import Layer
from context_layers.markers import DELETED
from engine import Engine, load_process
from engine.llm import MAX_TOOL_TURNS

from stub_llm import Reply, StubLLM

HERE = Path(__file__).resolve().parent / "model35"
PROCESS = HERE / "claim_triage.bpmn"
MODEL = "openai/stub-model"
API_KEY = "sk-test-model35-API-KEY-do-not-print"
SECRETS = (API_KEY, "sk-live-model35-SECRET-token")
START = {"claim_no": 41, "amount": 640}

ASSESS = Reply.json({"risk": "low", "assess_note": "a small, well documented claim"})
DECIDE = Reply.json({"decision": "pay"})


@pytest.fixture
def stub(monkeypatch: pytest.MonkeyPatch) -> Any:
    with StubLLM() as server:
        monkeypatch.setenv("LAYERFLOW_MODEL_API_BASE", server.url)
        monkeypatch.setenv("LAYERFLOW_MODEL_API_KEY", API_KEY)
        monkeypatch.setenv("LAYERFLOW_RETRY_BASE_DELAY", "0.01")
        yield server


@pytest.fixture
def engine(tmp_path: Path) -> Engine:
    return Engine(f"sqlite:///{tmp_path / 'runs.db'}", model=MODEL)


def _step(body: dict[str, Any]) -> str:
    for m in body["messages"]:
        found = re.search(r'<task activity="([^"]+)"', str(m.get("content") or ""))
        if found:
            return found.group(1)
    return "?"


def _steps(stub: StubLLM) -> list[str]:
    return [_step(b) for b in stub.requests]


def _notes(instance: Any, note: str, task: str | None = None) -> list[dict[str, Any]]:
    return [dict(e.data) for e in instance.main.tape
            if (e.data or {}).get("note") == note and task in (None, (e.data or {}).get("task_id"))]


def _begun(instance: Any, activity: str) -> int:
    return sum(1 for e in instance.main.tape if e.kind == "begin" and e.activity == activity)


def _written(instance: Any, actor: str) -> dict[str, Any]:
    return {key: value for e in instance.main.tape if e.actor == actor
            for layer, key, value in (e.changes or ()) if layer == Layer.WORKING and value is not DELETED}


def _run(engine: Engine) -> Any:
    return engine.run_process(load_process(PROCESS), START)


def _assert_failed_cleanly(failed: Any, step: str, *, attempts: int, words: tuple[str, ...]) -> None:
    """In ``error`` at ``step``, naming the attempts and what to do; no secret, no prompt; nothing written."""
    assert failed.status == "error", failed.status
    error = failed.error
    assert error["task_id"] == step, error
    message = error["message"]
    assert f"after {attempts} attempt" in message, message
    for word in words:
        assert word in message, (word, message)
    assert not [s for s in SECRETS if s in message], message
    assert "<task activity=" not in message and "Pay claims under" not in message and len(message) < 1500, message
    assert _written(failed, step) == {}
    assert failed.main.tape[-1].kind == "abort"


def _resumed(engine: Engine, stub: StubLLM, failed: Any, *replies: Reply) -> Any:
    """Resume once the provider behaves again; finished steps do not run again."""
    stub.requests.clear()
    stub.push(*replies)
    done = engine.resume(failed.id)
    assert done.status == "completed", done.error
    assert _begun(done, "intake") == 1
    return done


# ===== transport: 500, 429, a hang ==================================================================

def test_a_500_then_success_is_retried_and_the_reason_is_on_the_tape(stub: StubLLM, engine: Engine) -> None:
    stub.push(ASSESS, Reply.error(500, "upstream overloaded"), DECIDE)
    done = _run(engine)
    assert done.status == "completed", done.error
    notes = _notes(done, "llm_call", "decide")
    assert [(n["attempt"], n["status"]) for n in notes] == [(1, "error"), (2, "ok")]
    assert notes[0]["error"]["status_code"] == 500 and notes[0]["error"]["transient"] is True
    assert done.main.resolve("decision") == "pay"


def test_a_429_waits_as_the_server_asks_and_says_so_on_the_tape(stub: StubLLM, engine: Engine) -> None:
    stub.push(ASSESS, Reply.error(429, "slow down", headers=(("Retry-After", "0.2"),)), DECIDE)
    done = _run(engine)
    assert done.status == "completed", done.error
    first, second = _notes(done, "llm_call", "decide")
    assert first["error"]["status_code"] == 429 and second["status"] == "ok"
    assert first["error"].get("retry_after") == pytest.approx(0.2), first["error"]


def test_a_429_asking_for_an_hour_fails_at_once_and_resume_goes_on(stub: StubLLM, engine: Engine) -> None:
    stub.push(ASSESS, Reply.error(429, "quota", headers=(("Retry-After", "3600"),)))
    failed = _run(engine)
    _assert_failed_cleanly(failed, "decide", attempts=1, words=("Retry-After", "resume"))
    done = _resumed(engine, stub, failed, DECIDE)
    assert _steps(stub) == ["decide"]
    assert done.main.resolve("decision") == "pay"


def test_a_hang_past_the_timeout_is_bounded_and_resume_runs_only_the_failed_step(stub: StubLLM,
                                                                                engine: Engine) -> None:
    late = Reply.sleep(1.5, DECIDE)
    stub.push(ASSESS, late, late)
    failed = _run(engine)
    _assert_failed_cleanly(failed, "decide", attempts=2, words=("llm.timeout", "Timeout"))
    notes = _notes(failed, "llm_call", "decide")
    assert [(n["attempt"], n["status"], n["error"]["transient"]) for n in notes] == [(1, "error", True),
                                                                                   (2, "error", True)]
    done = _resumed(engine, stub, failed, DECIDE)
    assert _steps(stub) == ["decide"] and _begun(done, "assess") == 1
    assert done.main.resolve("risk") == "low" and done.main.resolve("decision") == "pay"


def test_a_body_that_is_not_json_names_the_api_base_to_check(stub: StubLLM, engine: Engine) -> None:
    page = Reply(body="<html><body>502 Bad Gateway</body></html>")
    stub.push(ASSESS, page, page)
    failed = _run(engine)
    assert failed.status == "error" and failed.error["task_id"] == "decide", failed.error
    assert "LAYERFLOW_MODEL_API_BASE" in failed.error["message"], failed.error
    assert not [s for s in SECRETS if s in failed.error["message"]]
    assert _written(failed, "decide") == {}
    _resumed(engine, stub, failed, DECIDE)
    assert _steps(stub) == ["decide"]


# ===== answers the step cannot take ===================================================================

BAD_ANSWERS = [
    ("not JSON", Reply.text("Sure! The decision is: pay."), ("JSON",)),
    ("schema", Reply.json({"risk": "medium", "assess_note": "x"}), ("outputSchema",)),
    ("cut off", Reply(content='{"risk": "low", "assess_note": "a long', finish_reason="length"), ("maxTokens",)),
]


@pytest.mark.parametrize(("what", "bad", "words"), BAD_ANSWERS, ids=[b[0] for b in BAD_ANSWERS])
def test_an_answer_the_step_cannot_take_is_corrected_then_fails_naming_what_to_do(
        stub: StubLLM, engine: Engine, what: str, bad: Reply, words: tuple[str, ...]) -> None:
    stub.push(bad, bad)
    failed = _run(engine)
    _assert_failed_cleanly(failed, "assess", attempts=2, words=words)
    notes = _notes(failed, "llm_call", "assess")
    assert [n["status"] for n in notes] == ["invalid_answer", "invalid_answer"]
    # the corrective turn said what was wrong, at the end of the conversation
    assert stub.requests[1]["messages"][-1]["role"] == "user"
    assert "not accepted" in stub.requests[1]["messages"][-1]["content"]
    _resumed(engine, stub, failed, ASSESS, DECIDE)
    assert _steps(stub) == ["assess", "decide"]


def test_a_schema_breaking_answer_corrected_on_the_second_attempt_is_written(stub: StubLLM, engine: Engine) -> None:
    stub.push(Reply.json({"risk": "medium", "assess_note": "x"}), ASSESS, DECIDE)
    done = _run(engine)
    assert done.status == "completed", done.error
    assert _written(done, "assess") == {"risk": "low", "assess_note": "a small, well documented claim"}


def test_a_reply_without_usage_is_taken_and_noted_without_usage(stub: StubLLM, engine: Engine) -> None:
    stub.push(Reply.json({"risk": "low", "assess_note": "ok"}, usage=None), Reply.json({"decision": "pay"}, usage=None))
    done = _run(engine)
    assert done.status == "completed", done.error
    assert [n["usage"] for n in _notes(done, "llm_call")] == [None, None]


@pytest.mark.parametrize("key", ["policy", "vendor_api_token", "_mergedConflicts", "activity:intake"])
def test_an_answer_writing_a_key_the_step_may_not_write_writes_nothing(stub: StubLLM, engine: Engine,
                                                                        key: str) -> None:
    stub.push(ASSESS, Reply.json({"decision": "pay", key: "overwritten by the model"}))
    engine_run = _run(engine)
    assert engine_run.status == "error", engine_run.error
    error = engine_run.error
    assert error["task_id"] == "decide" and error["kind"] == "permission_denied" and key in error["message"], error
    assert not [s for s in SECRETS if s in error["message"]], error
    assert "decision" not in _written(engine_run, "decide")
    assert engine_run.main.resolve("policy") == "Pay claims under 1000 EUR when the risk is low."
    refused = [e for e in engine_run.main.tape if e.kind == "denied" or (e.data or {}).get("note") ==
               "model_answer_refused"]
    assert refused, [e.kind for e in engine_run.main.tape[-6:]]
    done = _resumed(engine, stub, engine_run, DECIDE)
    assert _steps(stub) == ["decide"] and done.main.resolve("decision") == "pay"


# ===== tool calls ===========================================================================================

BAD_CALLS = [
    ("unknown tool", ("context_delete", {"key": "policy"}), "bad_request", "unknown tool"),
    ("not JSON", ("context_inspect", '{"layers": ["L3"'), "validation_error", "not JSON"),
    ("missing argument", ("human_confirm", {"message": "Pay it?"}), "validation_error", "options"),
    ("compress SYSTEM", ("context_compress", {"action": "compress", "target_layers": ["L0"]}), "bad_request",
     "target_layers"),
    ("engine key", ("context_branch", {"action": "resolve_conflict", "conflict_key": "_mergedConflicts",
                                       "resolution": [], "reason": "clean up"}), None, "_mergedConflicts"),
    ("long confirm", ("human_confirm", {"message": "x" * 30_000, "options": [{"label": "yes", "value": "y"}]}),
     "validation_error", "message"),
    ("many options", ("human_confirm", {"message": "Pay?", "options": [{"label": f"o{n}", "value": n}
                                                                       for n in range(500)]}),
     "validation_error", "options"),
    ("long label", ("context_branch", {"action": "snapshot", "label": "x" * 600}), "validation_error", "label"),
    ("huge arguments", ("context_branch", {"action": "snapshot", "label": "x" * 300_000}), "validation_error",
     "300035 characters"),
]


@pytest.mark.parametrize(("what", "call", "kind", "named"), BAD_CALLS, ids=[b[0] for b in BAD_CALLS])
def test_a_bad_tool_call_is_refused_to_the_model_and_noted_on_the_tape(
        stub: StubLLM, engine: Engine, what: str, call: tuple[str, Any], kind: str | None, named: str) -> None:
    stub.push(Reply.calls(call), ASSESS, DECIDE)
    done = _run(engine)
    assert done.status == "completed", done.error
    [result] = [json.loads(m["content"]) for m in stub.requests[1]["messages"] if m["role"] == "tool"]
    assert "error" in result, result
    if kind is not None:
        assert result["error"]["kind"] == kind, result
    assert named in result["error"]["message"], result
    assert len(result["error"]["message"]) < 2000, len(result["error"]["message"])
    [noted] = _notes(done, "tool_call")
    assert noted["tool"] == call[0] and noted["error"] == result["error"]["kind"]
    assert len(json.dumps(noted)) < 10_000
    assert done.to_document()["confirmations"] == []
    assert done.main.resolve("policy") == "Pay claims under 1000 EUR when the risk is low."
    assert len(json.dumps([e.data for e in done.main.tape], default=str)) < 200_000


def test_a_model_calling_the_same_tool_forever_is_stopped_and_resume_starts_the_step_again(
        stub: StubLLM, engine: Engine) -> None:
    same = Reply.calls(("context_inspect", {"layers": ["L1"], "metrics": ["keys"]}))
    stub.push(*[same] * (MAX_TOOL_TURNS + 3))
    failed = _run(engine)
    assert failed.status == "error" and failed.error["task_id"] == "assess", failed.error
    assert f"at most {MAX_TOOL_TURNS} turns" in failed.error["message"]
    assert f"its last {MAX_TOOL_TURNS} turns repeated the same call (context_inspect" in failed.error["message"]
    assert len(_notes(failed, "tool_call")) == MAX_TOOL_TURNS
    assert _written(failed, "assess") == {}
    stub.script.clear()
    done = _resumed(engine, stub, failed, ASSESS, DECIDE)
    assert _steps(stub) == ["assess", "decide"] and done.main.resolve("risk") == "low"


# ===== what a provider says back ==========================================================================

def test_an_api_key_the_provider_quotes_in_its_error_is_masked_everywhere(stub: StubLLM, engine: Engine) -> None:
    stub.push(ASSESS, Reply.error(401, f"Incorrect API key provided: {API_KEY}. You can find your key at ..."))
    failed = _run(engine)
    _assert_failed_cleanly(failed, "decide", attempts=1, words=("LAYERFLOW_MODEL_API_KEY", "***"))
    [note] = _notes(failed, "llm_call", "decide")
    assert "Incorrect API key provided: ***" in note["error"]["message"]
    assert API_KEY not in json.dumps([e.data for e in failed.main.tape], default=str)


def test_a_reply_the_content_filter_withheld_is_named_as_such(stub: StubLLM, engine: Engine) -> None:
    filtered = Reply(content="", finish_reason="content_filter")
    stub.push(ASSESS, filtered, filtered)
    failed = _run(engine)
    _assert_failed_cleanly(failed, "decide", attempts=2, words=("content filter", "content policy"))
    assert "stronger model" not in failed.error["message"]
    done = _resumed(engine, stub, failed, DECIDE)
    assert _steps(stub) == ["decide"] and done.main.resolve("decision") == "pay"


def _confirm(cid: str, message: str, *values: str) -> dict[str, Any]:
    arguments = {"message": message, "options": [{"label": v, "value": v} for v in values]}
    return {"id": cid, "type": "function", "function": {"name": "human_confirm", "arguments": json.dumps(arguments)}}


def test_two_questions_a_provider_gave_one_call_id_each_get_their_own_answer(stub: StubLLM, engine: Engine) -> None:
    twins = (_confirm("call_0", "Is the invoice genuine?", "yes", "no"),
             _confirm("call_0", "Which desk reviews it?", "north", "south"))
    stub.push(Reply(content=None, tool_calls=twins, finish_reason="tool_calls"))
    waiting = _run(engine)
    assert waiting.status == "waiting", waiting.error
    asked = {c["message"]: c["id"] for c in waiting.to_document()["confirmations"]}
    stub.push(ASSESS, DECIDE)
    done = engine.resume(waiting.id, answers={"confirmations": {asked["Is the invoice genuine?"]: "no",
                                                                asked["Which desk reviews it?"]: "south"}})
    assert done.status == "completed", done.error
    turn = stub.requests[-2]["messages"]
    [assistant] = [m for m in turn if m["role"] == "assistant"]
    ids = [c["id"] for c in assistant["tool_calls"]]
    assert len(set(ids)) == 2, ids
    results = {m["tool_call_id"]: json.loads(m["content"])["answer"] for m in turn if m["role"] == "tool"}
    assert [results[i] for i in ids] == ["no", "south"]


def test_what_the_model_is_sent_holds_no_secret(stub: StubLLM, engine: Engine) -> None:
    stub.push(ASSESS, DECIDE)
    assert _run(engine).status == "completed"
    assert not [s for s in SECRETS if s in json.dumps(stub.requests)]
