"""Compression rules as plain functions from HISTORY entries to HISTORY entries.

``apply_rule(items, rule, ...)`` takes HISTORY as ``(key, value)`` pairs in order and
returns the new pairs; it is deterministic and idempotent
(``apply_rule(apply_rule(x)) == apply_rule(x)``), and ``apply_rules`` runs a rule list
until nothing changes, so compressing twice with the same rules changes nothing the
second time. Invariants of every action:

* protected keys (preserved keys and the next activity's required context) and
  compressor records (``compaction:*``, ``count_only`` counters) are never matched, nor,
  by any rule but ``count_only``, an entry a counter lists as ``kept`` (verbatim: its word);
* an entry is replaced only when the replacement has fewer tokens, so rules never
  make HISTORY bigger;
* the entry kind survives: replaced dict values keep their ``kind`` field, and get
  ``"_compressed": <action>`` so a model reading them (and the next run) knows.

Actions:

* ``extract_keys``: keep ``kind``, ``_compressed`` and the dotted ``extractKeys`` paths
  (``data.id``) at the same paths, lists staying lists: a numeric segment indexes a
  list (``rows.1.id`` keeps ``rows: [null, {"id": ...}]``, the slots before it ``null``),
  a name segment on a list takes that field of each item (``rows.id``); missing paths
  are skipped and reported; an entry that is itself a list of rows has each path read
  in every row (``site``: the ``site`` of each row); an entry where no path resolves (or a
  value that is neither an object nor a list) is left unchanged. With no ``extractKeys``:
  keep the top-level scalar fields of at most ``SHORT_FIELD_TOKENS`` tokens.
* ``summarize``: ``{"kind", "_compressed": "summarize", "summary"}`` plus the identity
  fields (``activity``, ``tool``, ``name``, ``call_id``, ``tool_call_id``, ``status``)
  when scalar; the summary fits ``maxTokens`` (tiktoken). An entry already summarized
  within ``maxTokens`` is left alone.
* ``count_only``: of the matching entries (HISTORY order) keep the last ``keepLast``
  verbatim and replace the others by one counter record
  ``summary:count:<pattern>`` = ``{"kind": "count", "_compressed": "count_only",
  "pattern", "count" (entries seen), "dropped" (entries removed), "kept" (keys)}``.
  ``kept`` lists the entries it keeps verbatim; one another rule reduced before the counter
  kept it is listed by what it is, under ``"summarized"`` (a ``summarize`` output) or
  ``"extracted"`` (an ``extract_keys`` one), each only when not empty (``COUNTER_IN_PLACE``:
  ``counter_in_place`` gives all three). An entry the counter kept that a parallel branch's fold
  took away at a join is no longer listed as kept: the join moves it to ``"folded"`` (or
  ``"deleted"``, when a branch removed it), so ``count == dropped + len(kept) +
  len(summarized) + len(extracted) + len(folded) + len(deleted)``; a later count goes on from
  those (``counter_gone``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from .canonical import Memo, thaw
from .config import CompressRule
from .context import entry_kind
from .summarize import ExtractiveSummarizer, Summarizer, as_summarizer, fit_summary, value_text
from .tokens import DEFAULT_ENCODING, count_text, count_value

__all__ = [
    "SHORT_FIELD_TOKENS",
    "RuleOutcome",
    "SummaryCache",
    "apply_rule",
    "apply_rules",
    "count_key",
    "counter_basis",
    "counter_gone",
    "counter_in_place",
    "counter_lists",
    "extract_paths",
    "get_path",
]

SHORT_FIELD_TOKENS = 64
MAX_PASSES = 8
_IDENTITY = ("activity", "tool", "name", "call_id", "tool_call_id", "status")

Items = list[tuple[str, Any]]


@dataclass(frozen=True)
class RuleOutcome:
    """New HISTORY pairs, the keys a rule changed, removed or added, missing extract paths."""

    items: tuple[tuple[str, Any], ...]
    affected: tuple[str, ...] = ()
    missing_paths: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    # a ``count_only`` rule that matched entries to remove but made no counter, as it would cost more
    # tokens than they do: ``{"entries", "entries_tokens", "counter_tokens", "reason"}`` (else empty)
    declined: Mapping[str, Any] = field(default_factory=dict)


class SummaryCache:
    """Calls a summarizer once per (text, max_tokens) within one compression.

    ``offline_keys``: the keys whose values the summarizer may not be shown (a model's, for keys
    named like secrets): a ``summarize`` rule's text of such an entry is its value alone, with no
    name saying what it is, so it is summarized offline (``ExtractiveSummarizer``) instead."""

    def __init__(self, summarizer: Summarizer | None = None, *, encoding: str = DEFAULT_ENCODING,
                 prefix_messages: Callable[[], Sequence[Mapping[str, str]] | None] | None = None,
                 offline_keys: Callable[[str], bool] | None = None) -> None:
        self.summarizer = as_summarizer(summarizer) or ExtractiveSummarizer(encoding=encoding)
        self.encoding = encoding
        self._prefix = prefix_messages
        self._memo: dict[tuple[str, int], str] = {}
        self._offline_keys = offline_keys
        self._offline: SummaryCache | None = None

    def entry(self, key: str, text: str, max_tokens: int) -> str:
        """The summary of the entry ``key`` (its text): offline for an ``offline_keys`` key."""
        if self._offline_keys is None or not self._offline_keys(key):
            return self(text, max_tokens)
        if self._offline is None:
            self._offline = SummaryCache(encoding=self.encoding)
        return self._offline(text, max_tokens)

    def __call__(self, text: str, max_tokens: int) -> str:
        key = (text, max_tokens)
        if key not in self._memo:
            prefix = self._prefix() if self._prefix is not None else None
            raw = self.summarizer.summarize(text, max_tokens, prefix_messages=prefix)
            if not isinstance(raw, str):  # a summarizer of the application's own, wrongly typed
                raise TypeError(f"summarizer {type(self.summarizer).__name__}.summarize() returned a "
                                f"{type(raw).__name__} ({raw!r:.80}), not the summary text (str)")
            self._memo[key] = fit_summary(raw, max_tokens, self.encoding)
        return self._memo[key]


def is_protected_record(key: str, value: Any) -> bool:
    return key.startswith("compaction:") or (isinstance(value, dict) and value.get("_compressed") == "count_only")


COUNTER_GONE = ("folded", "deleted")  # a counter's kept entries a join took away, by how


def counter_gone(record: Any) -> dict[str, list[str]]:
    """The entries a ``count_only`` counter kept that a join took away since (``COUNTER_GONE``):
    counted, but neither dropped by the counter nor kept verbatim."""
    if not isinstance(record, Mapping):
        return {}
    return {field_: [k for k in record[field_] if isinstance(k, str)] for field_ in COUNTER_GONE
            if isinstance(record.get(field_), (list, tuple)) and record[field_]}


#: a counter's lists of the entries it leaves where they were: verbatim, or as a rule reduced them
#: before it kept them (by the ``_compressed`` marker the rule left: ``_REDUCED``)
COUNTER_IN_PLACE = ("kept", "summarized", "extracted")
_REDUCED = {"summarize": "summarized", "extract_keys": "extracted"}


def counter_lists(record: Any) -> dict[str, list[str]]:
    """A counter's ``COUNTER_IN_PLACE`` lists, each (``kept`` too) as it holds it, else empty."""
    lists: dict[str, list[str]] = {f: [] for f in COUNTER_IN_PLACE}
    if isinstance(record, Mapping):
        for f in COUNTER_IN_PLACE:
            if isinstance(record.get(f), (list, tuple)):
                lists[f] = [k for k in record[f] if isinstance(k, str)]
    return lists


def counter_in_place(record: Any) -> list[str]:
    """Every entry a counter leaves in HISTORY: kept verbatim, summarized or extracted."""
    return [k for keys in counter_lists(record).values() for k in keys]


def _placed(items: Iterable[tuple[str, Any]]) -> dict[str, list[str]]:
    """The entries a counter keeps, listed by what they are (``kept`` always, the others when not empty)."""
    lists: dict[str, list[str]] = {"kept": []}
    for key, value in items:
        marker = value.get("_compressed") if isinstance(value, Mapping) else None
        lists.setdefault(_REDUCED.get(marker, "kept") if isinstance(marker, str) else "kept", []).append(key)
    return lists


def counter_basis(record: Any) -> Any:
    """A counter as the compression wrote it, before a join took kept entries away (the order
    and the kind of what it keeps aside): two counters with one basis are the same count of
    the same entries."""
    gone = counter_gone(record)
    if not isinstance(record, Mapping) or (not gone and not any(record.get(f) for f in COUNTER_IN_PLACE[1:])):
        return record
    return {**{k: v for k, v in record.items() if k not in COUNTER_GONE and k not in COUNTER_IN_PLACE},
            "kept": sorted([*counter_in_place(record), *(k for keys in gone.values() for k in keys)])}


def get_path(value: Any, path: str) -> tuple[bool, Any]:
    """``(True, v)`` for the value at dotted ``path`` (numeric segments index lists), else ``(False, None)``."""
    node = value
    for seg in path.split("."):
        if isinstance(node, dict) and seg in node:
            node = node[seg]
        elif isinstance(node, list) and seg.isdigit() and int(seg) < len(node):
            node = node[int(seg)]
        else:
            return False, None
    return True, node


class _Absent:
    """What a path does not reach: a missing path, or a list slot no path picked."""


_ABSENT = _Absent()


def _pick(node: Any, segs: Sequence[str]) -> Any:
    """The part of ``node`` that ``segs`` reaches, in the shape of ``node`` (a list stays a
    list: ``rows.1.id`` gives ``[<absent>, {"id": ...}]``, so ``v["rows"][1]["id"]`` reads
    it back), or ``_ABSENT``. A name segment on a list takes that field of every item
    (``rows.id``), the one way to keep a field of each row whatever their number."""
    if not segs:
        return thaw(node)
    seg, rest = segs[0], segs[1:]
    if isinstance(node, dict):
        if seg not in node:
            return _ABSENT
        sub = _pick(node[seg], rest)
        return _ABSENT if sub is _ABSENT else {seg: sub}
    if isinstance(node, list):
        if seg.isdigit():
            i = int(seg)
            sub = _pick(node[i], rest) if i < len(node) else _ABSENT
            return _ABSENT if sub is _ABSENT else [*([_ABSENT] * i), sub]
        subs = [_pick(item, segs) for item in node]
        return _ABSENT if all(s is _ABSENT for s in subs) else subs
    return _ABSENT


def _merge(a: Any, b: Any) -> Any:
    """Two picks of one value together (what either reaches); a whole value wins over a part of it."""
    if a is _ABSENT:
        return b
    if b is _ABSENT:
        return a
    if isinstance(a, dict) and isinstance(b, dict):
        out = dict(a)
        for k, v in b.items():
            out[k] = _merge(out[k], v) if k in out else v
        return out
    if isinstance(a, list) and isinstance(b, list):
        n = max(len(a), len(b))
        return [_merge(a[i] if i < len(a) else _ABSENT, b[i] if i < len(b) else _ABSENT) for i in range(n)]
    return a


def _filled(value: Any) -> Any:
    """A merged pick as JSON: list slots no path picked become ``null``."""
    if value is _ABSENT:
        return None
    if isinstance(value, dict):
        return {k: _filled(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_filled(v) for v in value]
    return value


def extract_paths(value: Any, paths: Sequence[str], *, encoding: str = DEFAULT_ENCODING) -> tuple[Any | None, list[str]]:
    """The reduced value (``None`` when nothing resolves) and the paths that did not resolve."""
    if isinstance(value, list) and paths:
        return _extract_rows(value, paths)
    if not isinstance(value, dict):
        return None, list(paths)
    out: dict[str, Any] = {}
    if "kind" in value:
        out["kind"] = value["kind"]
    out["_compressed"] = value.get("_compressed", "extract_keys")
    missing: list[str] = []
    found = False
    if paths:
        picked: Any = _ABSENT
        for path in paths:
            sub = _pick(value, path.split("."))
            if sub is _ABSENT:
                missing.append(path)
            else:
                found = True
                picked = _merge(picked, sub)
        if found:
            for k, v in _filled(picked).items():
                if k not in out:
                    out[k] = v
    else:
        for k, v in value.items():
            if k in out or isinstance(v, (dict, list)):
                continue
            if count_value(v, encoding) <= SHORT_FIELD_TOKENS:
                out[k] = v
                found = True
    return (out if found else None), missing


def _extract_rows(rows: list[Any], paths: Sequence[str]) -> tuple[Any | None, list[str]]:
    """An entry that is a list of rows (a multi-instance task's output collection): each path
    is read in every row, as ``data.rows.id`` reads it inside an object, and the list stays a
    list of the rows' picked fields. It carries no ``_compressed`` marker (a list has no field
    for it); applied again it picks the same fields, so the rule stays idempotent."""
    picked: Any = _ABSENT
    missing: list[str] = []
    for path in paths:
        sub = _pick(rows, path.split("."))
        if sub is _ABSENT:
            missing.append(path)
        else:
            picked = _merge(picked, sub)
    return (None if picked is _ABSENT else _filled(picked)), missing


def _counter(encoding: str) -> Callable[[Any], int]:
    return lambda value: count_value(value, encoding)


_COUNT_PREFIX = "summary:count:"


def count_key(pattern: str) -> str:
    return f"{_COUNT_PREFIX}{pattern}"


_MATCHES: Memo[tuple[str, str, str], bool] = Memo(1 << 15)


def _matches(rule: CompressRule, kind: str, key: str) -> bool:
    """``rule.matches(kind, key)``, which depends on the rule's pattern only. HISTORY is
    matched again on every pass and every compression: the glob runs once per
    (pattern, kind, key)."""
    slot = (rule.pattern, kind, key)
    hit = _MATCHES.get(slot)
    if hit is None:
        hit = _MATCHES.put(slot, rule.matches(kind, key))
    return hit


# (id(rule), key, id(value)) -> (rule, value, missing paths): an entry a rule looked at
# and left as it was. ``apply_rules`` runs every rule again until a pass changes nothing,
# and the compressor runs the rules again on what a fold leaves: an entry judged once
# is not judged again. One memo serves one compression only: a summarize rule's verdict
# depends on that compression's summaries. It holds the rule and the value, so their
# ids are not reused while it lives.
Judged = dict[tuple[int, str, int], tuple[CompressRule, Any, tuple[str, ...]]]


def apply_rule(items: Iterable[tuple[str, Any]], rule: CompressRule, *, protected: Iterable[str] = (),
               summarize: Callable[[str, int], str] | None = None, encoding: str = DEFAULT_ENCODING,
               judged: Judged | None = None, tokens: Callable[[Any], int] | None = None) -> RuleOutcome:
    """Apply one rule to HISTORY pairs (see the module doc). ``judged``: the memo above;
    ``tokens``: a value's token count, ``count_value`` when ``None`` (the compressor
    passes its memo of the counts it knows)."""
    items = list(items)
    guard = frozenset(protected)
    kinds = {k: _kind(k, v, guard) for k, v in items}
    return _apply_rule(items, kinds, rule, summarize=summarize, encoding=encoding, judged=judged,
                       tokens=tokens or _counter(encoding))


def _kind(key: str, value: Any, guard: frozenset[str]) -> str | None:
    """An entry's kind; ``None`` for one no rule may touch (protected, compressor records)."""
    return None if key in guard or is_protected_record(key, value) else entry_kind(key, value)


def _apply_rule(items: Sequence[tuple[str, Any]], kinds: Mapping[str, str | None], rule: CompressRule, *,
                summarize: Callable[[str, int], str] | None, encoding: str, judged: Judged | None,
                tokens: Callable[[Any], int]) -> RuleOutcome:
    """``apply_rule`` with the entries' kinds known (``apply_rules`` keeps them from rule to rule)."""
    items = list(items)
    matched: list[int] = []
    for i, (key, _) in enumerate(items):
        kind = kinds[key]
        if kind is not None and _matches(rule, kind, key):
            matched.append(i)
    if rule.action == "count_only":
        return _count_only(items, matched, rule, tokens)
    verbatim = _kept_verbatim(items, kinds)
    if verbatim:
        matched = [i for i in matched if items[i][0] not in verbatim]
    summarize = summarize or SummaryCache(encoding=encoding)
    affected: list[str] = []
    missing: dict[str, tuple[str, ...]] = {}
    for i in matched:
        key, value = items[i]
        slot = (id(rule), key, id(value))
        seen = judged.get(slot) if judged is not None else None
        if seen is not None and seen[0] is rule and seen[1] is value:
            if seen[2]:
                missing[key] = seen[2]
            continue
        miss: tuple[str, ...] = ()
        if rule.action == "extract_keys":
            new, paths = extract_paths(value, rule.extract_keys, encoding=encoding)
            miss = tuple(paths)
            if miss:
                missing[key] = miss
        else:
            new = _summarized(key, value, rule.max_tokens or 100, summarize, encoding)
        # replaced only by fewer tokens (which also means another text: no need to compare them)
        if new is not None and tokens(new) < tokens(value):
            items[i] = (key, new)
            affected.append(key)
            continue
        if judged is not None:
            judged[slot] = (rule, value, miss)
    return RuleOutcome(items=tuple(items), affected=tuple(affected), missing_paths=missing)


def _kept_verbatim(items: Sequence[tuple[str, Any]], kinds: Mapping[str, str | None]) -> set[str]:
    """The entries the counters in ``items`` list as ``kept``: verbatim, as they say, so no other rule
    reduces them (a counter is a compressor record: no rule matched it, its kind is ``None``)."""
    out: set[str] = set()
    for key, value in items:
        if kinds.get(key) is None and key.startswith(_COUNT_PREFIX) and is_protected_record(key, value):
            out.update(k for k in value.get("kept") or () if isinstance(k, str))
    return out


def _summarized(key: str, value: Any, max_tokens: int, summarize: Callable[[str, int], str], encoding: str) -> Any:
    if (isinstance(value, dict) and value.get("_compressed") == "summarize" and isinstance(value.get("summary"), str)
            and count_text(value["summary"], encoding) <= max_tokens):
        return None
    out: dict[str, Any] = {"kind": entry_kind(key, value)}
    if isinstance(value, dict):
        for f in _IDENTITY:
            v = value.get(f)
            if v is not None and not isinstance(v, (dict, list)):
                out[f] = v
    out["_compressed"] = "summarize"
    if count_value(value, encoding) <= count_value({**out, "summary": ""}, encoding):
        # no summary makes it smaller (it is replaced only by fewer tokens): a model is not asked
        # to summarize a status, a flag or a count, each time with the whole request as its prefix
        return None
    text = value_text(value)
    out["summary"] = summarize.entry(key, text, max_tokens) if isinstance(summarize, SummaryCache) \
        else summarize(text, max_tokens)
    return out


def _count_only(items: Items, matched: list[int], rule: CompressRule, tokens: Callable[[Any], int]) -> RuleOutcome:
    keep = matched[len(matched) - rule.keep_last:] if rule.keep_last else []
    kept = set(keep)
    drop = [i for i in matched if i not in kept]
    if not drop:
        return RuleOutcome(items=tuple(items))
    key = count_key(rule.pattern)
    at = next((i for i, (k, _) in enumerate(items) if k == key), None)
    old = items[at][1] if at is not None else None
    if old is not None and not is_protected_record(key, old):
        return RuleOutcome(items=tuple(items))  # the key is taken by something else: leave it
    dropped = (old.get("dropped", 0) if isinstance(old, dict) else 0) + len(drop)
    away = counter_gone(old)
    record: dict[str, Any] = {"kind": "count", "_compressed": "count_only", "pattern": rule.pattern,
                              "count": dropped + len(keep) + sum(map(len, away.values())), "dropped": dropped,
                              **_placed(items[i] for i in keep), **away}
    saved = sum(tokens(items[i][1]) for i in drop)
    grown = tokens(record) - (tokens(old) if old is not None else 0)
    if grown >= saved:
        # never bigger (the module's invariant): the entries stay, and say why
        return RuleOutcome(items=tuple(items), declined={
            "entries": len(drop), "entries_tokens": saved, "counter_tokens": grown,
            "reason": f"count_only rule {rule.pattern!r} made no counter: it would cost {grown} tokens, more than "
                      f"the {len(drop)} entr{'y' if len(drop) == 1 else 'ies'} it replaces ({saved} tokens)"})
    gone = [items[i][0] for i in drop]
    gone_set = set(gone)
    out = [(k, record if k == key else v) for k, v in items if k not in gone_set]
    if at is None:
        out.append((key, record))
    return RuleOutcome(items=tuple(out), affected=(*gone, key))


def apply_rules(items: Iterable[tuple[str, Any]], rules: Sequence[CompressRule], *, protected: Iterable[str] = (),
                summarize: Callable[[str, int], str] | None = None, encoding: str = DEFAULT_ENCODING,
                counts: list[int] | None = None, judged: Judged | None = None,
                tokens: Callable[[Any], int] | None = None,
                declined: dict[int, Mapping[str, Any]] | None = None) -> RuleOutcome:
    """Apply the rules in order, again and again until a pass changes nothing.

    ``counts`` (one slot per rule) gains the number of entries each rule changed; ``declined``
    (rule index -> ``RuleOutcome.declined``) the ``count_only`` rules that, in the last pass,
    made no counter as it would have cost more than it saved;
    ``judged``: a memo of verdicts shared by the calls of one compression (see
    ``apply_rule``), one for this call when ``None``; ``tokens``: as for ``apply_rule``.
    """
    current = tuple(items)
    guard = frozenset(protected)
    summarize = summarize or SummaryCache(encoding=encoding)
    judged = {} if judged is None else judged
    tokens = tokens or _counter(encoding)
    affected: dict[str, None] = {}
    missing: dict[str, tuple[str, ...]] = {}
    kinds = {k: _kind(k, v, guard) for k, v in current}
    for _ in range(MAX_PASSES):
        changed = False
        for n, rule in enumerate(rules):
            out = _apply_rule(current, kinds, rule, summarize=summarize, encoding=encoding, judged=judged,
                              tokens=tokens)
            for k, paths in out.missing_paths.items():
                missing[k] = tuple(dict.fromkeys([*missing.get(k, ()), *paths]))
            if declined is not None:
                if out.declined:
                    declined[n] = out.declined
                else:
                    declined.pop(n, None)
            if out.affected:
                changed = True
                current = out.items
                stale = set(out.affected)
                kinds = {k: kinds[k] if k in kinds and k not in stale else _kind(k, v, guard) for k, v in current}
                for k in out.affected:
                    affected.setdefault(k, None)
                if counts is not None:
                    counts[n] += len(out.affected)
        if not changed:
            break
    return RuleOutcome(items=current, affected=tuple(affected), missing_paths=missing)
