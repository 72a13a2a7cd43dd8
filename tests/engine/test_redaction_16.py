"""What the engine sends a model is redacted (the element's ``redact`` config, on by default).

tests/engine/redaction16/vendor_access.bpmn: a model activity (``assess``) reads the start data,
a parallel split whose two checks disagree on ``tier`` (a plain key: the model resolves it) and on
``service_password`` (a secret-named key: the model is never shown it, a person decides), then an
XOR gateway whose ``grant`` branch is a sentence (the model decides). The start data holds an
``api_key``, a nested ``login.password``, a bearer token inside a note and an AWS key id inside
another. None of them may reach the model on any path (activity request, tool results, condition
question, conflict prompt), while the context, the tape and ``run --json`` keep the real values.

The fake model (engine.llm.load_litellm patched) records every request; one test goes through
litellm's real client to tests/stub_llm.py on 127.0.0.1.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import pytest
import yaml

from engine import Engine, load_process

import test_unseen_processes_4
from stub_llm import Reply, StubLLM
from test_model_paths_16 import _purpose  # which prompt a request is: activity, condition, conflict, summary

HERE = Path(__file__).resolve().parent / "redaction16"
BPMN = HERE / "vendor_access.bpmn"
CONFIG = HERE / "vendor_access.layerflow.yaml"

fake_model = test_unseen_processes_4.fake_model  # the deterministic fake model, shared

API_KEY = "acme-key-9f8e7d6c5b4a"
PASSWORD = "hunter2-login-pass"
BEARER = "abcdefghijklmnopqrstuvwx0123"  # in security_note (a script writes it) and in notes
AWS = "AKIAIOSFODNN7EXAMPLE"
DATA = {"vendor": "Acme", "api_key": API_KEY, "login": {"user": "acme-ops", "password": PASSWORD},
        "notes": f"Call their API with Authorization: Bearer {BEARER}", "cloud": f"account key {AWS}"}
SECRETS = (API_KEY, PASSWORD, BEARER, AWS, "sec-pass-1111", "fin-pass-2222")
ANSWERS = {"confirmations": {"checks_join/service_password": "sec-pass-1111"}}


def _payload(kwargs: dict[str, Any]) -> dict[str, Any]:
    """The JSON question of a condition or conflict request."""
    loaded: dict[str, Any] = json.loads(kwargs["messages"][1]["content"].split("\n", 1)[1])
    return loaded


def _answer(kwargs: dict[str, Any]) -> str:
    purpose = _purpose(kwargs)
    if purpose == "condition":
        return json.dumps({"branch": "grant", "rationale": "low risk, standard tier"})
    if purpose == "conflict":
        request = _payload(kwargs)
        return json.dumps({"final_value": request["branches"][-1]["value"], "rationale": "the contract",
                           "escalate": False})
    return json.dumps({"summary": "checked"} if "Answer with summary" in json.dumps(kwargs["messages"])
                      else {"risk": "low"})


def _config(tmp_path: Path, **changes: Any) -> Path:
    """The fixture's config with element configs (or ``process:`` options) changed, written beside
    a copy of the BPMN."""
    data = yaml.safe_load(CONFIG.read_text())
    for element, fields in changes.items():
        data.setdefault(element, {}).update(fields)
    shutil.copy(BPMN, tmp_path / BPMN.name)
    path = tmp_path / CONFIG.name
    path.write_text(yaml.safe_dump(data))
    return path


def _run(fake_model: Any, config: Path | None = None) -> tuple[Any, Any]:
    model = fake_model(_answer)
    process = load_process(BPMN if config is None else config.parent / BPMN.name, config=config)
    instance = Engine("memory://", model="fake/model").run_process(process, DATA, answers=ANSWERS)
    return instance, model


def _by_purpose(model: Any) -> dict[str, list[dict[str, Any]]]:
    found: dict[str, list[dict[str, Any]]] = {}
    for kwargs in model.requests:
        found.setdefault(_purpose(kwargs), []).append(kwargs)
    return found


def _tape_notes(instance: Any, note: str) -> list[dict[str, Any]]:
    return [e.data for ctx in instance.contexts.values() for e in ctx.tape if e.data.get("note") == note]


def test_no_secret_reaches_the_model_and_the_audit_record_keeps_them(fake_model: Any) -> None:
    instance, model = _run(fake_model)
    assert instance.status == "completed", instance.error
    sent = _by_purpose(model)
    assert set(sent) == {"activity", "condition", "conflict"}
    everything = json.dumps(model.requests)
    assert not [s for s in SECRETS if s in everything], everything
    # (1) the activity's request: keys stay, values hidden; a bearer token inside text hidden
    [activity, review] = sent["activity"]
    text = json.dumps(activity["messages"])
    assert "api_key" in text and "[REDACTED]" in text and "Bearer [REDACTED]" in text
    # after the join, the conflict log in the context names service_password: its values are hidden too
    assert "service_password" in json.dumps(review["messages"])
    # (2) the condition question
    [condition] = sent["condition"]
    context = _payload(condition)["context"]
    assert context["api_key"] == "[REDACTED]" and context["login"] == {"user": "acme-ops", "password": "[REDACTED]"}
    assert context["cloud"] == "account key [REDACTED]" and context["vendor"] == "Acme"
    # (3) the conflict prompt: tier asked with its related context hidden; service_password never asked
    prompts = {_payload(k)["key"]: _payload(k) for k in sent["conflict"]}
    assert set(prompts) == {"tier"}
    related = prompts["tier"]["related_context"]
    assert related["api_key"] == "[REDACTED]" and related["login"]["password"] == "[REDACTED]"
    reasons = {b["branch"]: b["reason"] for b in prompts["tier"]["branches"]}
    assert reasons["security_check"] == "rotated; use Authorization: Bearer [REDACTED]"
    [secret] = [c for c in instance.conflicts if c["key"] == "service_password"]
    assert secret["resolution"]["resolver"] == "human" and secret["resolution"]["value"] == "sec-pass-1111"
    steps = _tape_notes(instance, "resolution")
    skipped = [s for s in steps if s["key"] == "service_password" and s["outcome"] == "skipped"]
    assert skipped and "named like a secret" in skipped[0]["detail"], steps
    # the audit record keeps the real values
    ctx = instance.main
    assert ctx.resolve("api_key") == API_KEY and ctx.resolve("login")["password"] == PASSWORD
    assert ctx.resolve("service_password") == "sec-pass-1111" and ctx.resolve("decision") == "granted"
    document = json.dumps(instance.to_document(), default=str)
    assert API_KEY in document and PASSWORD in document
    assert API_KEY in json.dumps([e.data for e in ctx.tape] + [list(e.changes) for e in ctx.tape], default=str)


def test_the_redacted_request_is_the_same_bytes_every_time(fake_model: Any) -> None:
    first, model = _run(fake_model)
    again, model2 = _run(fake_model)
    assert first.status == again.status == "completed"
    assert json.dumps(model.requests, sort_keys=True) == json.dumps(model2.requests, sort_keys=True)


def test_redact_false_sends_the_values_and_lets_the_model_settle_the_secret_conflict(fake_model: Any,
                                                                                        tmp_path: Path) -> None:
    config = _config(tmp_path, assess={"redact": False}, route={"redact": False}, checks_join={"redact": False})
    instance, model = _run(fake_model, config)
    assert instance.status == "completed", instance.error
    sent = _by_purpose(model)
    assert API_KEY in json.dumps(sent["activity"]) and API_KEY in json.dumps(sent["condition"])
    prompts = {_payload(k)["key"] for k in sent["conflict"]}
    assert prompts == {"tier", "service_password"}
    [secret] = [c for c in instance.conflicts if c["key"] == "service_password"]
    assert secret["resolution"]["resolver"] == "model"


def test_extra_patterns_hide_more_and_the_defaults_still_hold(fake_model: Any, tmp_path: Path) -> None:
    config = _config(tmp_path, assess={"redact": ["vendor"]}, route={"redact": ["vend*"]})
    instance, model = _run(fake_model, config)
    assert instance.status == "completed", instance.error
    sent = _by_purpose(model)
    activity = json.dumps(sent["activity"][0])  # assess's (review keeps the defaults only)
    assert "Acme" not in activity and API_KEY not in activity
    context = _payload(sent["condition"][0])["context"]
    assert context["vendor"] == "[REDACTED]" and context["api_key"] == "[REDACTED]"
    assert instance.main.resolve("vendor") == "Acme"


def test_the_process_default_holds_where_an_element_sets_none_and_survives_a_resume(fake_model: Any,
                                                                                   tmp_path: Path) -> None:
    # process: {redact: [vendor]} hides vendor from every model path; assess says false for itself
    config = _config(tmp_path, process={"redact": ["vendor"]}, assess={"redact": False})
    model = fake_model(_answer)
    store = f"sqlite:///{tmp_path / 'runs.db'}"
    process = load_process(tmp_path / BPMN.name, config=config)
    instance = Engine(store, model="fake/model").run_process(process, DATA)
    assert instance.status == "waiting", instance.error  # service_password: a person decides
    done = Engine(store, model="fake/model").resume(instance.id, answers=ANSWERS)  # the process from the record
    assert done.status == "completed", done.error
    sent = _by_purpose(model)
    assess, review = sent["activity"]
    assert API_KEY in json.dumps(assess) and "Acme" in json.dumps(assess)  # its own redact: false
    assert "Acme" not in json.dumps(review) and API_KEY not in json.dumps(review)
    assert _payload(sent["condition"][0])["context"]["vendor"] == "[REDACTED]"
    assert _payload(sent["conflict"][0])["related_context"]["vendor"] == "[REDACTED]"


def test_the_tools_results_reach_the_model_redacted_and_the_tape_keeps_them(monkeypatch: pytest.MonkeyPatch,
                                                                            tmp_path: Path) -> None:
    import types

    import engine.llm
    requests: list[dict[str, Any]] = []

    def completion(**kwargs: Any) -> dict[str, Any]:
        requests.append(json.loads(json.dumps(kwargs, default=str)))
        if _purpose(kwargs) != "activity":
            return {"choices": [{"message": {"content": _answer(kwargs)}, "finish_reason": "stop"}]}
        if kwargs.get("tools") and not any(m.get("role") == "tool" for m in kwargs["messages"]):
            call = {"id": "call_1", "type": "function",
                    "function": {"name": "context_inspect", "arguments": json.dumps({"layers": ["L3"]})}}
            return {"choices": [{"finish_reason": "tool_calls",
                                 "message": {"role": "assistant", "content": None, "tool_calls": [call]}}]}
        return {"choices": [{"message": {"content": _answer(kwargs)}, "finish_reason": "stop"}]}

    monkeypatch.setattr(engine.llm, "load_litellm", lambda: types.SimpleNamespace(completion=completion))
    config = _config(tmp_path, review={"llm": {"instructions": "Review the checks. Answer with summary.",
                                               "outputKeys": ["summary"], "tools": True, "maxRetries": 0}})
    process = load_process(tmp_path / BPMN.name, config=config)
    instance = Engine("memory://", model="fake/model").run_process(process, DATA, answers=ANSWERS)
    assert instance.status == "completed", instance.error
    tool_messages = [m for r in requests for m in r["messages"] if m.get("role") == "tool"]
    assert tool_messages and json.loads(tool_messages[0]["content"])["layers"]["L3"]["keys"]
    assert not [s for s in SECRETS if s in json.dumps(requests)]


def test_the_text_a_compression_asks_the_model_to_summarize_has_its_secrets_hidden(fake_model: Any,
                                                                                   tmp_path: Path) -> None:
    # review's compression folds the checks (service_password, the bearer token in security_note)
    # into a compaction summary the model writes
    config = _config(tmp_path, review={"compressTokenThreshold": 60})
    model = fake_model(lambda kw: "The checks ran." if _purpose(kw) == "summary" else _answer(kw))
    process = load_process(tmp_path / BPMN.name, config=config)
    instance = Engine("memory://", model="fake/model").run_process(process, DATA, answers=ANSWERS)
    assert instance.status == "completed", instance.error
    summaries = [kw for kw in model.requests if _purpose(kw) == "summary"]
    assert summaries, [_purpose(kw) for kw in model.requests]
    text = json.dumps(summaries)
    assert "service_password: [REDACTED]" in text and "Bearer [REDACTED]" in text
    assert not [s for s in SECRETS if s in text]
    tape = json.dumps([list(e.changes) for e in instance.main.tape], default=str)
    assert "sec-pass-1111" in tape  # folded into the summary, the value stays on the tape


def test_a_tools_result_that_carries_values_reaches_the_model_redacted() -> None:
    # context_inspect lists the open conflicts of an instance with their values: a join waiting
    # for a person on service_password shows them to any tool-using activity that inspects
    from context_layers import LayeredContext
    from engine.llm import run_llm_tool_activity
    requests: list[dict[str, Any]] = []
    outcome = {"conflicts": [{"key": "service_password", "gateway_id": "checks_join", "base_value": "old-pass-0",
                              "values": {"security_check": "sec-pass-1111", "finance_check": "fin-pass-2222"},
                              "resolution": None}],
               "layers": {"L1": {"keys": ["api_key"]}}, "note": f"Bearer {BEARER}"}

    def completion(**kwargs: Any) -> dict[str, Any]:
        requests.append(json.loads(json.dumps(kwargs, default=str)))
        if len(requests) == 1:
            call = {"id": "c1", "type": "function", "function": {"name": "context_inspect", "arguments": "{}"}}
            return {"choices": [{"finish_reason": "tool_calls",
                                 "message": {"role": "assistant", "content": None, "tool_calls": [call]}}]}
        return {"choices": [{"message": {"content": json.dumps({"risk": "low"})}, "finish_reason": "stop"}]}

    ctx = LayeredContext(system={"policy": "least access"}, process={"api_key": API_KEY})
    ctx.begin_activity("assess")
    result = run_llm_tool_activity(ctx, "assess", None, model="fake/model", completion=completion,
                                   dispatch=lambda name, arguments: outcome, schemas=[])
    assert result.answer == {"risk": "low"}
    [tool] = [m for m in requests[1]["messages"] if m.get("role") == "tool"]
    shown = json.loads(tool["content"])
    assert shown["conflicts"][0]["values"] == {"security_check": "[REDACTED]", "finance_check": "[REDACTED]"}
    assert shown["conflicts"][0]["base_value"] == "[REDACTED]" and shown["note"] == "Bearer [REDACTED]"
    assert shown["layers"] == {"L1": {"keys": ["api_key"]}}  # key names are no secret
    assert not [s for s in (*SECRETS, "old-pass-0") if s in json.dumps(requests)]
    [call] = [e.data for e in ctx.tape if e.data.get("note") == "tool_call"]
    assert "sec-pass-1111" in call["result"]  # the tape's record of the tool is the audit record


@pytest.mark.parametrize("value", ["yes", 3, [""], ["*iban*", 7], {"keys": ["a"]}])
def test_a_bad_redact_value_is_a_config_error_naming_file_element_and_field(tmp_path: Path, value: Any) -> None:
    from click.testing import CliRunner

    from engine.cli import main
    config = _config(tmp_path, checks_join={"redact": value})
    result = CliRunner().invoke(main, ["validate", str(tmp_path / BPMN.name), "--config", str(config)])
    out = result.stdout + result.stderr
    assert result.exit_code != 0, out
    assert "vendor_access.layerflow.yaml" in out and "checks_join" in out and "redact" in out, out
    assert "glob patterns" in out, out


@pytest.mark.parametrize("value", ["no", [3]])
def test_a_bad_process_redact_is_reported_by_validate(tmp_path: Path, value: Any) -> None:
    from click.testing import CliRunner

    from engine.cli import main
    config = _config(tmp_path, process={"redact": value})
    result = CliRunner().invoke(main, ["validate", str(tmp_path / BPMN.name), "--config", str(config)])
    out = result.stdout + result.stderr
    assert result.exit_code != 0 and "process.redact" in out and "glob patterns" in out, out


def test_no_secret_reaches_the_model_through_litellm(tmp_path: Path) -> None:
    from click.testing import CliRunner

    from engine.cli import main

    def stub_answer(body: dict[str, Any]) -> Reply:
        return Reply.text(_answer(body))

    env: dict[str, str | None] = {k: None for k in os.environ if k.startswith(("LAYERFLOW_MODEL", "OPENAI"))}
    env["LAYERFLOW_STORE"] = None
    answers = tmp_path / "answers.json"
    answers.write_text(json.dumps(ANSWERS))
    with StubLLM() as stub:
        env["LAYERFLOW_MODEL_API_BASE"] = stub.url
        env["LAYERFLOW_MODEL_API_KEY"] = "test-key"
        # the stub answers in order: the activity, the tier conflict, the review, the condition
        stub.push(Reply.json({"risk": "low"}),
                  Reply.json({"final_value": "standard", "rationale": "the contract", "escalate": False}),
                  Reply.json({"summary": "checked"}), Reply.json({"branch": "grant", "rationale": "low risk"}))
        result = CliRunner(env=env).invoke(main, ["run", str(BPMN), "--data", json.dumps(DATA), "--answers",
                                                  str(answers), "--store", "memory://", "--model",
                                                  "openai/stub-model", "--json"], input="", catch_exceptions=False)
    doc = json.loads(result.stdout)
    assert result.exit_code == 0, (doc, result.stderr)
    assert len(stub.requests) == 4
    assert not [s for s in SECRETS if s in json.dumps(stub.requests)], stub.requests
    assert "[REDACTED]" in json.dumps(stub.requests[0]["messages"])
    assert doc["layers"]["L1"]["api_key"] == API_KEY  # run --json is the audit record
    assert doc["layers"]["L3"]["decision"] == "granted"


def test_a_model_governing_a_waiting_instance_sees_its_open_secret_conflict_redacted(fake_model: Any,
                                                                                      tmp_path: Path) -> None:
    # the join waits for a person on service_password; engine.tools.run_tool_loop's model inspects
    from engine.governance import GovernanceService
    from engine.tools import run_tool_loop
    fake_model(_answer)
    engine = Engine("memory://", model="fake/model")
    instance = engine.run_process(load_process(BPMN), DATA)
    assert instance.status == "waiting", instance.error
    sent: list[dict[str, Any]] = []

    def completion(**kwargs: Any) -> dict[str, Any]:
        sent.append(json.loads(json.dumps(kwargs, default=str)))
        if len(sent) == 1:
            call = {"id": "c1", "type": "function", "function": {"name": "context_inspect", "arguments": "{}"}}
            return {"choices": [{"message": {"role": "assistant", "content": None, "tool_calls": [call]}}]}
        return {"choices": [{"message": {"role": "assistant", "content": "inspected"}}]}

    catalog = tmp_path / "catalog"
    catalog.mkdir()
    result = run_tool_loop(GovernanceService(engine, catalog), instance.id, "fake", completion=completion)
    assert result.status == "done"
    [tool] = [m for m in sent[1]["messages"] if m.get("role") == "tool"]
    [shown] = [c for c in json.loads(tool["content"])["conflicts"] if c["key"] == "service_password"]
    assert set(shown["values"].values()) == {"[REDACTED]"}, shown
    assert not [s for s in SECRETS if s in json.dumps(sent)]
    [call] = result.calls  # the caller's record keeps what the tool gave
    assert "sec-pass-1111" in json.dumps(call["result"])


@pytest.mark.parametrize("value, setting, shown", [
    ({"api_key": "k", "Login": {"PassWord": "p", "user": "u"}}, True,
     {"api_key": "[REDACTED]", "Login": {"PassWord": "[REDACTED]", "user": "u"}}),
    ({"key": "db_password", "values": {"a": "x"}, "resolution": {"value": "x", "resolver": "human",
                                                                   "reason": 'a person chose "x"'}}, True,
     {"key": "db_password", "values": {"a": "[REDACTED]"},
      "resolution": {"value": "[REDACTED]", "resolver": "human", "reason": "[REDACTED]"}}),
    ({"iban": "AT61", "note": f"Bearer {BEARER}"}, ["iban"], {"iban": "[REDACTED]", "note": "Bearer [REDACTED]"}),
    ({"IBAN": "AT61", "api_key": "k"}, ["iban"], {"IBAN": "AT61", "api_key": "[REDACTED]"}),  # extras: case-sensitive
    ({"api_key": "k", "note": f"Bearer {BEARER}"}, False, {"api_key": "k", "note": f"Bearer {BEARER}"}),
])
def test_redact_for_model_is_deterministic_and_idempotent(value: Any, setting: Any, shown: Any) -> None:
    from context_layers.hooks import redact_for_model
    assert redact_for_model(value, setting) == shown
    assert redact_for_model(shown, setting) == shown
