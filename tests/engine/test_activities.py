"""Activities: BPMN scripts, Python handlers, errors, retry after a fix."""

from __future__ import annotations

from pathlib import Path

import pytest

from context_layers import Layer, LayeredContext
from context_layers.errors import ConfigError, ProcessError
from engine import ActivityContext, Engine, HandlerRegistry, activity, load_process
from engine.handlers import run_script

from engine_helpers import script_task, write_process


# ----------------------------------------------------------------------------- script semantics

@pytest.fixture
def ctx() -> LayeredContext:
    c = LayeredContext(system={"policy": "p"})
    c.write(Layer.PROCESS, "amount", 100, actor="input")
    c.write(Layer.WORKING, "items", [1, 2], actor="t")
    c.write(Layer.WORKING, "untouched", {"a": 1}, actor="t")
    c.begin_activity("s")
    return c


@pytest.mark.parametrize(("script", "written", "expected"), [
    ("total = amount * 2", ["total"], {"total": 200}),
    ("items.append(3)", ["items"], {"items": [1, 2, 3]}),               # an in-place change is a change
    ("_tmp = 5\nkept = _tmp + 1", ["kept"], {"kept": 6}),               # _names stay in the script
    ("y = amount", ["y"], {"y": 100}),                                  # reading alone writes nothing
    ("import math\ndef f(x):\n    return x * amount\nz = f(2)", ["z"], {"z": 200}),
    ("n = sum(i * amount for i in items)", ["n"], {"n": 300}),           # names visible in generators
    ("amount = 100", [], {}),                                           # same value: no write (PROCESS is append-only)
    ("del untouched", ["untouched"], {}),
    ("w = ctx.get('policy')\nctx.write('L5', 'scratch', 1)", ["w"], {"w": "p", "scratch": 1}),
], ids=["assign", "mutate", "underscore", "read-only", "function", "generator", "same-value", "delete", "ctx-object"])
def test_script_writes_what_it_assigns_or_changes(ctx: LayeredContext, script: str, written: list[str],
                                                  expected: dict) -> None:
    assert run_script(script, ActivityContext(ctx, task_id="s")) == written
    for key, value in expected.items():
        assert ctx.resolve(key) == value
    if "del" in script:
        assert "untouched" not in ctx


def test_a_script_cannot_change_system(ctx: LayeredContext) -> None:
    from context_layers.errors import ContextWriteDenied

    with pytest.raises(ContextWriteDenied):
        run_script("policy = 'overridden'", ActivityContext(ctx, task_id="s"))
    assert ctx.resolve("policy") == "p"
    assert ctx.tape[-1].kind == "denied"


# ----------------------------------------------------------------------------- errors and retry

FAILING = [script_task("prepare", "divisor = 0\ntotal = 10"),
           script_task("compute", "ctx.write('L4', 'partial', 1)\nratio = total / divisor\nchecked = True")]


def test_a_failing_script_leaves_error_with_task_line_message_and_context_as_before(tmp_path: Path) -> None:
    engine = Engine()
    instance = engine.run(engine.start(load_process(write_process(tmp_path, "failing", FAILING))))
    assert instance.status == "error"
    err = instance.error
    assert (err["kind"], err["task_id"], err["line"]) == ("activity_failed", "compute", 2)
    assert "ZeroDivisionError" in err["message"] and "line 2" in err["message"] and "'compute'" in err["message"]
    ctx = instance.main
    # as before the activity: prepare's writes are there, compute's are not
    assert ctx.resolve("divisor") == 0 and "partial" not in ctx and "ratio" not in ctx
    assert ctx.current_activity is None
    aborted = [e for e in ctx.tape if e.kind == "abort"]
    assert aborted and aborted[0].data["task_id"] == "compute"


def test_after_the_cause_is_fixed_resume_retries_the_activity(tmp_path: Path) -> None:
    engine = Engine()
    instance = engine.run(engine.start(load_process(write_process(tmp_path, "failing", FAILING))))
    engine.inject(instance, {"divisor": 4})      # the operator's correction (HISTORY key: auto-promoted)
    instance = engine.resume(instance)
    assert instance.status == "completed", instance.error
    assert (instance.main.resolve("ratio"), instance.main.resolve("checked")) == (2.5, True)
    assert instance.error is None


def test_resume_of_an_error_after_loading_from_the_store(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'lf.db'}"
    first = Engine(url)
    instance = first.run(first.start(load_process(write_process(tmp_path, "failing", FAILING))))
    assert instance.status == "error"
    second = Engine(url)
    loaded = second.load(instance.id)
    assert loaded.status == "error" and loaded.error == instance.error
    second.inject(loaded, {"divisor": 5})
    assert second.resume(loaded).status == "completed"
    assert second.load(instance.id).main.resolve("ratio") == 2.0


def test_a_script_that_changes_system_fails_with_permission_denied(tmp_path: Path) -> None:
    path = write_process(tmp_path, "sneaky", [script_task("sneak", "currency = 'USD'")],
                         config="system:\n  currency: EUR\n")
    engine = Engine()
    instance = engine.run(engine.start(load_process(path)))
    assert instance.status == "error"
    assert instance.error["kind"] == "permission_denied" and instance.error["task_id"] == "sneak"
    assert instance.main.resolve("currency") == "EUR"
    assert any(e.kind == "denied" for e in instance.main.tape)


def test_a_condition_that_fails_names_the_gateway(tmp_path: Path) -> None:
    xml = (tmp_path / "cond.bpmn")
    xml.write_text("""<?xml version="1.0" encoding="UTF-8"?>
<bpmn:definitions xmlns:bpmn="http://www.omg.org/spec/BPMN/20100524/MODEL"
  xmlns:xsi="http://www.w3.org/2001/XMLSchema-instance" id="d" targetNamespace="t">
  <bpmn:process id="cond" isExecutable="true">
    <bpmn:startEvent id="start"/>
    <bpmn:exclusiveGateway id="gate" default="f_b"/>
    <bpmn:scriptTask id="a"><bpmn:script>x = 1</bpmn:script></bpmn:scriptTask>
    <bpmn:scriptTask id="b"><bpmn:script>x = 2</bpmn:script></bpmn:scriptTask>
    <bpmn:endEvent id="end"/>
    <bpmn:sequenceFlow id="f0" sourceRef="start" targetRef="gate"/>
    <bpmn:sequenceFlow id="f_a" sourceRef="gate" targetRef="a">
      <bpmn:conditionExpression xsi:type="bpmn:tFormalExpression">missing_value &gt; 3</bpmn:conditionExpression>
    </bpmn:sequenceFlow>
    <bpmn:sequenceFlow id="f_b" sourceRef="gate" targetRef="b"/>
    <bpmn:sequenceFlow id="f1" sourceRef="a" targetRef="end"/>
    <bpmn:sequenceFlow id="f2" sourceRef="b" targetRef="end"/>
  </bpmn:process>
</bpmn:definitions>""", encoding="utf-8")
    engine = Engine()
    instance = engine.run(engine.start(load_process(xml)))
    assert instance.status == "error"
    assert instance.error["task_id"] == "gate" and "missing_value" in instance.error["message"]


# ----------------------------------------------------------------------------- handlers

def test_handlers_by_task_id_by_config_name_and_by_engine(tmp_path: Path) -> None:
    registry = HandlerRegistry()

    @activity("by_id", registry=registry)
    def by_id(actx: ActivityContext) -> dict:
        return {"seen_amount": actx["amount"]}

    @activity("named", registry=registry)
    def named(actx: ActivityContext) -> dict:
        actx.write(Layer.EPHEMERAL, "scratch", "gone at the end")
        return {"named_ran": True}

    path = write_process(tmp_path, "handlers", [
        '<bpmn:task id="by_id"/>',                       # a plain task with a handler runs unattended
        '<bpmn:serviceTask id="svc"/>',
    ], config="svc:\n  handler: named\n")
    engine = Engine(handlers=registry)
    instance = engine.run(engine.start(load_process(path), {"amount": 7}))
    assert instance.status == "completed", instance.error
    ctx = instance.main
    assert (ctx.resolve("seen_amount"), ctx.resolve("named_ran")) == (7, True)
    assert "scratch" not in ctx  # EPHEMERAL is cleared at the end of every activity
    assert ctx.layer(Layer.HISTORY)["activity:svc"]["keys"] == ["scratch", "named_ran"]

    override = Engine(handlers=registry.layered({"named": lambda actx: {"named_ran": "override"}}))
    assert override.run(override.start(load_process(path), {"amount": 7})).main.resolve("named_ran") == "override"


@pytest.mark.parametrize(("result_variable", "key"), [(' resultVariable="credit_report"', "credit_report"),
                                                     ("", "spiff__lookup_result")])
def test_a_spiffarena_service_task_runs_the_handler_registered_under_its_operator(
        tmp_path: Path, result_variable: str, key: str) -> None:
    """A spiffworkflow:serviceTaskOperator (a SpiffArena connector): the handler registered under
    the operator's name gets the parameters, evaluated over the context, in ``actx.params``; what
    it returns is the task's result variable (SpiffWorkflow's default name when none is given)."""
    registry = HandlerRegistry()
    seen: list[dict] = []

    @activity("http/GetRequest", registry=registry)
    def get(actx: ActivityContext) -> dict:
        seen.append(dict(actx.params))
        return {"status": 200, "score": 710}

    operator = (f'<spiffworkflow:serviceTaskOperator id="http/GetRequest"{result_variable}>'
                '<spiffworkflow:parameters>'
                '<spiffworkflow:parameter id="url" type="str" value="&quot;https://bureau.example/&quot; + applicant"/>'
                '<spiffworkflow:parameter id="timeout" type="int" value="5"/>'
                '</spiffworkflow:parameters></spiffworkflow:serviceTaskOperator>')
    from engine_helpers import flow, write_elements

    path = write_elements(tmp_path, "connector", [
        '<bpmn:startEvent id="start"/>',
        f'<bpmn:serviceTask id="lookup"><bpmn:extensionElements>{operator}</bpmn:extensionElements></bpmn:serviceTask>',
        '<bpmn:endEvent id="end"/>', flow("start", "lookup"), flow("lookup", "end")])
    engine = Engine(handlers=registry)
    instance = engine.run(engine.start(load_process(path), {"applicant": "APP7"}))
    assert instance.status == "completed", instance.error
    assert seen == [{"url": "https://bureau.example/APP7", "timeout": 5}]
    assert instance.main.resolve(key) == {"status": 200, "score": 710}
    assert instance.main.layer(Layer.HISTORY)["activity:lookup"]["keys"] == [key]
    # with no handler under the operator's name, validate says what to register, and the run stops there
    from engine.validate import validate_process

    [warning] = validate_process(path).problems
    assert warning.code == "no_implementation" and "@activity('http/GetRequest')" in warning.message
    plain = Engine(handlers=HandlerRegistry())
    failed = plain.run(plain.start(load_process(path), {"applicant": "APP7"}))
    assert failed.status == "error" and failed.error["task_id"] == "lookup"


def test_a_handler_from_a_file_beside_the_process(tmp_path: Path) -> None:
    (tmp_path / "my_handlers.py").write_text(
        "def double(ctx):\n    return {'doubled': ctx['amount'] * 2}\n", encoding="utf-8")
    path = write_process(tmp_path, "filehandler", ['<bpmn:serviceTask id="svc"/>'],
                         config="svc:\n  handler: my_handlers.py:double\n")
    engine = Engine()
    assert engine.run(engine.start(load_process(path), {"amount": 21})).main.resolve("doubled") == 42


def test_a_service_task_without_handler_fails_saying_what_to_do(tmp_path: Path) -> None:
    engine = Engine()
    path = write_process(tmp_path, "nohandler", ['<bpmn:serviceTask id="lonely"/>'])
    instance = engine.run(engine.start(load_process(path)))
    assert instance.status == "error"
    assert "@activity('lonely')" in instance.error["message"]


def test_a_model_call_without_a_model_nor_an_offline_handler_says_so(tmp_path: Path) -> None:
    # offline, an llm: activity runs its handler; with none the error told to register a handler only,
    # as if the llm: block were not there
    engine = Engine()
    path = write_process(tmp_path, "onboarding", ['<bpmn:serviceTask id="welcome"/>'],
                         "welcome:\n  llm: {instructions: Greet the new employee., outputKeys: [greeting]}\n")
    instance = engine.run(engine.start(load_process(path)))
    assert instance.status == "error" and instance.error["task_id"] == "welcome"
    assert "no model is configured" in instance.error["message"] and "--model" in instance.error["message"]


def test_initial_data_that_is_no_mapping_is_refused_saying_so(tmp_path: Path) -> None:
    # it failed with "AttributeError: 'list' object has no attribute 'items'"
    engine = Engine()
    process = load_process(write_process(tmp_path, "manual", ['<bpmn:task id="sign"/>']))
    with pytest.raises(TypeError, match="initial data must be a mapping .* got list"):
        engine.start(process, [("amount", 1)])  # type: ignore[arg-type]
    assert engine.store.list() == []


def test_a_plain_task_without_handler_waits_for_a_person(tmp_path: Path) -> None:
    engine = Engine()
    path = write_process(tmp_path, "manual", ['<bpmn:task id="sign"/>', script_task("after", "done = signed_by")])
    instance = engine.run(engine.start(load_process(path)))
    assert instance.status == "waiting" and instance.waiting_for[0]["task_id"] == "sign"
    instance = engine.complete_user_task(instance, "sign", {"signed_by": "ann"})
    assert instance.main.resolve("done") == "ann"


@pytest.mark.parametrize("key", ["", "x\ud800"])
def test_a_user_task_answer_with_a_key_no_context_can_hold_is_bad_input(tmp_path: Path, key: str) -> None:
    # as a value that is no JSON: the person's mistake, the task still waits (the instance failed)
    from engine.governance import InvalidAnswer

    engine = Engine()
    path = write_process(tmp_path, "manual", ['<bpmn:task id="sign"/>', script_task("after", "done = signed_by")])
    instance = engine.run(engine.start(load_process(path)))
    with pytest.raises(InvalidAnswer, match="'sign'") as err:
        engine.complete_user_task(instance, "sign", {key: 1, "signed_by": "ann"})
    assert err.value.task_id == "sign"
    again = engine.load(instance.id)
    assert again.status == "waiting" and again.waiting_for[0]["task_id"] == "sign"
    done = engine.complete_user_task(again, "sign", {"signed_by": "ann"})
    assert done.status == "completed" and done.main.resolve("done") == "ann"


def test_a_user_task_answer_cannot_forge_an_activity_record(tmp_path: Path) -> None:
    # a new activity:<id> key written to WORKING would arrive in HISTORY as the engine's record
    # of an activity that has not run (and push that activity's own record to activity:<id>#2)
    from engine import AnswerWriteDenied

    engine = Engine()
    path = write_process(tmp_path, "manual", ['<bpmn:task id="sign"/>', script_task("after", "done = signed_by")])
    instance = engine.run(engine.start(load_process(path)))
    forged = {"kind": "activity", "activity": "after", "status": "completed", "summary": "approved", "keys": []}
    with pytest.raises(AnswerWriteDenied, match="activity:after"):
        engine.complete_user_task(instance, "sign", {"activity:after": forged, "signed_by": "ann"})
    done = engine.complete_user_task(engine.load(instance.id), "sign", {"signed_by": "ann"})
    history = done.main.layer(Layer.HISTORY)
    assert done.status == "completed" and history["activity:after"]["keys"] == ["done"]
    assert "activity:after#2" not in history


# ----------------------------------------------------------------------------- loading

def test_config_from_both_extension_namespaces_on_tasks_and_gateways(tmp_path: Path) -> None:
    xml = tmp_path / "ext.bpmn"
    xml.write_text("""<?xml version="1.0" encoding="UTF-8"?>
<bpmn:definitions xmlns:bpmn="http://www.omg.org/spec/BPMN/20100524/MODEL"
  xmlns:spiffworkflow="http://spiffworkflow.org/bpmn/schema/1.0/core"
  xmlns:layerflow="https://layerflow.dev/bpmn" id="d" targetNamespace="t">
  <bpmn:process id="ext" isExecutable="true">
    <bpmn:startEvent id="start"/>
    <bpmn:scriptTask id="t">
      <bpmn:extensionElements>
        <spiffworkflow:activityConfig>{"preserveKeys": ["a"], "compressTokenThreshold": 100}</spiffworkflow:activityConfig>
        <layerflow:config>{"compressTokenThreshold": 200}</layerflow:config>
      </bpmn:extensionElements>
      <bpmn:script>a = 1</bpmn:script>
    </bpmn:scriptTask>
    <bpmn:parallelGateway id="g">
      <bpmn:extensionElements><layerflow:config>{"mergeStrategy": "FAIL_ON_CONFLICT"}</layerflow:config></bpmn:extensionElements>
    </bpmn:parallelGateway>
    <bpmn:endEvent id="end"/>
    <bpmn:sequenceFlow id="f0" sourceRef="start" targetRef="t"/>
    <bpmn:sequenceFlow id="f1" sourceRef="t" targetRef="g"/>
    <bpmn:sequenceFlow id="f2" sourceRef="g" targetRef="end"/>
  </bpmn:process>
</bpmn:definitions>""", encoding="utf-8")
    (tmp_path / "ext.layerflow.yaml").write_text("t:\n  preserveKeys: [a, b]\n", encoding="utf-8")
    process = load_process(xml)
    assert process.configs["t"].effective_preserve_keys == ["a", "b"]          # the file overrides
    assert process.configs["t"].effective_token_threshold == 200               # own namespace over spiff's
    assert process.configs["g"].merge_strategy == "FAIL_ON_CONFLICT"           # gateways have config too
    assert type(process.spec.task_specs["g"]).__name__ == "LayerflowParallelGateway"


def test_nothing_runs_on_a_process_that_does_not_validate(tmp_path: Path) -> None:
    path = write_process(tmp_path, "bad", [script_task("t", "x = (")], config="nope:\n  preserveKeys: [a]\n")
    with pytest.raises((ProcessError, ConfigError)) as err:
        load_process(path)
    text = str(err.value)
    assert "nope" in text and "'t'" in text  # every problem at once: the unknown id and the script syntax


LOOP_BPMN = """<?xml version="1.0" encoding="UTF-8"?>
<bpmn:definitions xmlns:bpmn="http://www.omg.org/spec/BPMN/20100524/MODEL"
    xmlns:xsi="http://www.w3.org/2001/XMLSchema-instance" id="d" targetNamespace="https://layerflow.dev/tests">
  <bpmn:process id="loop3" isExecutable="true">
    <bpmn:startEvent id="start"/>
    <bpmn:scriptTask id="init"><bpmn:script>count = 0
items = []</bpmn:script></bpmn:scriptTask>
    <bpmn:scriptTask id="work"><bpmn:script>count = count + 1
items = items + ["item number %d of the loop" % count]</bpmn:script></bpmn:scriptTask>
    <bpmn:exclusiveGateway id="more" default="f_done"/>
    <bpmn:endEvent id="end"/>
    <bpmn:sequenceFlow id="f1" sourceRef="start" targetRef="init"/>
    <bpmn:sequenceFlow id="f2" sourceRef="init" targetRef="work"/>
    <bpmn:sequenceFlow id="f3" sourceRef="work" targetRef="more"/>
    <bpmn:sequenceFlow id="f_again" sourceRef="more" targetRef="work"><bpmn:conditionExpression xsi:type="bpmn:tFormalExpression">count &lt; 3</bpmn:conditionExpression></bpmn:sequenceFlow>
    <bpmn:sequenceFlow id="f_done" sourceRef="more" targetRef="end"/>
  </bpmn:process>
</bpmn:definitions>
"""


def test_each_loop_pass_record_names_its_keys_and_counts_their_tokens(tmp_path: Path) -> None:
    # every pass rewrites keys HISTORY holds since the first: those writes land in HISTORY at
    # once, and the record counted only WORKING's (0, or the split markers' tokens on one pass)
    path = tmp_path / "loop3.bpmn"
    path.write_text(LOOP_BPMN, encoding="utf-8")
    instance = Engine("memory://").run_process(load_process(path), {})
    assert instance.status == "completed", instance.error
    ctx = instance.contexts["main"]
    history = ctx.layer(Layer.HISTORY)
    passes = [history[k] for k in ("activity:work", "activity:work#2", "activity:work#3")]
    items_tokens = []
    for record in passes:
        assert record["keys"] == ["count", "items"]
        items_tokens.append(record["tokens"])
        assert record["tokens"] > 0
    # the list grows each pass: so does what the pass wrote
    assert items_tokens == sorted(items_tokens) and items_tokens[0] < items_tokens[-1]
    assert passes[-1]["tokens"] == ctx.key_tokens(Layer.HISTORY, "count") + ctx.key_tokens(Layer.HISTORY, "items")
    assert LayeredContext.replay(ctx.tape) == ctx
