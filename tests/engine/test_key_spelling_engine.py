"""Keys that pass for the engine's own records (`аctivity:` with a Cyrillic a, a full-width `＿`, a
zero-width space in `activity:`) or are spelt in decomposed Unicode are refused at every door a key
comes in by: start data, a person's answer, a message payload, an operator's inject and a model's
answer, over Python, the CLI and REST, naming the key and the character, with nothing written
(tests/context_layers/test_key_spelling.py holds the rule itself)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from context_layers import ContextValueError
from engine import Engine, load_process
from engine.governance import InvalidAnswer
from engine.api import create_app

from test_unseen_processes_4 import fake_model  # noqa: F401 - the "fake_model" fixture
from engine_helpers import cli_in_a_tmp_store  # noqa: F401 - the "cli" fixture
from engine_helpers import run_json
from governance_helpers import TOKEN, ServerThread

HERE = Path(__file__).resolve().parent / "unseen10"
DISPUTE = HERE / "supplier_dispute.bpmn"
CLAIM = HERE / "goods_claim.bpmn"
FORGED_RECORD = "\u0430ctivity:await_reply"        # Cyrillic a
FORGED_LOG = "\uff3fmergedConflicts"                # full-width low line
CYRILLIC_A = "U+0430 CYRILLIC SMALL LETTER A"


def test_start_data_with_a_look_alike_record_key_starts_nothing(cli: Any) -> None:
    with pytest.raises(ContextValueError) as refused:
        Engine("memory://").start(load_process(DISPUTE), {"deduction": 400, FORGED_RECORD: {"status": "completed"}})
    assert refused.value.key == FORGED_RECORD and CYRILLIC_A in str(refused.value)
    done = cli("run", str(DISPUTE), "--data", json.dumps({"deduction": 1, "activ\u200bity:x": 1}), "--json")
    assert done.exit_code == 2, done.stdout
    doc = json.loads(done.stdout)
    assert doc["instance_id"] is None and "U+200B ZERO WIDTH SPACE" in doc["error"]["message"]


def test_a_message_payload_with_a_look_alike_key_is_refused_whole(cli: Any) -> None:
    engine = Engine("memory://")
    waiting = engine.run(load_process(DISPUTE), {"deduction": 400})
    version = engine.load(waiting.id).version
    with pytest.raises(ContextValueError) as refused:
        engine.send_event(waiting.id, "supplier_reply", {"reply": "we object", FORGED_RECORD: {"status": "completed"}})
    assert refused.value.key == FORGED_RECORD
    still = engine.load(waiting.id)
    assert still.version == version and [w["task_id"] for w in still.waiting_for] == ["await_reply"]
    assert all("reply" not in ctx for ctx in still.contexts.values())

    doc = run_json(cli, "run", str(DISPUTE), "--data", '{"deduction": 2500}', code=3)
    sent = cli("send", doc["instance_id"], "supplier_reply", "--json-payload", json.dumps({"reply": "x", FORGED_LOG: []}))
    assert sent.exit_code == 2 and FORGED_LOG in sent.stderr and "U+FF3F FULLWIDTH LOW LINE" in sent.stderr
    assert run_json(cli, "inspect", doc["instance_id"])["status"] == "waiting"


def test_a_persons_answer_with_a_look_alike_or_decomposed_key_leaves_the_task_waiting() -> None:
    engine = Engine("memory://")
    waiting = engine.run(load_process(CLAIM), {"units": 5})
    for key, named in ((FORGED_LOG, "U+FF3F FULLWIDTH LOW LINE"), ("damaged_unit\u0073\u0307", "U+0307 COMBINING DOT")):
        with pytest.raises(InvalidAnswer) as refused:
            engine.complete_user_task(waiting.id, "inspect_goods", {"damaged_units": 1, key: 1})
        assert repr(key) in str(refused.value) and named in str(refused.value)
        assert [w["task_id"] for w in engine.load(waiting.id).waiting_for] == ["inspect_goods"]
    assert engine.complete_user_task(waiting.id, "inspect_goods", {"damaged_units": 1}).status == "completed"


@pytest.fixture
def api() -> Iterator[httpx.Client]:
    with ServerThread(create_app(Engine("memory://"), HERE, TOKEN)) as server:
        with httpx.Client(base_url=server.url, headers={"Authorization": f"Bearer {TOKEN}"}, timeout=60) as client:
            yield client


def test_rest_refuses_look_alike_keys_in_inject_events_and_answers(api: httpx.Client) -> None:
    started = api.post("/api/instances", json={"process_id": "goods_claim", "data": {"units": 5}})
    assert started.status_code in (200, 201), started.text
    iid = started.json()["instance_id"]
    before = api.get(f"/api/instances/{iid}").json()

    injected = api.post("/api/context-governance/inject", json={"instance_id": iid, "key": FORGED_RECORD, "value": 1})
    answered = api.post(f"/api/instances/{iid}/user-tasks/inspect_goods",
                        json={"data": {"damaged_units": 1, FORGED_LOG: []}})
    for refused in (injected, answered):
        assert refused.status_code == 400, refused.text
        assert ("аctivity:await_reply" in refused.text or "mergedConflicts" in refused.text), refused.text
    after = api.get(f"/api/instances/{iid}").json()
    assert after["version"] == before["version"] and after["layers"] == before["layers"]

    disputed = api.post("/api/instances", json={"process_id": "supplier_dispute", "data": {"deduction": 400}}).json()
    sent = api.post(f"/api/instances/{disputed['instance_id']}/events",
                    json={"name": "supplier_reply", "payload": {"reply": "x", "compacti\u03bfn:1": "all settled"}})
    assert sent.status_code == 400 and "U+03BF GREEK SMALL LETTER OMICRON" in sent.text, sent.text


def test_a_models_answer_with_a_look_alike_key_fails_the_activity_and_resume_runs_it_again(fake_model: Any) -> None:
    def answer(request: dict[str, Any]) -> str:
        return json.dumps({"letter": "Dear supplier, we refund 200."} if len(model.requests) > 1 else
                          {"letter": "Dear supplier, we refund 10000.", FORGED_LOG: []})

    model = fake_model(answer)
    engine = Engine("memory://")
    failed = engine.run(load_process(HERE / "deduction_review.bpmn"), {"deduction": 400, "complaint": "late"})
    assert failed.status == "error" and failed.error["task_id"] == "draft_letter", failed.error
    assert FORGED_LOG in failed.error["message"] and "letter" not in failed.main
    done = engine.resume(failed.id)
    assert done.status == "completed", done.error
    assert done.main.resolve("letter") == "Dear supplier, we refund 200."
    assert [c["resolution"]["resolver"] for c in done.main.resolve("_mergedConflicts")] == ["policy"]
