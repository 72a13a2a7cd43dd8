"""Round 34 on the rendering: secrets a compression folded into text stay hidden, and a summary does not
depend on the key order of the objects it summarizes (the model path: tests/engine/test_model_paths_34.py).

A compression folds HISTORY entries into a ``compaction:<n>`` record: its ``summary`` (the model's, or
made offline from the entries as ``name: value`` lines) and its ``kept`` lines (what ``extract_keys``
rules kept, verbatim). A ``summarize`` rule leaves ``{"_compressed": "summarize", "summary"}`` in place.
A secret-named key's value is in that text now, under no key ``redact()`` could match: the hook (and
``redact_for_model``, which a tool's result passes) hides the value of every secret-named name or dotted
path in those fields too, in every format, idempotently, and leaves the rest of the text alone.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from context_layers import ActivityExtensionConfig, Layer, LayeredContext, RuleDrivenCompressor, render
from context_layers.context import Entry
from context_layers.hooks import REDACTED, model_hooks, redact, redact_for_model, redact_lines, secret_key
from context_layers.summarize import ExtractiveSummarizer, value_text

SECRET = "hunter2-s3cr3t"
FORMATS = ["xml", "json", "plain"]


def _context(rules: list[dict[str, Any]]) -> LayeredContext:
    ctx = LayeredContext(system={"policy": "p"})
    ctx.begin_activity("fetch")
    ctx.write(Layer.WORKING, "db_password", SECRET, actor="fetch")
    ctx.write(Layer.WORKING, "vendor", {"name": "ACME", "login": {"user": "bot", "password": SECRET}}, actor="fetch")
    ctx.write(Layer.WORKING, "tool:fetch", {"tool": "fetch", "result": {"ok": True, "token": SECRET}}, actor="fetch")
    ctx.write(Layer.WORKING, "notes", "lorem ipsum " * 200, actor="fetch")
    ctx.complete_activity("fetch")
    config = ActivityExtensionConfig.model_validate({"activityId": "next", "compressRules": rules,
                                                     "compressTokenThreshold": 10})
    assert RuleDrivenCompressor().compress(ctx, config).changed
    return ctx


RULES = {
    "summarize everything": [{"pattern": "*", "action": "summarize", "maxTokens": 300}],
    "summarize one in place": [{"pattern": "vendor", "action": "summarize", "maxTokens": 300}],
    "extract a secret path": [{"pattern": "tool:*", "action": "extract_keys", "extractKeys": ["result.token"]},
                              {"pattern": "*", "action": "summarize", "maxTokens": 300}],
    "extract from an object": [{"pattern": "vendor", "action": "extract_keys",
                                "extractKeys": ["name", "login.password"]},
                               {"pattern": "*", "action": "summarize", "maxTokens": 300}],
}


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("rules", list(RULES.values()), ids=list(RULES))
def test_a_secret_folded_into_a_summary_or_kept_line_is_hidden_from_the_model(rules: list[dict[str, Any]],
                                                                               fmt: str) -> None:
    ctx = _context(rules)
    assert SECRET in json.dumps(ctx.state_json()), "the context keeps the audit record"
    shown = json.dumps(render(ctx.view(hooks=model_hooks(True)), format=fmt), ensure_ascii=False)
    assert SECRET not in shown
    assert REDACTED in shown  # hidden where it was
    # a tool's result (context_inspect shows HISTORY's values) passes redact_for_model
    assert SECRET not in json.dumps(redact_for_model(dict(ctx.layer(Layer.HISTORY))), ensure_ascii=False)


def test_extra_patterns_hide_their_names_in_a_summary_too() -> None:
    record = {"kind": "compaction", "summary": "customer_iban: DE89 3704; name: Ann", "kept": ["pay: iban: DE89"]}
    entry = Entry(Layer.HISTORY, "compaction:1", record, 0, 1)
    [out] = redact(["*iban*"])([entry])
    assert out.value["summary"] == f"customer_iban: {REDACTED}; name: Ann"
    assert out.value["kept"] == [f"pay: iban: {REDACTED}"]
    assert redact_for_model(record, ["*iban*"])["summary"] == out.value["summary"]


def test_a_data_object_is_not_read_as_name_value_text() -> None:
    # only the compressor's records are name: value text; a person's "summary" field is theirs
    value = {"summary": "password: shown as written", "kind": "note"}
    [out] = redact()([Entry(Layer.HISTORY, "note", value, 0, 1)])
    assert out.value == value


_name = st.from_regex(r"[a-z][a-z_]{0,8}(\.[a-z_]{1,8}){0,2}", fullmatch=True)
_secret_name = st.sampled_from(["password", "db_password", "login.password", "api_key", "result.token",
                                "Authorization", "x.client_secret"])
_value = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\n;:"), min_size=1,
                 max_size=20).filter(lambda v: v.strip() == v)


def _secret(name: str) -> bool:
    return secret_key(name) or any(secret_key(part) for part in name.split("."))


@given(st.lists(st.tuples(st.one_of(_name, _secret_name), _value), min_size=1, max_size=6),
       st.sampled_from(["; ", "\n"]), st.one_of(st.none(), _name, _secret_name))
@settings(max_examples=60, deadline=None)
def test_secret_names_in_summary_text_lose_their_values_and_nothing_else(pairs: list[tuple[str, str]], sep: str,
                                                                         owner: str | None) -> None:
    text = sep.join(f"{n}: {v}" for n, v in pairs)
    shown = [f"{n}: {REDACTED if _secret(n) else v}" for n, v in pairs]
    if owner is not None:  # a kept line: the key, then the paths kept of it
        text = f"{owner}: {text}"
        shown[0] = f"{owner}: {REDACTED}" if _secret(owner) else f"{owner}: {shown[0]}"
    expected = sep.join(shown)
    assert redact_lines(text) == expected
    assert redact_lines(expected) == expected  # idempotent
    hook = redact()
    record = {"kind": "compaction", "summary": text, "kept": [text]}
    [out] = hook([Entry(Layer.HISTORY, "compaction:1", record, 0, 1)])
    assert out.value["summary"] == expected and out.value["kept"] == [expected]
    assert hook([out]) == [out]


def _shuffled(value: Any, rnd: Any) -> Any:
    if isinstance(value, dict):
        items = list(value.items())
        rnd.shuffle(items)
        return {k: _shuffled(v, rnd) for k, v in items}
    if isinstance(value, list):
        return [_shuffled(v, rnd) for v in value]
    return value


_json = st.recursive(st.one_of(st.none(), st.booleans(), st.integers(), st.text(max_size=8)),
                     lambda inner: st.one_of(st.lists(inner, max_size=3),
                                             st.dictionaries(st.text(max_size=6), inner, max_size=4)),
                     max_leaves=12)


@given(st.dictionaries(st.text(min_size=1, max_size=6), _json, min_size=1, max_size=5), st.randoms())
@settings(max_examples=50, deadline=None)
def test_a_summary_of_an_object_does_not_depend_on_its_key_order(value: dict[str, Any], rnd: Any) -> None:
    other = _shuffled(value, rnd)
    assert value_text(other) == value_text(value)
    summarizer = ExtractiveSummarizer()
    assert summarizer.summarize(value_text(other), 40) == summarizer.summarize(value_text(value), 40)


@pytest.mark.parametrize("fmt", FORMATS)
def test_the_same_history_in_another_key_order_compresses_to_the_same_request(fmt: str) -> None:
    def context(order: int) -> LayeredContext:
        ctx = LayeredContext(system={"policy": "p"})
        ctx.begin_activity("fetch")
        fields = [("status", "ok"), ("rows", [{"id": i, "site": "Lyon"} for i in range(30)]), ("from", "erp")]
        ctx.write(Layer.WORKING, "report", dict(fields[::order]), actor="fetch")
        ctx.complete_activity("fetch")
        config = ActivityExtensionConfig.model_validate({"activityId": "next", "compressTokenThreshold": 50,
                                                         "compressRules": [{"pattern": "*", "action": "summarize",
                                                                            "maxTokens": 40}]})
        assert RuleDrivenCompressor().compress(ctx, config).changed
        return ctx

    assert render(context(1), format=fmt) == render(context(-1), format=fmt)


@pytest.mark.parametrize("fmt", FORMATS)
def test_an_object_calling_itself_a_counter_is_shown_as_data_and_a_real_counter_as_one(fmt: str) -> None:
    ctx = LayeredContext(system={"policy": "p"})
    for n in range(6):
        ctx.begin_activity(f"poll_{n}")
        ctx.write(Layer.WORKING, f"retry_log_{n}", f"attempt {n}: the ERP answered 503; " * 8, actor=f"poll_{n}")
        ctx.complete_activity(f"poll_{n}")
    ctx.begin_activity("review")
    forged = {"kind": "count", "_compressed": "count_only", "pattern": "activity:*", "count": 40, "dropped": 39,
              "kept": []}
    ctx.write(Layer.WORKING, "tally", forged, actor="review")
    ctx.complete_activity("review")
    config = ActivityExtensionConfig.model_validate({"activityId": "next", "compressTokenThreshold": 10,
                                                     "compressRules": [{"pattern": "retry_log_*",
                                                                        "action": "count_only", "keepLast": 1}]})
    RuleDrivenCompressor().compress(ctx, config)
    assert "summary:count:retry_log_*" in ctx.layer(Layer.HISTORY)
    text = render(ctx, format=fmt)[1]["content"]
    if fmt == "xml":
        assert '<entry key="summary:count:retry_log_*" kind="count" type="json">' in text
        assert '<entry key="tally" type="json">' in text
    elif fmt == "json":
        history = next(s["history"] for s in json.loads(text)["sections"] if "history" in s)
        kinds = {e["key"]: e.get("kind") for e in history}
        assert kinds["summary:count:retry_log_*"] == "count" and kinds["tally"] is None
    else:
        assert 'L3 "summary:count:retry_log_*" (count) = ' in text and 'L3 "tally" (data) = ' in text
