"""Shapes met in public BPMN and DMN files, round 7: other engines' input and output mappings on
tasks (Camunda 7's and Operaton's ``camunda:inputOutput``, Camunda 8's ``zeebe:ioMapping``), and
processes of repositories not read before. Each is redrawn small in ``tests/engine/realworld/``;
where plain SpiffWorkflow 3.2 can run a shape, a case runs it there too and the outcome must agree."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from context_layers import Layer
from engine import Engine, load_process
from engine.validate import validate_process

from engine_helpers import path_of, variables
from test_realworld_4 import plain, rewritten

REALWORLD = Path(__file__).resolve().parent / "realworld"


def found_for(path: Path, *codes: str, process_id: str | None = None) -> list[Any]:
    return [p for p in validate_process([path], process_id=process_id).problems if p.code in codes]


# -- input and output mappings on tasks -----------------------------------------------------------


def test_camunda7_input_and_output_parameters_run_around_the_task() -> None:
    """Camunda 7's input/output parameters on a script task and a user task: plain SpiffWorkflow runs
    none, and stops at the script on the input it never set ("name 'net' is not defined"); validate
    only warned that they are not run. They run now: a variable by its name, a path into an object,
    a literal, a text constant, an empty parameter (null), a list and a map before the task's work, the outputs
    after it, so the gateway reads what they set; nothing is reported."""
    path = REALWORLD / "io_mapping_camunda7.bpmn"
    with pytest.raises(Exception, match="name 'net' is not defined"):
        plain(path, "invoice_tax", {"invoice": {"net": 400}, "requester": "ann"})
    assert found_for(path, "foreign_extension", "io_mapping_expression") == []
    for net, approved, end in ((400, True, "paid"), (600, True, "held"), (400, False, "held")):
        engine = Engine(store="memory://")
        instance = engine.run(engine.start(load_process([path]), {"invoice": {"net": net}, "requester": "ann"}),
                              answers={"user_tasks": {"approve": {"approved": approved}}})
        assert instance.status == "completed", instance.error
        tax = round(net * 0.2, 2)
        assert variables(instance.main) == {
            "invoice": {"net": net}, "requester": "ann", "net": net, "rate": 0.2, "currency": "EUR", "note": None,
            "tax": tax, "label": f"{tax} EUR", "taxDue": tax, "reviewer": "ann", "approved": approved,
            "approvedBy": "ann", "approvalOk": approved, "copies": ["ann", "audit"],
            "form": {"title": "Invoice approval", "urgent": False}}
        assert path_of(instance.workflow)[-2:] == ["decide", end]
        # no task-local scope here: an input is a write of the task, kept in HISTORY as the task ends
        assert instance.main.layer(Layer.HISTORY)["net"] == net
        assert "net" not in instance.main.layer(Layer.WORKING)


def test_camunda8_io_mappings_run_on_sub_process_script_task_and_call_activity() -> None:
    """Camunda 8's zeebe:ioMapping on a sub-process, a script task inside it and a call activity:
    FEEL paths into the order (a key it lacks gives null, as FEEL does), a literal, a static input
    text; the outputs give the gateway parcelCount and shippingFee. Plain SpiffWorkflow stops in the
    sub-process ("name 'items' is not defined")."""
    path = REALWORLD / "io_mapping_zeebe.bpmn"
    order = {"items": ["a", "b", "c", "d"], "address": {"country": "DE"}}
    with pytest.raises(Exception, match="name 'items' is not defined"):
        plain(path, "shipping", {"order": order})
    assert found_for(path, "foreign_extension", "io_mapping_expression", process_id="shipping") == []
    small = {"items": ["a", "b"], "address": {"country": "FR"}, "coupon": "C10"}
    for given, parcels, fee, coupon, end in ((order, 2, 29, None, "by_freight"), (small, 1, 35, "C10", "by_post")):
        engine = Engine(store="memory://")
        instance = engine.run(engine.start(load_process([path], process_id="shipping"), {"order": given}))
        assert instance.status == "completed", instance.error
        found = variables(instance.main)
        assert {k: found[k] for k in ("items", "perParcel", "parcels", "parcelCount", "country", "insured", "tier",
                                      "coupon", "fee", "shippingFee")} == {
            "items": given["items"], "perParcel": 3, "parcels": parcels, "parcelCount": parcels,
            "country": given["address"]["country"], "insured": True, "tier": "standard", "coupon": coupon,
            "fee": fee, "shippingFee": fee}
        assert path_of(instance.workflow)[-2:] == ["route", end]


def test_a_camunda7_mapping_of_a_variable_not_set_stops_the_run_naming_the_mapping() -> None:
    """Camunda 7 stops on ``${requester}`` when no requester is set; so does layerflow, and its error
    names the mapping, the task and what to do, not a preScript the file does not have. (Camunda 8's
    FEEL gives null instead: the coupon above.)"""
    engine = Engine(store="memory://")
    instance = engine.run(engine.start(load_process([REALWORLD / "io_mapping_camunda7.bpmn"]),
                                       {"invoice": {"net": 400}}), answers={"user_tasks": {"approve": {"approved": True}}})
    assert instance.status == "error"
    assert instance.error is not None and instance.error["task_id"] == "approve"
    message = instance.error["message"]
    assert "camunda:inputParameter 'reviewer' of 'approve' reads a variable that is not set" in message
    assert "give it in the start data or set it in a step before 'approve'" in message
    assert "name 'requester' is not defined" in message


_STEP = '<bpmn:scriptTask id="step" name="Book the amount">'
_SCRIPT = "      <bpmn:script>seen = net</bpmn:script>\n    </bpmn:scriptTask>"
_INNER = ('      <bpmn:startEvent id="inner_start"><bpmn:outgoing>i1</bpmn:outgoing></bpmn:startEvent>\n'
          '      <bpmn:sequenceFlow id="i1" sourceRef="inner_start" targetRef="inner" />\n'
          '      <bpmn:scriptTask id="inner"><bpmn:incoming>i1</bpmn:incoming><bpmn:outgoing>i2</bpmn:outgoing>'
          '<bpmn:script>seen = net</bpmn:script></bpmn:scriptTask>\n'
          '      <bpmn:sequenceFlow id="i2" sourceRef="inner" targetRef="inner_end" />\n'
          '      <bpmn:endEvent id="inner_end"><bpmn:incoming>i2</bpmn:incoming></bpmn:endEvent>\n')


@pytest.mark.parametrize("opening, closing, person", [
    (_STEP, _SCRIPT, False),
    ('<bpmn:userTask id="step">', "    </bpmn:userTask>", True),
    ('<bpmn:manualTask id="step">', "    </bpmn:manualTask>", True),
    ('<bpmn:task id="step">', "    </bpmn:task>", True),
    ('<bpmn:sendTask id="step">', "    </bpmn:sendTask>", False),
    ('<bpmn:subProcess id="step">', _INNER + "    </bpmn:subProcess>", False),
    ('<bpmn:transaction id="step">', _INNER + "    </bpmn:transaction>", False),
    ('<bpmn:callActivity id="step" calledElement="ledger">', "    </bpmn:callActivity>", False),
], ids=["scriptTask", "userTask", "manualTask", "task", "sendTask", "subProcess", "transaction", "callActivity"])
def test_input_and_output_mappings_run_on_every_kind_of_activity(tmp_path: Path, opening: str, closing: str,
                                                                 person: bool) -> None:
    """Every activity SpiffWorkflow gives a pre- and postScript maps its inputs before its work (the
    person's form, the sub-process's steps, the called process see ``net``) and its outputs after it
    (``booked``)."""
    path = rewritten(tmp_path, REALWORLD / "io_mapping_task_kinds.bpmn", [(_STEP, opening), (_SCRIPT, closing)])
    assert found_for(path, "foreign_extension", "io_mapping_expression", process_id="booking") == []
    engine = Engine(store="memory://")
    answers = {"user_tasks": {"step": {"checked": True}}} if person else None
    instance = engine.run(engine.start(load_process([path], process_id="booking"), {"amount": 120}), answers=answers)
    assert instance.status == "completed", instance.error
    found = variables(instance.main)
    assert (found["net"], found["booked"]) == (120, 120)
    if "scriptTask" in closing or "subProcess" in closing or "transaction" in closing or "callActivity" in closing:
        assert found["seen"] == 120


C7 = REALWORLD / "io_mapping_camunda7.bpmn"
C8 = REALWORLD / "io_mapping_zeebe.bpmn"


@pytest.mark.parametrize("path, old, new, severity, element, field, says", [
    # computed, its target read by the gateway: the run would stop there
    (C7, "${tax}</camunda:outputParameter>", "${net * rate}</camunda:outputParameter>", "error", "compute",
     "camunda:outputParameter", ["camunda:outputParameter 'taxDue' = '${net * rate}': an expression that computes",
                                 "and the run stops where it is read; set it in a spiffworkflow:postScript of "
                                 "'compute' (taxDue = ...; write 'net * rate')"]),
    # text around an expression, its target read by the script
    (C7, ">EUR<", ">Total ${invoice.net}<", "error", "compute", "camunda:inputParameter",
     ["camunda:inputParameter 'currency' = 'Total ${invoice.net}': text around an expression",
      "spiffworkflow:preScript of 'compute' (currency = ...; write f\"Total {invoice['net']}\")"]),
    # a script, its target read by nothing: a warning
    (C7, '<camunda:inputParameter name="note" />',
     '<camunda:inputParameter name="note"><camunda:script scriptFormat="groovy">"n"</camunda:script>'
     '</camunda:inputParameter>', "warning", "compute", "camunda:inputParameter",
     ["camunda:inputParameter 'note' (a camunda:script): a script, which layerflow does not run, so nothing sets "
      "'note'; set it", "write what the script computes in Python"]),
    (C8, 'source="=parcels"', 'source="=count(items)"', "error", "pack", "zeebe:output",
     ["zeebe:output source='=count(items)' target='parcelCount': an expression that computes a value",
      "spiffworkflow:postScript of 'pack' (parcelCount = ...; write 'len(items)')"]),
    (C8, 'source="=fee" target="shippingFee"', 'source="fee" target="shippingFee"', "error", "quote", "zeebe:output",
     ["a static text, which Camunda 8 does not take as an output's source"]),
    (C8, 'source="=fee" target="shippingFee"', 'source="=fee" target="quote fee"', "warning", "quote",
     "zeebe:output", ["its target 'quote fee' is no variable name", "(a variable name = ...; write 'fee')"]),
    (C8, 'source="=order.coupon"', 'source="=upper case(order.coupon)"', "warning", "quote", "zeebe:input",
     ["so nothing sets 'coupon'; set it in a spiffworkflow:preScript of 'quote' (coupon = ...; rewrite it as a "
      "Python expression"]),
], ids=["computed-read", "text-around", "script", "feel-count", "static-output", "target-name", "feel-unread"])
def test_a_mapping_that_computes_is_refused_where_its_target_is_read(
        tmp_path: Path, path: Path, old: str, new: str, severity: str, element: str, field: str, says: list[str]) -> None:
    """A mapping that computes something is another engine's expression: nothing evaluates it, so its
    target is never set. Refused (an error) where a condition or script of the files reads the
    target, a warning otherwise, at the mapping's line, with the Python to write and where."""
    changed = rewritten(tmp_path, path, [(old, new)])
    [problem] = found_for(changed, "io_mapping_expression", process_id="shipping" if path == C8 else None)
    line = next(i for i, text in enumerate(changed.read_text().splitlines(), 1) if new in text)
    assert (problem.severity, problem.element_id, problem.field, problem.line, problem.file) == (
        severity, element, field, line, str(changed))
    for part in says:
        assert part in problem.message
    assert found_for(changed, "foreign_extension", process_id="shipping" if path == C8 else None) == []


def test_the_python_validate_says_to_write_runs(tmp_path: Path) -> None:
    """The computed output moved into a postScript as validate says runs as Camunda would."""
    changed = rewritten(tmp_path, C7, [
        ('<camunda:outputParameter name="taxDue">${tax}</camunda:outputParameter>', ""),
        ('<camunda:inputOutput>\n          <camunda:inputParameter name="net">',
         '<spiffworkflow:postScript>taxDue = net * rate</spiffworkflow:postScript>'
         '<camunda:inputOutput>\n          <camunda:inputParameter name="net">'),
        ('xmlns:camunda=', 'xmlns:spiffworkflow="http://spiffworkflow.org/bpmn/schema/1.0/core" xmlns:camunda=')])
    assert found_for(changed, "io_mapping_expression", "foreign_extension") == []
    engine = Engine(store="memory://")
    instance = engine.run(engine.start(load_process([changed]), {"invoice": {"net": 400}, "requester": "ann"}),
                          answers={"user_tasks": {"approve": {"approved": True}}})
    assert instance.status == "completed", instance.error
    assert variables(instance.main)["taxDue"] == 80.0


_SPIFF_NS = 'xmlns:spiffworkflow="http://spiffworkflow.org/bpmn/schema/1.0/core" xmlns:camunda='


@pytest.mark.parametrize("opening, closing, person", [
    (_STEP, _SCRIPT, False),
    ('<bpmn:userTask id="step">', "    </bpmn:userTask>", True),
], ids=["scriptTask", "userTask"])
def test_a_pre_and_post_script_run_outside_the_mappings(tmp_path: Path, opening: str, closing: str,
                                                        person: bool) -> None:
    """A spiffworkflow:preScript runs before the input mappings, a postScript after the output ones
    (the mappings are closest to the work). On a script task SpiffWorkflow's parser dropped both
    without a word (it reads the script only): they run there too now."""
    path = rewritten(tmp_path, REALWORLD / "io_mapping_task_kinds.bpmn", [
        (_STEP, opening), (_SCRIPT, closing), ('xmlns:camunda=', _SPIFF_NS),
        ("<camunda:inputOutput>", "<spiffworkflow:preScript>net = -1\npre = amount</spiffworkflow:preScript>"
                                  "<spiffworkflow:postScript>booked = booked + 1</spiffworkflow:postScript>"
                                  "<camunda:inputOutput>")])
    engine = Engine(store="memory://")
    answers = {"user_tasks": {"step": {"checked": True}}} if person else None
    instance = engine.run(engine.start(load_process([path], process_id="booking"), {"amount": 120}), answers=answers)
    assert instance.status == "completed", instance.error
    found = variables(instance.main)
    assert (found["pre"], found["net"], found["booked"]) == (120, 120, 121)


@pytest.mark.parametrize("sequential", ["true", "false"])
def test_each_instance_of_a_multi_instance_activity_maps_its_own_variables(tmp_path: Path, sequential: str) -> None:
    """Camunda maps the inputs and outputs of a multi-instance activity for each instance: each
    reads its own line (``${line.price}``). SpiffWorkflow would move the activity's scripts to the
    loop, run once before any instance has a line: the mappings stay with the instances."""
    path = rewritten(tmp_path, REALWORLD / "io_mapping_multi_instance.bpmn",
                     [('isSequential="true"', f'isSequential="{sequential}"')])
    assert found_for(path, "foreign_extension", "io_mapping_expression") == []
    engine = Engine(store="memory://")
    lines = [{"price": 2, "qty": 3}, {"price": 5, "qty": 1}, {"price": 1.5, "qty": 2}]
    instance = engine.run(engine.start(load_process([path]), {"lines": lines}))
    assert instance.status == "completed", instance.error
    found = variables(instance.main)
    assert (found["totals"], found["grand"]) == ([6, 5, 3.0], 14.0)
    # one context for the activity (no task-local scope): the last instance's values stay
    assert (found["unitPrice"], found["lineTotal"]) == (1.5, 3.0)


def test_mappings_run_in_an_instance_resumed_from_its_store(tmp_path: Path) -> None:
    """The mappings travel with the saved process: an instance that waits at the user task, loaded
    by another engine from the store, maps the task's outputs as the person answers."""
    store = f"sqlite:///{tmp_path / 'store.db'}"
    first = Engine(store=store)
    instance = first.run(first.start(load_process([C7]), {"invoice": {"net": 400}, "requester": "ann"}))
    assert instance.status == "waiting"
    assert variables(instance.main)["reviewer"] == "ann"  # the input mapped as the task became ready
    later = Engine(store=store)
    done = later.complete_user_task(instance.id, instance.waiting_for[0]["id"], {"approved": False})
    assert done.status == "completed", done.error
    found = variables(done.main)
    assert (found["approvedBy"], found["approvalOk"], found["taxDue"]) == ("ann", False, 80.0)


def test_a_service_tasks_handler_reads_its_input_mapping_and_its_result_is_mapped_out() -> None:
    """A Camunda 8 service task: its job worker (here the handler its config names) reads the input
    ``to`` mapped from ``=customer.email``; what it returns is mapped out by the output."""
    seen: list[Any] = []

    def send_mail(actx: Any) -> dict[str, Any]:
        seen.append(actx.get("to"))
        return {"messageId": "m-1"}

    path = REALWORLD / "zeebe_worker.bpmn"
    engine = Engine(store="memory://", handlers={"send_mail_handler": send_mail})
    instance = engine.run(engine.start(load_process([path]), {"customer": {"email": "ann@example.org"}}))
    assert instance.status == "completed", instance.error
    assert seen == ["ann@example.org"]
    assert (variables(instance.main)["to"], variables(instance.main)["mailId"]) == ("ann@example.org", "m-1")


# -- bpmn-to-code's test processes (emaarco/bpmn-to-code) ------------------------------------------


def test_a_mapping_through_camundas_process_api_runs_and_a_beans_method_is_named_as_one() -> None:
    """bpmn-to-code's output-mapping process maps ``${execution.getVariable('result')}`` and
    ``${someBean.compute()}``. The first only reads a variable through Camunda's API: it runs as that
    variable (null when not set, as getVariable gives). Of the second, validate said to write
    'someBean.compute()' in Python and no more, where no such object is (a bean was told apart by a
    camelCase method only): it now says the bean is the Camunda application's, and to compute the
    value in a handler."""
    path = REALWORLD / "io_mapping_bean_and_api.bpmn"
    [problem] = found_for(path, "io_mapping_expression", "foreign_extension")
    assert (problem.severity, problem.element_id, problem.field) == ("warning", "work", "camunda:outputParameter")
    assert "camunda:outputParameter 'score' = '${scoring.compute()}'" in problem.message
    assert "scoring.compute() calls a Java bean of the Camunda application, which is not here" in problem.message
    for size, end in ((3, "small"), (8, "large")):
        engine = Engine(store="memory://")
        instance = engine.run(engine.start(load_process([path]), {"size": size}))
        assert instance.status == "completed", instance.error
        found = variables(instance.main)
        assert (found["allowedResult"], found["missingResult"]) == (size * 2, None)
        assert "score" not in found
        assert path_of(instance.workflow)[-1] == end


@pytest.mark.parametrize("juel, python", [
    ('${status.equals("ok")}', "write \"status == 'ok'\""),
    ('${reviewer.equalsIgnoreCase("Ann")}', "write \"reviewer.lower() == 'Ann'.lower()\""),
    ("${name.trim()}", "write 'name.strip()'"),
    ("${items.size() > 2}", "write 'len(items) > 2'"),
    ('${tags.contains("vip")}', "write \"'vip' in tags\""),
    ("${note.isEmpty()}", "write 'not note'"),
    ('${code.startsWith("DE")}', "write \"code.startswith('DE')\""),
    ("${order.customer.toUpperCase()}", "write \"order['customer'].upper()\""),
])
def test_java_methods_of_a_value_are_written_as_python(tmp_path: Path, juel: str, python: str) -> None:
    """A JUEL expression that calls Java's methods of a string or a list: validate called each a Java
    bean of the Camunda application (its camelCase methods) or said to write it unchanged in Python,
    where no such method is. It now writes the Python of it, as the advice of a mapping (here) and of
    a condition."""
    changed = rewritten(tmp_path, C7, [("${tax}</camunda:outputParameter>", f"{juel}</camunda:outputParameter>")])
    [problem] = found_for(changed, "io_mapping_expression")
    assert problem.message.endswith(f"(taxDue = ...; {python})"), problem.message
    assert "Java bean" not in problem.message


def test_a_connectors_inputs_into_an_objects_keys_and_static_values_reach_its_handler() -> None:
    """Camunda Modeler writes an outbound connector (bpmn-driven-testing's simpleOutboundConnector)
    with inputs into an object's keys, ``target="authentication.type"``, and static values, a number
    among them (``source="20"``, the text "20" in Camunda 8). Validate said the keyed targets were not
    run. They run now, as Camunda 8 sets them: the object is made (or copied) and the key set; the
    handler that stands for the connector reads them."""
    seen: list[dict[str, Any]] = []

    def fetch(actx: Any) -> dict[str, Any]:
        seen.append({k: actx.get(k) for k in ("authentication", "method", "url", "connectionTimeoutInSeconds")})
        return {"response": {"status": 200, "body": {"EUR": 1}}}

    path = REALWORLD / "io_mapping_connector.bpmn"
    assert found_for(path, "io_mapping_expression") == []
    engine = Engine(store="memory://", handlers={"call_api": fetch})
    instance = engine.run(engine.start(load_process([path]), {"apiToken": "t-1"}))
    assert instance.status == "completed", instance.error
    assert seen == [{"authentication": {"type": "bearer", "token": "t-1"}, "method": "GET",
                     "url": "https://rates.example.org", "connectionTimeoutInSeconds": "20"}]
    assert variables(instance.main)["httpStatus"] == 200


# -- flowzer's engine tests (flowzer-io/flowzer-bpmn-core-engine) -----------------------------------


def test_a_business_rule_tasks_mappings_run_around_its_decision() -> None:
    """A Camunda 8 business rule task whose input names what its decision reads and whose output
    takes one field of the decision's result variable (flowzer's BusinessRuleTaskWithMapping): the
    input is set before the decision runs, the output after its result is written."""
    bpmn, dmn = REALWORLD / "io_mapping_decision.bpmn", REALWORLD / "io_mapping_discount.dmn"
    assert [p for p in validate_process([bpmn, dmn]).problems] == []
    for total, rate, end in ((500, 0, "plain"), (20000, 5, "discounted")):
        engine = Engine(store="memory://")
        instance = engine.run(engine.start(load_process([bpmn, dmn]), {"sales": {"total": total}}))
        assert instance.status == "completed", instance.error
        found = variables(instance.main)
        assert (found["turnover"], found["discountRate"], found["result"]["rate"]) == (total, rate, rate)
        assert path_of(instance.workflow)[-1] == end


def test_an_events_output_mappings_run_as_it_fires(tmp_path: Path) -> None:
    """flowzer's VariablesTest sets the order in its start event's output mapping, and a service
    task's input reads ``=Order.Address.Firstname``. An event has no postScript: the mapping never ran,
    the input read null, and the run completed with the name None (validate only warned of the start
    event's settings in general). An event's output mappings now run as it fires: the start event's
    at the start, a message catch event's after the message's payload went into the context, also in
    an instance resumed from its store by another engine."""
    path = REALWORLD / "io_mapping_on_events.bpmn"
    assert [(p.element_id, p.field) for p in found_for(path, "io_mapping_on_event", "foreign_extension")] == [
        ("end", "zeebe:input")]
    store = f"sqlite:///{tmp_path / 'store.db'}"
    first = Engine(store=store)
    instance = first.run(first.start(load_process([path]), {}))
    assert instance.status == "waiting", instance.error
    found = variables(instance.main)
    assert found["order"] == {"address": {"city": "Berlin"}, "tags": [1, 2], "express": True}
    assert (found["city"], found["parcel_label"]) == ("Berlin", "BERLIN")
    later = Engine(store=store)
    done = later.send_event(instance.id, "paid", {"amount": 12.5})
    assert done.status == "completed", done.error
    assert (variables(done.main)["amount"], variables(done.main)["paidAmount"]) == (12.5, 12.5)


def test_a_mapping_on_an_event_that_never_runs_is_refused_where_its_target_is_read(tmp_path: Path) -> None:
    """An event's input mapping (a throw event's, for the job that sends its message) never runs,
    nor does an output that computes something: refused where the files read the target (by a
    condition, a script or another mapping, whose input would read null), a warning otherwise, with
    the script task to draw and its Python."""
    path = REALWORLD / "io_mapping_on_events.bpmn"
    [end] = found_for(path, "io_mapping_on_event")
    assert (end.severity, end.element_id, end.field, end.line) == ("warning", "end", "zeebe:input", 43)
    assert end.message.endswith("an event runs no script before it fires, so its input mappings never run, and "
                                "nothing sets 'receiptAmount'; draw a bpmn:scriptTask before 'end' that sets it: "
                                "receiptAmount = paidAmount")
    computed = rewritten(tmp_path, path, [('target="order"', 'target="orderRef"'),
                                          ('source="=amount"', 'source="=amount * 100"'),
                                          ('source="=paidAmount" target="receiptAmount"',
                                           'source="=paidAmount" target="order"')])
    found = {p.element_id: p for p in found_for(computed, "io_mapping_on_event")}
    # paidAmount is read by the end event's input, order by the script task's
    assert {k: v.severity for k, v in found.items()} == {"paid": "error", "end": "error"}
    assert "zeebe:output target='paidAmount': an expression that computes a value, which layerflow does not " \
           "evaluate, so it never runs" in found["paid"].message
    assert "draw a bpmn:scriptTask after 'paid' that sets it (write 'amount * 100')" in found["paid"].message
    assert "nothing sets 'order', and the run stops or reads null where it is read" in found["end"].message


def test_a_mapping_of_a_variable_to_itself_on_an_event_is_no_problem() -> None:
    """flowzer's MessageThrow maps ``=antragsnummer`` to antragsnummer on a throw event: in Camunda a
    local copy for the job; here the variable itself, which the mapping would not change. Validate
    said nothing sets it: it says nothing now, and the process runs."""
    path = REALWORLD / "io_mapping_throw_identity.bpmn"
    assert found_for(path, "io_mapping_on_event", "foreign_extension") == []
    engine = Engine(store="memory://")
    instance = engine.run(engine.start(load_process([path]), {"caseNumber": "A-1", "decision": "yes"}))
    assert instance.status == "completed", instance.error
    assert variables(instance.main) == {"caseNumber": "A-1", "decision": "yes"}


def test_a_loop_whose_output_element_is_its_input_element_is_told_ids_that_load(tmp_path: Path) -> None:
    """flowzer's ParallelFlowWithCompletingConditionTest collects each instance's own item
    (``inputElement="Person"``, ``outputElement="=Person"``). Validate said to write an inputDataItem
    and an outputDataItem both with id 'Person': done so, the file failed with a repeated id. It now
    gives the output item an id of its own and says what each instance sets; done so, the loop runs
    and collects each line as its instance left it."""
    path = REALWORLD / "mi_same_item.bpmn"
    [problem] = found_for(path, "multi_instance_foreign_collection")
    assert ('<bpmn:loopDataInputRef>lines</bpmn:loopDataInputRef> and <bpmn:inputDataItem id="line" name="line"/>, '
            '<bpmn:loopDataOutputRef>priced</bpmn:loopDataOutputRef> and '
            '<bpmn:outputDataItem id="line_out" name="line_out"/>') in problem.message
    assert "each instance sets 'line_out' (line_out = line at the end of its script" in problem.message
    fixed = rewritten(tmp_path, path, [
        ('<bpmn:extensionElements>\n          <zeebe:loopCharacteristics inputCollection="=lines" inputElement="line" '
         'outputCollection="priced" outputElement="=line" />\n        </bpmn:extensionElements>',
         '<bpmn:loopDataInputRef>lines</bpmn:loopDataInputRef><bpmn:loopDataOutputRef>priced</bpmn:loopDataOutputRef>'
         '<bpmn:inputDataItem id="line" name="line"/><bpmn:outputDataItem id="line_out" name="line_out"/>'),
        ('"total": line["qty"] * line["price"]}', '"total": line["qty"] * line["price"]}\nline_out = line')])
    assert [p for p in validate_process([fixed]).problems if p.severity == "error"] == []
    engine = Engine(store="memory://")
    lines = [{"qty": 2, "price": 3}, {"qty": 1, "price": 5}]
    instance = engine.run(engine.start(load_process([fixed]), {"lines": lines}))
    assert instance.status == "completed", instance.error
    assert variables(instance.main)["priced"] == [{"qty": 2, "price": 3, "total": 6}, {"qty": 1, "price": 5, "total": 5}]


def test_a_mapping_refused_by_the_layer_rules_is_named() -> None:
    """Camunda models map a form's local copy back to the variable it came from
    (``<camunda:outputParameter name="str">${localStr}</...>``). When that variable came with the
    start data (L1 PROCESS, append-only), the write is refused: the error named the key, not the
    mapping that wrote it, which the file shows nowhere as a script."""
    engine = Engine(store="memory://")
    instance = engine.run(engine.start(load_process([REALWORLD / "io_mapping_task_kinds.bpmn"], process_id="booking"),
                                       {"amount": 120, "booked": 5}))
    assert instance.status == "error"
    assert instance.error is not None and instance.error["task_id"] == "step"
    message = instance.error["message"]
    assert "write of key 'booked' to L1" in message
    assert "'booked' is set by camunda:outputParameter 'booked' of 'step'" in message
    assert "data_layers: {booked: WORKING}" in message


# -- olive-io/bpmn's test processes ------------------------------------------------------------------


def test_a_condition_that_reads_a_variable_through_a_function_is_told_to_read_it_by_name(tmp_path: Path) -> None:
    """olive-io's condexpr_dataobject routes on ``getDataObject('cond1o')``. Validate said the
    function is no Python builtin, and no more: it now says what to write, the data object by its
    name; done so, the process runs."""
    path = REALWORLD / "condition_get_data_object.bpmn"
    found = {p.element_id: p for p in found_for(path, "condition_unknown_function")}
    assert set(found) == {"yes_flow", "no_flow"}
    assert found["yes_flow"].message.endswith(
        "(getDataObject('approved') reads 'approved', which an expression reads by its name: write 'approved')")
    assert found["no_flow"].message.endswith(
        "(getDataObject('approved') reads 'approved', which an expression reads by its name: write 'not approved')")
    fixed = rewritten(tmp_path, path, [("getDataObject('approved')", "approved"),
                                       ('getDataObject("approved")', "approved")])
    assert found_for(fixed, "condition_unknown_function") == []
    for approved, end in ((True, "accepted"), (False, "refused")):
        engine = Engine(store="memory://")
        instance = engine.run(engine.start(load_process([fixed]), {"approved": approved}))
        assert instance.status == "completed", instance.error
        assert path_of(instance.workflow)[-1] == end


def test_a_multi_instance_call_activity_maps_its_inputs_and_in_mappings_per_call() -> None:
    """A multi-instance call activity with an input parameter read by its camunda:in mapping: each
    call maps its own claim (the input parameter first, then the in mapping, as Camunda orders
    them), in that call's scope, and its out mapping sets the instance's output item."""
    path = REALWORLD / "io_mapping_multi_call.bpmn"
    assert found_for(path, "io_mapping_expression", "call_mapping_expression", "foreign_extension",
                     process_id="claims_batch") == []
    engine = Engine(store="memory://")
    instance = engine.run(engine.start(load_process([path], process_id="claims_batch"),
                                       {"claims": [{"amount": 50}, {"amount": 500}, {"amount": 101}]}))
    assert instance.status == "completed", instance.error
    found = variables(instance.main)
    assert found["verdicts"] == [False, True, True]
    assert "value" not in found  # what one call was given stays in its scope


def test_operatons_input_output_parameters_run_as_camundas(tmp_path: Path) -> None:
    """Operaton, Camunda 7's fork, writes the same parameters in its own namespace: they run alike."""
    text = C7.read_text().replace('xmlns:camunda="http://camunda.org/schema/1.0/bpmn"',
                                  'xmlns:operaton="http://operaton.org/schema/1.0/bpmn"').replace("camunda:", "operaton:")
    path = tmp_path / "io_mapping_operaton.bpmn"
    path.write_text(text)
    assert found_for(path, "foreign_extension", "io_mapping_expression") == []
    engine = Engine(store="memory://")
    instance = engine.run(engine.start(load_process([path]), {"invoice": {"net": 400}, "requester": "ann"}),
                          answers={"user_tasks": {"approve": {"approved": True}}})
    assert instance.status == "completed", instance.error
    assert (variables(instance.main)["taxDue"], variables(instance.main)["approvedBy"]) == (80.0, "ann")
