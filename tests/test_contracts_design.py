"""Black-box checks of DESIGN.md, sentence by sentence, for the statements the rest of the
suite did not check from the outside: "The six layers", "Public names", "Tape,
snapshots, views", "Gateways", "Compression", "Rendering".

Each test quotes the sentence it checks. They use the public names DESIGN.md lists
(Layer, LayeredContext, render, ContextSplitter, load_process, Engine) and the documented
members of what those return (views, snapshots, tape events, instances), on processes
written here; no private attribute is read."""

from __future__ import annotations

import json
import tracemalloc
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from context_layers import ActivityExtensionConfig, ContextWriteDenied, Layer, LayeredContext, render
from engine import Engine, load_process
from gateways import ContextSplitter

BPMN = """<?xml version="1.0" encoding="UTF-8"?>
<bpmn:definitions xmlns:bpmn="http://www.omg.org/spec/BPMN/20100524/MODEL"
    xmlns:xsi="http://www.w3.org/2001/XMLSchema-instance" id="d" targetNamespace="x">
{processes}
</bpmn:definitions>
"""


def process(pid: str, elements: str, flows: list[tuple[str, str]]) -> str:
    """A process: ``elements`` as written, one sequence flow per ``(source, target)``."""
    lines = [f'  <bpmn:process id="{pid}" isExecutable="true">', elements]
    lines += [f'    <bpmn:sequenceFlow id="{pid}_{s}_{t}" sourceRef="{s}" targetRef="{t}"/>' for s, t in flows]
    lines.append("  </bpmn:process>")
    return "\n".join(lines)


def script(task_id: str, body: str) -> str:
    return f'    <bpmn:scriptTask id="{task_id}"><bpmn:script>{body}</bpmn:script></bpmn:scriptTask>'


def write_bpmn(folder: Path, name: str, *processes: str, config: str | None = None) -> Path:
    path = folder / f"{name}.bpmn"
    path.write_text(BPMN.format(processes="\n".join(processes)))
    if config is not None:
        (folder / f"{name}.layerflow.yaml").write_text(config)
    return path


def plain(value: Any) -> Any:
    """A context value as plain JSON data."""
    return json.loads(json.dumps(value))


# =============================================================================== the six layers


def test_every_layer_history_included_holds_json_values(tmp_path: Path) -> None:
    """"Every layer, HISTORY included, is a key -> value map of JSON-compatible values."

    Strings JSON text cannot carry (a lone surrogate is not Unicode text, so no UTF-8
    document holds it) are refused like any other non-JSON value, before the default
    store is asked to save them; everything a run leaves in any layer is JSON."""
    ctx = LayeredContext(system={"policy": "p"})
    for layer in (Layer.PROCESS, Layer.KNOWLEDGE, Layer.WORKING, Layer.EPHEMERAL):
        for bad in ("broken \ud800 text", {"nested": ["ok", "\udfff"]}, {"key \ud834": 1}):
            before = ctx.as_dict()
            with pytest.raises(TypeError) as err:  # ContextValueError is a TypeError
                ctx.write(layer, "note", bad, actor="a")
            assert "note" in str(err.value)
            assert ctx.as_dict() == before
    with pytest.raises(TypeError):
        ctx.write(Layer.WORKING, "key \ud800", 1, actor="a")

    bpmn = write_bpmn(tmp_path, "tiny", process("tiny", "\n".join([
        '    <bpmn:startEvent id="s"/>', script("t", "doubled = amount * 2"), '    <bpmn:endEvent id="e"/>']),
        [("s", "t"), ("t", "e")]))
    engine = Engine(f"sqlite:///{tmp_path / 'runs.db'}")
    with pytest.raises(TypeError):
        engine.start(load_process(str(bpmn)), {"amount": 2, "note": "lone \ud800 surrogate"})
    instance = engine.run(engine.start(load_process(str(bpmn)), {"amount": 2, "note": "naïve ✓ 𝄞"}))
    assert instance.status == "completed"
    loaded = engine.load(instance.id)
    for layer in Layer:
        values = dict(loaded.main.layer(layer))
        assert plain(values) == values, layer
    assert loaded.main.resolve("note") == "naïve ✓ 𝄞"


def test_a_key_in_two_layers_resolves_to_the_lower_number() -> None:
    """"Reads resolve a key from L0 to L5: the first layer that holds the key wins.\""""
    ctx = LayeredContext(system={"policy": "p"})
    ctx.write(Layer.EPHEMERAL, "k", "ephemeral", actor="a")
    assert ctx.resolve("k") == "ephemeral"
    ctx.write(Layer.KNOWLEDGE, "k", {"text": "knowledge", "source": "kb", "confidence": 0.9}, actor="rag")
    assert dict(ctx.layer(Layer.EPHEMERAL)) == {"k": "ephemeral"}  # still there, shadowed
    assert ctx.resolve("k")["text"] == "knowledge" and ctx.get("k")["text"] == "knowledge"
    ctx.delete(Layer.KNOWLEDGE, "k", actor="rag")
    assert ctx.resolve("k") == "ephemeral"


SEQ_USER = process("seq_user", "\n".join([
    '    <bpmn:startEvent id="s"/>',
    script("prep", 'score = amount * 2'),
    '    <bpmn:userTask id="review"/>',
    script("after", 'done = True'),
    '    <bpmn:endEvent id="e"/>']), [("s", "prep"), ("prep", "review"), ("review", "after"), ("after", "e")])


@pytest.mark.parametrize("answer, key", [({"policy": "anything goes"}, "policy"), ({"amount": 1}, "amount")])
def test_a_persons_answer_cannot_shadow_system_or_process(tmp_path: Path, answer: dict[str, Any], key: str) -> None:
    """"nothing an activity writes can shadow what the system or the process fixed" (a
    user task's answer is what that activity writes). "Denied writes raise
    ContextWriteDenied with the key, the target and the effective layer, and are recorded on
    the tape": the person's answer is refused whole and the task still waits for another."""
    bpmn = write_bpmn(tmp_path, "seq", SEQ_USER, config="system: {policy: fixed by the engine}\n")
    engine = Engine("memory://")
    instance = engine.run(engine.start(load_process(str(bpmn)), {"amount": 7}))
    assert instance.status == "waiting"
    tape = len(instance.main.tape)
    effective = Layer.SYSTEM if key == "policy" else Layer.PROCESS
    for give in (lambda: engine.run(instance, answers={"user_tasks": {"review": {**answer, "ok": True}}}),
                 lambda: engine.complete_user_task(instance, "review", {**answer, "ok": True})):
        with pytest.raises(ContextWriteDenied) as denied:
            give()
        assert (denied.value.key, denied.value.target, denied.value.effective) == (key, Layer.WORKING, effective)
        assert "'review'" in str(denied.value)
        stored = engine.load(instance.id)
        assert stored.status == "waiting" and [w["task_id"] for w in stored.waiting_for] == ["review"]
        assert stored.main.resolve("policy") == "fixed by the engine" and stored.main.resolve("amount") == 7
        assert "ok" not in stored.main
    denials = [e for e in list(engine.load(instance.id).main.tape)[tape:] if e.kind == "denied"]
    assert [e.data["key"] for e in denials] == [key, key]  # each refusal is on the tape
    done = engine.complete_user_task(engine.load(instance.id), "review", {"ok": True})
    assert done.status == "completed" and done.main.resolve("done") is True


# =============================================================================== tape, snapshots, views

CONFLICTING = process("two_keys", "\n".join([
    '    <bpmn:startEvent id="s"/>',
    '    <bpmn:parallelGateway id="fork"/>',
    script("finance", 'x = 1\ny = "approved"'),
    script("risk", 'x = 2\ny = "rejected"'),
    '    <bpmn:parallelGateway id="join"/>',
    '    <bpmn:endEvent id="e"/>']),
    [("s", "fork"), ("fork", "finance"), ("fork", "risk"), ("finance", "join"), ("risk", "join"), ("join", "e")])


def _all_events(instance: Any) -> dict[str, list[str]]:
    """Every context's tape, as JSON text per event."""
    return {name: [json.dumps(e.to_dict(), sort_keys=True, default=str) for e in ctx.tape]
            for name, ctx in instance.contexts.items()}


def _added(before: dict[str, list[str]], after: dict[str, list[str]]) -> list[str]:
    """The events appended since ``before``; fails when one of them was changed or removed."""
    added = []
    for name, events in after.items():
        old = before.get(name, [])
        assert events[: len(old)] == old, name
        added += events[len(old):]
    return added


def test_a_human_decision_is_on_the_tape_when_it_is_made(tmp_path: Path) -> None:
    """"every change (write, denied write, move, split, join, conflict, resolution, human
    decision, compression, rollback, inject, config change) is an event appended to the
    instance's tape" -- a person's answer too, also while the join still waits for others."""
    bpmn = write_bpmn(tmp_path, "two_keys", CONFLICTING)
    engine = Engine(f"sqlite:///{tmp_path / 'runs.db'}")
    instance = engine.run(engine.start(load_process(str(bpmn))))
    assert instance.status == "waiting"
    assert {w["id"] for w in instance.waiting_for} == {"join/x", "join/y"}
    before = _all_events(instance)
    instance = engine.answer_confirmation(engine.load(instance.id), "join/x", 2)
    assert instance.status == "waiting"  # join/y is still open
    added = _added(before, _all_events(engine.load(instance.id)))  # appended, nothing rewritten
    assert any('"join/x"' in text and '"value": 2' in text for text in added), added
    before = _all_events(engine.load(instance.id))
    instance = engine.answer_confirmation(engine.load(instance.id), "join/y", "rejected")
    added = _added(before, _all_events(engine.load(instance.id)))
    assert any('"join/y"' in text and '"value": "rejected"' in text for text in added), added


def test_answers_given_one_at_a_time_across_saves_settle_the_join(tmp_path: Path) -> None:
    """"Resolution of conflicts, in order: policy rules in the config; the model ...;
    `human_confirm` (message, options, timeout, default on timeout)" -- with the instance
    "persisted and resumed later" between two people's answers to one join."""
    bpmn = write_bpmn(tmp_path, "two_keys", CONFLICTING)
    engine = Engine(f"sqlite:///{tmp_path / 'runs.db'}")
    instance = engine.run(engine.start(load_process(str(bpmn))))
    assert {w["id"] for w in instance.waiting_for} == {"join/x", "join/y"}
    instance = engine.answer_confirmation(engine.load(instance.id), "join/x", 2)
    assert [w["id"] for w in instance.waiting_for] == ["join/y"]
    instance = Engine(f"sqlite:///{tmp_path / 'runs.db'}").answer_confirmation(
        engine.load(instance.id), "join/y", "rejected")
    assert instance.status == "completed", instance.waiting_for
    assert instance.main.resolve("x") == 2 and instance.main.resolve("y") == "rejected"
    resolutions = {c["key"]: c["resolution"] for c in instance.conflicts}
    assert {k: (r["value"], r["resolver"]) for k, r in resolutions.items()} == {
        "x": (2, "human"), "y": ("rejected", "human")}
    logged = {e["key"]: e["resolution"]["value"] for e in instance.main.resolve("_mergedConflicts")}
    assert logged == {"x": 2, "y": "rejected"}


LOAN_DATA = {"amount": 120000, "applicant_id": "APP-9", "purpose": "expansion", "industry": "gambling"}
ROOT = Path(__file__).resolve().parents[1]


def test_every_event_names_its_activity_and_branch() -> None:
    """"every change ... is an event appended to the instance's tape with a sequence number,
    time, actor, activity and branch.\""""
    engine = Engine("memory://")
    loan = load_process(str(ROOT / "bpmn_examples" / "loan_approval.bpmn"))
    instance = engine.run(engine.start(loan, LOAN_DATA), answers={"confirmations": {"*": "pending_dual_approval"}})
    assert instance.status == "completed", instance.error
    branches = {name: info["branch_id"] for name, info in instance.branches.items()}
    assert len(branches) >= 2
    for name, ctx in instance.contexts.items():
        seqs = [e.seq for e in ctx.tape]
        assert seqs == sorted(set(seqs))
        open_activity = None
        for e in ctx.tape:
            assert isinstance(e.time, float) and e.actor, (name, e.seq)
            assert e.branch == branches.get(name), (name, e.seq, e.branch)
            if e.kind == "begin":
                open_activity = e.activity
            assert open_activity is None or e.activity == open_activity, (name, e.seq, e.kind, e.activity)
            if e.kind in ("complete", "abort"):
                open_activity = None


def test_the_state_at_every_sequence_number_of_a_run_is_rebuilt_byte_identical() -> None:
    """"The state of any context at any sequence number can be rebuilt from the tape alone
    (replay), and the rebuild is byte-identical.\""""
    seen: list[tuple[str, int, str, list[dict[str, str]]]] = []

    def progress(instance: Any, task_id: str, ctx: LayeredContext) -> None:
        seen.append((ctx.name, ctx.tape[-1].seq, json.dumps(ctx.as_dict()), render(ctx, format="json")))

    engine = Engine("memory://", progress=progress)
    loan = load_process(str(ROOT / "bpmn_examples" / "loan_approval.bpmn"))
    instance = engine.run(engine.start(loan, LOAN_DATA), answers={"confirmations": {"*": "pending_dual_approval"}})
    assert instance.status == "completed" and instance.compressions  # a join and a compression on the way
    assert len(seen) >= 6
    for name, seq, layers, messages in seen:
        rebuilt = LayeredContext.replay(instance.contexts[name].tape, until=seq)
        assert json.dumps(rebuilt.as_dict()) == layers, (name, seq)
        assert render(rebuilt, format="json") == messages, (name, seq)


def _context_of(n: int) -> LayeredContext:
    # the size in SYSTEM, which one event fills; a snapshot and a fork treat every layer alike
    ctx = LayeredContext(system={f"k{i}": {"v": i, "text": f"value {i}"} for i in range(n)})
    ctx.begin_activity("load")
    ctx.write(Layer.WORKING, "loaded", n, actor="load")
    ctx.complete_activity("load")
    ctx.begin_activity("next")
    ctx.write(Layer.EPHEMERAL, "scratch", [1, 2], actor="next")
    return ctx


def _allocated(fn: Callable[[], Any], repeat: int) -> int:
    """Bytes still allocated after ``repeat`` calls of ``fn`` (their results kept)."""
    kept = []
    tracemalloc.start()
    try:
        start = tracemalloc.get_traced_memory()[0]
        for _ in range(repeat):
            kept.append(fn())
        return tracemalloc.get_traced_memory()[0] - start
    finally:
        tracemalloc.stop()


def test_snapshots_and_splits_cost_the_same_whatever_the_size() -> None:
    """"Snapshots capture all six layers. Take them with persistent (structurally shared)
    maps, so a snapshot costs O(1) and a split of N branches O(N), whatever the size of
    the context" (measured in memory, which unlike time does not depend on the machine)."""
    small, big = _context_of(10), _context_of(50_000)
    snap = big.snapshot()
    assert set(snap.as_dict()) == {"L0", "L1", "L2", "L3", "L4", "L5"}
    layers = snap.as_dict()
    assert layers["L5"] == {"scratch": [1, 2]} and len(layers["L0"]) == 50_000 and layers["L3"]["loaded"] == 50_000
    per_small = _allocated(small.snapshot, 50) / 50
    per_big = _allocated(big.snapshot, 50) / 50
    assert per_big < 2 * per_small + 2048, (per_small, per_big)
    big.complete_activity("next")
    small.complete_activity("next")
    counter = iter(range(10**6))

    def split(ctx: LayeredContext, n: int) -> Any:
        return ContextSplitter().split(ctx, f"g{next(counter)}", [f"b{i}" for i in range(n)])

    two_small = _allocated(lambda: split(small, 2), 5) / 5
    two_big = _allocated(lambda: split(big, 2), 5) / 5
    eight_big = _allocated(lambda: split(big, 8), 5) / 5
    assert two_big < 2 * two_small + 4096, (two_small, two_big)
    assert eight_big < 6 * two_big, (two_big, eight_big)  # linear in the branches, not in the keys


def test_hooks_are_applied_in_order() -> None:
    """"A view is: an anchor (where the visible part starts) plus select hooks (drop tool
    results, keep only the newest read of the same file, redact secrets) applied in order.\""""
    ctx = LayeredContext(system={"policy": "p"})
    ctx.begin_activity("a")
    ctx.write(Layer.WORKING, "old", "before the anchor", actor="a")
    ctx.complete_activity("a")
    ctx.anchor("handoff")
    ctx.begin_activity("b")
    ctx.write(Layer.WORKING, "token", "secret-123", actor="b")
    ctx.write(Layer.WORKING, "memo", "visible", actor="b")
    ctx.complete_activity("b")

    def mask(entries: list[Any]) -> list[Any]:
        import dataclasses
        return [dataclasses.replace(e, value="MASKED") if e.key == "token" else e for e in entries]

    def drop_masked(entries: list[Any]) -> list[Any]:
        return [e for e in entries if e.value != "MASKED"]

    tape = len(ctx.tape)
    mask_then_drop = "\n".join(m["content"] for m in render(ctx.view(anchor="handoff", hooks=[mask, drop_masked]),
                                                                   format="json"))
    drop_then_mask = "\n".join(m["content"] for m in render(ctx.view(anchor="handoff", hooks=[drop_masked, mask]),
                                                                   format="json"))
    assert "secret-123" not in mask_then_drop and "MASKED" not in mask_then_drop
    assert "MASKED" in drop_then_mask and "secret-123" not in drop_then_mask
    for text in (mask_then_drop, drop_then_mask):
        assert "visible" in text and "before the anchor" not in text
    assert len(ctx.tape) == tape and ctx.resolve("token") == "secret-123"


@pytest.mark.parametrize("fmt", ["xml", "json", "plain"])
def test_what_changed_after_the_anchor_is_visible(fmt: str) -> None:
    """"A view is: an anchor (where the visible part starts) plus select hooks": a HISTORY
    key written before the anchor and changed after it shows its new value."""
    ctx = LayeredContext(system={"policy": "p"})
    ctx.begin_activity("draft")
    ctx.write(Layer.WORKING, "status", "status_before_anchor", actor="draft")
    ctx.write(Layer.WORKING, "untouched", "untouched_before_anchor", actor="draft")
    ctx.complete_activity("draft")
    ctx.anchor("handoff")
    ctx.begin_activity("review")
    assert ctx.write(Layer.WORKING, "status", "status_after_anchor", actor="review") == Layer.HISTORY
    ctx.write(Layer.WORKING, "added", "added_after_anchor", actor="review")
    ctx.complete_activity("review")
    view = ctx.view(anchor="handoff")
    assert view.layer(Layer.HISTORY)["status"] == "status_after_anchor"
    assert "untouched" not in view.layer(Layer.HISTORY) and "added" in view.layer(Layer.HISTORY)
    text = "\n".join(m["content"] for m in render(view, format=fmt))
    assert "status_after_anchor" in text and "added_after_anchor" in text
    assert "status_before_anchor" not in text and "untouched_before_anchor" not in text
    assert ctx.resolve("status") == "status_after_anchor" and "untouched" in ctx


# =============================================================================== gateways

def _injecting(kind: str) -> str:
    """s -> fork -> (ta | tb) -> join -> e; an XOR or inclusive fork takes only ta."""
    default = ' default="f_tb"' if kind != "parallel" else ""
    into_ta = "<bpmn:conditionExpression>True</bpmn:conditionExpression>" if kind != "parallel" else ""
    return "\n".join([
        '  <bpmn:process id="inject" isExecutable="true">',
        '    <bpmn:startEvent id="s"/>', f'    <bpmn:{kind}Gateway id="fork"{default}/>',
        script("ta", "a = 1"), script("tb", "b = 1"), f'    <bpmn:{kind}Gateway id="join"/>',
        '    <bpmn:endEvent id="e"/>',
        '    <bpmn:sequenceFlow id="f_s" sourceRef="s" targetRef="fork"/>',
        f'    <bpmn:sequenceFlow id="f_ta" sourceRef="fork" targetRef="ta">{into_ta}</bpmn:sequenceFlow>',
        '    <bpmn:sequenceFlow id="f_tb" sourceRef="fork" targetRef="tb"/>',
        '    <bpmn:sequenceFlow id="f_ja" sourceRef="ta" targetRef="join"/>',
        '    <bpmn:sequenceFlow id="f_jb" sourceRef="tb" targetRef="join"/>',
        '    <bpmn:sequenceFlow id="f_e" sourceRef="join" targetRef="e"/>',
        "  </bpmn:process>"])


@pytest.mark.parametrize("kind", ["parallel", "inclusive", "exclusive"])
def test_a_split_that_would_inject_over_process_is_denied_on_the_tape(tmp_path: Path, kind: str) -> None:
    """"Denied writes raise `ContextWriteDenied` with the key, the target and the effective
    layer, and are recorded on the tape" -- a branch's `contextInject` (WORKING, on split)
    included: it cannot change what PROCESS fixed, at every kind of split (an XOR split
    once went on, with the refused key left out)."""
    config = "fork:\n  branches:\n    - {id: ta, contextInject: {track: fast, amount: 999}}\n"
    bpmn = write_bpmn(tmp_path, "inject", _injecting(kind), config=config)
    engine = Engine("memory://")
    instance = engine.run(engine.start(load_process(str(bpmn)), {"amount": 5}))
    assert instance.status == "error" and instance.error["kind"] == "permission_denied"
    assert "amount" in instance.error["message"] and instance.error["task_id"] == "fork"
    assert "'fork'" in instance.error["message"] and "'ta'" in instance.error["message"]
    assert instance.main.resolve("amount") == 5 and "track" not in instance.main
    denials = [e for e in instance.main.tape if e.data.get("note") == "denied" and e.data.get("key") == "amount"]
    assert [(d.data["gateway_id"], d.data["branch_id"]) for d in denials] == [("fork", "ta")]


LONG = " ".join(f"step {i} of the reviewer's reasoning weighs the figures again." for i in range(40))
PRESERVE_VS_COMPRESS = process("pvc", "\n".join([
    '    <bpmn:startEvent id="s"/>',
    script("assess", f'risk_factors = {{"kind": "reasoning_chain", "text": "{LONG}"}}'),
    '    <bpmn:parallelGateway id="fork"/>',
    script("keep", "kept = True"),
    script("squeeze", f'notes = {{"kind": "reasoning_chain", "text": "{LONG} more"}}'),
    '    <bpmn:parallelGateway id="join"/>',
    '    <bpmn:endEvent id="e"/>']),
    [("s", "assess"), ("assess", "fork"), ("fork", "keep"), ("fork", "squeeze"), ("keep", "join"),
     ("squeeze", "join"), ("join", "e")])


def test_a_key_one_branch_preserves_is_not_altered_by_a_compression_in_another(tmp_path: Path) -> None:
    """"The activity's `preserveKeys` are marked as preserved: no compressor may drop or alter
    them" -- also when the compressor runs in a parallel branch that did not mark them."""
    config = ("keep: {preserveKeys: [risk_factors]}\n"
              "squeeze:\n  compressTokenThreshold: 200\n"
              "  compressRules: [{pattern: reasoning_chain, action: summarize, maxTokens: 20}]\n")
    bpmn = write_bpmn(tmp_path, "pvc", PRESERVE_VS_COMPRESS, config=config)
    engine = Engine("memory://")
    instance = engine.run(engine.start(load_process(str(bpmn))))
    assert instance.status == "completed", instance.error
    assert [c["activity_id"] for c in instance.compressions] == ["squeeze"]  # the other branch compressed
    assert plain(instance.main.resolve("risk_factors")) == {"kind": "reasoning_chain", "text": LONG}
    assert "risk_factors" in instance.main.preserved
    assert instance.main.resolve("notes") != {"kind": "reasoning_chain", "text": f"{LONG} more"}  # compressed


TWICE_CALLED = "\n".join([
    process("caller", "\n".join([
        '    <bpmn:startEvent id="s"/>',
        '    <bpmn:parallelGateway id="fork"/>',
        script("small", "small_size = 1"),
        script("large", "large_size = 40"),
        '    <bpmn:callActivity id="call_small" calledElement="helper"/>',
        '    <bpmn:callActivity id="call_large" calledElement="helper"/>',
        '    <bpmn:parallelGateway id="join"/>',
        '    <bpmn:endEvent id="e"/>']),
        [("s", "fork"), ("fork", "small"), ("fork", "large"), ("small", "call_small"), ("large", "call_large"),
         ("call_small", "join"), ("call_large", "join"), ("join", "e")]),
    process("helper", "\n".join([
        '    <bpmn:startEvent id="hs"/>',
        script("stamp", 'stamped = True\nif "large_size" in dir():\n    notes_large = "x " * large_size\nelse:\n    notes_small = 1'),
        '    <bpmn:endEvent id="he"/>']), [("hs", "stamp"), ("stamp", "he")]),
])


def test_records_of_different_activities_never_conflict(tmp_path: Path) -> None:
    """"records of different activities have different keys and never conflict" -- also
    when two branches run the same task of a called process: two runs of an activity are
    two activities, and each keeps its own record."""
    bpmn = write_bpmn(tmp_path, "twice", TWICE_CALLED)
    engine = Engine("memory://")
    instance = engine.run(engine.start(load_process(str(bpmn), "caller")))
    assert instance.status == "completed", (instance.waiting_for, instance.conflicts)
    assert instance.conflicts == [] and "_mergedConflicts" not in instance.main
    history = instance.main.layer(Layer.HISTORY)
    stamps = [history[k] for k in history if k.startswith("activity:stamp")]
    assert len(stamps) == 2
    assert sorted(tuple(r["keys"]) for r in stamps) == [("stamped", "notes_large"), ("stamped", "notes_small")]
    assert history["notes_small"] == 1 and history["stamped"] is True
    # each record follows the data keys of its branch, in branch order
    keys = list(history)
    assert keys.index("notes_small") < keys.index("notes_large")
    assert LayeredContext.replay(instance.main.tape) == instance.main


ARRIVAL = process("arrival", "\n".join([
    '    <bpmn:startEvent id="s"/>',
    script("init", 'status = "pending"\ndoc = {"a": 1, "b": [1, 2]}'),
    '    <bpmn:parallelGateway id="fork"/>',
    '    <bpmn:userTask id="first_waits"/>',
    script("first_work", 'a_one = 1\na_two = 2\ndoc = {"b": [1, 2], "a": 1}\nstatus = "pending"'),
    script("second", 'b_one = 1\nstatus = "approved"'),
    script("third", 'c_one = 1'),
    '    <bpmn:parallelGateway id="join"/>',
    '    <bpmn:endEvent id="e"/>']),
    [("s", "init"), ("init", "fork"), ("fork", "first_waits"), ("fork", "second"), ("fork", "third"),
     ("first_waits", "first_work"), ("first_work", "join"), ("second", "join"), ("third", "join"), ("join", "e")])


def test_merged_history_is_base_first_then_each_branchs_new_keys_in_branch_order(tmp_path: Path) -> None:
    """"the merged HISTORY keeps insertion order: the base first, then each branch's new
    keys in branch order" -- branch order, not the order in which the branches arrived
    (the first branch waits for a person and arrives last). "a branch that writes the
    value the key already had has not changed it", "compared by canonical JSON, so nested
    objects and lists work".\""""
    bpmn = write_bpmn(tmp_path, "arrival", ARRIVAL)
    engine = Engine("memory://")
    instance = engine.run(engine.start(load_process(str(bpmn))))
    assert instance.status == "waiting"
    instance = engine.run(instance, answers={"user_tasks": {"first_waits": {"checked": True}}})
    assert instance.status == "completed" and instance.conflicts == []
    keys = [k for k in instance.main.layer(Layer.HISTORY) if not k.startswith("_")]
    assert keys == ["status", "doc", "activity:init",
                    "checked", "activity:first_waits", "a_one", "a_two", "activity:first_work",
                    "b_one", "activity:second", "c_one", "activity:third"]
    assert instance.main.resolve("status") == "approved"
    assert plain(instance.main.resolve("doc")) == {"a": 1, "b": [1, 2]}


NESTED_INJECT = process("nested_inject", "\n".join([
    '    <bpmn:startEvent id="s"/>',
    '    <bpmn:parallelGateway id="outer"/>',
    '    <bpmn:parallelGateway id="inner"/>',
    script("a", 'lane = "a-changed"'),
    script("b", 'other = 1'),
    '    <bpmn:parallelGateway id="inner_join"/>',
    script("c", 'cc = 1'),
    '    <bpmn:parallelGateway id="outer_join"/>',
    '    <bpmn:endEvent id="e"/>']),
    [("s", "outer"), ("outer", "inner"), ("outer", "c"), ("inner", "a"), ("inner", "b"), ("a", "inner_join"),
     ("b", "inner_join"), ("inner_join", "outer_join"), ("c", "outer_join"), ("outer_join", "e")])


def test_a_key_in_working_at_the_split_that_one_branch_left_alone_is_no_conflict(tmp_path: Path) -> None:
    """"'changed' means the value differs from the split's snapshot" -- also for a key in
    WORKING at the split (here the outer split's contextInject, as the inner split sees it):
    a branch whose activity only moved it into HISTORY with the value it had did not change it."""
    bpmn = write_bpmn(tmp_path, "nested_inject", NESTED_INJECT,
                      config="outer:\n  branches:\n    - {id: inner, contextInject: {lane: inner-lane}}\n")
    engine = Engine("memory://")
    instance = engine.run(engine.start(load_process(str(bpmn))))
    assert instance.status == "completed", (instance.waiting_for, instance.conflicts)
    assert instance.conflicts == []
    assert instance.main.resolve("other") == 1 and instance.main.resolve("cc") == 1
    assert LayeredContext.replay(instance.main.tape) == instance.main
    # the same with the public names alone
    ctx = LayeredContext(system={"policy": "p"})
    ctx.write(Layer.WORKING, "k", 1, actor="op")
    ctx.write(Layer.WORKING, "both", 1, actor="op")
    a, b = (branch.context for branch in ContextSplitter().split(ctx, "fork", ["a", "b"]))
    a.begin_activity("ta"); a.write(Layer.WORKING, "k", 2, actor="ta"); a.complete_activity("ta")  # noqa: E702
    a.begin_activity("ta2"); a.write(Layer.WORKING, "both", 5, actor="ta2"); a.complete_activity("ta2")  # noqa: E702
    b.begin_activity("tb"); b.write(Layer.WORKING, "both", 6, actor="tb"); b.complete_activity("tb")  # noqa: E702
    from gateways import join_contexts

    snapshot = ctx.get_snapshot(a.resolve("_snapshot_id"))
    result = join_contexts(snapshot, {"a": a, "b": b}, gateway_id="join",
                           config=ActivityExtensionConfig.model_validate({"mergeStrategy": "LAST_WRITER_WINS"}))
    assert [c.key for c, _ in result.conflicts] == ["both"]  # changed differently in both: still a conflict


# =============================================================================== rendering


@pytest.mark.parametrize("fmt", ["xml", "json", "plain"])
def test_volatile_parts_are_bound_late_at_the_end_of_the_last_user_message(fmt: str) -> None:
    """"Stable parts first (SYSTEM, PROCESS, compaction summary, HISTORY in order), volatile
    parts (KNOWLEDGE hits, WORKING, recalled memory) bound late, at the end of the last user
    message, so provider prompt caches keep hitting.\""""
    def build(hit: str, draft: str) -> LayeredContext:
        ctx = LayeredContext(system={"policy": "policy_marker"})
        ctx.write(Layer.PROCESS, "application", "process_marker", actor="submit")
        for i in range(3):
            ctx.begin_activity(f"step{i}")
            ctx.write(Layer.WORKING, f"history_marker_{i}", f"finding {i}", actor=f"step{i}")
            ctx.complete_activity(f"step{i}")
        ctx.write(Layer.KNOWLEDGE, "hit", {"text": hit, "source": "kb://rules", "confidence": 0.8}, actor="rag")
        ctx.begin_activity("decide")
        ctx.write(Layer.WORKING, "draft", draft, actor="decide")
        return ctx

    messages = render(build("knowledge_marker", "working_marker"), format=fmt, memory=("memory_marker",))
    assert messages[-1]["role"] == "user"
    text = [m["content"] for m in messages]
    assert "policy_marker" in text[0] and "process_marker" in text[0]
    last = text[-1]
    order = ["history_marker_0", "history_marker_1", "history_marker_2", "knowledge_marker", "working_marker",
             "memory_marker"]
    positions = [last.index(marker) for marker in order]
    assert positions == sorted(positions)
    other = render(build("other_hit", "other_draft"), format=fmt, memory=("other_memory",))
    assert other[:-1] == messages[:-1]  # everything before the last message is the same bytes
    stable = last[: last.index("history_marker_2")]
    assert other[-1]["content"].startswith(stable)


@pytest.mark.parametrize("store", ["memory://", "sqlite:///{tmp}/runs.db"])
def test_an_instance_answers_by_the_names_of_its_json_document(store: str, tmp_path: Path) -> None:
    """The ``--json`` document names the instance ``instance_id``; the Python instance answers
    to that name as well as to ``id``, before and after a reload from the store."""
    engine = Engine(store.format(tmp=tmp_path))
    process_ = load_process("bpmn_examples/loan_approval.bpmn")
    instance = engine.run(engine.start(process_, {"amount": 20000, "applicant_id": "A1", "purpose": "x"}))
    assert instance.instance_id == instance.id == instance.to_document()["instance_id"]
    again = engine.load(instance.instance_id)
    assert again.instance_id == instance.id and again.main == instance.main


@pytest.mark.parametrize("url", ["memory://", "sqlite:///{tmp}/runs.db", "redis"])
def test_the_store_engine_open_store_gives_holds_tapes_snapshots_and_confirmations(url: str, tmp_path: Path,
                                                                                  request: pytest.FixtureRequest) -> None:
    """"One ``Store`` protocol: instances (... with a version for optimistic concurrency), tapes
    (append, read from a sequence number), snapshots, pending human confirmations.\" The store
    ``engine.open_store`` gives answers all of it, not only the instance records."""
    import uuid

    import engine as engine_package
    from stores.conftest import REDIS_URL, drop_prefix, redis_or_skip

    if url == "redis":  # the store tests' Redis, under a prefix of its own, removed afterwards
        redis_or_skip()
        prefix = f"lftest-{uuid.uuid4().hex[:12]}"
        url = f"{REDIS_URL}{'&' if '?' in REDIS_URL else '?'}prefix={prefix}"
        request.addfinalizer(lambda: drop_prefix(REDIS_URL, prefix))
    url = url.format(tmp=tmp_path)
    runner = Engine(url)
    instance = runner.run(runner.start(load_process("bpmn_examples/loan_approval.bpmn"),
                                       {"amount": 20000, "applicant_id": "A1", "purpose": "x"}))
    store = engine_package.open_store(url) if not url.startswith("memory") else runner.store
    tape = [event.to_dict() for event in instance.main.tape]
    assert plain(store.read_tape(instance.id, "main")) == plain(tape)
    assert plain(store.read_tape(instance.id, "main", 3)) == plain(tape[3:])  # events after seq 3
    assert store.tape_heads(instance.id)["main"] == tape[-1]["seq"]
    assert isinstance(store.list_snapshots(instance.id), list)
    assert store.list_confirmations(instance.id) == []
    assert [s["instance_id"] for s in store.list_instances()].count(instance.id) == 1
    assert store.load(instance.id)["version"] == instance.version
