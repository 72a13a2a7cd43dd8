"""Rendering: determinism, order, late binding, prefix stability, views and select hooks."""

import json
import os
import subprocess
import sys
import textwrap
import xml.etree.ElementTree as ET
from dataclasses import FrozenInstanceError
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from context_layers import Layer, LayeredContext
from context_layers.context import Entry
from context_layers.hooks import drop_tool_results, newest_read_only, redact
from context_layers.prefix import (
    common_prefix_tokens,
    prefix_report,
    prefix_stability,
    request_text,
    sliding_window_trim,
)
from context_layers.render import RenderOptions, render, request_tokens, stable_prefix

FORMATS = ["xml", "json", "plain"]
ROOT = Path(__file__).resolve().parents[2]
# Where each format's late-bound block starts (the end of the cacheable head).
LATE_MARK = {"xml": "\n<current>", "json": ',{"knowledge"', "plain": "\n== CURRENT"}


def history_end(text: str, fmt: str) -> int:
    """Where the last HISTORY entry ends (new entries are inserted here)."""
    if fmt == "json":
        return text.index("]}", text.index('{"history":['))
    return text.index({"xml": "\n</history>", "plain": "\n== CURRENT"}[fmt])


def loan_context() -> LayeredContext:
    ctx = LayeredContext(system={"policy": "Loans over 100000 need two approvals.", "max_amount": 500000})
    ctx.write(Layer.PROCESS, "application_id", "A-17", actor="start")
    ctx.begin_activity("submit")
    ctx.write(Layer.WORKING, "amount", 120000, actor="submit")
    ctx.write(Layer.WORKING, "applicant", {"name": "Ada", "income": 85000.5}, actor="submit")
    ctx.complete_activity("submit")
    ctx.begin_activity("check")
    ctx.write(Layer.WORKING, "credit_score", 712, actor="check")
    ctx.complete_activity("check")
    ctx.write(Layer.KNOWLEDGE, "rate_policy", {"text": "Base rate 3.1%", "source": "kb://rates", "confidence": 0.9},
              actor="retriever")
    ctx.write(Layer.KNOWLEDGE, "old_rate", {"text": "Base rate 2.5%", "source": "kb://old", "confidence": 0.3},
              actor="retriever")
    ctx.begin_activity("risk")
    ctx.write(Layer.WORKING, "draft", "pending", actor="risk")
    ctx.write(Layer.EPHEMERAL, "scratch", [1, 2, 3], actor="risk")
    return ctx


def opts(fmt: str, **kw) -> RenderOptions:
    return RenderOptions(format=fmt, instructions="Assess the risk. Answer JSON.", task_id="risk", **kw)


# ----- determinism ---------------------------------------------------------------------

@pytest.mark.parametrize("fmt", FORMATS)
def test_same_input_same_bytes_also_after_save_and_load(fmt):
    ctx = loan_context()
    first = render(ctx, opts(fmt, memory=("Ada prefers email",)))
    assert render(ctx, opts(fmt, memory=("Ada prefers email",))) == first
    loaded = LayeredContext.from_dict(json.loads(json.dumps(ctx.to_dict())))
    again = render(loaded, opts(fmt, memory=("Ada prefers email",)))
    assert json.dumps(again).encode() == json.dumps(first).encode()


def test_render_is_pure_and_reads_no_clock():
    ctx = loan_context()
    before = (len(ctx.tape), ctx.state_json())
    render(ctx, opts("xml"))
    assert (len(ctx.tape), ctx.state_json()) == before
    # A replay at a different wall-clock time renders the same bytes.
    replayed = LayeredContext.replay(ctx.tape)
    assert render(replayed, opts("xml")) == render(ctx, opts("xml"))


def test_render_in_a_fresh_process_is_identical():
    code = textwrap.dedent("""
        import json, sys
        sys.path.insert(0, sys.argv[1])
        sys.path.insert(0, sys.argv[2])
        from test_render import loan_context, opts
        from context_layers.render import render
        print(json.dumps([render(loan_context(), opts(f)) for f in ("xml", "json", "plain")]))
    """)
    out = subprocess.run([sys.executable, "-c", code, str(ROOT), str(Path(__file__).parent)],
                         capture_output=True, text=True, check=True, env={**os.environ, "PYTHONHASHSEED": "12345"})
    assert json.loads(out.stdout) == [render(loan_context(), opts(f)) for f in FORMATS]


# ----- structure and order -------------------------------------------------------------

@pytest.mark.parametrize("fmt", FORMATS)
def test_message_structure_and_order(fmt):
    messages = render(loan_context(), opts(fmt))
    assert [m["role"] for m in messages] == ["system", "user"]
    system, user = messages[0]["content"], messages[1]["content"]
    for token in ("Loans over 100000", "A-17"):
        assert token in system and token not in user
    order = ["amount", "credit_score", "rate_policy", "draft", "scratch", "Assess the risk"]
    positions = [user.index(t) for t in order]
    assert positions == sorted(positions), "history, then knowledge, working, ephemeral, task"
    assert user.index("activity:submit") < user.index("activity:check") < user.index("rate_policy")


@pytest.mark.parametrize("fmt", FORMATS)
def test_compaction_summary_comes_before_history(fmt):
    ctx = loan_context()
    ctx.abort_activity("risk", reason="test")
    ctx.apply_changes([(Layer.HISTORY, "compaction:1", {
        "kind": "compaction", "summary": "Ada applied for 120000.", "covers": ["amount"]})],
        kind="compression", actor="compressor")
    user = render(ctx, opts(fmt))[1]["content"]
    assert user.index("Ada applied for 120000.") < user.index("credit_score")
    assert '"covers"' not in user and "covers" not in user, "only the summary field is rendered"


def test_xml_identity_is_in_attributes_and_text_in_cdata():
    messages = render(loan_context(), opts("xml"))
    for m in messages:
        root = ET.fromstring(m["content"])
        assert root.tag == "layerflow"
    user = ET.fromstring(messages[1]["content"])
    k = user.find("./current/knowledge/entry[@key='rate_policy']")
    assert k is not None and k.get("source") == "kb://rates" and k.get("confidence") == "0.9"
    assert k.get("field") == "text" and k.text == "Base rate 3.1%", "a hit is its text, provenance in attributes"
    assert user.find("./current/working").get("layer") == "L4"
    draft = user.find("./current/working/entry[@key='draft']")
    assert draft.get("type") is None and draft.text == "pending" and draft.get("kind") is None
    assert user.find("./history/entry[@key='activity:submit']").get("kind") == "activity"
    assert "<![CDATA[pending]]>" in messages[1]["content"]
    assert user.find("./current/task").get("activity") == "risk"


@pytest.mark.parametrize("fmt", FORMATS)
def test_include_layers_and_knowledge_selection(fmt):
    ctx = loan_context()
    only = render(ctx, opts(fmt, include_layers=(Layer.SYSTEM, Layer.HISTORY)))
    text = request_text(only)
    assert "credit_score" in text and "A-17" not in text and "rate_policy" not in text and "draft" not in text
    top = request_text(render(ctx, opts(fmt, knowledge_top_k=1)))
    assert "rate_policy" in top and "old_rate" not in top
    confident = request_text(render(ctx, opts(fmt, knowledge_min_confidence=0.5)))
    assert "rate_policy" in confident and "old_rate" not in confident


@pytest.mark.parametrize("fmt", FORMATS)
def test_budget_sheds_only_late_bound_parts_lowest_confidence_first(fmt):
    ctx = loan_context()
    full = render(ctx, opts(fmt, memory=("m1", "m2")))
    size = request_tokens(full)
    trimmed = render(ctx, opts(fmt, memory=("m1", "m2"), budget=size - 5))
    text = request_text(trimmed)
    assert "old_rate" not in text and "rate_policy" in text
    head = request_text(full)
    head = head[: head.index(LATE_MARK[fmt])]
    assert request_text(trimmed).startswith(head), "the stable head is never touched"
    tiny = request_text(render(ctx, opts(fmt, memory=("m1",), budget=1)))
    assert "rate_policy" not in tiny and '"m1"' not in tiny and "m1]]" not in tiny and "credit_score" in tiny


def test_options_are_frozen_and_checked():
    o = RenderOptions()
    with pytest.raises(FrozenInstanceError):
        o.format = "json"  # type: ignore[misc]
    with pytest.raises(ValueError, match="unknown render format"):
        RenderOptions(format="yaml")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="unknown option"):
        render(loan_context(), colour="red")
    with pytest.raises(TypeError, match="LayeredContext"):
        render("not a context")
    assert render(loan_context(), format="json") == render(loan_context(), RenderOptions(format="json"))


# ----- late binding and prefix stability -------------------------------------------------

def grow(ctx: LayeredContext, i: int) -> None:
    ctx.begin_activity(f"step{i}")
    ctx.write(Layer.WORKING, f"result_{i}", {"score": i, "note": f"step {i} done"}, actor=f"step{i}")
    ctx.complete_activity(f"step{i}")


@pytest.mark.parametrize("fmt", FORMATS)
def test_appending_history_keeps_the_earlier_request_as_prefix(fmt):
    ctx = loan_context()
    ctx.abort_activity("risk", reason="test")
    first = request_text(render(ctx, RenderOptions(format=fmt, instructions="task A", task_id="a",
                                                   memory=("fact 1",))))
    grow(ctx, 1)
    ctx.write(Layer.KNOWLEDGE, "new_hit", {"text": "x", "source": "kb", "confidence": 0.5}, actor="retriever")
    second = request_text(render(ctx, RenderOptions(format=fmt, instructions="task B", task_id="b",
                                                    memory=("fact 2",))))
    head = first[: history_end(first, fmt)]
    assert second.startswith(head), "everything up to the end of the old HISTORY is reused"
    assert common_prefix_tokens(first, second) >= common_prefix_tokens(head, head) - 2


def test_stable_prefix_is_a_prefix_of_the_full_request():
    ctx = loan_context()
    for fmt in FORMATS:
        full = request_text(render(ctx, opts(fmt)))
        head = request_text(stable_prefix(ctx, opts(fmt)))
        cut = head[: head.index(LATE_MARK[fmt]) if LATE_MARK[fmt] in head else len(head) - 40]
        assert full.startswith(cut)
        assert "Assess the risk" not in head


def test_prefix_stability_metric():
    a = [{"role": "system", "content": "s" * 200}, {"role": "user", "content": "hello world"}]
    b = [{"role": "system", "content": "s" * 200}, {"role": "user", "content": "hello world and more"}]
    c = [{"role": "system", "content": "t" * 200}, {"role": "user", "content": "other"}]
    assert prefix_stability([a, a]) == 1.0
    assert prefix_stability([a]) == 1.0  # nothing comparable
    assert prefix_stability([a], first="zero") == 0.0
    ab = prefix_stability([a, b])
    assert 0.6 < ab < 1.0
    assert prefix_stability([a, c]) < 0.1
    # agents are compared only with themselves
    assert prefix_stability([a, c, b, c], key=["x", "y", "x", "y"]) == pytest.approx((ab + 1.0) / 2)
    assert prefix_stability([a, c, a], key=lambda r: r[0]["content"][0]) == 1.0
    points = prefix_report([a, b])
    assert points[0].share is None and points[1].previous == 0 and points[1].prefix_tokens <= points[1].tokens
    with pytest.raises(ValueError):
        prefix_stability([a, b], key=["x"])


def test_sliding_window_trim_messages_and_entries():
    msgs = [{"role": "system", "content": "sys"}] + [{"role": "user", "content": f"m{i} " * 50} for i in range(6)]
    trimmed = sliding_window_trim(msgs, budget=request_tokens(msgs[:1] + msgs[-2:]))
    assert trimmed[0]["role"] == "system" and trimmed[-1] == msgs[-1] and len(trimmed) == 3
    assert sliding_window_trim(msgs, budget=1)[-1] == msgs[-1], "the last message always stays"
    ctx = LayeredContext(system={"p": 1})
    for i in range(5):
        grow(ctx, i)
    entries = ctx.entries()
    kept = sliding_window_trim(entries, budget=60)
    history = [e.key for e in kept if e.layer == Layer.HISTORY]
    all_history = [e.key for e in entries if e.layer == Layer.HISTORY]
    assert history == all_history[len(all_history) - len(history):], "oldest dropped first"
    assert any(e.layer == Layer.SYSTEM for e in kept)
    assert sum(len(json.dumps(e.value)) for e in kept) < sum(len(json.dumps(e.value)) for e in entries)


# ----- views and select hooks ------------------------------------------------------------

def tool_context() -> LayeredContext:
    ctx = LayeredContext(system={"api_key": "sk-secret", "policy": "p"})
    records = [
        ("tool:1", {"kind": "tool_call", "tool": "read_file", "path": "a.txt"}),
        ("tool:2", {"kind": "tool_call_result", "tool": "read_file", "path": "a.txt", "content": "v1"}),
        ("tool:3", {"kind": "tool_call", "tool": "read_file", "path": "a.txt"}),
        ("tool:4", {"kind": "tool_call_result", "tool": "read_file", "path": "a.txt", "content": "v2"}),
        ("tool:5", {"kind": "tool_call_result", "tool": "read_file", "path": "b.txt", "content": "b"}),
        ("tool:6", {"kind": "read", "resource": "db://x", "content": "x1"}),
        ("tool:7", {"kind": "read", "resource": "db://x", "content": "x2"}),
    ]
    ctx.apply_changes([(Layer.HISTORY, k, v) for k, v in records], kind="tools", actor="engine")
    ctx.begin_activity("t")
    ctx.write(Layer.WORKING, "creds", {"user": "u", "password": "hunter2", "nested": [{"token": "abc"}]}, actor="t")
    return ctx


def test_builtin_hooks_through_a_view_leave_the_tape_alone():
    ctx = tool_context()
    before = (len(ctx.tape), ctx.state_json())
    view = ctx.view(hooks=[drop_tool_results])
    keys = [e.key for e in view.entries() if e.layer == Layer.HISTORY]
    assert keys == ["tool:1", "tool:3", "tool:6", "tool:7"]
    newest = [e.key for e in ctx.view(hooks=[newest_read_only]).entries() if e.layer == Layer.HISTORY]
    assert newest == ["tool:1", "tool:3", "tool:4", "tool:5", "tool:7"]
    red = ctx.view(hooks=[redact(["api_key", "pass*", "token"])])
    layers = red.as_dict()
    assert layers["L0"]["api_key"] == "[REDACTED]" and layers["L0"]["policy"] == "p"
    assert layers["L4"]["creds"] == {"user": "u", "password": "[REDACTED]", "nested": [{"token": "[REDACTED]"}]}
    text = request_text(render(red, format="xml"))
    assert "sk-secret" not in text and "hunter2" not in text and "abc" not in text
    assert (len(ctx.tape), ctx.state_json()) == before
    assert ctx.resolve("api_key") == "sk-secret"


def test_view_anchor_hides_earlier_history():
    ctx = LayeredContext(system={"p": 1})
    grow(ctx, 0)
    ctx.anchor("handoff")
    grow(ctx, 1)
    text = request_text(render(ctx.view(anchor="handoff")))
    assert "result_1" in text and "result_0" not in text
    assert render(ctx.view(anchor="handoff"), hooks=(drop_tool_results,)) == render(ctx.view(anchor="handoff"))


JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-100, 100) | st.text(max_size=6),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(
        st.sampled_from(["path", "resource", "token", "password", "x", "kind"]), inner, max_size=3),
    max_leaves=6)
VALUES = JSON | st.fixed_dictionaries({
    "kind": st.sampled_from(["tool_call", "tool_call_result", "tool_result", "read", "data"]),
    "path": st.sampled_from(["a", "b", "c"]), "content": st.text(max_size=4)})
ENTRIES = st.lists(st.tuples(st.sampled_from(list(Layer)), st.sampled_from(
    ["api_key", "password", "tool:1", "tool:2", "tool:3", "x", "secret_token"]), VALUES, st.integers(1, 50)),
    max_size=12).map(lambda rows: [Entry(layer, key, value, order, seq)
                                   for order, (layer, key, value, seq) in enumerate(rows, start=1)])
HOOKS = [drop_tool_results, newest_read_only, redact(["*password*", "api_key", "*token*"])]


@pytest.mark.parametrize("hook", HOOKS, ids=lambda h: h.__name__)
@given(entries=ENTRIES)
def test_hooks_are_idempotent_deterministic_and_keep_order(hook, entries):
    once = hook(list(entries))
    assert hook(list(once)) == once
    assert hook(list(entries)) == once
    orders = [e.order for e in once]
    assert orders == sorted(orders)
    assert {id(e) for e in once} <= {id(e) for e in entries} or hook is HOOKS[2]


@given(entries=ENTRIES)
def test_composed_hooks_are_idempotent(entries):
    def all_hooks(xs):
        for h in HOOKS:
            xs = h(xs)
        return xs
    once = all_hooks(list(entries))
    assert all_hooks(list(once)) == once


# ----- no model client in the pure path -----------------------------------------------------

def test_rendering_does_not_import_litellm():
    code = textwrap.dedent("""
        import sys
        import context_layers
        from context_layers import Layer, LayeredContext
        from context_layers.render import render
        from context_layers.prefix import prefix_stability
        from context_layers.hooks import redact
        import engine.llm, engine.answer
        ctx = LayeredContext(system={"p": "x"})
        ctx.write(Layer.WORKING, "a", 1, actor="t")
        rs = [render(ctx.view(hooks=[redact("p")]), format=f) for f in ("xml", "json", "plain")]
        assert prefix_stability(rs) >= 0
        assert "litellm" not in sys.modules, "litellm was imported"
        print("ok")
    """)
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"


# ----- HISTORY as a log -------------------------------------------------------------------

def status_context() -> LayeredContext:
    ctx = LayeredContext(system={"p": "policy"})
    ctx.begin_activity("intake")
    ctx.write(Layer.WORKING, "status", "opened", actor="intake")
    ctx.complete_activity("intake")
    grow(ctx, 1)
    return ctx


def rewrite(ctx: LayeredContext, task: str, value: str) -> None:
    ctx.begin_activity(task)
    ctx.write(Layer.WORKING, "status", value, actor=task)  # auto-promoted: lives in HISTORY
    ctx.complete_activity(task)


@pytest.mark.parametrize("fmt", FORMATS)
def test_a_rewritten_history_key_is_appended_not_rewritten_in_place(fmt):
    ctx = status_context()
    first = request_text(render(ctx, format=fmt, instructions="t", task_id="x"))
    rewrite(ctx, "review", "escalated")
    second = request_text(render(ctx, format=fmt, instructions="t", task_id="x"))
    assert second.startswith(first[: history_end(first, fmt)]), "the old value stays where it was"
    assert second.index("opened") < second.index("escalated") and second.count("escalated") == 1
    assert ctx.resolve("status") == "escalated"
    state = request_text(render(ctx, format=fmt, history="state"))
    assert '"opened"' not in state and "[opened]" not in state and "escalated" in state


def test_revisions_are_marked_and_parse_back():
    ctx = status_context()
    for n, value in enumerate(["review", "escalated", "closed"]):
        rewrite(ctx, f"r{n}", value)
    user = ET.fromstring(render(ctx, format="xml")[1]["content"])
    shown = [(e.text, e.get("revision")) for e in user.iter("entry") if e.get("key") == "status"]
    assert shown == [("opened", None), ("review", "2"), ("escalated", "3"), ("closed", "4")]
    doc = json.loads(render(ctx, format="json")[1]["content"])
    history = next(s["history"] for s in doc["sections"] if "history" in s)
    assert [(e["value"], e.get("revision")) for e in history if e["key"] == "status"][-1] == ("closed", 4)
    capped = ET.fromstring(render(ctx, format="xml", max_revisions=2)[1]["content"])
    assert [(e.text, e.get("revision")) for e in capped.iter("entry") if e.get("key") == "status"] == \
        [("escalated", "3"), ("closed", "4")]
    loaded = LayeredContext.from_dict(json.loads(json.dumps(ctx.to_dict())))
    assert render(loaded) == render(ctx)


def test_same_value_rewrites_and_aborts_do_not_add_revisions():
    ctx = status_context()
    rewrite(ctx, "same", "opened")
    ctx.begin_activity("failing")
    ctx.write(Layer.WORKING, "status", "broken", actor="failing")
    ctx.abort_activity("failing", reason="test")
    text = request_text(render(ctx))
    assert "broken" not in text and 'revision="' not in text


def test_compression_and_forks_collapse_the_log():
    ctx = status_context()
    rewrite(ctx, "review", "escalated")
    ctx.apply_changes([(Layer.HISTORY, "compaction:1", {"kind": "compaction", "summary": "earlier work"})],
                      kind="compress", actor="compressor")
    text = request_text(render(ctx))
    assert "[opened]" not in text and "escalated" in text
    ctx2 = status_context()
    rewrite(ctx2, "review", "escalated")
    branch = LayeredContext.fork(ctx2.snapshot(), name="b", branch_id="b")
    assert "[opened]" not in request_text(render(branch))
    assert render(branch, history="log") == render(branch, history="state")


def test_knowledge_scope_activity_shows_only_the_open_activitys_hits():
    ctx = LayeredContext(system={"p": 1})
    ctx.begin_activity("a")
    ctx.write(Layer.KNOWLEDGE, "old_hit", {"text": "old", "confidence": 0.9}, actor="retriever")
    ctx.complete_activity("a")
    ctx.begin_activity("b")
    ctx.write(Layer.KNOWLEDGE, "new_hit", {"text": "new", "confidence": 0.9}, actor="retriever")
    scoped = request_text(render(ctx, knowledge_scope="activity"))
    assert 'key="new_hit"' in scoped and 'key="old_hit"' not in scoped
    assert 'key="old_hit"' in request_text(render(ctx))
    with pytest.raises(ValueError):
        RenderOptions(knowledge_scope="some")  # type: ignore[arg-type]
