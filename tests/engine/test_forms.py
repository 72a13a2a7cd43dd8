"""User task forms as modelers declare them (Camunda 7 formData, SpiffArena JSON Schema, Camunda 8
form keys): shown in ``waiting_for``, answers checked against them on every path (CLI, Python,
REST), declarations checked by ``validate``."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import httpx
import pytest

from engine import Engine, FormAnswerInvalid, load_process
from engine.api import create_app

from engine_helpers import cli_in_a_tmp_store  # noqa: F401 - the "cli" fixture

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
    for name in (CAMUNDA, SPIFF, ZEEBE, READONLY, PROJECT):
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


# ----------------------------------------------------------------------------- read-only fields, formats,
# options from the context

READONLY = "readonly_invoice.bpmn"  # reference "INV-7", amount 250 set by a script; cost_center defaults to "ops"
PROJECT = "project_request.bpmn"  # request_id "REQ-1", projects (value/label dicts) and teams (plain) set by a script
GOOD_PROJECT = {"project": "apollo", "start": "2026-03-01"}

REFUSED = [
    (READONLY, "check_invoice", {"reference": "INV-8"}, "reference",
     ['read-only', '"INV-8"', 'the form shows "INV-7"']),
    (READONLY, "check_invoice", {"amount": 999}, "amount", ["read-only", "999", "the form shows 250"]),
    (READONLY, "check_invoice", {"cost_center": "sales"}, "cost_center",
     ["read-only", '"sales"', 'the form shows "ops"']),
    (READONLY, "check_invoice", {"due": "2026-02-30"}, "due", ['"2026-02-30" is not a date', "dd/MM/yyyy", "YYYY-MM-DD"]),
    (READONLY, "check_invoice", {"due": "31/02/2026"}, "due", ['"31/02/2026" is not a date']),
    (READONLY, "check_invoice", {"due": "20260131"}, "due", ['"20260131" is not a date']),
    (PROJECT, "request_project", {**GOOD_PROJECT, "request_id": "REQ-2"}, "request_id",
     ["read-only", '"REQ-2"', 'the form shows "REQ-1"']),
    (PROJECT, "request_project", {**GOOD_PROJECT, "priority": "high"}, "priority",
     ["read-only", '"high"', 'the form shows "normal"']),
    (PROJECT, "request_project", {**GOOD_PROJECT, "project": "mercury"}, "project",
     ['"mercury" is not one of "apollo", "gemini"']),
    (PROJECT, "request_project", {**GOOD_PROJECT, "team": "green"}, "team", ['"green" is not one of "red", "blue"']),
    (PROJECT, "request_project", {**GOOD_PROJECT, "start": "2026-02-30"}, "start",
     ['"2026-02-30" is not a date', "YYYY-MM-DD"]),
    (PROJECT, "request_project", {**GOOD_PROJECT, "start": "01/03/2026"}, "start", ['"01/03/2026" is not a date']),
    (PROJECT, "request_project", {**GOOD_PROJECT, "kickoff": "2026-03-01 10:00"}, "kickoff",
     ['"2026-03-01 10:00" is not a date-time', "2026-01-31T09:30:00Z"]),
    (PROJECT, "request_project", {**GOOD_PROJECT, "contact": "nobody"}, "contact",
     ['"nobody" is not an email address']),
    (PROJECT, "request_project", {**GOOD_PROJECT, "daily": "9:30"}, "daily", ['"9:30" is not a time', "09:30:00Z"]),
    (PROJECT, "request_project", {**GOOD_PROJECT, "helpers": ["red", "green"]}, "helpers",
     ["'green' is not one of ['red', 'blue']"]),
]


@pytest.mark.parametrize(("bpmn", "task", "answer", "field", "parts"), REFUSED,
                         ids=[f"{r[3]}={json.dumps(r[2][r[3]])}" for r in REFUSED])
def test_a_refused_answer_names_task_field_value_and_what_is_allowed_and_writes_nothing(
        cli, forms_dir: Path, bpmn, task, answer, field, parts) -> None:
    waiting = _doc(cli("run", str(forms_dir / bpmn), "--json"))
    iid = waiting["instance_id"]
    before = _doc(cli("tape", iid, "--json"))
    result = cli("resume", iid, "--json", "--answer", f"{task}={json.dumps(answer)}")
    assert result.exit_code == 2, result.stdout
    error = _doc(result)["error"]
    assert error["kind"] == "invalid_answer" and error["task_id"] == task
    assert f"user task {task!r}" in error["message"] and f"field {field!r}" in error["message"]
    (problem,) = [p["problem"] for p in error["problems"] if p["field"] == field]
    assert all(part in problem for part in parts), problem
    again = _doc(cli("resume", iid, "--json"))
    assert again["status"] == "waiting" and _item(again)["task_id"] == task
    assert again["layers"] == waiting["layers"]
    after = _doc(cli("tape", iid, "--json"))
    assert after[:len(before)] == before
    assert [e["data"]["note"] for e in after[len(before):]] == ["answer_refused"]


@pytest.mark.parametrize(("bpmn", "task", "answer", "kept"), [
    (READONLY, "check_invoice", {}, {"reference": "INV-7", "amount": 250, "cost_center": "ops", "approved": False}),
    (READONLY, "check_invoice", {"reference": "INV-7", "amount": "250", "cost_center": "ops", "approved": True},
     {"reference": "INV-7", "amount": 250, "cost_center": "ops", "approved": True}),
    (READONLY, "check_invoice", {"due": "31/01/2026"}, {"due": "31/01/2026"}),
    (READONLY, "check_invoice", {"due": "2026-01-31"}, {"due": "2026-01-31"}),
    (READONLY, "check_invoice", {"due": "2026-01-31T09:30:00+01:00"}, {"due": "2026-01-31T09:30:00+01:00"}),
    (PROJECT, "request_project", GOOD_PROJECT, {"request_id": "REQ-1", "priority": "normal", "project": "apollo"}),
    (PROJECT, "request_project", {**GOOD_PROJECT, "request_id": "REQ-1", "priority": "normal", "team": "blue",
                                  "kickoff": "2026-03-02T09:30:00Z", "contact": "ana@example.org",
                                  "daily": "09:30:00+01:00", "helpers": ["red", "blue"]},
     {"team": "blue", "kickoff": "2026-03-02T09:30:00Z", "contact": "ana@example.org", "start": "2026-03-01",
      "helpers": ["red", "blue"]}),
], ids=["readonly_omitted", "readonly_repeated", "date_camunda", "date_iso", "date_time", "schema_readonly_omitted",
        "schema_all_given"])
def test_an_answer_that_fits_passes(forms_dir: Path, bpmn, task, answer, kept) -> None:
    engine = Engine("memory://")
    waiting = engine.run(engine.start(load_process(forms_dir / bpmn)))
    done = engine.complete_user_task(waiting, task, answer)
    assert done.status == "completed", done.to_document()["error"]
    assert {key: done.main.resolve(key) for key in kept} == kept


def test_the_waiting_item_shows_options_from_the_context_and_why_a_field_has_none(cli, forms_dir: Path) -> None:
    fields = {f["id"]: f for f in _item(_doc(cli("run", str(forms_dir / PROJECT), "--json")))["form"]["fields"]}
    assert fields["project"]["options"] == [{"id": "apollo", "name": "Apollo"}, {"id": "gemini", "name": "Gemini"}]
    assert fields["team"]["options"] == [{"id": "red", "name": "red"}, {"id": "blue", "name": "blue"}]
    assert fields["helpers"]["options"] == fields["team"]["options"]  # checkboxes: each item one of them
    assert fields["request_id"]["readonly"] is True and fields["request_id"]["value"] == "REQ-1"
    assert fields["start"]["format"] == "date"
    budget = fields["budget_code"]
    assert "options" not in budget and budget["options_from"] == "budget_codes"
    assert "'budget_codes'" in budget["warning"] and "any value" in budget["warning"]
    plain = cli("run", str(forms_dir / PROJECT)).stdout
    line = next(ln for ln in plain.splitlines() if "waiting for user_task" in ln)
    assert "project* string(apollo|gemini)" in line and "request_id string read-only" in line
    assert "budget_code string(any value: no options in 'budget_codes')" in line and "start* string date" in line


def test_options_from_a_key_the_context_does_not_hold_accept_any_value(forms_dir: Path) -> None:
    """expense_request: 'project' takes its options from 'projects', which nothing sets."""
    engine = Engine("memory://")
    waiting = engine.run(engine.start(load_process(forms_dir / SPIFF)))
    project = next(f for f in _item(waiting.to_document())["form"]["fields"] if f["id"] == "project")
    assert "'projects'" in project["warning"]
    done = engine.complete_user_task(waiting, "Activity_enter_expense",
                                     {"amount": 3, "category": "meals", "project": "anything"})
    assert done.status == "completed" and done.main.resolve("project") == "anything"


@pytest.mark.parametrize("options", [
    "not a list", [{"label": "no value"}], [],
], ids=["not_a_list", "no_value", "empty"])
def test_options_the_context_holds_in_another_shape_accept_any_value_and_say_why(
        forms_dir: Path, options) -> None:
    path = forms_dir / PROJECT
    path.write_text(path.read_text().replace('teams = ["red", "blue"]', f"teams = {options!r}"))
    engine = Engine("memory://")
    waiting = engine.run(engine.start(load_process(path)))
    team = next(f for f in _item(waiting.to_document())["form"]["fields"] if f["id"] == "team")
    assert "options" not in team and "'teams'" in team["warning"] and "any value" in team["warning"]
    done = engine.complete_user_task(waiting, "request_project", {**GOOD_PROJECT, "team": "green"})
    assert done.status == "completed" and done.main.resolve("team") == "green"


def test_rest_refuses_a_readonly_change_and_an_option_not_offered_with_400(forms_dir: Path) -> None:
    with ServerThread(create_app("memory://", forms_dir, TOKEN)) as server, \
            httpx.Client(base_url=server.url, headers=AUTH, timeout=30) as c:
        first = c.post("/api/instances", json={"process_id": "project_request", "data": {}}).json()
        url = f"/api/instances/{first['instance_id']}/user-tasks/request_project"
        refused = c.post(url, json={"data": {**GOOD_PROJECT, "project": "mercury", "request_id": "REQ-9"}})
        assert refused.status_code == 400, refused.text
        body = refused.json()["error"]
        assert body["task_id"] == "request_project"
        assert {p["field"] for p in body["problems"]} == {"project", "request_id"}
        assert "the form asks for: request_id string read-only" in body["message"]
        assert "project* string(apollo|gemini)" in body["message"]  # the options it was checked against
        doc = c.get(f"/api/instances/{first['instance_id']}").json()
        assert doc["status"] == "waiting" and doc["layers"] == first["layers"]
        done = c.post(url, json={"data": {**GOOD_PROJECT, "request_id": "REQ-1"}})
        assert done.status_code == 200, done.text
        assert done.json()["status"] == "completed"
