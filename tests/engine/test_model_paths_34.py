"""Round 34 on the model path: what the model is sent is deterministic, cache-friendly and keeps
secrets hidden, measured on a process of its own (the rendering itself: tests/context_layers/
test_render_34.py).

expense_audit (tests/engine/model34/): ``intake`` (a script; the vendor portal's login and a database
password among its data) -> ``classify`` (model) -> ``review`` (a person) -> ``receipts`` (a message
with a payload) -> ``audit`` (model; HISTORY is compressed after it, by the model's summary) ->
``legal_check`` | ``finance_check`` (models, in parallel) -> ``decide`` (model).

* a person's answer, a message's payload and an operator's inject are JSON objects, which have no key
  order: the same object in another key order sends the same bytes to every later model call (the
  start data and a model's answer already did);
* between consecutive calls the earlier request's head (its system message, and its user message up
  to the end of HISTORY) is a prefix of the later one, across the person's step, the message, the
  split and the join; only the compression after ``audit`` (a cliff) moves it, once;
* a summary the model could not give is made offline from the folded entries as ``name: value`` text:
  the secrets of those entries are in that text now, under no secret key, and must not reach the next
  model's request (nor a tool's result) any more than the entries themselves did;
* what the model is asked to summarize holds no secret either: a ``summarize`` rule's text of one entry
  is its value alone (``db_password``'s is just the password), and a line may name a secret field first
  (``erp: api_key: ...``).
"""

from __future__ import annotations

import json
import types
from pathlib import Path
from typing import Any

import pytest

import engine.llm
from context_layers.hooks import REDACTED
from engine import Engine, load_process

HERE = Path(__file__).resolve().parent / "model34"
PROCESS = HERE / "expense_audit.bpmn"
SECRETS = ("hunter2-vendor-portal", "hunter2-ledger-db", "hunter2-erp-key")
START = {"employee": "E-7", "amount": 420.5, "currency": "EUR", "trip": {"from": "Paris", "to": "Nice"}}
ANSWERS = {"classify": {"category": "travel", "class_note": "a trip"}, "audit": {"audit_note": "receipts match"},
           "legal_check": {"legal_ok": True}, "finance_check": {"finance_ok": True}, "decide": {"decision": "pay"}}


class Model:
    """Deterministic: an activity's answer by the task its request ends with; a summary request
    (``<entries>`` at the end) gets ``summary``: empty (the default), the compressor makes it offline."""

    def __init__(self) -> None:
        self.requests: list[list[dict[str, Any]]] = []
        self.summary = ""

    def completion(self, **kwargs: Any) -> dict[str, Any]:
        messages = [{"role": m["role"], "content": m["content"]} for m in kwargs["messages"]]
        self.requests.append(messages)
        last = messages[-1]["content"]
        if "<entries><![CDATA[" in last:
            content = self.summary
        else:
            task = last[last.rindex('<task activity="') + len('<task activity="'):]
            content = json.dumps(ANSWERS[task[:task.index('"')]])
        return {"id": f"fake-{len(self.requests)}", "choices": [{"message": {"content": content},
                                                                  "finish_reason": "stop"}]}

    def activity_requests(self) -> list[list[dict[str, Any]]]:
        return [r for r in self.requests if "<entries><![CDATA[" not in r[-1]["content"]]


@pytest.fixture
def model(monkeypatch: pytest.MonkeyPatch) -> Model:
    monkeypatch.setenv("LAYERFLOW_MODEL_API_KEY", "test-key")
    fake = Model()
    monkeypatch.setattr(engine.llm, "load_litellm", lambda: types.SimpleNamespace(completion=fake.completion))
    return fake


def _run(model: Model, *, answer: dict[str, Any], payload: dict[str, Any], inject: dict[str, Any] | None = None,
         start: dict[str, Any] = START) -> Any:
    model.requests.clear()
    eng = Engine("memory://", model="fake/model")
    inst = eng.run_process(load_process(PROCESS), start)
    assert inst.status == "waiting", inst.error
    if inject is not None:
        inst = eng.inject(inst, inject)
    inst = eng.complete_user_task(inst, "review", answer)
    assert inst.status == "waiting", inst.error
    inst = eng.send_event(inst, "receipts_received", payload)
    assert inst.status == "completed", inst.error
    return inst


ANSWER = {"reviewer": "ann", "comment": "looks fine", "approved": True, "checks": {"b": 1, "a": [2, 3]}}
PAYLOAD = {"files": ["taxi.pdf", "hotel.pdf"], "count": 2, "received_by": "mailroom"}
INJECT = {"cost_center": "CC-42", "budget_line": "travel"}


def _reordered(value: dict[str, Any]) -> dict[str, Any]:
    return {k: _reordered(v) if isinstance(v, dict) else v for k, v in reversed(list(value.items()))}


@pytest.mark.parametrize("what", ["answer", "payload", "inject"])
def test_a_persons_answer_a_payload_and_an_inject_in_any_key_order_send_the_same_bytes(model: Model,
                                                                                        what: str) -> None:
    _run(model, answer=ANSWER, payload=PAYLOAD, inject=INJECT)
    first = model.requests[:]
    given = {"answer": ANSWER, "payload": PAYLOAD, "inject": INJECT}
    given[what] = _reordered(given[what])
    _run(model, answer=given["answer"], payload=given["payload"], inject=given["inject"], start=_reordered(START))
    assert len(model.requests) == len(first)
    for n, (a, b) in enumerate(zip(first, model.requests)):
        assert a == b, f"request {n} differs when the {what}'s keys come in another order"


def _head(messages: list[dict[str, Any]]) -> str:
    user = messages[1]["content"]
    return messages[0]["content"] + "\x00" + user[:user.index("\n</history>")]


def test_each_request_starts_with_the_previous_ones_head_but_across_the_compression(model: Model) -> None:
    inst = _run(model, answer=ANSWER, payload=PAYLOAD)
    requests = model.activity_requests()
    assert [r[-1]["content"].rsplit('<task activity="', 1)[1].split('"')[0] for r in requests] == \
        ["classify", "audit", "legal_check", "finance_check", "decide"]
    texts = [r[0]["content"] + "\x00" + r[1]["content"] for r in requests]
    # the compression after `audit` is the one cliff: every other request starts with the previous head
    compressed = [c["activity_id"] for c in inst.to_document()["compressions"]]
    assert compressed == ["audit"]
    for n in range(1, len(requests)):
        if n == 2:  # legal_check: the first request after the compression
            assert requests[n][0] == requests[n - 1][0], "the system message stays across the cliff"
            continue
        assert texts[n].startswith(_head(requests[n - 1])), f"request {n} does not start with request {n - 1}'s head"
    # and between the cliff and the end HISTORY only grows: decide's starts with legal_check's head
    assert texts[4].startswith(_head(requests[2]))


def test_a_summary_made_offline_keeps_the_folded_secrets_out_of_the_next_request(model: Model) -> None:
    inst = _run(model, answer=ANSWER, payload=PAYLOAD)
    fallbacks = [f["purpose"] for f in inst.to_document().get("model_fallbacks", [])]
    assert "compression_summary" in fallbacks  # the summary was made offline, from the folded entries
    summary = next(v for k, v in inst.main.layer(3).items() if k.startswith("compaction:"))["summary"]
    assert any(s in summary for s in SECRETS)  # the context keeps the audit record as it was written
    later = model.activity_requests()[2:]
    assert later
    for messages in later:
        text = json.dumps(messages, ensure_ascii=False)
        assert not [s for s in SECRETS if s in text], "a folded secret reached the model"
        assert f"db_password: {REDACTED}" in text


def test_the_text_a_model_summarizes_hides_a_secret_field_named_first_in_its_line(model: Model) -> None:
    model.summary = "Travel claim of E-7; receipts listed; vendor ACME Travel."
    inst = _run(model, answer=ANSWER, payload=PAYLOAD)
    assert not inst.to_document().get("model_fallbacks")
    summaries = [r[-1]["content"] for r in model.requests if "<entries><![CDATA[" in r[-1]["content"]]
    # ``erp: api_key: ...; host: ...``: the secret is the first field, inside the line of its key
    assert any("erp: api_key: [REDACTED]; host: erp.example.com" in text for text in summaries)
    assert not [s for r in model.requests for s in SECRETS if s in json.dumps(r, ensure_ascii=False)]


def test_a_model_is_not_asked_to_summarize_an_entry_no_summary_can_make_smaller(model: Model) -> None:
    # `summarize: "*"` matches every entry; one is replaced only by fewer tokens, and a flag, a count or a
    # word never is: each of those calls sent the whole request as its prefix for nothing
    model.summary = "Travel claim of E-7; receipts listed; vendor ACME Travel."
    _run(model, answer=ANSWER, payload=PAYLOAD)
    asked = [r[-1]["content"].split("<entries><![CDATA[", 1)[1][:-len("]]></entries>")] for r in model.requests
             if "<entries><![CDATA[" in r[-1]["content"]]
    assert asked, "the long entries are still summarized by the model"
    assert not [text for text in asked if text in ("2", "true", "travel", "a trip", "ann", "looks fine", "mailroom")]
    assert any(text.startswith("Line 0: taxi at Paris") for text in asked)
