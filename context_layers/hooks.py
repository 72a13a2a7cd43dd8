"""Built-in select hooks: plain functions from entries to entries.

A view applies its hooks in order to what it shows a model; the context and its tape
are never touched (audit mode and token mode are two views of one tape). Every hook
here is deterministic and idempotent (``hook(hook(x)) == hook(x)``), keeps the order
of what it keeps, and returns entries it does not concern unchanged.

* ``drop_tool_results``: keep tool calls, drop their results (entries of kind
  ``tool_call_result`` or ``tool_result``, or without a kind and keyed as one: ``tool:...``,
  ``tool_call_result_1``; see ``is_tool_result``).
* ``newest_read_only``: of repeated reads of the same resource keep only the newest.
  A read is an entry of kind ``read`` or ``read_file``, a tool result (``is_tool_result``),
  or an entry of another kind than ``tool_call`` naming the tool ``read_file`` in its
  ``name`` or ``tool`` field (the seed's ``{"name": "read_file", "path": ...}`` event),
  whose value names the resource in a string ``resource`` or ``path`` field. Newest is
  the last changed (highest tape seq, then insertion order).
* ``redact(patterns, replacement)``: values of keys matching any glob pattern
  (``fnmatch``, case-sensitive) become ``replacement``, in every layer, and so do
  nested object fields whose name matches. The entry stays, so the model still sees
  that the key exists; a record about such a key (an object whose ``key`` field names it, as a
  join's conflict records do) shows only its identity fields. ``redact()`` with no patterns takes ``SECRET_PATTERNS`` (passwords,
  secrets, API keys, access tokens, credentials, private keys), matched case-insensitively,
  and also hides secrets written inside any string (``SECRET_TEXT``: a bearer token, a JWT,
  an ``sk-`` key, an AWS access key id, a PEM private key), the rest of the text kept.

What the engine sends to a model goes through the same rules (``RedactSetting``: the ``redact``
field of an activity's or a gateway's config): ``model_hooks(setting)`` are the hooks an
activity's request is rendered through, ``redact_for_model(value, setting)`` hides the same
secrets in a plain JSON value (a condition's context, a conflict prompt's values, a tool's
result), and ``secret_key(key, setting)`` says whether a key's value is hidden whole. The
setting is ``True`` (``SECRET_PATTERNS`` and ``SECRET_TEXT``: the default), ``False`` (nothing
hidden) or a list of extra glob patterns (case-sensitive, as ``redact([...])`` takes them)
hidden on top of the default ones. A prompt that asks a model to decide or summarize (a conflict,
a branch's sentence, a summary, a compression plan) adds ``REDACTED_NOTE`` when it shows a hidden
value (``note_redacted``), telling the model not to guess it or ask for it.
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace
from typing import Any

from .canonical import freeze
from .context import TOOL_RESULT_KINDS, Entry, SelectHook, names_tool_result

__all__ = ["REDACTED", "REDACTED_NOTE", "SECRET_PATTERNS", "SECRET_TEXT", "TOOL_RESULT_KINDS", "RedactSetting",
           "drop_tool_results", "is_tool_result", "model_hooks", "newest_read_only", "note_redacted", "redact",
           "redact_for_model", "redact_lines", "redact_text", "secret_key"]

#: what a hidden value becomes
REDACTED = "[REDACTED]"
#: what a model whose request shows ``REDACTED`` is told (``note_redacted``): without it, a model asked
#: to decide on a value it cannot see may guess one, or answer by asking for it
REDACTED_NOTE = ("[REDACTED] marks a value withheld on purpose (a secret): do not guess it, "
                 "and do not ask for it.")
#: an element's ``redact`` config: True (the default secrets), False (none), or extra glob patterns
RedactSetting = bool | Sequence[str]

_READ_KINDS = frozenset({"read", "read_file"}) | TOOL_RESULT_KINDS
_READ_TOOLS = frozenset({"read_file"})

# what ``redact()`` hides when given no patterns; not ``*token*``, which would hide the
# token counts of activity records
SECRET_PATTERNS = ("*password*", "*passwd*", "*secret*", "*api_key*", "*apikey*", "*api-key*",
                   "token", "*_token", "*access_token*", "*refresh_token*", "*credential*",
                   "*private_key*", "authorization")

# Secrets by their shape, for a log line or a tool's request that carries one under an
# innocent key. Only shapes no ordinary text has, so claims, names and ids stay readable;
# group 1, where present, is kept (the "Bearer " that says what was hidden).
SECRET_TEXT = re.compile(
    r"(\bBearer\s+)[A-Za-z0-9._~+/-]{16,}=*"
    r"|\beyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}"
    r"|\bsk-[A-Za-z0-9_-]{16,}"
    r"|\bAKIA[0-9A-Z]{16}\b"
    r"|-----BEGIN [A-Z ]*PRIVATE KEY-----.*?(?:-----END [A-Z ]*PRIVATE KEY-----|\Z)",
    re.DOTALL)


def is_tool_result(e: Entry) -> bool:
    """A tool's result: an entry of kind ``tool_call_result``/``tool_result``, or one with no kind
    of its own whose key says so: a ``tool:`` record (DESIGN.md's HISTORY records), or a key that
    is, or begins up to a separator, ``tool_call_result``/``tool_result`` (as a compress rule's
    plain-word pattern matches it). An entry of another kind (``tool_call``) is not one."""
    if e.kind in TOOL_RESULT_KINDS:
        return True
    return e.kind == "data" and names_tool_result(e.key)


def drop_tool_results(entries: Sequence[Entry]) -> list[Entry]:
    """Keep the calls, drop the results (see module doc and ``is_tool_result``)."""
    return [e for e in entries if not is_tool_result(e)]


def _is_read(e: Entry) -> bool:
    if e.kind in _READ_KINDS or is_tool_result(e):
        return True
    return e.kind != "tool_call" and isinstance(e.value, Mapping) and any(
        e.value.get(f) in _READ_TOOLS for f in ("name", "tool"))


def _resource(e: Entry) -> str | None:
    if not isinstance(e.value, Mapping) or not _is_read(e):
        return None
    for field in ("resource", "path"):
        value = e.value.get(field)
        if isinstance(value, str):
            return value
    return None


def newest_read_only(entries: Sequence[Entry]) -> list[Entry]:
    """Of reads of one resource, keep the newest (see module doc)."""
    newest: dict[tuple[int, str], Entry] = {}
    for e in entries:
        resource = _resource(e)
        if resource is None:
            continue
        group = (int(e.layer), resource)
        best = newest.get(group)
        if best is None or (e.seq, e.order) > (best.seq, best.order):
            newest[group] = e
    keep = {id(e) for e in newest.values()}
    return [e for e in entries if _resource(e) is None or id(e) in keep]


# fields a record about a key keeps when the key it names is a secret: what identifies the record,
# never a value, a reason or a message (a conflict's reason may quote the value a person chose)
_RECORD_IDENTITY = frozenset({"key", "layer", "gateway_id", "resolver", "branch", "source_branches", "id", "type",
                              "kind", "status", "timed_out", "escalate", "task_id", "activity_id"})


def _redact_value(value: Any, patterns: tuple[str, ...], replacement: Any, fold: bool, secret: bool = False) -> Any:
    if isinstance(value, Mapping):
        named = value.get("key")
        if secret or (isinstance(named, str) and _matches(named, patterns, fold)):
            # a record about a secret key (a join's conflict: key, base value, branch values,
            # resolution): only its identity shows
            return {k: _redact_value(v, patterns, replacement, fold, True) if isinstance(v, (Mapping, list, tuple))
                    else v if k in _RECORD_IDENTITY else replacement for k, v in value.items()}
        out = {k: replacement if _matches(k, patterns, fold) else _redact_value(v, patterns, replacement, fold)
               for k, v in value.items()}
        if _summary_record(value):
            # the compressor wrote the folded entries as ``name: value`` text: a secret key's value
            # is in that text now, where no key names it
            for name in _SUMMARY_TEXT_FIELDS:
                text = out.get(name)
                if isinstance(text, str):
                    out[name] = _redact_pairs(text, patterns, fold, replacement)
                elif isinstance(text, list):
                    out[name] = [_redact_pairs(t, patterns, fold, replacement) if isinstance(t, str) else t
                                 for t in text]
        return out
    if isinstance(value, (list, tuple)):
        return [_redact_value(v, patterns, replacement, fold, secret) for v in value]
    if secret:
        return replacement
    if fold and isinstance(value, str):  # the default secrets: their shapes inside text too
        return _redact_text(value, replacement)
    return value


def _redact_text(text: str, replacement: Any) -> str:
    mark = replacement if isinstance(replacement, str) else "[REDACTED]"
    return SECRET_TEXT.sub(lambda m: (m.group(1) or "") + mark, text)


def _matches(key: str, patterns: tuple[str, ...], fold: bool = False) -> bool:
    if fold:
        key = key.lower()
    return any(fnmatch.fnmatchcase(key, p) for p in patterns)


def redact(patterns: str | Iterable[str] | None = None, replacement: Any = REDACTED) -> SelectHook:
    """A hook that replaces the values of keys matching ``patterns`` (see module doc);
    ``SECRET_PATTERNS``, case-insensitively, when ``None``."""
    fold = patterns is None
    pats = SECRET_PATTERNS if patterns is None else (patterns,) if isinstance(patterns, str) else tuple(patterns)
    if pats and all(isinstance(p, Entry) for p in pats):
        raise TypeError("redact(patterns) makes a select hook, it is not one: pass hooks=[redact()] "
                        "(SECRET_PATTERNS) or hooks=[redact(['api_key', '*password*'])]")
    if not pats or not all(isinstance(p, str) and p for p in pats):
        raise ValueError(f"redact needs non-empty glob patterns, got {patterns!r}")
    frozen_replacement = freeze(replacement)

    def hook(entries: Sequence[Entry]) -> list[Entry]:
        out = []
        for e in entries:
            if _matches(e.key, pats, fold):
                value = frozen_replacement
            else:
                value = freeze(_redact_value(e.value, pats, frozen_replacement, fold))
            out.append(e if value == e.value and type(value) is type(e.value) else replace(e, value=value))
        return out

    hook.__name__ = "redact()" if fold else f"redact({', '.join(pats)})"
    hook.__qualname__ = hook.__name__
    return hook


def _extra(setting: RedactSetting) -> tuple[str, ...]:
    return () if isinstance(setting, bool) else tuple(setting)


def model_hooks(setting: RedactSetting = True) -> tuple[SelectHook, ...]:
    """The hooks in front of a model's request: ``redact()`` and, for extra patterns,
    ``redact(patterns)``; none when the setting is ``False``."""
    if setting is False:
        return ()
    extra = _extra(setting)
    return (redact(), redact(extra)) if extra else (redact(),)


def redact_for_model(value: Any, setting: RedactSetting = True) -> Any:
    """``value`` (plain JSON: a mapping of keys to values, a list, a text) as a model may see it:
    the secrets ``model_hooks(setting)`` hide in a context hidden here too (deterministic and
    idempotent; the value itself is never changed). Mappings come back as dicts, sequences as lists."""
    if setting is False:
        return value
    out = _redact_value(value, SECRET_PATTERNS, REDACTED, True)
    extra = _extra(setting)
    return _redact_value(out, extra, REDACTED, False) if extra else out


def redact_text(text: str, setting: RedactSetting = True) -> str:
    """A text a model is sent, with the secrets written inside it (``SECRET_TEXT``) hidden."""
    return text if setting is False else _redact_text(text, REDACTED)


def note_redacted(instruction: str, *shown: str, sep: str = "\n\n") -> str:
    """``instruction`` (a prompt's system text or instruction) followed by ``REDACTED_NOTE`` when any
    text of the request (``shown``) holds ``REDACTED``; unchanged otherwise, so a request with nothing
    hidden keeps its bytes (and a provider's prompt cache its prefix)."""
    return f"{instruction}{sep}{REDACTED_NOTE}" if any(REDACTED in text for text in shown) else instruction


def secret_key(key: str, setting: RedactSetting = True) -> bool:
    """Whether the value of ``key`` is hidden from a model whole (a key named like a secret)."""
    if setting is False:
        return False
    return _matches(key, SECRET_PATTERNS, True) or _matches(key, _extra(setting))


# ``name: value`` pairs of the text a compression summarizes (``summarize.value_text`` lines, joined
# by "; " in a compaction's lines): a dotted name, its value up to the next pair or line end
# (a name may hold a colon not followed by a space: ``tool:fetch: result.token: ...``, a record's key
# before the paths kept of it)
_NAME = r"[^\s:;](?:[^:;\n]|:(?! ))*?"
_PAIR = re.compile(rf"(^|; )({_NAME}): ([^\n]*?)(?=; {_NAME}: |\n|$)", re.MULTILINE)
_LEAD = re.compile(rf"({_NAME}): ")


def redact_lines(text: str, setting: RedactSetting = True) -> str:
    """``redact_text``, and in ``name: value`` lines (the text a compression asks a model to
    summarize) the values of names, or dotted paths with a part, named like a secret."""
    if setting is False:
        return text
    text = _redact_pairs(text, SECRET_PATTERNS, True, REDACTED)
    extra = _extra(setting)
    return redact_text(_redact_pairs(text, extra, False, REDACTED) if extra else text, setting)


# the fields of a compressor's record that hold the ``name: value`` text of what it folded: a
# ``compaction:<n>`` record's summary and kept lines, a ``summarize`` rule's summary in place
_SUMMARY_TEXT_FIELDS = ("summary", "kept")


def _summary_record(value: Mapping[str, Any]) -> bool:
    return value.get("kind") == "compaction" or value.get("_compressed") == "summarize"


def _redact_pairs(text: str, patterns: tuple[str, ...], fold: bool, replacement: Any) -> str:
    """In ``name: value`` lines, the values of names (or of a part of a dotted path) that match."""
    mark = replacement if isinstance(replacement, str) else REDACTED

    def hidden(name: str) -> bool:
        return _matches(name, patterns, fold) or any(_matches(part, patterns, fold) for part in name.split("."))

    def pair(m: re.Match[str]) -> str:
        out, name, value, at = [m.group(1)], m.group(2), m.group(3), 0
        while True:
            out.append(f"{name}: ")
            if hidden(name):
                out.append(mark)
                break
            # a value that is itself ``name: value`` (a kept line: the key, then the paths kept of it)
            inner = _LEAD.match(value, at)
            if inner is None:
                out.append(value[at:])
                break
            name, at = inner.group(1), inner.end()
        return "".join(out)

    return _PAIR.sub(pair, text)
