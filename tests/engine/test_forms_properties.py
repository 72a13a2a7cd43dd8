"""Form properties, the older form of Activiti, Flowable and Camunda 7
(``<flowable:formProperty id name type required writable variable default datePattern>``, enum
values in ``<flowable:value id name>``): shown in ``waiting_for`` and answers checked, as
``camunda:formData`` is. Before they were read, such a form was ignored without a word: any
answer passed, and the waiting item showed no fields. A ``formKey`` (a form file of the
modeler's tool) is reported, nothing checked."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from engine import Engine, FormAnswerInvalid, load_process

from engine_helpers import cli_in_a_tmp_store  # noqa: F401 - the "cli" fixture

NAMESPACES = {"flowable": "http://flowable.org/bpmn", "activiti": "http://activiti.org/bpmn",
              "camunda": "http://camunda.org/schema/1.0/bpmn"}

PROPERTIES = """
          <{p}:formProperty id="approved" name="Approve?" type="boolean" required="true"/>
          <{p}:formProperty id="amount" name="Amount" type="long" default="100"/>
          <{p}:formProperty id="rate" name="Rate" type="double"/>
          <{p}:formProperty id="decision" name="Decision" type="enum">
            <{p}:value id="pay" name="Pay"/><{p}:value id="hold" name="Hold"/>
          </{p}:formProperty>
          <{p}:formProperty id="due" name="Due" type="date" datePattern="dd-MM-yyyy"/>
          <{p}:formProperty id="reference" name="Reference" type="string" writable="false"/>
          <{p}:formProperty id="note" name="Note" type="string" variable="reviewer_note"/>
          <{p}:formProperty id="secret" type="string" readable="false" writable="false"/>"""

PROCESS = """<?xml version="1.0" encoding="UTF-8"?>
<definitions xmlns="http://www.omg.org/spec/BPMN/20100524/MODEL" xmlns:{p}="{ns}"
    id="d" targetNamespace="http://www.{p}.org/processdef">
  <process id="invoice_check" name="Invoice check" isExecutable="true">
    <startEvent id="start"/>
    <sequenceFlow id="f0" sourceRef="start" targetRef="prepare"/>
    <scriptTask id="prepare" scriptFormat="python"><script>reference = "INV-9"</script></scriptTask>
    <sequenceFlow id="f1" sourceRef="prepare" targetRef="check"/>
    <userTask id="check" name="Check the invoice"{form_key}>
      <extensionElements>{properties}
      </extensionElements>
    </userTask>
    <sequenceFlow id="f2" sourceRef="check" targetRef="end"/>
    <endEvent id="end"/>
  </process>
</definitions>
"""


def _write(tmp_path: Path, prefix: str, properties: str | None = None, form_key: str = "") -> Path:
    path = tmp_path / f"{prefix}_invoice.bpmn"
    props = PROPERTIES if properties is None else properties
    path.write_text(PROCESS.format(p=prefix, ns=NAMESPACES[prefix], form_key=form_key,
                                   properties=props.format(p=prefix)))
    return path




def _waiting_form(cli, path: Path) -> tuple[str, dict]:
    result = cli("run", str(path), "--json")
    assert result.exit_code == 3, result.output
    doc = json.loads(result.stdout)
    (item,) = [w for w in doc["waiting_for"] if w["kind"] == "user_task"]
    return doc["instance_id"], item["form"]


@pytest.mark.parametrize("prefix", sorted(NAMESPACES))
def test_the_waiting_item_lists_the_form_properties(cli, tmp_path: Path, prefix: str) -> None:
    _, form = _waiting_form(cli, _write(tmp_path, prefix))
    assert form["source"] == f"{prefix}:formProperty"
    fields = {f["id"]: f for f in form["fields"]}
    assert list(fields) == ["approved", "amount", "rate", "decision", "due", "reference", "reviewer_note"]
    assert fields["approved"] == {"id": "approved", "label": "Approve?", "type": "boolean", "required": True,
                                  "default": None}
    assert fields["amount"]["default"] == 100 and fields["amount"]["type"] == "long"
    assert fields["rate"]["type"] == "double"
    assert [o["id"] for o in fields["decision"]["options"]] == ["pay", "hold"]
    assert fields["due"]["pattern"] == "dd-MM-yyyy"
    assert fields["reference"]["readonly"] is True and fields["reference"]["value"] == "INV-9"
    assert fields["reviewer_note"]["label"] == "Note"  # kept under its variable, as the engine does


@pytest.mark.parametrize(("answer", "field", "problem"), [
    ({}, "approved", "is required and missing"),
    ({"approved": "yes"}, "approved", "is not true or false"),
    ({"approved": True, "amount": 2.5}, "amount", "is not a whole number"),
    ({"approved": True, "rate": "high"}, "rate", "is not a number"),
    ({"approved": True, "decision": "later"}, "decision", "is not one of pay, hold"),
    ({"approved": True, "due": "2026-01-31"}, "due", "is not a date in the pattern dd-MM-yyyy"),
    ({"approved": True, "reference": "INV-1"}, "reference", "is read-only"),
], ids=["required", "boolean", "long", "double", "enum", "date_pattern", "readonly"])
def test_an_answer_that_does_not_fit_is_refused_and_nothing_is_written(tmp_path: Path, answer, field, problem) -> None:
    engine = Engine("memory://")
    waiting = engine.run(engine.start(load_process(_write(tmp_path, "flowable"))))
    before = json.dumps(waiting.to_document()["layers"], sort_keys=True)
    with pytest.raises(FormAnswerInvalid) as raised:
        engine.complete_user_task(waiting, "check", answer)
    assert f"field {field!r}" in str(raised.value) and problem in str(raised.value), str(raised.value)
    again = engine.run(waiting)
    assert again.status == "waiting"
    assert json.dumps(again.to_document()["layers"], sort_keys=True) == before


def test_an_answer_that_fits_completes_with_defaults_and_text_numbers(tmp_path: Path) -> None:
    engine = Engine("memory://")
    waiting = engine.run(engine.start(load_process(_write(tmp_path, "activiti"))))
    done = engine.run(engine.complete_user_task(waiting, "check", {
        "approved": True, "rate": "2.5", "decision": "pay", "due": "31-01-2026", "reference": "INV-9",
        "reviewer_note": "ok"}))
    assert done.status == "completed"
    assert done.context.resolve("amount") == 100  # its default
    assert done.context.resolve("rate") == 2.5  # a form posts text
    assert done.context.resolve("due") == "31-01-2026"


def test_validate_names_a_broken_form_property(cli, tmp_path: Path) -> None:
    broken = ('<flowable:formProperty id="decision" type="enum"/>'
              '<flowable:formProperty id="amount" type="long" default="lots"/>'
              '<flowable:formProperty id="due" type="date" datePattern="dd-MM-yyyy" default="2026-01-31"/>'
              '<flowable:formProperty name="no id"/>')
    path = _write(tmp_path, "flowable", properties=broken)
    result = cli("validate", str(path))
    assert result.exit_code == 2, result.output
    lines = [ln for ln in result.stdout.splitlines() if "user task form:" in ln]
    kinds = {p["code"] for p in json.loads(cli("validate", str(path), "--json").stdout)["problems"]}
    assert kinds == {"invalid_form"}, kinds
    for field, message in [("decision", "offers no <flowable:value>"), ("amount", "'lots' is not a whole number"),
                           ("due", "'2026-01-31' is not a date in the pattern dd-MM-yyyy")]:
        line = next((ln for ln in lines if message in ln), None)
        assert line is not None, (message, result.stdout)
        assert str(path) in line and "'check'" in line and f"field {field!r}" in line
    assert any("has no id" in ln for ln in lines)


def test_an_unknown_property_type_is_a_warning_and_runs_unchecked(cli, tmp_path: Path) -> None:
    path = _write(tmp_path, "flowable", properties='<flowable:formProperty id="body" type="textarea"/>')
    result = cli("validate", str(path))
    assert result.exit_code == 0, result.output
    assert "'body'" in result.output and "'textarea'" in result.output
    iid, form = _waiting_form(cli, path)
    assert form["fields"][0]["type"] == "textarea"
    assert cli("resume", iid, "--answer", 'check={"body": 42}').exit_code == 0


@pytest.mark.parametrize("prefix", ["flowable", "camunda"])
def test_a_form_key_is_reported(cli, tmp_path: Path, prefix: str) -> None:
    path = _write(tmp_path, prefix, properties="", form_key=f' {prefix}:formKey="embedded:app:forms/check.html"')
    _, form = _waiting_form(cli, path)
    assert form == {"source": f"{prefix}:formKey", "form_key": "embedded:app:forms/check.html", "fields": []}
