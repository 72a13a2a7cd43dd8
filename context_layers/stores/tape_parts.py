"""How tape events are stored: long lists and strings as content-addressed parts.

An event carries every value it changes whole, and an agent loop that appends to a
list on every pass changes the whole list on every pass (the write, the move into
HISTORY, a join's result). Stored whole, such a tape grows with the square of the
passes. So the stores keep every list or string whose JSON reaches ``PART_BYTES``
(anywhere in an event) cut into parts:

* a list (of at least ``MIN_ITEMS`` items) is cut greedily from its start, a part
  closing once its items' JSON reaches ``PART_BYTES``; a string every ``PART_BYTES``
  characters. Appending never moves an earlier cut: the list of the next pass has the
  same parts, and at most a new one;
* each whole part is stored once per instance, under the sha256 of its JSON, in the
  instance's blobs (beside the snapshot parts, ``split_snapshot``), in the same
  transaction as the events that need it;
* the event keeps the parts' hashes and the open end (``tail``: less than
  ``PART_BYTES``). So that it does not keep one hash per part of a long list, every
  ``FANOUT`` aligned parts of a level make a part of the next (a node: their hashes),
  and the event keeps at most ``FANOUT - 1`` hashes per level.

An event so stores O(log n) bytes for a list of n items (and its tail), not O(n), and
needs no other event to be read (a read from any ``since_seq`` fetches only parts).
Delta chains (an event naming the one it extends) would store less per event, but a
read from a middle ``since_seq`` would have to walk back to a full value, and every
K-th value stored whole would keep the growth quadratic; parts by hash have neither
problem, and the move of a value from WORKING to HISTORY, or a branch's copy, costs
only hashes. A save sends the parts of its long values again (the store keeps the
first copy): what it writes per event is O(n), as before; what stays is O(log n).

Stored forms (JSON)::

    event with nothing long    the event, exactly as Event.to_dict() gives it (as before parts)
    event with parts           {"$parts": 1, "event": <the event, encoded>}   (no "seq": never an event)
    a long list (encoded)      {"$list": [[hash, ...], [tail item, ...]]}
    a long string              {"$str": [[hash, ...], "tail"]}
    a dict of one key that is one of "$list", "$str", "$lit"
                               {"$lit": {key: <value, encoded>}}
    part: list leaf / string leaf / node
                               [item, ...] / "text" / {"$node": [hash, ...]}

A reader decodes the events of one read with one ``PartReader``: a part is decoded once
and its items are shared (frozen, so sharing is safe) by every event that holds them,
and equal encoded values (a write and the move of its value) become one object.
"""

from __future__ import annotations

import hashlib
import json
from bisect import bisect_left
from collections.abc import Callable, Iterable, Mapping
from itertools import accumulate, chain
from typing import Any

from ..canonical import FrozenDict, FrozenList

__all__ = ["PART_BYTES", "FANOUT", "MIN_ITEMS", "WALK_PARTS", "PARTS_FORMAT", "PartWriter", "PartReader", "read_events"]

#: Lists and strings whose JSON reaches this many characters are stored in parts of about this size.
PART_BYTES = 512

#: Parts per node: an event keeps at most FANOUT - 1 hashes per level of the tree.
FANOUT = 4

#: A list of fewer items is never cut (its long items are cut themselves): the small lists
#: that hold a long value (a change, an event's changes) would otherwise make a part of
#: their own at every event.
MIN_ITEMS = 8

#: An event is searched for long values only once its JSON reaches this many parts' worth:
#: a shorter one stores whole at no more than that, and most events of a run (activity
#: records, small writes, joins of small values) are not walked at every save.
WALK_PARTS = 4

#: Version of the stored form above; a reader refuses a higher one.
PARTS_FORMAT = 1

_PARTS, _EVENT = "$parts", "event"
_LIST, _STR, _LIT, _NODE = "$list", "$str", "$lit", "$node"
_MARKS = frozenset((_LIST, _STR, _LIT))

# the stores' encoder (compact, key order kept), built once
_ENCODER = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False, allow_nan=False)
_dumps = _ENCODER.encode


def _refuse(value: Any) -> Any:
    raise TypeError(f"{type(value).__name__} is not JSON-compatible")


# The same encoding for the items of a list that may be cut, one call each: ``encode``
# builds its C encoder anew at every call, which costs more than a small item. Items
# reach it only once their event encoded whole (no cycle, nothing but JSON), so it
# keeps no cycle check.
_C_ENCODER: Any = getattr(json.encoder, "c_make_encoder", None)  # CPython's; None elsewhere
_item_encoder = None if _C_ENCODER is None else _C_ENCODER(
    None, _refuse, json.encoder.encode_basestring, None, ":", ",", False, False, False)


def _item_text(value: Any) -> str:
    return _dumps(value) if _item_encoder is None else "".join(_item_encoder(value, 0))


class PartWriter:
    """Encodes the events of one write; ``parts`` collects the parts they need (hash -> JSON).

    ``part_bytes=None`` stores every value whole (the form before parts)."""

    def __init__(self, part_bytes: int | None = PART_BYTES) -> None:
        self.parts: dict[str, str] = {}
        self._limit = part_bytes
        self._cut = False

    def text(self, event: Mapping[str, Any]) -> str:
        """The stored JSON text of ``event`` (raises TypeError / ValueError when it is not JSON)."""
        try:
            # the encoder built once (an event of a save costs little more than building one);
            # it keeps no cycle check, so a cycle ends in RecursionError: encoded again the
            # usual way, it raises the ValueError that names it
            text = _item_text(event)
        except RecursionError:
            text = _dumps(event)
        if self._limit is None or len(text) < self._limit * WALK_PARTS:
            return text  # nothing in it is long enough to be worth parts
        self._cut = False
        encoded = self._encode(event, self._limit)
        if not self._cut:
            return text
        return _dumps({_PARTS: PARTS_FORMAT, _EVENT: encoded})

    def _encode(self, value: Any, limit: int) -> Any:
        """``value`` encoded: long lists and strings cut into parts, dicts that look like a mark
        escaped. Only the items of a list that may be cut are encoded to JSON here (once each):
        the dicts and short lists above a long value (the event, its changes, a change) are
        walked, not encoded again at every level."""
        if isinstance(value, str):
            if len(value) < limit:
                return value
            whole = len(value) - len(value) % limit
            leaves = [_dumps(value[i:i + limit]) for i in range(0, whole, limit)]
            self._cut = True
            return {_STR: [self._tree(leaves), value[whole:]]}
        if isinstance(value, Mapping):
            node = {k: self._encode(v, limit) for k, v in value.items()}
            if len(node) == 1 and next(iter(node)) in _MARKS:
                return {_LIT: node}
            return node
        if isinstance(value, (list, tuple)):
            if len(value) < MIN_ITEMS:
                return [self._encode(v, limit) for v in value]
            items = list(value)
            texts = list(map(_item_text, items))
            if max(map(len, texts)) >= limit or '"$' in "".join(texts):
                for i, t in enumerate(texts):
                    if len(t) >= limit or '"$' in t:  # may hold a long value or a mark (every mark starts with "$)
                        items[i] = self._encode(items[i], limit)
                        texts[i] = _dumps(items[i])
            # ends[i]: the JSON length of items[:i + 1], a comma each; a part closes at the first
            # item that takes it to ``limit`` since the last close
            ends = list(accumulate(len(t) + 1 for t in texts))
            leaves, start = [], 0
            while True:
                i = bisect_left(ends, (ends[start - 1] if start else 0) + limit, start)
                if i == len(ends):
                    break
                leaves.append("[" + ",".join(texts[start:i + 1]) + "]")
                start = i + 1
            if not leaves:
                return items
            self._cut = True
            return {_LIST: [self._tree(leaves), items[start:]]}
        return value

    def _tree(self, leaves: list[str]) -> list[str]:
        """The hashes an event keeps for these leaf parts, in order: the nodes of the highest
        level first, then what is left over of each level below (fewer than FANOUT each)."""
        hashes = [self._put(t) for t in leaves]
        left_over: list[list[str]] = []
        while len(hashes) >= FANOUT:
            full = len(hashes) - len(hashes) % FANOUT
            left_over.append(hashes[full:])
            hashes = [self._put(_dumps({_NODE: hashes[i:i + FANOUT]})) for i in range(0, full, FANOUT)]
        return [*hashes, *chain.from_iterable(reversed(left_over))]

    def _put(self, text: str) -> str:
        digest = hashlib.sha256(text.encode()).hexdigest()
        self.parts[digest] = text
        return digest


Fetch = Callable[[Iterable[str]], Mapping[str, str]]


def fetch_parts(fetch: Fetch, wanted: set[str], named: Callable[[Any, set[str]], None], docs: dict[str, Any],
                what: str) -> None:
    """Fetch the parts ``wanted`` and every part they name (``named(doc, out)`` adds the hashes a
    parsed part names), one round trip per level, into ``docs`` (hash -> parsed part). Tape parts
    and snapshot parts alike; a part that is not there means a damaged store."""
    while wanted:
        got = fetch(sorted(wanted))
        missing = wanted - set(got)
        if missing:
            from .base import StoreError  # base imports this module

            raise StoreError(f"{what} refers to {len(missing)} missing part(s) ({sorted(missing)[0]}...); "
                             "the store is damaged: restore it from a backup")
        wanted = set()
        for digest, text in got.items():
            docs[digest] = doc = json.loads(text)
            named(doc, wanted)
        wanted -= set(docs)


class PartReader:
    """Decodes stored events, fetching the parts they name with ``fetch(hashes)`` (one
    round trip per level of parts). Parts and equal values decoded once are shared."""

    def __init__(self, fetch: Fetch, what: str) -> None:
        self._fetch = fetch
        self._what = what
        self._docs: dict[str, Any] = {}          # hash -> the part's JSON, parsed
        self._segments: dict[str, Any] = {}      # hash -> its items (a tuple) or its text
        self._values: dict[tuple[str, str], Any] = {}  # an encoded long value -> its decoded value

    def events(self, texts: Iterable[str]) -> list[dict[str, Any]]:
        docs: list[Any] = [json.loads(t) for t in texts]
        encoded = [i for i, d in enumerate(docs) if isinstance(d, dict) and "seq" not in d and _PARTS in d]
        if not encoded:
            return docs
        wanted: set[str] = set()
        for i in encoded:
            found = docs[i][_PARTS]
            if not isinstance(found, int) or found > PARTS_FORMAT:
                from .base import StoreFormatError  # base imports this module

                raise StoreFormatError(f"{self._what} holds an event stored in parts format {found!r}; this "
                                       f"layerflow reads parts format {PARTS_FORMAT}. Upgrade layerflow to read it")
            _hashes_in(docs[i][_EVENT], wanted)
        self._load(wanted)
        for i in encoded:
            docs[i] = dict(self._value(docs[i][_EVENT]))
        return docs

    def _load(self, wanted: set[str]) -> None:
        def named(doc: Any, out: set[str]) -> None:
            if isinstance(doc, dict):
                out.update(doc[_NODE])
            elif isinstance(doc, list):
                _hashes_in(doc, out)

        fetch_parts(self._fetch, wanted, named, self._docs, self._what)

    def _value(self, node: Any) -> Any:
        if isinstance(node, dict):
            if len(node) == 1:
                mark, body = next(iter(node.items()))
                if mark in (_LIST, _STR):
                    key = (mark, _dumps(body))
                    value = self._values.get(key)
                    if value is None:
                        value = self._values[key] = self._long(mark, body)
                    return value
                if mark == _LIT:
                    return FrozenDict({k: self._value(v) for k, v in body.items()})
            return FrozenDict({k: self._value(v) for k, v in node.items()})
        if isinstance(node, list):
            return FrozenList(self._value(v) for v in node)
        return node

    def _long(self, mark: str, body: list[Any]) -> Any:
        hashes, tail = body
        segments = [self._segment(h) for h in hashes]
        if mark == _STR:
            return "".join([*segments, tail])
        return FrozenList(chain(chain.from_iterable(segments), (self._value(v) for v in tail)))

    def _segment(self, digest: str) -> Any:
        seg = self._segments.get(digest)
        if seg is None:
            doc = self._docs[digest]
            if isinstance(doc, dict):
                children = [self._segment(h) for h in doc[_NODE]]
                seg = "".join(children) if isinstance(children[0], str) else tuple(chain.from_iterable(children))
            elif isinstance(doc, list):
                seg = tuple(self._value(v) for v in doc)
            else:
                seg = doc
            self._segments[digest] = seg
        return seg


def _hashes_in(node: Any, out: set[str]) -> None:
    """Add the hashes that the encoded value ``node`` names directly (its tails included)."""
    if isinstance(node, dict):
        if len(node) == 1:
            mark, body = next(iter(node.items()))
            if mark in (_LIST, _STR):
                out.update(body[0])
                if mark == _LIST:
                    _hashes_in(body[1], out)
                return
            if mark == _LIT:
                node = body
        for v in node.values():
            _hashes_in(v, out)
    elif isinstance(node, list):
        for v in node:
            _hashes_in(v, out)


def read_events(texts: Iterable[str], fetch: Fetch, what: str) -> list[dict[str, Any]]:
    """The events these stored texts hold, whole (see the module doc)."""
    return PartReader(fetch, what).events(texts)
