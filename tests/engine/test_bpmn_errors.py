"""Activities that throw BPMN errors (``engine.BpmnError``): a handler, a BPMN script or a model
activity (``llm.onError.throw``) throws an error code at its task, and BPMN decides who catches
it: an error boundary event on the task with that code (before a catch-all one), else an error
event sub-process of the enclosing scope, else an error boundary event of an enclosing
sub-process; nothing catching it, the instance fails naming the task and the code.

What the throwing activity wrote is dropped (its activity is aborted, as a failing one's) and
an ``activity:<id>`` record with status ``error_thrown`` is kept; the catching event's context
gets ``error_code``, ``error_message`` and the payload (under the error's
``spiffworkflow:variableName``, else as its keys). A plain exception still fails the instance."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import engine
from context_layers import Layer, LayeredContext, thaw
from context_layers.errors import ConfigError
from engine import ActivityContext, BpmnError, Engine, Instance, load_process
from engine.validate import validate_process

from engine_helpers import ROOT, path_of, variables

HERE = Path(__file__).resolve().parent / "bpmn_errors"
CHARGE = HERE / "charge.bpmn"
NESTED = HERE / "nested.bpmn"
TRIAGE = HERE / "triage.bpmn"
BATCH = HERE / "batch.bpmn"
ERROR_KEYS = ("error_code", "error_message")


def run(path: Path, data: dict[str, Any], **kw: Any) -> Instance:
    eng = Engine(**kw)
    return eng.run(eng.start(load_process(path), data))


def records(instance: Instance, prefix: str) -> dict[str, Any]:
    return {k: thaw(v) for k, v in instance.main.resolved().items() if k.startswith(prefix)}


def assert_replays(instance: Instance) -> None:
    for ctx in instance.contexts.values():
        again = LayeredContext.replay(ctx.tape)
        assert again == ctx
        assert json.dumps({str(x): thaw(dict(again.layer(x).items())) for x in Layer}, sort_keys=True) == \
            json.dumps({str(x): thaw(dict(ctx.layer(x).items())) for x in Layer}, sort_keys=True)


# ----- a BPMN script throws at its task ------------------------------------------------------------

def test_the_boundary_event_of_the_thrown_code_catches_it_before_the_catch_all() -> None:
    instance = run(CHARGE, {"amount": 40, "code": "card_declined"})

    assert instance.status == "completed", instance.error
    assert path_of(instance.workflow) == ["start", "prepare", "declined", "notify", "end_declined"]
    # the script's writes are dropped (charged_amount); the payload sits under the error's variable
    assert variables(instance.main) == {
        "amount": 40, "code": "card_declined", "attempt": 1,
        "decline": {"reason": "insufficient funds", "tried": 40},
        "error_code": "card_declined", "error_message": "the bank said no",
        "outcome": "notified: card_declined / insufficient funds"}
    thrown = instance.main.resolve("activity:charge_card")
    assert (thrown["status"], thrown["error_code"], thrown["error_message"], thaw(thrown["caught_by"])) == \
        ("error_thrown", "card_declined", "the bank said no", ["declined"])
    assert thaw(thrown["keys"]) == []
    caught = instance.main.resolve("event:declined")
    assert (caught["event_kind"], caught["event"], caught["sent_by"]) == ("error", "Card declined", "process")
    aborts = [e for e in instance.main.tape if e.kind.value == "abort" and e.activity == "charge_card"]
    assert len(aborts) == 1 and "card_declined" in aborts[0].data["reason"]
    assert_replays(instance)


def test_any_other_code_takes_the_catch_all_path_to_a_person_with_the_payload_as_keys() -> None:
    eng = Engine()
    waiting = eng.run(eng.start(load_process(CHARGE), {"amount": 40, "code": "bank_down"}))

    assert waiting.status == "waiting", waiting.error
    assert [w["task_id"] for w in waiting.waiting_for] == ["review"]
    assert {k: variables(waiting.main)[k] for k in ("reason", "tried", *ERROR_KEYS)} == {
        "reason": "insufficient funds", "tried": 40, "error_code": "bank_down", "error_message": "the bank said no"}
    done = eng.complete_user_task(waiting, waiting.waiting_for[0]["id"], {"decision": "retry tomorrow"})
    assert done.status == "completed", done.error
    assert variables(done.main)["outcome"] == "review: bank_down / retry tomorrow"
    assert "charged_amount" not in done.main


def test_no_error_no_boundary_path() -> None:
    instance = run(CHARGE, {"amount": 40, "code": ""})
    assert instance.status == "completed"
    assert path_of(instance.workflow)[-2:] == ["done", "end_ok"]
    assert instance.main.resolve("activity:charge_card")["status"] == "completed"
    assert "error_code" not in instance.main


# ----- a Python handler throws ---------------------------------------------------------------------

def test_a_handler_throws_and_a_plain_exception_still_fails_the_instance_and_resume_retries() -> None:
    calls: list[str] = []

    def charge(ctx: ActivityContext) -> dict[str, Any]:
        calls.append(ctx.task_id)
        ctx.write(Layer.WORKING, "half_done", True)
        if len(calls) == 1:
            raise RuntimeError("connection reset")  # no BPMN error: the catch-all does not fire
        raise BpmnError("card_declined", payload={"reason": "stolen card"})

    eng = Engine(handlers={"charge_card": charge})
    failed = eng.run(eng.start(load_process(CHARGE), {"amount": 5, "code": ""}))
    assert failed.status == "error" and failed.error is not None
    assert failed.error["task_id"] == "charge_card" and "connection reset" in failed.error["message"]
    assert "error_code" not in failed.error
    assert "any_error" not in path_of(failed.workflow)

    resumed = eng.resume(failed)
    assert len(calls) == 2
    assert resumed.status == "completed", resumed.error
    assert path_of(resumed.workflow)[-3:] == ["declined", "notify", "end_declined"]
    assert variables(resumed.main)["decline"] == {"reason": "stolen card"}
    assert variables(resumed.main)["error_message"] is None
    assert "half_done" not in resumed.main


def test_bpmn_error_arguments_are_checked() -> None:
    with pytest.raises(TypeError, match="non-empty string"):
        BpmnError("")
    with pytest.raises(TypeError, match="JSON object"):
        BpmnError("x", payload=["not", "an", "object"])  # type: ignore[arg-type]
    assert "BpmnError" in engine.__all__ and engine.BpmnError is BpmnError
    err = BpmnError(" late ", "too late", {"n": 1})
    assert (err.code, err.message, err.payload, str(err)) == ("late", "too late", {"n": 1}, "BPMN error 'late': too late")


# ----- no boundary on the task: the scope's event sub-process, the sub-process's boundary ----------

@pytest.mark.parametrize(("code", "path_end", "expected"), [
    # pay's own boundary event: the branch goes on, and joins with the other
    ("soft", ["pay_soft", "pay_later", "paid_merge", "join", "fulfil_end", "fulfil", "ship", "end"],
     {"packed": True, "pay_ref": "P-9", "payment": "later P-9", "shipped": True}),
    # the error event sub-process of the sub-process: the rest of the sub-process is interrupted
    ("fraud", ["fraud_start", "block", "fraud_end", "on_fraud", "fulfil", "ship", "end"],
     {"pay_ref": "P-9", "blocked": "fraud P-9", "shipped": True}),
    # the error boundary event of the sub-process: the sub-process is cancelled, the refund path runs
    ("hard", ["fulfil_hard", "refund", "end_refund"],
     {"pay_ref": "P-9", "refunded": "payment failed: hard"}),
])
def test_an_error_with_no_boundary_on_its_task_goes_up_as_bpmn_says(code: str, path_end: list[str],
                                                                     expected: dict[str, Any]) -> None:
    instance = run(NESTED, {"code": code})

    assert instance.status == "completed", instance.error
    assert path_of(instance.workflow)[-len(path_end):] == path_end
    got = variables(instance.main)
    assert got.pop("error_code") == code and got.pop("error_message") == f"payment failed: {code}"
    assert got == {"code": code, **expected}
    assert "paid" not in instance.main  # the throwing script's write is dropped
    assert_replays(instance)


@pytest.mark.parametrize("code", ["fraud", "hard"])
def test_a_thrown_error_leaves_the_branches_as_an_error_end_event_there_does(code: str, tmp_path: Path) -> None:
    """The same process with an error end event after ``pay`` instead of its raise: the contexts
    end the same (the other parallel branch dropped), but for what only the throw carries."""
    src = NESTED.read_text(encoding="utf-8")
    script = src[src.index('<bpmn:script>paid = True'):src.index("</bpmn:script>", src.index("paid = True"))]
    variant = src.replace(script, "<bpmn:script>paid = True").replace(
        '<bpmn:sequenceFlow id="s4" sourceRef="pay" targetRef="paid_merge"/>',
        f'<bpmn:sequenceFlow id="s4" sourceRef="pay" targetRef="boom"/><bpmn:endEvent id="boom">'
        f'<bpmn:errorEventDefinition errorRef="err_{code}"/></bpmn:endEvent>')
    if code == "fraud":
        variant = variant.replace('blocked = error_code + " " + pay_ref', 'blocked = "fraud P-9"')
    else:
        variant = variant.replace("refunded = error_message", 'refunded = "payment failed: hard"')
    path = tmp_path / "nested_end_event.bpmn"
    path.write_text(variant, encoding="utf-8")
    by_end_event = run(path, {"code": code})
    thrown = run(NESTED, {"code": code})

    assert by_end_event.status == thrown.status == "completed"
    ours = variables(thrown.main)
    for key in (*ERROR_KEYS, "pay_ref"):
        ours.pop(key)
    theirs = variables(by_end_event.main)
    assert theirs.pop("paid") is True  # the end event came after pay completed
    assert ours == theirs
    assert sorted(i["status"] for i in thrown.branches.values()) == \
        sorted(i["status"] for i in by_end_event.branches.values())


def test_an_error_nothing_catches_fails_the_instance_naming_task_and_code() -> None:
    eng = Engine()
    instance = eng.run(eng.start(load_process(NESTED), {"code": "lost"}))

    assert instance.status == "error"
    assert instance.error is not None
    assert instance.error["task_id"] == "pay" and instance.error["error_code"] == "lost"
    message = instance.error["message"]
    assert "activity 'pay' threw BPMN error 'lost'" in message and "nothing catches it" in message
    assert 'errorCode="lost"' in message
    # no error_thrown record (it was thrown nowhere); the activity aborted, as a failing one
    assert not any(k.startswith("activity:pay") for ctx in instance.contexts.values() for k in ctx.resolved())
    aborts = sum(1 for ctx in instance.contexts.values() for e in ctx.tape
                 if e.kind.value == "abort" and e.activity == "pay")
    assert aborts == 1

    again = eng.resume(instance)  # resume runs the activity again: it throws again
    assert again.status == "error" and again.error is not None and again.error["error_code"] == "lost"
    assert sum(1 for ctx in again.contexts.values() for e in ctx.tape
               if e.kind.value == "abort" and e.activity == "pay") == 2


# ----- multi-instance ------------------------------------------------------------------------------

@pytest.mark.parametrize("sequential", [False, True])
def test_an_instance_that_throws_ends_its_multi_instance_activity(sequential: bool, tmp_path: Path) -> None:
    path = tmp_path / "batch.bpmn"
    path.write_text(BATCH.read_text(encoding="utf-8").replace('isSequential="false"',
                                                              f'isSequential="{str(sequential).lower()}"'))
    ok = run(path, {"items": ["a", "b"]})
    assert ok.status == "completed" and variables(ok.main)["checked"] == ["A", "B"]

    bad = run(path, {"items": ["a", "bad", "c"]})
    assert bad.status == "completed", bad.error
    assert path_of(bad.workflow)[-3:] == ["on_bad", "report", "end_bad"]
    assert variables(bad.main) == {"items": ["a", "bad", "c"], "bad": "bad", "error_code": "bad_item",
                                   "error_message": "item rejected", "report": "rejected bad"}
    assert bad.main.resolve("activity:check")["status"] == "error_thrown"
    assert_replays(bad)


# ----- a model activity: llm.onError.throw ---------------------------------------------------------

@pytest.fixture
def stub(monkeypatch: pytest.MonkeyPatch) -> Any:
    from stub_llm import StubLLM

    with StubLLM() as server:
        monkeypatch.setenv("LAYERFLOW_MODEL_API_KEY", "test-key")
        monkeypatch.setenv("LAYERFLOW_MODEL_API_BASE", server.url)
        yield server


def test_a_failing_model_throws_the_configured_error_and_a_person_takes_over(stub: Any) -> None:
    from stub_llm import Reply

    stub.push(Reply.error(500))
    eng = Engine()
    waiting = eng.run(eng.start(load_process(TRIAGE), {"ticket": "printer on fire"}))

    assert waiting.status == "waiting", waiting.error
    assert [w["task_id"] for w in waiting.waiting_for] == ["human_review"]
    got = variables(waiting.main)
    assert got["error_code"] == "model_failed" and "stub failure" in got["error_message"]
    assert (got["failed_model"], got["model_attempts"]) == ("openai/stub-model", 1)
    assert waiting.main.resolve("activity:classify")["status"] == "error_thrown"
    (fallback,) = waiting.to_document()["model_fallbacks"]  # the run went on without the model: said so
    assert (fallback["element_id"], fallback["purpose"], fallback["fallback"]) == (
        "classify", "activity", "BPMN error 'model_failed' thrown")
    assert "stub failure" in fallback["error"]
    done = eng.complete_user_task(waiting, waiting.waiting_for[0]["id"], {"category": "hardware"})
    assert done.status == "completed" and variables(done.main)["category"] == "hardware"

    stub.push(Reply.json({"category": "billing"}))
    answered = eng.run(eng.start(load_process(TRIAGE), {"ticket": "double charge"}))
    assert answered.status == "completed" and variables(answered.main)["routed_to"] == "billing"


def test_without_on_error_a_failing_model_fails_the_instance(stub: Any, tmp_path: Path) -> None:
    from stub_llm import Reply

    (tmp_path / "triage.bpmn").write_text(TRIAGE.read_text(encoding="utf-8"), encoding="utf-8")
    config = (HERE / "triage.layerflow.yaml").read_text(encoding="utf-8").replace("    onError: {throw: model_failed}\n", "")
    (tmp_path / "triage.layerflow.yaml").write_text(config, encoding="utf-8")
    stub.push(Reply.error(500))
    failed = run(tmp_path / "triage.bpmn", {"ticket": "x"})
    assert failed.status == "error" and failed.error is not None
    assert failed.error["task_id"] == "classify" and "human_review" not in path_of(failed.workflow)


@pytest.mark.parametrize(("on_error", "field"), [
    ("{throw: ''}", "throw"),
    ("{thorw: model_failed}", "thorw"),
    ("model_failed", "onError"),
])
def test_on_error_is_validated(tmp_path: Path, on_error: str, field: str) -> None:
    (tmp_path / "triage.bpmn").write_text(TRIAGE.read_text(encoding="utf-8"), encoding="utf-8")
    config = (HERE / "triage.layerflow.yaml").read_text(encoding="utf-8").replace(
        "onError: {throw: model_failed}", f"onError: {on_error}")
    (tmp_path / "triage.layerflow.yaml").write_text(config, encoding="utf-8")
    with pytest.raises(ConfigError) as info:
        load_process(tmp_path / "triage.bpmn")
    assert "classify" in str(info.value) and field in str(info.value)


# ----- validate ------------------------------------------------------------------------------------

def test_validate_reports_an_error_boundary_naming_an_unknown_error(tmp_path: Path) -> None:
    assert validate_process(CHARGE).ok and validate_process(NESTED).ok
    path = tmp_path / "charge.bpmn"
    path.write_text(CHARGE.read_text(encoding="utf-8").replace(
        '<bpmn:errorEventDefinition errorRef="err_declined">', '<bpmn:errorEventDefinition errorRef="err_typo">'))
    report = validate_process(path)
    assert not report.ok
    assert [p.element_id for p in report.problems if p.code == "event_ref_unknown"] == ["declined"]


# ----- CLI, save and resume in another process, replay ---------------------------------------------

def _cli(*args: str, store: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    return subprocess.run([sys.executable, "-m", "engine.cli", *args, "--store", store], capture_output=True,
                          text=True, cwd=ROOT, env=env, timeout=180, stdin=subprocess.DEVNULL)


def test_cli_run_json_takes_the_boundary_path_and_resumes_in_another_process(tmp_path: Path) -> None:
    store = f"sqlite:///{tmp_path / 'errors.db'}"
    declined = _cli("run", str(CHARGE), "--data", '{"amount": 7, "code": "card_declined"}', "--json", store=store)
    assert declined.returncode == 0, declined.stderr
    doc = json.loads(declined.stdout)
    assert doc["status"] == "completed" and doc["error"] is None
    assert doc["layers"]["L3"]["error_code"] == "card_declined"
    assert doc["layers"]["L3"]["activity:charge_card"]["status"] == "error_thrown"

    waiting = _cli("run", str(CHARGE), "--data", '{"amount": 7, "code": "bank_down"}', "--json", store=store)
    assert waiting.returncode == 3, waiting.stderr
    iid = json.loads(waiting.stdout)["instance_id"]
    resumed = _cli("resume", iid, "--answer", 'review={"decision": "call the bank"}', "--json", store=store)
    assert resumed.returncode == 0, resumed.stderr
    after = json.loads(resumed.stdout)

    eng = Engine()
    here = eng.run(eng.start(load_process(CHARGE), {"amount": 7, "code": "bank_down"}))
    here = eng.complete_user_task(here, here.waiting_for[0]["id"], {"decision": "call the bank"})
    assert after["status"] == here.status == "completed"
    assert {k: v for k, v in after["layers"]["L3"].items() if not k.startswith(("activity:", "event:"))} == \
        {k: v for k, v in variables(here.main).items() if k not in after["layers"]["L1"]}
    assert after["layers"]["L3"]["outcome"] == "review: bank_down / call the bank"

    loaded = Engine(store).load(iid)
    assert path_of(loaded.workflow) == path_of(here.workflow)
    assert_replays(loaded)

    uncaught = _cli("run", str(NESTED), "--data", '{"code": "lost"}', "--json", store=store)
    assert uncaught.returncode == 1
    error = json.loads(uncaught.stdout)["error"]
    assert error["task_id"] == "pay" and error["error_code"] == "lost" and "nothing catches it" in error["message"]


# ----- the README's section ------------------------------------------------------------------------

def test_the_readme_section_examples_hold() -> None:
    import re

    import yaml

    from context_layers.config import ActivityExtensionConfig
    from engine.handlers import HandlerRegistry

    text = (ROOT / "README.md").read_text(encoding="utf-8")
    section = text[text.index("## Activities that throw BPMN errors"):]
    section = section[:section.index("\n## ", 1)]
    code = re.search(r"```python\n(.*?)```", section, re.S)
    config = re.search(r"```yaml\n(.*?)```", section, re.S)
    assert code and config
    registry = HandlerRegistry()
    namespace: dict[str, Any] = {}
    exec(code.group(1).replace('@activity("charge_card")', '@activity("charge_card", registry=registry)'),
         {"registry": registry, **namespace})
    handler = registry.get("charge_card")
    assert handler is not None

    eng = Engine(handlers={"charge_card": handler})
    declined = eng.run(eng.start(load_process(CHARGE), {"amount": 3, "code": "", "card_blocked": True}))
    assert declined.status == "completed" and variables(declined.main)["decline"] == {"reason": "blocked card"}
    charged = eng.run(eng.start(load_process(CHARGE), {"amount": 3, "code": ""}))
    assert variables(charged.main)["outcome"] == "charged R-1"

    llm = ActivityExtensionConfig.model_validate(yaml.safe_load(config.group(1))["classify"]).llm
    assert llm is not None and llm.on_error is not None and llm.on_error.throw == "model_failed"


@pytest.mark.parametrize("items", [["bad", "a", "c"], ["a", "c", "bad"]])
def test_an_instance_error_caught_by_the_sub_process_around_ends_the_other_instances(items: list[str],
                                                                                    tmp_path: Path) -> None:
    """The check runs inside sub-process "wrap", whose boundary event catches the error: the
    instances still to run when one throws run no more (their activity is over)."""
    src = BATCH.read_text(encoding="utf-8")
    start = src.index('    <bpmn:scriptTask id="check">')
    end = src.index("</bpmn:scriptTask>", start) + len("</bpmn:scriptTask>")
    src = (src[:start] + '<bpmn:subProcess id="wrap"><bpmn:startEvent id="w_start"/>' + src[start:end]
           + '<bpmn:endEvent id="w_end"/><bpmn:sequenceFlow id="w1" sourceRef="w_start" targetRef="check"/>'
           '<bpmn:sequenceFlow id="w2" sourceRef="check" targetRef="w_end"/></bpmn:subProcess>' + src[end:])
    src = (src.replace('attachedToRef="check"', 'attachedToRef="wrap"')
           .replace('sourceRef="start" targetRef="check"', 'sourceRef="start" targetRef="wrap"')
           .replace('sourceRef="check" targetRef="total"', 'sourceRef="wrap" targetRef="total"'))
    path = tmp_path / "wrapped.bpmn"
    path.write_text(src, encoding="utf-8")
    instance = run(path, {"items": items})

    assert instance.status == "completed", instance.error
    assert path_of(instance.workflow)[-3:] == ["on_bad", "report", "end_bad"]
    assert variables(instance.main) == {"items": items, "bad": "bad", "error_code": "bad_item",
                                        "error_message": "item rejected", "report": "rejected bad"}
    assert_replays(instance)


def test_an_error_thrown_in_a_called_process_reaches_the_call_activity_boundary() -> None:
    eng = Engine()
    instance = eng.run(eng.start(load_process(HERE / "call.bpmn", process_id="main"), {}))

    assert instance.status == "completed", instance.error
    assert path_of(instance.workflow)[-3:] == ["on_x", "after_x", "end_x"]
    assert variables(instance.main) == {"error_code": "x", "error_message": "deep", "handled": "x"}


def test_a_connector_throws_through_the_handler_of_its_operator() -> None:
    def transfer(ctx: ActivityContext) -> dict[str, Any]:
        if ctx.params["iban"].startswith("XX"):
            raise BpmnError("iban_rejected", payload={"iban_checked": ctx.params["iban"]})
        return {"ok": True}

    eng = Engine(handlers={"bank/Transfer": transfer})
    rejected = eng.run(eng.start(load_process(HERE / "connector.bpmn"), {"iban": "XX00"}))
    assert rejected.status == "completed", rejected.error
    assert variables(rejected.main)["route"] == "manual: iban_rejected XX00"
    assert "transfer_result" not in rejected.main
    sent = eng.run(eng.start(load_process(HERE / "connector.bpmn"), {"iban": "DE00"}))
    assert sent.status == "completed" and variables(sent.main)["transfer_result"] == {"ok": True}
