"""User task forms as modelers declare them (Camunda 7 formData, SpiffArena JSON Schema, Camunda 8
form keys): shown in ``waiting_for``, answers checked against them on every path (CLI, Python,
REST), declarations checked by ``validate``."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import httpx
import pytest
from click.testing import CliRunner

from engine import Engine, FormAnswerInvalid, load_process
from engine.api import create_app
from engine.cli import main

from governance_helpers import TOKEN, ServerThread

FORMS = Path(__file__).resolve().parent / "fixtures" / "forms"
CAMUNDA = "camunda_approval.bpmn"
SPIFF = "expense_request.bpmn"
ZEEBE = "zeebe_review.bpmn"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


@pytest.fixture
def forms_dir(tmp_path: Path) -> Path:
    target = tmp_path / "forms"
    shutil.copytree(FORMS, target)
    return target


@pytest.fixture
def cli(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("LAYERFLOW_STORE", f"sqlite:///{tmp_path / 'forms.db'}")
    runner = CliRunner()

    def invoke(*args: str):
        return runner.invoke(main, list(args), catch_exceptions=False)
    return invoke


def _doc(result) -> dict:
    return json.loads(result.stdout)


def _item(doc: dict) -> dict:
    (item,) = [w for w in doc["waiting_for"] if w["kind"] == "user_task"]
    return item


def test_waiting_items_carry_the_camunda_form(cli, forms_dir: Path) -> None:
    result = cli("run", str(forms_dir / CAMUNDA), "--json")
    assert result.exit_code == 3, result.stderr
    item = _item(_doc(result))
    assert item["documentation"] == "Check the invoice against the order."  # existing fields kept
    assert item["form"] == {"source": "camunda:formData", "fields": [
        {"id": "approved", "label": "Approve?", "type": "boolean", "required": True, "default": False},
        {"id": "amount", "label": "Amount", "type": "long", "required": True, "default": None, "min": 1, "max": 100000},
        {"id": "cost_center", "label": "Cost center", "type": "enum", "required": False, "default": "ops",
         "options": [{"id": "ops", "name": "Operations"}, {"id": "sales", "name": "Sales"}]},
        {"id": "comment", "label": "Comment", "type": "string", "required": False, "default": None, "maxlength": 200},
    ]}


def test_waiting_items_carry_the_spiffarena_and_zeebe_forms(cli, forms_dir: Path) -> None:
    spiff = _item(_doc(cli("run", str(forms_dir / SPIFF), "--json")))
    assert spiff["instructions"] == "Enter the expense you want refunded."
    form = spiff["form"]
    assert form["source"] == "expense-request-schema.json"
    by_id = {f["id"]: f for f in form["fields"]}
    assert list(by_id) == ["amount", "category", "currency", "note", "project"]
    assert by_id["amount"] == {"id": "amount", "label": "Amount", "type": "number", "required": True,
                               "default": None, "min": 0.01, "max": 5000}
    assert [o["id"] for o in by_id["category"]["options"]] == ["travel", "meals", "equipment"]
    assert by_id["currency"]["default"] == "EUR" and not by_id["currency"]["required"]
    zeebe = _item(_doc(cli("run", str(forms_dir / ZEEBE), "--json")))
    assert zeebe["form"] == {"fields": [], "source": "zeebe:formDefinition", "form_key": "claim-review-form"}


def test_the_plain_waiting_line_lists_the_fields(cli, forms_dir: Path) -> None:
    out = cli("run", str(forms_dir / CAMUNDA)).stdout
    line = next(ln for ln in out.splitlines() if "waiting for user_task" in ln)
    assert ('form: approved* boolean=false, amount* long 1..100000, cost_center enum(ops|sales)="ops", '
            'comment string ..200 (* required)') in line
    zeebe = cli("run", str(forms_dir / ZEEBE)).stdout
    assert "form 'claim-review-form' (zeebe:formDefinition)" in zeebe


BAD_ANSWERS = [
    (CAMUNDA, "approve_invoice", {"approved": True}, "amount", "is required and missing"),
    (CAMUNDA, "approve_invoice", {"approved": True, "amount": "abc"}, "amount", "is not a whole number"),
    (CAMUNDA, "approve_invoice", {"approved": "yes", "amount": 5}, "approved", "is not true or false"),
    (CAMUNDA, "approve_invoice", {"amount": 5, "cost_center": "legal"}, "cost_center", 'is not one of ops, sales'),
    (CAMUNDA, "approve_invoice", {"amount": 0}, "amount", "below the minimum 1"),
    (CAMUNDA, "approve_invoice", {"amount": 100001}, "amount", "above the maximum 100000"),
    (CAMUNDA, "approve_invoice", {"amount": 5, "comment": "x" * 201}, "comment", "longer than 200"),
    (SPIFF, "Activity_enter_expense", {"amount": 10}, "category", "is required and missing"),
    (SPIFF, "Activity_enter_expense", {"amount": 10, "category": "food"}, "category",
     '"food" is not one of "travel", "meals", "equipment"'),
    (SPIFF, "Activity_enter_expense", {"amount": "ten", "category": "meals"}, "amount", "is not of type 'number'"),
    (SPIFF, "Activity_enter_expense", {"amount": 9000, "category": "meals"}, "amount", "maximum of 5000"),
]


@pytest.mark.parametrize(("bpmn", "task", "answer", "field", "problem"), BAD_ANSWERS)
def test_resume_refuses_an_answer_that_does_not_fit_the_form(cli, forms_dir, bpmn, task, answer, field,
                                                              problem) -> None:
    waiting = _doc(cli("run", str(forms_dir / bpmn), "--json"))
    iid = waiting["instance_id"]
    result = cli("resume", iid, "--json", "--answer", f"{task}={json.dumps(answer)}")
    assert result.exit_code == 2, result.stdout
    doc = _doc(result)
    error = doc["error"]
    assert error["kind"] == "invalid_answer" and error["task_id"] == task
    assert f"user task {task!r}" in error["message"] and f"field {field!r}" in error["message"]
    assert problem in error["message"] and "the form asks for:" in error["message"]
    assert any(p["field"] == field and problem in p["problem"] for p in error["problems"])
    # nothing written, still waiting for the same task; the refusal is on the tape
    again = _doc(cli("resume", iid, "--json"))
    assert again["status"] == "waiting" and _item(again)["task_id"] == task
    assert all(not again["layers"][layer] for layer in ("L3", "L4"))
    tape = cli("tape", iid).stdout
    assert "answer_refused" in tape


def test_a_good_answer_gets_the_defaults_and_undeclared_fields_pass(cli, forms_dir: Path) -> None:
    iid = _doc(cli("run", str(forms_dir / CAMUNDA), "--json"))["instance_id"]
    result = cli("resume", iid, "--json", "--answer",
                 'approve_invoice={"amount": "250", "reviewer_note": "ok by phone"}')
    assert result.exit_code == 0, result.stdout
    history = _doc(result)["layers"]["L3"]
    assert history["amount"] == 250  # a form posts text: a long field keeps the number
    assert history["approved"] is False and history["cost_center"] == "ops"  # the defaults
    assert history["reviewer_note"] == "ok by phone"  # not declared: accepted, as before
    assert "comment" not in history


def test_answers_file_through_run(cli, forms_dir: Path, tmp_path: Path) -> None:
    answers = tmp_path / "answers.json"
    answers.write_text(json.dumps({"user_tasks": {"Activity_enter_expense": {"amount": 12.5, "category": "travel"}}}))
    doc = _doc(cli("run", str(forms_dir / SPIFF), "--json", "--answers", str(answers)))
    assert doc["status"] == "completed"
    assert {k: doc["layers"]["L3"][k] for k in ("amount", "category", "currency")} == \
        {"amount": 12.5, "category": "travel", "currency": "EUR"}
    answers.write_text(json.dumps({"user_tasks": {"Activity_enter_expense": {"amount": 12.5}}}))
    bad = cli("run", str(forms_dir / SPIFF), "--json", "--answers", str(answers))
    assert bad.exit_code == 2 and "field 'category' is required" in _doc(bad)["error"]["message"]


def test_the_python_api_raises_and_the_task_still_waits(forms_dir: Path) -> None:
    engine = Engine("memory://")
    instance = engine.run(engine.start(load_process(forms_dir / CAMUNDA)))
    version = instance.version
    with pytest.raises(FormAnswerInvalid) as caught:
        engine.complete_user_task(instance, "approve_invoice", {"approved": "yes", "amount": 7})
    err = caught.value
    assert err.kind == "invalid_answer" and err.task_id == "approve_invoice" and err.instance_id == instance.id
    assert err.problems == [("approved", '"yes" is not true or false (type boolean)')]
    assert err.to_dict()["problems"] == [{"field": "approved", "problem": '"yes" is not true or false (type boolean)'}]
    stored = engine.load(instance.id)
    assert stored.version > version  # saved: the refusal is on the tape
    assert stored.status == "waiting" and _item(stored.to_document())["task_id"] == "approve_invoice"
    refused = [e for e in stored.main.tape if e.data.get("note") == "answer_refused"]
    assert [e.data["problems"] for e in refused] == [[{"field": "approved",
                                                       "problem": '"yes" is not true or false (type boolean)'}]]
    assert not any(e.data.get("note") == "user_input" for e in stored.main.tape)
    done = engine.complete_user_task(stored, "approve_invoice", {"approved": True, "amount": 7})
    assert done.status == "completed" and done.main.resolve("approved") is True


def test_the_form_travels_with_the_instance(forms_dir: Path, tmp_path: Path) -> None:
    """Resumed where the schema file is gone, the stored instance still checks its answers."""
    engine = Engine(f"sqlite:///{tmp_path / 'x.db'}")
    iid = engine.run(engine.start(load_process(forms_dir / SPIFF))).id
    (forms_dir / "expense-request-schema.json").unlink()
    with pytest.raises(FormAnswerInvalid, match="field 'category'"):
        engine.complete_user_task(engine.load(iid), "Activity_enter_expense", {"amount": 3})


def test_rest_refuses_with_400_naming_task_and_field(forms_dir: Path) -> None:
    with ServerThread(create_app("memory://", forms_dir, TOKEN)) as server, \
            httpx.Client(base_url=server.url, headers=AUTH, timeout=30) as c:
        started = c.post("/api/instances", json={"process_id": "invoice_approval", "data": {}})
        assert started.status_code == 201, started.text
        first = started.json()
        assert _item(first)["form"]["source"] == "camunda:formData"
        url = f"/api/instances/{first['instance_id']}/user-tasks/approve_invoice"
        refused = c.post(url, json={"data": {"amount": 5, "cost_center": "legal"}})
        assert refused.status_code == 400, refused.text
        body = refused.json()["error"]
        assert body["kind"] == "invalid_answer" and body["task_id"] == "approve_invoice"
        assert body["problems"] == [{"field": "cost_center", "problem": '"legal" is not one of ops, sales'}]
        doc = c.get(f"/api/instances/{first['instance_id']}").json()
        assert doc["status"] == "waiting" and not doc["layers"]["L4"] and not doc["layers"]["L3"]
        resumed = c.post(f"/api/instances/{first['instance_id']}/resume",
                         json={"answers": {"user_tasks": {"approve_invoice": {"approved": "no"}}}})
        assert resumed.status_code == 400 and "field 'approved'" in resumed.json()["error"]["message"]
        done = c.post(url, json={"data": {"amount": 5, "approved": True}})
        assert done.status_code == 200, done.text
        assert done.json()["status"] == "completed" and done.json()["layers"]["L3"]["cost_center"] == "ops"


BROKEN = [
    ('type="long">', 'type="integer">', "amount", "type 'integer' is not a Camunda form field type"),
    ('<camunda:value id="ops" name="Operations" />\n            <camunda:value id="sales" name="Sales" />', '',
     "cost_center", "an enum field offers no <camunda:value>"),
    ('defaultValue="false"', 'defaultValue="maybe"', "approved", "defaultValue 'maybe' is not true or false"),
    ('defaultValue="ops"', 'defaultValue="legal"', "cost_center", "defaultValue 'legal' is not one of its values"),
]


@pytest.mark.parametrize(("old", "new", "field", "message"), BROKEN)
def test_validate_names_a_broken_camunda_field(cli, forms_dir: Path, old, new, field, message) -> None:
    path = forms_dir / CAMUNDA
    text = path.read_text()
    assert old in text
    path.write_text(text.replace(old, new))
    result = cli("validate", str(path))
    assert result.exit_code == 2
    line = next(ln for ln in result.stdout.splitlines() if message in ln)
    assert str(path) in line and "'approve_invoice'" in line and f"field {field!r}" in line


@pytest.mark.parametrize(("content", "message"), [
    ("{not json", "is not valid JSON"),
    ('{"type": "object", "properties": {"amount": {"type": "money"}}}', "is not a valid JSON Schema at properties/amount"),
])
def test_validate_names_a_broken_json_schema_file(cli, forms_dir: Path, content, message) -> None:
    schema = forms_dir / "expense-request-schema.json"
    if content is None:
        schema.unlink()
    else:
        schema.write_text(content)
    result = cli("validate", str(forms_dir / SPIFF))
    assert result.exit_code == 2
    line = next(ln for ln in result.stdout.splitlines() if message in ln)
    assert "'Activity_enter_expense'" in line and "expense-request-schema.json" in line
    assert str(forms_dir / SPIFF) in line


def test_a_schema_file_not_beside_the_bpmn_is_a_warning_and_the_task_runs_unchecked(cli, forms_dir: Path) -> None:
    """A SpiffArena export given without its schema files still runs (as it did before forms were
    read); validate warns, naming the task and the file, and the answer is not checked."""
    (forms_dir / "expense-request-schema.json").unlink()
    checked = cli("validate", str(forms_dir / SPIFF))
    assert checked.exit_code == 0, checked.stdout + checked.stderr
    line = next(ln for ln in (checked.stdout + checked.stderr).splitlines() if "no file" in ln)
    assert "'Activity_enter_expense'" in line and "expense-request-schema.json" in line and "not checked" in line
    run = cli("run", str(forms_dir / SPIFF), "--store", "memory://", "--json",
              "--answer", 'Activity_enter_expense={"amount": "not a number"}')
    doc = json.loads(run.stdout)
    assert doc["error"] is None, doc["error"]
    assert "form" not in next((w for w in doc["waiting_for"] if w["task_id"] == "Activity_enter_expense"), {})


def test_validate_accepts_the_saved_forms(cli, forms_dir: Path) -> None:
    for name in (CAMUNDA, SPIFF, ZEEBE):
        result = cli("validate", str(forms_dir / name))
        assert result.exit_code == 0, result.stdout + result.stderr


FIELD_HOLDER = """<?xml version="1.0" encoding="UTF-8"?>
<bpmn:definitions xmlns:bpmn="http://www.omg.org/spec/BPMN/20100524/MODEL" xmlns:camunda="http://camunda.org/schema/1.0/bpmn"
    xmlns:spiffworkflow="http://spiffworkflow.org/bpmn/schema/1.0/core" id="d" targetNamespace="x">
  <bpmn:process id="held" isExecutable="true">
    <bpmn:startEvent id="s"><bpmn:outgoing>f0</bpmn:outgoing></bpmn:startEvent>
    <bpmn:sequenceFlow id="f0" sourceRef="s" targetRef="before"/>
    <bpmn:scriptTask id="before"><bpmn:incoming>f0</bpmn:incoming><bpmn:outgoing>f1</bpmn:outgoing>
      <bpmn:script>{before}</bpmn:script></bpmn:scriptTask>
    <bpmn:sequenceFlow id="f1" sourceRef="before" targetRef="review"/>
    <bpmn:userTask id="review">
      <bpmn:extensionElements>
        {pre}
        <camunda:formData>
          <camunda:formField id="cost_center" type="enum" defaultValue="ops">
            <camunda:value id="ops" name="Operations" /><camunda:value id="sales" name="Sales" />
          </camunda:formField>
          <camunda:formField id="approved" type="boolean" defaultValue="false"/>
        </camunda:formData>
      </bpmn:extensionElements>
      <bpmn:incoming>f1</bpmn:incoming><bpmn:outgoing>f2</bpmn:outgoing>
    </bpmn:userTask>
    <bpmn:sequenceFlow id="f2" sourceRef="review" targetRef="e"/>
    <bpmn:endEvent id="e"><bpmn:incoming>f2</bpmn:incoming></bpmn:endEvent>
  </bpmn:process>
</bpmn:definitions>
"""


@pytest.mark.parametrize(("before", "pre", "system"), [
    ("note = 1", '<spiffworkflow:preScript>cost_center = "sales"</spiffworkflow:preScript>', None),
    ('cost_center = "sales"', "", None),
    ("note = 1", "", "sales"),
], ids=["preScript", "earlier_task", "system"])
def test_a_default_never_replaces_what_the_context_holds(tmp_path: Path, before, pre, system) -> None:
    """A form field bound to a key the context already holds starts from that value, not from its
    defaultValue (as Camunda's form shows the variable): the person who leaves it alone changes
    nothing, and a SYSTEM key of the field's name is not written behind their back."""
    bpmn = tmp_path / "held.bpmn"
    bpmn.write_text(FIELD_HOLDER.replace("{before}", before).replace("{pre}", pre))
    if system:
        (tmp_path / "held.layerflow.yaml").write_text(f"system:\n  cost_center: {system}\n")
    engine = Engine("memory://")
    waiting = engine.run(engine.start(load_process(bpmn)))
    assert waiting.status == "waiting"
    done = engine.complete_user_task(waiting, "review", {"approved": True})
    assert done.status == "completed"
    assert done.main.resolve("cost_center") == "sales" and done.main.resolve("approved") is True
    assert not any(e.kind == "denied" for e in done.main.tape)


def test_the_waiting_item_shows_the_value_a_field_starts_from(cli, forms_dir: Path) -> None:
    """prescript_review.bpmn: the user task's preScript sets cost_center, a field with a default."""
    fields = _item(_doc(cli("run", str(forms_dir / "prescript_review.bpmn"), "--json")))["form"]["fields"]
    assert [(f["id"], f.get("value"), f["default"]) for f in fields] == \
        [("cost_center", "sales", "ops"), ("approved", None, False)]
    assert "value" not in fields[1]  # the context holds no 'approved': the form starts from the default


def test_a_multi_instance_form_left_alone_gives_the_value_the_prescript_set(forms_dir: Path) -> None:
    """prescript_votes.bpmn: each instance of a multi-instance user task has a form field that is
    its output item, with a default, and the task's preScript sets it: an answer that leaves the
    field alone gives the preScript's value as each instance's output, as the form shows it."""
    engine = Engine("memory://")
    waiting = engine.run(engine.start(load_process(forms_dir / "prescript_votes.bpmn")))
    items = [w for w in waiting.to_document()["waiting_for"] if w["kind"] == "user_task"]
    assert [f["value"] for w in items for f in w["form"]["fields"]] == [5, 5]
    with pytest.raises(FormAnswerInvalid, match="field 'score'"):
        engine.complete_user_task(waiting, "vote", {"score": 11})
    done = engine.load(waiting.id)
    for _ in items:  # the Python API answers one instance at a time
        done = engine.complete_user_task(done, "vote", {})
    assert done.status == "completed", done.to_document()["error"]
    assert done.main.resolve("scores") == [5, 5]
    chosen = engine.run(engine.start(load_process(forms_dir / "prescript_votes.bpmn")))
    for score in (7, {}):
        chosen = engine.complete_user_task(chosen, "vote", {"score": score} if score else {})
    assert chosen.main.resolve("scores") == [7, 5]


def test_a_number_for_an_enum_whose_values_are_digits_is_refused_saying_they_are_text(forms_dir: Path) -> None:
    """star_rating.bpmn: an enum whose camunda:value ids are "1" and "2". A JSON answer of 1 is
    not "1": the refusal shows the values as text (it read '1 is not one of 1, 2')."""
    engine = Engine("memory://")
    waiting = engine.run(engine.start(load_process(forms_dir / "star_rating.bpmn")))
    with pytest.raises(FormAnswerInvalid) as caught:
        engine.complete_user_task(waiting, "rate", {"stars": 1})
    assert caught.value.problems == [("stars", '1 is not one of "1", "2" (its values are text)')]
    done = engine.complete_user_task(engine.load(waiting.id), "rate", {"stars": "1"})
    assert done.status == "completed" and done.main.resolve("stars") == "1"
