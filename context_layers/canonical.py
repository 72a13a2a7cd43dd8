"""Canonical JSON: the one serialization used for equality, token counts and rendering.

Two notions, kept apart on purpose:

* ``canonical_json(value)`` is the byte-exact text of a value: sorted keys, no
  whitespace, UTF-8 kept as is. ``1`` and ``1.0`` render differently, as JSON does.
* ``canonical_key(value)`` is the text used to decide whether two values are *equal*
  (the three-way merge, "did a branch change this key"). Numbers compare by value
  across int and float (``1 == 1.0``: JSON has one number type and many parsers
  return ``1.0`` for ``1``), but ``True`` is never ``1`` (different JSON types).
  Nested dicts compare regardless of key order; lists compare in order.
"""

from __future__ import annotations

import json
import math
import re
import unicodedata
from collections.abc import Callable, Hashable
from typing import Any, Generic, TypeVar

__all__ = ["canonical_json", "canonical_key", "canonical_text", "json_equal", "thaw", "freeze", "text_problem",
           "key_problem", "FrozenDict", "FrozenList", "MEMO_CHARS", "Memo", "remember_value"]

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


# one encoder for every call: ``json.dumps`` with options builds a new encoder each time,
# which costs more than encoding a small value
_CANONICAL = json.JSONEncoder(sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)


# ... and that encoder's C part, built once too: ``encode`` builds it anew at every call, which
# costs as much as encoding a small value (every write counts the tokens of its value's canonical
# text). It keeps no cycle check: a cycle ends in RecursionError, and ``encode`` then raises the
# ValueError that names it, as before.
_C_MAKE_ENCODER: Any = getattr(json.encoder, "c_make_encoder", None)  # CPython's; None elsewhere
_CANONICAL_C: Any = None if _C_MAKE_ENCODER is None else _C_MAKE_ENCODER(
    None, _CANONICAL.default, json.encoder.encode_basestring, None, ":", ",", True, False, False)


def fast_encode(encoder: json.JSONEncoder) -> Callable[[Any], str]:
    """``encoder.encode`` with its C part built once: ``encode`` builds it anew at every call,
    which costs more than encoding a small value. It keeps no cycle check: a cycle ends in
    RecursionError, and ``encoder.encode`` then raises the ValueError that names it."""
    make: Any = _C_MAKE_ENCODER
    if make is None or encoder.indent is not None:
        return encoder.encode
    strings = json.encoder.encode_basestring_ascii if encoder.ensure_ascii else json.encoder.encode_basestring
    c_encode = make(None, encoder.default, strings, None, encoder.key_separator, encoder.item_separator,
                    encoder.sort_keys, encoder.skipkeys, encoder.allow_nan)

    def encode(value: Any) -> str:
        try:
            return "".join(c_encode(value, 0))
        except RecursionError:
            return encoder.encode(value)

    return encode


def canonical_json(value: Any) -> str:
    if _CANONICAL_C is None:
        return _CANONICAL.encode(value)
    try:
        return "".join(_CANONICAL_C(value, 0))
    except RecursionError:
        return _CANONICAL.encode(value)


def _normalize(value: Any) -> Any:
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return value
    if isinstance(value, float):
        if value.is_integer() and math.isfinite(value):
            return int(value)
        return value
    if isinstance(value, int):
        return value
    if isinstance(value, dict):
        return {k: _normalize(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_normalize(v) for v in value]
    return value


def canonical_key(value: Any) -> str:
    """Text that is equal for two values exactly when they are JSON-equal (see module doc)."""
    return canonical_json(_normalize(value))


def json_equal(a: Any, b: Any) -> bool:
    if a is b:
        return True
    return canonical_key(a) == canonical_key(b)


class FrozenDict(dict):  # type: ignore[type-arg]
    """A dict that refuses mutation: context values are immutable once written.

    It is a real ``dict`` subclass so equality, ``json.dumps`` and ``isinstance``
    work unchanged; ``thaw`` gives a mutable deep copy.
    """

    __slots__ = ()

    def _refuse(self, *args: Any, **kwargs: Any) -> Any:
        raise TypeError("context values are immutable; use thaw(value) for a mutable copy and write it back")

    __setitem__ = __delitem__ = clear = pop = popitem = setdefault = update = _refuse
    __ior__ = _refuse

    def __reduce__(self) -> Any:
        return (FrozenDict, (dict(self),))

    def __copy__(self) -> "FrozenDict":
        return self

    def __deepcopy__(self, memo: Any) -> "FrozenDict":
        return self


class FrozenList(list):  # type: ignore[type-arg]
    """A list that refuses mutation (see ``FrozenDict``)."""

    __slots__ = ()

    def _refuse(self, *args: Any, **kwargs: Any) -> Any:
        raise TypeError("context values are immutable; use thaw(value) for a mutable copy and write it back")

    __setitem__ = __delitem__ = append = extend = insert = pop = remove = clear = sort = reverse = _refuse
    __iadd__ = __imul__ = _refuse

    def __reduce__(self) -> Any:
        return (FrozenList, (list(self),))

    def __copy__(self) -> "FrozenList":
        return self

    def __deepcopy__(self, memo: Any) -> "FrozenList":
        return self


# A Python str may hold surrogate code points, which are not characters: no UTF-8 text (a
# stored record, the CLI's output, a request to a model) can carry them, so they are not JSON.
_SURROGATE = re.compile("[\ud800-\udfff]")


def text_problem(text: str) -> str | None:
    """Why ``text`` cannot be JSON text (it holds a lone surrogate), or None."""
    if text.isascii():  # O(1): CPython keeps the flag
        return None
    found = _SURROGATE.search(text)
    if found is None:
        return None
    return (f"holds the lone surrogate U+{ord(found.group()):04X} at index {found.start()}, which is not "
            "Unicode text: no UTF-8 JSON document can carry it")


#: the prefixes of the keys the engine, the compressor and the retrieval name their records and
#: bookkeeping with (``activity:``, ``_mergedConflicts``, ...): a key that only looks like one of them
#: would be read, by a person or a model, as the engine's own record
RESERVED_LOOKS = ("activity:", "event:", "compaction:", "summary:", "tool:", "kb:", "_")

# Characters of other scripts drawn like the Latin letters, colon and low line of ``RESERVED_LOOKS``
# (from Unicode's confusables.txt, the ones for those glyphs); NFKC already folds the full-width and
# mathematical forms.
_LOOKALIKES = str.maketrans({
    "\u0430": "a", "\u0251": "a", "\u03b1": "a", "\u0185": "b", "\u0441": "c", "\u03f2": "c", "\u1d04": "c",
    "\u0435": "e", "\u04bd": "e", "\u0456": "i", "\u03b9": "i", "\u0131": "i", "\u0269": "i", "\u04cf": "l",
    "\u01c0": "l", "\u043a": "k", "\u03ba": "k", "\u043c": "m", "\u0578": "n", "\u043e": "o", "\u03bf": "o",
    "\u0585": "o", "\u1d0f": "o", "\u0440": "p", "\u03c1": "p", "\u0433": "r", "\u0455": "s", "\ua731": "s",
    "\u0442": "t", "\u03c4": "t", "\u03c5": "u", "\u057d": "u", "\u1d1c": "u", "\u03bd": "v", "\u0475": "v",
    "\u1d20": "v", "\u0443": "y", "\u04af": "y", "\u03b3": "y", "\u02d0": ":", "\ua789": ":", "\u2236": ":",
    "\u0589": ":", "\u05c3": ":", "\u02cd": "_",
})


def key_problem(key: str) -> str | None:
    """Why ``key`` cannot name a context entry, or None.

    Keys are compared exactly, as JSON and the stores compare them, so two spellings of the same
    text must not both be allowed: a key must be in Unicode NFC (else "café" written by one branch
    and "cafe\u0301" by another would be two keys, and a join would see no conflict). And a key
    must not pass for an engine record or bookkeeping key (``activity:``, ``_mergedConflicts``, ...)
    while not being one: letters of another script, compatibility forms or invisible characters
    would show the engine's name in a prompt or a table and hide who wrote it.
    """
    problem = text_problem(key)
    if problem is not None or key.isascii():
        return problem
    nfc = unicodedata.normalize("NFC", key)
    if nfc != key:
        odd = next((ch for ch in key if unicodedata.combining(ch)), key[-1])
        return (f"is not in Unicode NFC form (it composes U+{ord(odd):04X} {unicodedata.name(odd, 'a mark')} "
                "separately), so another spelling of the same text would be another key; write it composed "
                "(unicodedata.normalize('NFC', key))")
    look = "".join(ch for ch in unicodedata.normalize("NFKC", key)
                   if unicodedata.category(ch) != "Cf").translate(_LOOKALIKES)
    for prefix in RESERVED_LOOKS:
        if look.startswith(prefix) and not key.startswith(prefix):
            odd = next((ch for ch in key[:len(prefix) + 8] if not ch.isascii()), key[0])
            return (f"looks like the engine's {prefix!r} keys but is spelt with "
                    f"U+{ord(odd):04X} {unicodedata.name(odd, 'an unnamed character')}: those keys name the "
                    "engine's records and bookkeeping; name the key in plain letters of its own")
    return None


#: how deeply objects and lists may nest in a context value: every walk over a value (freezing,
#: comparing, rendering, storing) recurses once per level, and a deeper one ended the run with a
#: RecursionError traceback instead of an error naming the key
MAX_DEPTH = 200


def freeze(value: Any, _path: str = "", _depth: int = 0) -> Any:
    """Validate a JSON-compatible value and return an immutable copy of it.

    Raises ``ValueError``/``TypeError`` with the path of the offending part; the
    caller adds the context key.
    """
    # Every context write and every tape event freezes its value: the common case (plain
    # JSON types, valid) runs without building the path of each part; only a value that
    # fails is walked again, with paths, for the message.
    try:
        return _freeze_plain(value, _depth)
    except (TypeError, ValueError):
        pass
    return _freeze_at(value, _path, _depth)


def _freeze_plain(value: Any, depth: int = 0) -> Any:
    """``freeze`` for exact JSON types, without paths: raises a bare error on anything else
    (``freeze`` then walks the value again with paths, for the message, or for a subclass
    of a JSON type, which it accepts)."""
    if depth > MAX_DEPTH:
        raise ValueError
    t = type(value)
    if t is str:
        if value.isascii() or _SURROGATE.search(value) is None:
            return value
        raise ValueError
    if t is int or t is bool or value is None:
        return value
    if t is float:
        if math.isfinite(value):
            return value
        raise ValueError
    if t is FrozenDict or t is FrozenList:
        return value
    if t is dict:
        out = {}
        for k, v in value.items():
            if type(k) is not str or not (k.isascii() or _SURROGATE.search(k) is None):
                raise TypeError
            tv = type(v)
            # the scalars a record is mostly made of, without a call each
            out[k] = v if tv is int or tv is bool or v is None or (tv is str and v.isascii()) else _freeze_plain(v, depth + 1)
        return FrozenDict(out)
    if t is list or t is tuple:
        return FrozenList([_freeze_plain(v, depth + 1) for v in value])
    raise TypeError


def _freeze_at(value: Any, _path: str, _depth: int = 0) -> Any:
    if _depth > MAX_DEPTH:
        where = _path if len(_path) <= 60 else _path[:40] + "..."
        raise ValueError(f"{where or 'value'} is nested more than {MAX_DEPTH} objects or lists deep, which layerflow "
                         "does not keep; flatten it, or store the deep part as a JSON string")
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, str):
        problem = text_problem(value)
        if problem is not None:
            raise ValueError(f"{_path or 'value'} {problem}")
        return value
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError(f"{_path or 'value'} is {value!r}, which JSON cannot represent")
        return value
    if isinstance(value, FrozenDict) or isinstance(value, FrozenList):
        return value
    if isinstance(value, dict):
        out = {}
        for k, v in value.items():
            if not isinstance(k, str):
                raise TypeError(f"{_path or 'value'} has a key {k!r} of type {type(k).__name__}; JSON object keys must be str")
            problem = text_problem(k)
            if problem is not None:
                raise ValueError(f"{_path or 'value'} has a key {k!r} that {problem}")
            out[k] = _freeze_at(v, f"{_path}.{k}" if _path else k, _depth + 1)
        return FrozenDict(out)
    if isinstance(value, (list, tuple)):
        return FrozenList(_freeze_at(v, f"{_path}[{i}]", _depth + 1) for i, v in enumerate(value))
    raise TypeError(f"{_path or 'value'} is of type {type(value).__name__}, which is not JSON-compatible")


def thaw(value: Any) -> Any:
    """A mutable deep copy (plain dict / list) of a frozen value."""
    if isinstance(value, dict):
        return {k: thaw(v) for k, v in value.items()}
    if isinstance(value, list):
        return [thaw(v) for v in value]
    return value


MEMO_CHARS = 1 << 22  # characters of keys and values a memory of long texts holds at most (about 4 MB each)


class Memo(dict[K, V], Generic[K, V]):
    """A cache for a pure function: a dict that forgets everything once it holds ``limit``
    entries, or once the characters charged to its entries (``put(..., chars=)``: the length
    of a text key, of a value's repr) would pass ``chars`` (bounded, and cheaper than keeping
    an LRU order on a hot path). A worker runs instance after instance in one process, each
    with texts of its own: bounded by entries alone, a memory of long texts grows to gigabytes."""

    def __init__(self, limit: int, *, chars: int | None = None) -> None:
        super().__init__()
        self.limit = limit
        self.max_chars = chars
        self.chars = 0  # charged to the entries held

    def put(self, key: K, value: V, *, chars: int = 0) -> V:
        if len(self) >= self.limit or (self.max_chars is not None and self.chars + chars > self.max_chars):
            self.clear()
        self[key] = value
        self.chars += chars
        return value

    def clear(self) -> None:
        super().clear()
        self.chars = 0


# canonical_json of frozen objects and lists (context values), by identity: a value's text is made
# when its tokens are counted (every write), and read again by the memories below (attention scores
# after an activity, a join counting the values it merges) without walking the value again. The
# memo holds the value, so its id is not reused while remembered; bounded by entries and characters,
# few of them: what it saves is for the values of the instance running now (the text of an equal value
# of another instance is found by the memories keyed by text).
_TEXTS_BY_ID: "Memo[int, tuple[Any, str]]" = Memo(1 << 12, chars=MEMO_CHARS // 8)
# a long value's text is not kept: walking it again costs little beside what reads it (tokens,
# shingles), and the memories that key by text hold their own bounded copy of it
_TEXT_MEMO_MAX = 1 << 14


def canonical_text(value: Any) -> str:
    """``canonical_json(value)``, remembered for frozen values (``FrozenDict``, ``FrozenList``)."""
    t = type(value)
    if t is not FrozenDict and t is not FrozenList:
        return canonical_json(value)
    hit = _TEXTS_BY_ID.get(id(value))
    if hit is not None and hit[0] is value:
        return hit[1]
    text = canonical_json(value)
    if len(text) <= _TEXT_MEMO_MAX:
        # charged for the text and for the value it holds (about as large)
        _TEXTS_BY_ID.put(id(value), (value, text), chars=2 * len(text))
    return text


def remember_value(by_id: "Memo[tuple[Any, int], tuple[Any, V]]", by_text: "Memo[tuple[Any, str], V]",
                   key: Any, value: Any, compute: Callable[[], V], *, cost: Callable[[V], int] | None = None) -> V:
    """``compute()`` for an immutable context value, remembered by identity (the memo holds
    the value, so its id is not reused while remembered) and by ``key`` and canonical text (an
    equal value built anew: ``canonical_text``, which tells JSON values apart up to the order of
    an object's keys, which the computations remembered here do not depend on). Both memories are
    charged the length of the text (what the value takes, held as an object or as its text) and
    what the result takes: its length when it is a text, else ``cost(result)`` (in bytes, roughly),
    else nothing."""
    hit = by_id.get((key, id(value)))
    if hit is not None and hit[0] is value:
        return hit[1]
    text = (key, canonical_text(value))
    out = by_text.get(text)
    fresh = out is None
    if out is None:
        out = compute()
    charge = len(text[1]) + (len(out) if isinstance(out, str) else cost(out) if cost is not None else 0)
    if fresh:
        by_text.put(text, out, chars=charge)
    by_id.put((key, id(value)), (value, out), chars=charge)
    return out
