"""Camunda 8 (form-js) forms on user tasks: an embedded ``zeebe:userTaskForm`` and a linked
``*.form`` file beside the BPMN, read into the form model the other sources use; answers checked
on every path (CLI, Python, REST); declarations checked by ``validate``."""

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

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "forms_zeebe"
EMBEDDED = "refund_embedded.bpmn"
LINKED = "invoice_linked.bpmn"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
GOOD_REFUND = {"reason": "broken", "amount": 20}


@pytest.fixture
def forms_dir(tmp_path: Path) -> Path:
    target = tmp_path / "forms_zeebe"
    shutil.copytree(FIXTURES, target)
    return target




def _doc(result) -> dict:
    return json.loads(result.stdout)


def _item(doc: dict) -> dict:
    (item,) = [w for w in doc["waiting_for"] if w["kind"] == "user_task"]
    return item


def test_the_embedded_form_is_read_with_groups_flattened_and_unkeyed_components_skipped(cli, forms_dir) -> None:
    form = _item(_doc(cli("run", str(forms_dir / EMBEDDED), "--json")))["form"]
    assert form["source"] == "zeebe:userTaskForm"
    assert form["fields"] == [
        {"id": "reason", "label": "Reason", "type": "string", "required": True, "default": None,
         "minlength": 3, "maxlength": 40},
        {"id": "amount", "label": "Amount", "type": "double", "required": True, "default": None, "min": 1, "max": 500},
        {"id": "urgent", "label": "Urgent", "type": "boolean", "required": False, "default": False},
        {"id": "channel", "label": "Pay back by", "type": "enum", "required": False, "default": "bank",
         "options": [{"id": "bank", "name": "Bank transfer"}, {"id": "card", "name": "Card"}]},
        {"id": "refund_on", "label": "Refund on", "type": "date", "required": False, "default": None,
         "format": "date"},
        {"id": "reference", "label": "Reference", "type": "string", "required": False, "default": "R-1",
         "readonly": True},
        {"id": "checks", "label": "Checked", "type": "list", "required": False, "default": None,
         "options": [{"id": "receipt", "name": "Receipt"}, {"id": "return", "name": "Return"}]},
        {"id": "iban", "label": "IBAN", "type": "string", "required": False, "default": None,
         "pattern": "^[A-Z]{2}[0-9]+$"},
    ]


def test_the_linked_form_file_beside_the_bpmn_is_read(cli, forms_dir) -> None:
    form = _item(_doc(cli("run", str(forms_dir / LINKED), "--json")))["form"]
    assert form["source"] == "invoice.form"
    assert [(f["id"], f["type"], f["required"]) for f in form["fields"]] == [
        ("decision", "enum", True), ("tags", "list", False), ("comment", "string", False), ("total", "double", False)]
    assert form["fields"][3]["readonly"] is True and form["fields"][3]["default"] == 120
    plain = cli("run", str(forms_dir / LINKED)).stdout
    assert "decision* enum(approve|reject)" in plain


BAD_ANSWERS = [
    (EMBEDDED, "approve_refund", {"amount": 20}, "reason", "is required and missing"),
    (EMBEDDED, "approve_refund", {"reason": "no", "amount": 20}, "reason", "shorter than 3 characters"),
    (EMBEDDED, "approve_refund", {**GOOD_REFUND, "amount": 501}, "amount", "above the maximum 500"),
    (EMBEDDED, "approve_refund", {**GOOD_REFUND, "amount": 0.5}, "amount", "below the minimum 1"),
    (EMBEDDED, "approve_refund", {**GOOD_REFUND, "amount": "lots"}, "amount", "is not a number"),
    (EMBEDDED, "approve_refund", {**GOOD_REFUND, "urgent": "yes"}, "urgent", "is not true or false"),
    (EMBEDDED, "approve_refund", {**GOOD_REFUND, "channel": "cash"}, "channel", "is not one of bank, card"),
    (EMBEDDED, "approve_refund", {**GOOD_REFUND, "refund_on": "31/01/2026"}, "refund_on", "is not a date"),
    (EMBEDDED, "approve_refund", {**GOOD_REFUND, "reference": "R-2"}, "reference", "is read-only"),
    (EMBEDDED, "approve_refund", {**GOOD_REFUND, "checks": ["receipt", "photo"]}, "checks",
     '"photo" is not one of receipt, return'),
    (EMBEDDED, "approve_refund", {**GOOD_REFUND, "checks": "receipt"}, "checks", "is not a list"),
    (EMBEDDED, "approve_refund", {**GOOD_REFUND, "iban": "de12"}, "iban", "does not match the pattern"),
    (LINKED, "decide_invoice", {}, "decision", "is required and missing"),
    (LINKED, "decide_invoice", {"decision": "maybe"}, "decision", "is not one of approve, reject"),
    (LINKED, "decide_invoice", {"decision": "approve", "tags": ["food"]}, "tags", '"food" is not one of'),
    (LINKED, "decide_invoice", {"decision": "approve", "comment": "x" * 11}, "comment", "longer than 10"),
    (LINKED, "decide_invoice", {"decision": "approve", "total": 99}, "total", "is read-only"),
]


@pytest.mark.parametrize(("bpmn", "task", "answer", "field", "problem"), BAD_ANSWERS)
def test_resume_refuses_an_answer_that_does_not_fit_the_form(cli, forms_dir, bpmn, task, answer, field,
                                                              problem) -> None:
    iid = _doc(cli("run", str(forms_dir / bpmn), "--json"))["instance_id"]
    result = cli("resume", iid, "--json", "--answer", f"{task}={json.dumps(answer)}")
    assert result.exit_code == 2, result.stdout
    error = _doc(result)["error"]
    assert error["kind"] == "invalid_answer" and error["task_id"] == task
    assert any(p["field"] == field and problem in p["problem"] for p in error["problems"]), error["problems"]
    again = _doc(cli("resume", iid, "--json"))
    assert again["status"] == "waiting" and _item(again)["task_id"] == task
    assert all(not again["layers"][layer] for layer in ("L3", "L4"))


GOOD_ANSWERS = [
    (EMBEDDED, "approve_refund", {**GOOD_REFUND, "refund_on": "2026-01-31", "checks": ["return"],
                                  "iban": "DE1234", "reference": "R-1"},
     {"reason": "broken", "amount": 20, "urgent": False, "channel": "bank", "reference": "R-1",
      "refund_on": "2026-01-31", "checks": ["return"], "iban": "DE1234"}),
    (EMBEDDED, "approve_refund", {"reason": "dent", "amount": "12.5", "note": "not on the form"},
     {"reason": "dent", "amount": 12.5, "urgent": False, "channel": "bank", "note": "not on the form"}),
    (LINKED, "decide_invoice", {"decision": "reject", "tags": ["travel", "office"]},
     {"decision": "reject", "tags": ["travel", "office"], "total": 120}),
]


@pytest.mark.parametrize(("bpmn", "task", "answer", "kept"), GOOD_ANSWERS)
def test_an_answer_that_fits_passes_with_the_defaults(cli, forms_dir, bpmn, task, answer, kept) -> None:
    iid = _doc(cli("run", str(forms_dir / bpmn), "--json"))["instance_id"]
    result = cli("resume", iid, "--json", "--answer", f"{task}={json.dumps(answer)}")
    assert result.exit_code == 0, result.stdout
    history = _doc(result)["layers"]["L3"]
    assert {k: history.get(k) for k in kept} == kept


def test_the_python_api_raises_form_answer_invalid(forms_dir: Path) -> None:
    engine = Engine("memory://")
    instance = engine.run(engine.start(load_process(forms_dir / LINKED)))
    with pytest.raises(FormAnswerInvalid) as caught:
        engine.complete_user_task(instance, "decide_invoice", {"decision": "maybe"})
    assert caught.value.problems == [("decision", '"maybe" is not one of approve, reject')]
    stored = engine.load(instance.id)
    assert stored.status == "waiting" and not any(e.data.get("note") == "user_input" for e in stored.main.tape)
    done = engine.complete_user_task(stored, "decide_invoice", {"decision": "approve"})
    assert done.status == "completed" and done.main.resolve("decision") == "approve"


def test_rest_refuses_with_400_and_writes_nothing(forms_dir: Path) -> None:
    with ServerThread(create_app("memory://", forms_dir, TOKEN)) as server, \
            httpx.Client(base_url=server.url, headers=AUTH, timeout=30) as c:
        started = c.post("/api/instances", json={"process_id": "refund", "data": {}})
        assert started.status_code == 201, started.text
        iid = started.json()["instance_id"]
        url = f"/api/instances/{iid}/user-tasks/approve_refund"
        refused = c.post(url, json={"data": {**GOOD_REFUND, "channel": "cash"}})
        assert refused.status_code == 400, refused.text
        assert refused.json()["error"]["problems"] == [{"field": "channel", "problem": '"cash" is not one of bank, card'}]
        doc = c.get(f"/api/instances/{iid}").json()
        assert doc["status"] == "waiting" and not doc["layers"]["L3"] and not doc["layers"]["L4"]
        accepted = c.post(url, json={"data": GOOD_REFUND})
        assert accepted.status_code == 200, accepted.text


def test_validate_accepts_the_saved_forms(cli, forms_dir: Path) -> None:
    for name in (EMBEDDED, LINKED):
        result = cli("validate", str(forms_dir / name))
        assert result.exit_code == 0, result.stdout + result.stderr
        assert "user task form" not in result.stdout + result.stderr


def _warning(result) -> str:
    return next(ln for ln in (result.stdout + result.stderr).splitlines() if "user task form" in ln)


def test_a_linked_form_not_beside_the_bpmn_is_a_warning_and_the_task_runs_unchecked(cli, forms_dir) -> None:
    (forms_dir / "invoice.form").unlink()
    checked = cli("validate", str(forms_dir / LINKED))
    assert checked.exit_code == 0, checked.stdout + checked.stderr
    line = _warning(checked)
    assert "'decide_invoice'" in line and "'invoice-form'" in line and "not checked" in line
    assert str(forms_dir) in line
    doc = _doc(cli("run", str(forms_dir / LINKED), "--json", "--store", "memory://",
                   "--answer", 'decide_invoice={"decision": "maybe"}'))
    assert doc["error"] is None and doc["status"] == "completed"


@pytest.mark.parametrize(("content", "message"), [
    ("{not json", "is not valid JSON"),
    ('["a list"]', "holds a JSON list"),
])
def test_a_malformed_linked_form_is_a_warning_naming_the_file(cli, forms_dir, content, message) -> None:
    (forms_dir / "invoice.form").write_text(content)
    checked = cli("validate", str(forms_dir / LINKED))
    assert checked.exit_code == 0, checked.stdout + checked.stderr
    line = _warning(checked)
    assert "'decide_invoice'" in line and "invoice.form" in line and message in line and "not checked" in line
    doc = _doc(cli("run", str(forms_dir / LINKED), "--json", "--store", "memory://",
                   "--answer", 'decide_invoice={"decision": "maybe"}'))
    assert doc["error"] is None and doc["status"] == "completed"


def test_a_component_of_an_unknown_type_is_a_warning_naming_it_and_its_answer_is_unchecked(cli, forms_dir) -> None:
    form = json.loads((forms_dir / "invoice.form").read_text())
    form["components"].append({"type": "slider", "key": "score", "label": "Score"})
    (forms_dir / "invoice.form").write_text(json.dumps(form))
    checked = cli("validate", str(forms_dir / LINKED))
    assert checked.exit_code == 0, checked.stdout + checked.stderr
    line = _warning(checked)
    assert "'decide_invoice'" in line and "invoice.form" in line and "'score'" in line and "'slider'" in line
    run = _doc(cli("run", str(forms_dir / LINKED), "--json", "--store", "memory://",
                   "--answer", 'decide_invoice={"decision": "approve", "score": "anything"}'))
    assert run["error"] is None and run["status"] == "completed"
    bad = cli("run", str(forms_dir / LINKED), "--json", "--store", "memory://",
              "--answer", 'decide_invoice={"decision": "maybe"}')
    assert bad.exit_code == 2  # the other fields are still checked


def test_an_embedded_form_key_with_no_user_task_form_is_an_error_naming_it(cli, forms_dir) -> None:
    path = forms_dir / EMBEDDED
    path.write_text(path.read_text().replace('formKey="camunda-forms:bpmn:userTaskForm_refund"',
                                             'formKey="camunda-forms:bpmn:userTaskForm_gone"'))
    checked = cli("validate", str(path))
    assert checked.exit_code != 0
    line = _warning(checked)
    assert "'approve_refund'" in line and "userTaskForm_gone" in line


def test_an_embedded_form_that_is_not_json_is_a_warning(cli, forms_dir) -> None:
    path = forms_dir / EMBEDDED
    path.write_text(path.read_text().replace('"id": "refund-form",', '"id": "refund-form",,'))
    checked = cli("validate", str(path))
    assert checked.exit_code == 0, checked.stdout + checked.stderr
    line = _warning(checked)
    assert "'approve_refund'" in line and "userTaskForm_refund" in line and "is not valid JSON" in line


def test_a_required_field_hidden_by_a_condition_may_be_left_out_and_says_why(cli, forms_dir) -> None:
    """form-js submits no value for a hidden field; its FEEL condition is not evaluated here."""
    form = json.loads((forms_dir / "invoice.form").read_text())
    form["components"].append({"type": "textfield", "key": "why_rejected", "label": "Why rejected?",
                               "validate": {"required": True}, "conditional": {"hide": '=decision = "approve"'}})
    (forms_dir / "invoice.form").write_text(json.dumps(form))
    doc = _doc(cli("run", str(forms_dir / LINKED), "--json", "--store", "memory://"))
    (field,) = [f for f in _item(doc)["form"]["fields"] if f["id"] == "why_rejected"]
    assert field["required"] is False and 'decision = "approve"' in field["warning"]
    done = _doc(cli("run", str(forms_dir / LINKED), "--json", "--store", "memory://",
                    "--answer", 'decide_invoice={"decision": "approve"}'))
    assert done["error"] is None and done["status"] == "completed"


@pytest.mark.parametrize(("fmt", "good", "bad"), [
    ("date", ["2026-01-31"], ["2026-02-30", "31/01/2026", "2026-01-31T09:30"]),
    ("time", ["09:30", "09:30Z", "23:59+01:00"], ["9:30", "24:00", "2026-01-31"]),
    ("date-time", ["2026-01-31T09:30", "2026-01-31T09:30Z", "2026-01-31T09:30-05:00"],
     ["2026-01-31", "2026-01-31 09:30", "2026-01-31T25:00"]),
])
def test_datetime_values_are_checked_as_form_js_posts_them(fmt, good, bad) -> None:
    from engine.forms import check_answer

    form = {"source": "x.form", "fields": [{"id": "when", "label": "When", "type": "date", "required": False,
                                            "default": None, "format": fmt}]}
    for value in good:
        assert check_answer(form, {"when": value})[1] == [], value
    for value in bad:
        (problem,) = check_answer(form, {"when": value})[1]
        assert problem[0] == "when" and f"{json.dumps(value)} is not a" in problem[1], value
