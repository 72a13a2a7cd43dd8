"""Forms on a process's none start event (Camunda 7 formData, Flowable formProperty, Camunda 8 linked
form-js): the start data is checked against them as a user task's answer is, on every start path
(Python, CLI run, REST, worker submit), and a refusal creates no instance."""

from __future__ import annotations

import json
import shutil
import uuid
from pathlib import Path

import httpx
import local_http
import pytest

from context_layers.stores import open_store
from engine import Engine, FormAnswerInvalid, StartDataInvalid, load_process
from engine.api import create_app

from engine_helpers import cli_in_a_tmp_store  # noqa: F401 - the "cli" fixture

from governance_helpers import TOKEN, ServerThread

START_FORMS = Path(__file__).resolve().parent / "fixtures" / "start_forms"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
ORDER = {"customer": "Acme", "quantity": 3}


@pytest.fixture
def forms_dir(tmp_path: Path) -> Path:
    target = tmp_path / "start_forms"
    shutil.copytree(START_FORMS, target)
    return target


def _engine() -> Engine:
    return Engine(f"memory://start-forms-{uuid.uuid4().hex}")


def _refusal(name: str, data: dict) -> tuple[Engine, StartDataInvalid]:
    engine = _engine()
    with pytest.raises(StartDataInvalid) as caught:
        engine.start(load_process(START_FORMS / name), data)
    assert engine.store.list() == []  # nothing created
    return engine, caught.value


@pytest.mark.parametrize(("name", "data", "problems"), [
    ("order_intake.bpmn", {}, [("customer", "is required and missing"), ("quantity", "is required and missing")]),
    ("order_intake.bpmn", {**ORDER, "quantity": 0}, [("quantity", "0 is below the minimum 1")]),
    ("order_intake.bpmn", {**ORDER, "quantity": "many"}, [("quantity", '"many" is not a whole number (type long)')]),
    ("order_intake.bpmn", {**ORDER, "priority": "urgent"}, [("priority", '"urgent" is not one of normal, rush')]),
    ("order_intake.bpmn", {**ORDER, "customer": "A"}, [("customer", "shorter than 2 characters")]),
    ("order_intake.bpmn", {**ORDER, "channel": "phone"},
     [("channel", 'is read-only: the form shows "web", the answer gives "phone"; leave it out or give the value shown')]),
    ("leave_request.bpmn", {"days": "two"},
     [("employee", "is required and missing"), ("days", '"two" is not a whole number (type long)')]),
    ("ticket_intake.bpmn", {"subject": "printer", "severity": "mid"}, [("severity", '"mid" is not one of low, high')]),
    ("ticket_intake.bpmn", {"severity": "high"}, [("subject", "is required and missing")]),
])
def test_python_start_refuses_data_that_does_not_fit_the_start_form(name, data, problems) -> None:
    _, err = _refusal(name, data)
    assert err.problems == problems
    assert err.kind == "invalid_answer" and err.instance_id is None
    start_event = {"order_intake.bpmn": "order_received", "leave_request.bpmn": "request_leave",
                   "ticket_intake.bpmn": "ticket_opened"}[name]
    assert err.task_id == start_event
    message = str(err)
    assert name in message and f"start event {start_event!r}" in message
    assert all(f"field {field!r} {problem}" in message for field, problem in problems)
    assert "no instance was created" in message


@pytest.mark.parametrize(("name", "data", "process_layer"), [
    # defaults filled as the submitted form would carry them; a long given as text becomes a number
    ("order_intake.bpmn", {"customer": "Acme", "quantity": "3"},
     {"customer": "Acme", "quantity": 3, "priority": "normal", "channel": "web"}),
    ("order_intake.bpmn", {**ORDER, "priority": "rush", "channel": "web", "note": "not on the form"},
     {**ORDER, "priority": "rush", "channel": "web", "note": "not on the form"}),
    ("leave_request.bpmn", {"employee": "kim", "days": 2}, {"employee": "kim", "days": 2, "paid": True}),
    ("ticket_intake.bpmn", {"subject": "printer"}, {"subject": "printer", "severity": "low"}),
])
def test_python_start_fills_defaults_of_data_that_fits(name, data, process_layer) -> None:
    instance = _engine().start(load_process(START_FORMS / name), data)
    assert dict(instance.main.layer(1)) == process_layer


def test_a_form_default_does_not_replace_a_system_key(tmp_path: Path) -> None:
    """A field whose id is a SYSTEM key of the config shows that value: its default is not written
    (initial data can never set a SYSTEM key)."""
    shutil.copy(START_FORMS / "order_intake.bpmn", tmp_path / "order_intake.bpmn")
    (tmp_path / "order_intake.layerflow.yaml").write_text("system:\n  channel: web\n")
    instance = _engine().start(load_process(tmp_path / "order_intake.bpmn"), dict(ORDER))
    assert dict(instance.main.layer(1)) == {**ORDER, "priority": "normal"}
    assert instance.main.resolve("channel") == "web"


def test_cli_run_refuses_bad_start_data_with_exit_2_and_creates_nothing(cli, forms_dir: Path, tmp_path: Path) -> None:
    data = tmp_path / "order.json"
    data.write_text(json.dumps({"customer": "Acme", "quantity": 500}))
    result = cli("run", str(forms_dir / "order_intake.bpmn"), "--data", str(data), "--json")
    assert result.exit_code == 2, result.stderr
    doc = json.loads(result.stdout)
    assert doc["instance_id"] is None and doc["status"] == "error"
    assert doc["error"]["kind"] == "invalid_answer" and doc["error"]["task_id"] == "order_received"
    assert doc["error"]["problems"] == [{"field": "quantity", "problem": "500 is above the maximum 100"}]
    assert str(data) in doc["error"]["message"] and "order_intake.bpmn" in doc["error"]["message"]
    listed = cli("list", "--json")
    assert listed.exit_code == 0 and json.loads(listed.stdout) == []

    text = cli("run", str(forms_dir / "order_intake.bpmn"), "--data", str(data))
    assert text.exit_code == 2
    assert "start event 'order_received'" in text.stderr and "field 'quantity' 500 is above the maximum 100" in text.stderr


def test_cli_run_starts_with_start_data_that_fits(cli, forms_dir: Path) -> None:
    result = cli("run", str(forms_dir / "order_intake.bpmn"), "--data", json.dumps(ORDER), "--json")
    assert result.exit_code == 3, result.stderr  # waits at confirm_order
    doc = json.loads(result.stdout)
    assert doc["layers"]["L1"] == {**ORDER, "priority": "normal", "channel": "web"}
    assert [w["task_id"] for w in doc["waiting_for"]] == ["confirm_order"]


def test_rest_start_refuses_bad_start_data_with_400_and_creates_nothing(forms_dir: Path) -> None:
    with ServerThread(create_app("memory://", forms_dir, TOKEN)) as server, \
            httpx.Client(base_url=server.url, headers=AUTH, timeout=30) as c:
        refused = c.post("/api/instances", json={"process_id": "leave_request", "data": {"employee": "kim"}})
        assert refused.status_code == 400, refused.text
        body = refused.json()["error"]
        assert body["kind"] == "invalid_answer" and body["task_id"] == "request_leave"
        assert body["problems"] == [{"field": "days", "problem": "is required and missing"}]
        assert "instance_id" not in body
        assert c.get("/api/instances").json() == []
        started = c.post("/api/instances", json={"process_id": "leave_request", "data": {"employee": "kim", "days": 1}})
        assert started.status_code == 201, started.text
        assert started.json()["layers"]["L1"] == {"employee": "kim", "days": 1, "paid": True}


def test_rest_shows_a_catalog_process_start_form(forms_dir: Path) -> None:
    """GET /api/processes/{id}: what POST /api/instances will check the data against, so a client
    can build the start screen; null for a process whose start event has no form; 404 naming the
    registered processes for an unknown id."""
    (forms_dir / "plain_start.bpmn").write_text(
        '<bpmn:definitions xmlns:bpmn="http://www.omg.org/spec/BPMN/20100524/MODEL" id="d" targetNamespace="x">'
        '<bpmn:process id="plain_start" isExecutable="true"><bpmn:startEvent id="go"/><bpmn:endEvent id="done"/>'
        '<bpmn:sequenceFlow id="f" sourceRef="go" targetRef="done"/></bpmn:process></bpmn:definitions>')
    with ServerThread(create_app("memory://", forms_dir, TOKEN)) as server, \
            httpx.Client(base_url=server.url, headers=AUTH, timeout=30) as c:
        shown = c.get("/api/processes/leave_request")
        assert shown.status_code == 200, shown.text
        body = shown.json()
        assert body["id"] == "leave_request" and body["file"] == "leave_request.bpmn"
        form = body["start_form"]
        assert form["event_id"] == "request_leave"
        fields = {f["id"]: f for f in form["fields"]}
        assert fields["days"]["required"] is True
        assert "employee" in fields and "paid" in fields
        assert local_http.get(f"{server.url}/api/processes/leave_request", timeout=30).status_code == 401
        assert c.get("/api/processes/order_intake").json()["start_form"]["event_id"] == "order_received"
        assert c.get("/api/processes/plain_start").json() == {"id": "plain_start", "name": None,
                                                              "file": "plain_start.bpmn", "start_form": None}
        missing = c.get("/api/processes/no_such_process")
        assert missing.status_code == 404
        assert "leave_request" in missing.json()["error"]["message"]


def test_worker_submit_refuses_bad_start_data_and_queues_nothing() -> None:
    from engine.worker import queue_client, submit
    from stores.conftest import REDIS_URL, redis_or_skip

    redis_or_skip()
    store = open_store(f"memory://start-forms-{uuid.uuid4().hex}")
    stream = f"lftest-{uuid.uuid4().hex[:12]}:ready"
    client = queue_client(queue_url=REDIS_URL)
    try:
        with pytest.raises(FormAnswerInvalid) as caught:
            submit(store, START_FORMS / "ticket_intake.bpmn", {"severity": "high"}, stream=stream, client=client)
        assert caught.value.problems == [("subject", "is required and missing")]
        assert store.list_instances() == [] and client.xlen(stream) == 0
        submit(store, START_FORMS / "ticket_intake.bpmn", {"subject": "printer"}, stream=stream, client=client)
        assert client.xlen(stream) == 1
    finally:
        client.delete(stream)
        client.close()


def test_cli_submit_refuses_bad_start_data_field_by_field_and_queues_nothing(cli) -> None:
    """`layerflow submit --json` names the refused fields as `run --json` does (error.problems)."""
    import engine.cli_worker  # noqa: F401 - registers the commands
    from engine.worker import queue_client
    from stores.conftest import REDIS_URL, redis_or_skip

    redis_or_skip()
    url = f"memory://start-forms-{uuid.uuid4().hex}"
    stream = f"lftest-{uuid.uuid4().hex[:12]}:ready"
    client = queue_client(queue_url=REDIS_URL)
    try:
        result = cli("submit", str(START_FORMS / "ticket_intake.bpmn"), "--data", json.dumps({"severity": "high"}),
                     "--store", url, "--queue", REDIS_URL, "--stream", stream, "--json")
        assert result.exit_code == 2, result.stderr
        error = json.loads(result.stdout)["error"]
        assert error["kind"] == "invalid_answer"
        assert error["problems"] == [{"field": "subject", "problem": "is required and missing"}]
        assert error["task_id"] is not None and error["task_id"] in error["message"]
        assert open_store(url).list_instances() == [] and client.xlen(stream) == 0
    finally:
        client.delete(stream)
        client.close()


def test_a_collaboration_checks_the_start_form_of_the_pool_that_starts_with_it(cli, forms_dir: Path) -> None:
    """In a collaboration the requester pool's none start event holds the form (the supplier pool
    starts on its message): the start data is checked against it on every path, the refusal names
    the pool, and data that fits runs both pools with the form's default filled in."""
    path = START_FORMS / "parts_request.bpmn"
    engine, err = _refusal("parts_request.bpmn", {"count": 12})
    assert err.task_id == "parts_needed"
    assert err.problems == [("part", "is required and missing"), ("count", "12 is above the maximum 10")]
    assert "process 'parts_request' (its pool 'requester')" in str(err) and str(path) in str(err)

    instance = engine.run(engine.start(load_process(path), {"part": "gear"}))
    assert instance.status == "completed"
    doc = instance.to_document()
    assert doc["layers"]["L1"] == {"part": "gear", "count": 1}
    assert doc["layers"]["L3"]["picked"] == "gear x1"

    result = cli("run", str(forms_dir / "parts_request.bpmn"), "--data", json.dumps({"count": 3}), "--json")
    assert result.exit_code == 2, result.stderr
    assert json.loads(result.stdout)["error"]["problems"] == [{"field": "part", "problem": "is required and missing"}]
    with ServerThread(create_app("memory://", forms_dir, TOKEN)) as server, \
            httpx.Client(base_url=server.url, headers=AUTH, timeout=30) as c:
        shown = c.get("/api/processes/parts_request").json()["start_form"]
        assert shown["event_id"] == "parts_needed" and [f["id"] for f in shown["fields"]] == ["part", "count"]
        refused = c.post("/api/instances", json={"process_id": "parts_request", "data": {}})
        assert refused.status_code == 400 and refused.json()["error"]["task_id"] == "parts_needed"
        assert c.get("/api/instances").json() == []


def test_validate_reports_a_start_form_linked_to_a_missing_form_file(cli, forms_dir: Path) -> None:
    (forms_dir / "ticket_start.form").unlink()
    result = cli("validate", str(forms_dir / "ticket_intake.bpmn"))
    assert result.exit_code == 0, result.stdout
    line = next(ln for ln in result.stdout.splitlines() if "ticket-start-form" in ln)
    assert "start event form" in line and "'ticket_opened'" in line and "the start data is not checked" in line


def test_validate_reports_a_broken_start_form_field(cli, forms_dir: Path) -> None:
    path = forms_dir / "order_intake.bpmn"
    path.write_text(path.read_text().replace('defaultValue="normal"', 'defaultValue="later"'))
    result = cli("validate", str(path))
    assert result.exit_code == 2
    line = next(ln for ln in result.stdout.splitlines() if "start event form" in ln)
    assert str(path) in line and "'order_received'" in line and "field 'priority'" in line and "'later'" in line


def test_a_form_on_a_message_start_event_is_not_a_start_form(tmp_path: Path) -> None:
    """Only the none start event's form checks the start data: a message start's data comes with the message."""
    text = (START_FORMS / "leave_request.bpmn").read_text()
    text = text.replace('<outgoing>l1</outgoing>\n    </startEvent>',
                        '<outgoing>l1</outgoing>\n      <messageEventDefinition id="m1" messageRef="leave_msg" />\n'
                        '    </startEvent>')
    text = text.replace('</process>', '</process>\n  <message id="leave_msg" name="leave" />')
    assert "messageEventDefinition" in text
    path = tmp_path / "leave_message.bpmn"
    path.write_text(text)
    instance = _engine().start(load_process(path), {"days": "two"})
    assert dict(instance.main.layer(1)) == {"days": "two"}
