"""Black-box checks of DESIGN.md promises (and the seeds' shapes behind them) that no other
contract test checked from the outside, found by going through DESIGN.md line by line
(round 26). Each test quotes what it checks; each uses the public surface only: names
imported from the packages' top level, a real ``layerflow serve`` process for the REST API."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import local_http
import pytest

from context_layers import ActivityExtensionConfig, Layer, LayeredContext, RuleDrivenCompressor, render
from engine import Engine, load_process
from gateways import ContextSplitter
from test_contracts_design import CONFLICTING, process, script, write_bpmn
from test_contracts_rest import example_catalog, serving

ROOT = Path(__file__).resolve().parents[1]
TOKEN = "seeds-26-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
LOAN_CONFLICT = {"amount": 120000, "applicant_id": "APP-26", "purpose": "expansion", "industry": "gambling"}


# =============================================================================== layout

OUTSIDE_THE_MODEL = ("SpiffWorkflow", "fastapi", "starlette", "uvicorn", "litellm")


def _imported(path: Path) -> list[tuple[int, str]]:
    """Every module a source file imports, lazily inside a function too (``importlib.import_module``
    and ``__import__`` of a literal name included); relative imports stay in their package."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.append((node.lineno, node.module))
        elif (isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant)
              and getattr(node.func, "attr", getattr(node.func, "id", None)) in ("import_module", "__import__")):
            found.append((node.lineno, str(node.args[0].value)))
    return found


@pytest.mark.parametrize("package, banned", [
    ("context_layers", ("gateways", "engine", *OUTSIDE_THE_MODEL)),
    ("gateways", ("engine", *OUTSIDE_THE_MODEL)),
])
def test_dependencies_point_one_way(package: str, banned: tuple[str, ...]) -> None:
    """"Dependencies point one way: `engine` -> `gateways` -> `context_layers`. `context_layers`
    imports neither of the others, and nothing in `context_layers` or `gateways` imports
    SpiffWorkflow, FastAPI or litellm" -- read from the source, so a lazy import inside a
    function, which importing the package would never run, counts too."""
    files = sorted((ROOT / package).rglob("*.py"))
    assert files
    wrong = [f"{path.relative_to(ROOT)}:{line} imports {name}" for path in files
             for line, name in _imported(path) if name.split(".")[0] in banned]
    assert wrong == []


# =============================================================================== the six layers, on split


def test_a_branch_s_history_is_its_own_and_system_and_process_are_shared() -> None:
    """"| L3 | HISTORY | ... | independent copy |", "| L0 | SYSTEM | ... | shared |", "| L1 |
    PROCESS | ... | shared |": what one branch's activity moves into HISTORY is in no other
    branch and not in the parent; each branch starts from the parent's HISTORY."""
    ctx = LayeredContext(system={"policy": "p"})
    ctx.write(Layer.PROCESS, "amount", 120000, actor="submit")
    ctx.begin_activity("assess")
    ctx.write(Layer.WORKING, "risk_level", "high", actor="assess")
    ctx.complete_activity("assess")
    finance, risk = (b.context for b in ContextSplitter().split(ctx, "review", ["finance", "risk"]))
    for branch in (finance, risk):
        assert dict(branch.layer(Layer.SYSTEM)) == {"policy": "p"}
        assert dict(branch.layer(Layer.PROCESS)) == {"amount": 120000}
        assert branch.layer(Layer.HISTORY)["risk_level"] == "high"
    finance.begin_activity("finance")
    finance.write(Layer.WORKING, "finance_comment", "income stable", actor="finance")
    finance.complete_activity("finance")
    assert finance.layer(Layer.HISTORY)["finance_comment"] == "income stable"
    for other in (risk, ctx):
        assert "finance_comment" not in other.layer(Layer.HISTORY)
        assert "activity:finance" not in other.layer(Layer.HISTORY)
    assert LayeredContext.replay(finance.tape) == finance


# =============================================================================== gateways

REDUCED = process("reduced", "\n".join([
    '    <bpmn:startEvent id="s"/>',
    script("init", 'n = 10\ntags = ["x"]'),
    '    <bpmn:parallelGateway id="fork"/>',
    script("a", 'n = 15\ntags = ["x", "a"]'),
    script("b", 'n = 7\ntags = ["x", "b"]'),
    script("c", 'other = 1'),
    '    <bpmn:parallelGateway id="join"/>',
    '    <bpmn:endEvent id="e"/>']),
    [("s", "init"), ("init", "fork"), ("fork", "a"), ("fork", "b"), ("fork", "c"), ("a", "join"), ("b", "join"),
     ("c", "join"), ("join", "e")])


@pytest.mark.parametrize("reducer, key, expected", [
    ("sum", "n", 12),                 # the base plus each changing branch's delta: 10 + 5 - 3
    ("max", "n", 15),
    ("min", "n", 7),
    ("append", "tags", ["x", "a", "b"]),
    ("union", "tags", ["x", "a", "b"]),
])
def test_a_per_key_reducer_settles_the_key_without_a_conflict(tmp_path: Path, reducer: str, key: str,
                                                              expected: Any) -> None:
    """"Merge strategies (the join's `mergeStrategy`): ... and per-key reducers (`append`,
    `union`, `sum`, `max`, `min`)": two branches change the key differently, the reducer
    combines them, nobody is asked and no conflict is listed."""
    other = "tags" if key == "n" else "n"
    bpmn = write_bpmn(tmp_path, "reduced", REDUCED,
                      config=f"join:\n  reducers: {{{key}: {reducer}}}\n  mergeStrategy: LAST_WRITER_WINS\n")
    engine = Engine("memory://")
    instance = engine.run(engine.start(load_process(str(bpmn))))
    assert instance.status == "completed", (instance.error, instance.waiting_for)
    assert json.loads(json.dumps(instance.main.resolve(key))) == expected
    # the other key still conflicts: the reducer settles its own key only
    assert [c["key"] for c in instance.conflicts] == [other]
    assert instance.conflicts[0]["resolution"]["resolver"] == "strategy"
    assert LayeredContext.replay(instance.main.tape) == instance.main


def test_fail_on_conflict_names_every_conflict(tmp_path: Path) -> None:
    """"`FAIL_ON_CONFLICT` (the instance stops with an error that names every conflict)":
    two keys in conflict, both named, neither resolved, nothing merged."""
    bpmn = write_bpmn(tmp_path, "two_keys", CONFLICTING, config="join:\n  mergeStrategy: FAIL_ON_CONFLICT\n")
    engine = Engine("memory://")
    instance = engine.run(engine.start(load_process(str(bpmn))))
    assert instance.status == "error" and instance.error["task_id"] == "join"
    message = instance.error["message"]
    for key, values in (("x", ("1", "2")), ("y", ("approved", "rejected"))):
        assert f"'{key}'" in message and all(v in message for v in values), (key, message)
    assert [(c["key"], c["resolution"]) for c in instance.conflicts] == [("x", None), ("y", None)]
    assert "x" not in instance.main and "y" not in instance.main


def test_a_conflict_s_own_answer_wins_over_the_star(tmp_path: Path) -> None:
    """"KEY is a confirmation id, `GATEWAY_ID/CONTEXT_KEY` for a join conflict, or `*` for any
    other confirmation": given both, the conflict named takes its own answer, the star the
    rest; the document's `confirmations` records each answer, none timed out."""
    bpmn = write_bpmn(tmp_path, "two_keys", CONFLICTING)
    engine = Engine("memory://")
    instance = engine.run(engine.start(load_process(str(bpmn))),
                          answers={"confirmations": {"*": "approved", "join/x": 2}})
    assert instance.status == "completed", instance.waiting_for
    assert (instance.main.resolve("x"), instance.main.resolve("y")) == (2, "approved")
    document = instance.to_document()
    answered = {c["id"]: (c["answer"], c["timed_out"]) for c in document["confirmations"]}
    assert answered == {"join/x": (2, False), "join/y": ("approved", False)}
    assert {c["key"]: c["resolution"]["resolver"] for c in document["conflicts"]} == {"x": "human", "y": "human"}


INCLUSIVE = process("inclusive", "\n".join([
    '    <bpmn:startEvent id="s"/>',
    script("init", "k = 0"),
    '    <bpmn:inclusiveGateway id="fork"/>',
    script("a", "k = 1"), script("b", "k = 2"), script("c", "k = 3"),
    '    <bpmn:inclusiveGateway id="join"/>',
    '    <bpmn:endEvent id="e"/>']),
    [("s", "init"), ("init", "fork"), ("a", "join"), ("b", "join"), ("c", "join"), ("join", "e")])
_TAKEN = "".join(f'\n    <bpmn:sequenceFlow id="in_{t}" sourceRef="fork" targetRef="{t}">'
                 f"<bpmn:conditionExpression>{cond}</bpmn:conditionExpression></bpmn:sequenceFlow>"
                 for t, cond in (("a", "k == 0"), ("b", "True"), ("c", "k == 99")))
INCLUSIVE = INCLUSIVE.replace("  </bpmn:process>", _TAKEN.lstrip("\n") + "\n  </bpmn:process>")


def test_an_inclusive_join_merges_the_branches_taken_three_way(tmp_path: Path) -> None:
    """"Join (AND, inclusive): three-way merge of each branch against the split's snapshot";
    "branch ids are the BPMN ids of the first element of each outgoing branch": the branch
    not taken brings nothing, the two taken ones conflict and a person settles it."""
    bpmn = write_bpmn(tmp_path, "inclusive", INCLUSIVE)
    engine = Engine("memory://")
    instance = engine.run(engine.start(load_process(str(bpmn))))
    assert instance.status == "waiting"
    [conflict] = instance.conflicts
    assert (conflict["gateway_id"], conflict["key"], conflict["base_value"]) == ("join", "k", 0)
    assert conflict["values"] == {"a": 1, "b": 2}
    done = engine.run(instance, answers={"confirmations": {"join/k": 2}})
    assert done.status == "completed" and done.main.resolve("k") == 2
    [logged] = done.main.resolve("_mergedConflicts")
    assert (logged["key"], logged["baseValue"], list(logged["conflictingValues"]), list(logged["sourceBranches"])) == \
        ("k", 0, [1, 2], ["a", "b"])
    assert logged["resolution"]["value"] == 2 and logged["resolution"]["resolver"] == "human"


# =============================================================================== compression


def test_compression_ratio_is_the_share_the_seed_names() -> None:
    """The seed's `CompressResult`: `beforeTokens`, `afterTokens` and `compressionRatio = 1.0 -
    afterTokens / beforeTokens`; DESIGN: "reports tokens before/after, ratio"."""
    ctx = LayeredContext(system={"policy": "p"})
    for i in range(6):
        ctx.begin_activity(f"call{i}")
        ctx.write(Layer.WORKING, f"tool_call_result_{i}",
                  {"status": "ok", "data": {"id": i, "summary": "s", "payload": "lorem ipsum " * 40}}, actor=f"call{i}")
        ctx.complete_activity(f"call{i}")
    config = ActivityExtensionConfig.model_validate({"activityId": "x", "compressRules": [
        {"pattern": "tool_call_result", "action": "extract_keys", "extractKeys": ["status", "data.id", "data.summary"]}]})
    result = RuleDrivenCompressor().compress(ctx, config)
    assert (result.beforeTokens, result.afterTokens) == (result.tokens_before, result.tokens_after)
    assert result.tokens_after == ctx.tokens(Layer.HISTORY) + ctx.tokens(Layer.WORKING)
    assert result.compressionRatio == pytest.approx(1.0 - result.tokens_after / result.tokens_before)
    assert 0 < result.compressionRatio < 1


CHAIN = process("chain", "\n".join([
    '    <bpmn:startEvent id="s"/>',
    *[script(f"step{i}", f'note_{i} = "{"finding %d " % i * 60}"\nstatus = "step {i}"') for i in range(6)],
    '    <bpmn:endEvent id="e"/>']),
    [("s", "step0"), *[(f"step{i}", f"step{i + 1}") for i in range(5)], ("step5", "e")])


def test_the_rendered_prefix_changes_only_at_a_cliff(tmp_path: Path) -> None:
    """"Compression of HISTORY is a cliff, not a sliding window: it happens rarely and moves a
    cursor, so the rendered prefix stays stable between cliffs." After every activity the
    request a model would be sent begins with the whole stable part of the one before (a key
    that changed too), except at the one activity that compressed."""
    bpmn = write_bpmn(tmp_path, "chain", CHAIN, config="step4:\n  compressTokenThreshold: 400\n")
    renders: list[tuple[str, list[dict[str, str]]]] = []
    engine = Engine("memory://", progress=lambda instance, task_id, ctx: renders.append(
        (task_id, render(ctx, format="xml"))))
    instance = engine.run(engine.start(load_process(str(bpmn))))
    assert instance.status == "completed"
    assert [c["activity_id"] for c in instance.compressions] == ["step4"]
    steps = [task for task, _ in renders]
    assert steps == [f"step{i}" for i in range(6)]
    for (_, before), (task, after) in zip(renders, renders[1:]):
        assert after[:-1] == before[:-1], task  # the system message never moves
        last = before[-1]["content"]
        stable = last[: last.index("</history>")]
        kept = after[-1]["content"].startswith(stable)
        assert kept is (task != "step4"), task


# =============================================================================== interfaces: REST


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    folder = tmp_path_factory.mktemp("seeds26")
    yield from serving(folder, example_catalog(folder), TOKEN)


def _post(url: str, path: str, body: dict[str, Any]) -> httpx.Response:
    return local_http.post(f"{url}{path}", json=body, headers=AUTH, timeout=120)


def _get(url: str, path: str, **params: Any) -> httpx.Response:
    return local_http.get(f"{url}{path}", params=params, headers=AUTH, timeout=120)


DESIGN_KINDS = ["write", "denied", "move", "split", "join", "conflict", "resolution", "human_decision",
                "compression", "rollback", "inject", "config"]


def test_every_kind_of_change_design_names_is_on_the_instance_tape(server: str) -> None:
    """"every change (write, denied write, move, split, join, conflict, resolution, human
    decision, compression, rollback, inject, config change) is an event appended to the
    instance's tape with a sequence number, time, actor, activity and branch. Nothing is ever
    deleted from a tape." One loan instance driven through all of them over REST; the tape
    filter finds each by its DESIGN name."""
    started = _post(server, "/api/instances", {"process_id": "loan_approval", "data": LOAN_CONFLICT})
    assert started.status_code == 201, started.text
    iid = started.json()["instance_id"]
    assert [w["id"] for w in started.json()["waiting_for"]] == ["review_join/approval_status"]
    denied = _post(server, "/api/context-governance/inject", {"instance_id": iid, "values": {"policy": "anything"}})
    assert denied.status_code == 403, denied.text
    injected = _post(server, "/api/context-governance/inject",
                     {"instance_id": iid, "context": "finance_review", "values": {"ops_note": "checked by ops"}})
    assert injected.status_code == 200, injected.text
    configured = _post(server, "/api/context-governance/config", {
        "instance_id": iid, "config": {"activityId": "disbursement_decision", "compressTokenThreshold": 1000}})
    assert configured.status_code == 200, configured.text
    snapshot = _post(server, "/api/context-governance/snapshot", {"instance_id": iid}).json()["snapshot_id"]
    resolved = _post(server, "/api/context-governance/resolve", {
        "instance_id": iid, "conflict_key": "approval_status", "resolution": "pending_dual_approval",
        "reason": "dual approval"})
    assert resolved.status_code == 200 and resolved.json()["status"] == "completed", resolved.text
    assert resolved.json()["layers"]["L3"]["ops_note"] == "checked by ops"  # the branch's inject was merged
    assert [c["activity_id"] for c in resolved.json()["compressions"]] == ["disbursement_decision"]
    before = _get(server, f"/api/instances/{iid}/tape").json()["events"]
    back = _post(server, "/api/context-governance/rollback", {"instance_id": iid, "snapshot_id": snapshot,
                                                               "layers": ["L3"]})
    assert back.status_code == 200, back.text
    after = _get(server, f"/api/instances/{iid}/tape").json()["events"]
    assert after[: len(before)] == before and len(after) > len(before)  # appended, nothing rewritten
    for kind in DESIGN_KINDS:
        found = _get(server, f"/api/instances/{iid}/tape", kind=kind).json()
        assert found["events"], (kind, found.get("note"))
        for event in found["events"]:
            assert {"seq", "time", "actor", "activity", "branch"} <= set(event), (kind, event)
            assert isinstance(event["seq"], int) and event["actor"], (kind, event)
    final = _get(server, f"/api/instances/{iid}").json()
    assert final["tape_length"] == len(after)
    # the tape alone rebuilds the context the document shows, branches' events and all
    assert json.loads(json.dumps(LayeredContext.replay(after).as_dict())) == final["layers"]


def test_the_seed_s_model_tool_calls_run_over_rest(server: str) -> None:
    """"Model tools: `context_inspect`, `context_compress`, `context_branch`, `human_confirm` as
    function-calling schemas, served by the same governance service as the REST API" -- the
    seed's own example calls, sent as written, to a real server."""
    schemas = _get(server, "/api/context-governance/tools").json()
    names = [tool["function"]["name"] for tool in (schemas["tools"] if isinstance(schemas, dict) else schemas)]
    assert names == ["context_inspect", "context_compress", "context_branch", "human_confirm"]
    iid = _post(server, "/api/instances", {"process_id": "loan_approval", "data": LOAN_CONFLICT}).json()["instance_id"]

    def tool(name: str, arguments: dict[str, Any]) -> dict[str, Any]:
        r = _post(server, f"/api/context-governance/tools/{name}", {"instance_id": iid, "arguments": arguments})
        assert r.status_code == 200, (name, r.text)
        body: dict[str, Any] = r.json()
        assert body.get("error") is None, (name, body)
        return body

    snap = tool("context_branch", {"action": "snapshot", "layers": ["L2", "L3", "L4"]})
    assert snap["snapshot_id"]
    check = tool("context_branch", {"action": "evaluate", "branch_id": "finance_review",
                                    "required_keys": ["amount", "approval_status"]})
    assert "approval_status" in json.dumps(check)
    done = tool("context_branch", {"action": "resolve_conflict", "conflict_key": "approval_status",
                                   "resolution": "approved", "reason": "finance approval first, risk follows"})
    assert done["status"] == "completed"
    doc = _get(server, f"/api/instances/{iid}").json()
    assert doc["layers"]["L3"]["approval_status"] == "approved"
    [conflict] = doc["conflicts"]
    assert conflict["resolution"]["value"] == "approved"
    assert "finance approval first" in conflict["resolution"]["reason"]


# =============================================================================== tape: replay from the JSON tape


def _layerflow(folder: Path, *args: str) -> Any:
    env = {k: v for k, v in os.environ.items() if k not in ("LAYERFLOW_MODEL_API_BASE", "LAYERFLOW_STORE")}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    out = subprocess.run([sys.executable, "-m", "engine.cli", *args, "--json"], cwd=folder, env=env,
                         capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=180)
    assert out.returncode in (0, 3), (out.returncode, out.stdout[-800:], out.stderr[-800:])
    return json.loads(out.stdout)


def test_any_context_is_rebuilt_from_the_instance_s_json_tape_alone(tmp_path: Path) -> None:
    """"The state of any context at any sequence number can be rebuilt from the tape alone
    (replay), and the rebuild is byte-identical" -- from the instance's tape as `layerflow tape
    --json` (and the REST API) give it: every context's events, each naming its `context`. A
    branch starts from its parent's snapshot, which the parent's events in that same tape
    rebuild; before, replay refused every instance with a parallel branch."""
    store = f"sqlite:///{tmp_path / 'runs.db'}"
    doc = _layerflow(tmp_path, "demo", "loan", "--yes", "--store", store)
    assert doc["status"] == "completed" and doc["contexts"]
    events = _layerflow(tmp_path, "tape", doc["instance_id"], "--store", store)
    assert {e["context"] for e in events} == {"main", *doc["contexts"]}
    instance = Engine(store).load(doc["instance_id"])
    main = LayeredContext.replay(events)  # the first context of the tape: main
    assert main == instance.main
    assert json.loads(json.dumps(main.as_dict())) == doc["layers"]
    for name, ctx in instance.contexts.items():
        rebuilt = LayeredContext.replay(events, name=name)
        assert rebuilt == ctx, name
        assert render(rebuilt, format="xml") == render(ctx, format="xml"), name
        for seq in {1, 2, len(ctx.tape) // 2, len(ctx.tape)}:
            assert LayeredContext.replay(events, name=name, until=seq) == LayeredContext.replay(ctx.tape, until=seq), \
                (name, seq)
    for name, info in doc["contexts"].items():  # a branch id names its context, as on the CLI
        assert LayeredContext.replay(events, name=info["branch_id"]) == instance.contexts[name]
    with pytest.raises(KeyError, match="main/nowhere@1"):
        LayeredContext.replay(events, name="main/nowhere@1")
    # a filtered tape (`tape --kind write --json`) is not the tape: refused, never a wrong context
    with pytest.raises(ValueError, match="not whole"):
        LayeredContext.replay([e for e in events if e["kind"] == "write"])


def test_an_engine_compression_is_evaluated_and_undone_by_its_snapshot(server: str) -> None:
    """"Every compression takes a snapshot first, reports tokens before/after, ratio and
    attention before/after (`evaluate`), and can be undone (`decompress` to that snapshot)" --
    the compression the engine made after an activity, named by `run --json`'s `compressions`,
    evaluated and undone over REST."""
    started = _post(server, "/api/instances", {"process_id": "loan_approval", "data": LOAN_CONFLICT,
                                               "answers": {"confirmations": {"*": "pending_dual_approval"}}})
    doc = started.json()
    assert doc["status"] == "completed", doc["waiting_for"]
    [compression] = doc["compressions"]
    assert compression["activity_id"] == "disbursement_decision"
    assert doc["tokens"]["L3"] + doc["tokens"]["L4"] == compression["tokens_after"] < compression["tokens_before"]
    iid, snapshot = doc["instance_id"], compression["snapshot_id"]
    report = _post(server, "/api/context-governance/compress",
                   {"instance_id": iid, "action": "evaluate", "before_snapshot_id": snapshot})
    assert report.status_code == 200, report.text
    body = report.json()
    assert (body["tokens_before"], body["tokens_after"]) == (compression["tokens_before"], compression["tokens_after"])
    assert body["ratio"] == pytest.approx(compression["tokens_after"] / compression["tokens_before"])
    for side in ("attention_before", "attention_after"):
        assert {"density", "redundancy", "decay", "conflict", "toolEfficiency"} <= set(body[side]), side
        assert all(0.0 <= v <= 1.0 for v in body[side].values()), side
    undone = _post(server, "/api/context-governance/compress",
                   {"instance_id": iid, "action": "decompress", "snapshot_id": snapshot})
    assert undone.status_code == 200, undone.text
    after = _get(server, f"/api/instances/{iid}").json()
    assert after["tokens"]["L3"] + after["tokens"]["L4"] == compression["tokens_before"]
    assert after["tape_length"] > doc["tape_length"]  # the undo is an event; the compression's stays
    for key in ("risk_level", "assessment_id", "approval_status", "track_type"):  # preserved all along
        assert after["layers"]["L3"][key] == doc["layers"]["L3"][key], key
    assert {"credit_bureau_result", "risk_reasoning"} <= set(after["layers"]["L3"]) - set(doc["layers"]["L3"])


def test_the_seed_s_inspect_filter_and_metrics_narrow_the_report(server: str) -> None:
    """The seed's `context_inspect`: `layers`, the `metrics` asked for, and `filter`
    (`key_prefix` "risk_*": only the keys beginning so; `modified_after`: only what changed
    since), as the body of `POST /api/context-governance/inspect` on a real server."""
    doc = _post(server, "/api/instances", {"process_id": "loan_approval", "data": LOAN_CONFLICT}).json()
    iid, history = doc["instance_id"], doc["layers"]["L3"]

    def inspect(**body: Any) -> dict[str, Any]:
        r = _post(server, "/api/context-governance/inspect", {"instance_id": iid, "layers": ["L3", "L4"], **body})
        assert r.status_code == 200, r.text
        report: dict[str, Any] = r.json()
        return report

    risk = inspect(filter={"key_prefix": "risk_*"})["L3"]
    assert risk["keys"] == [k for k in history if k.startswith("risk_")] and risk["key_count"] == len(risk["keys"])
    assert 0 < risk["token_count"] < doc["tokens"]["L3"]
    assert inspect(filter={"modified_after": "2099-01-01T00:00:00Z"})["L3"]["key_count"] == 0
    assert inspect(filter={"modified_after": "2000-01-01T00:00:00Z"})["L3"]["key_count"] == len(history)
    only = inspect(metrics=["token_count"])
    assert only["L3"] == {"token_count": doc["tokens"]["L3"]} and only["L4"] == {"token_count": 0}
