"""Near-duplicate detection for the redundancy score and the compressor.

An entry's *words* are the lower-cased ``\\w+`` runs of its value's leaves (strings,
numbers, booleans; object fields in sorted order, their names left out so that two
values of one schema are not alike for sharing it; the metadata fields ``kind`` and
``_compressed`` left out). A value of fewer than ``SHINGLE_WORDS`` words is prefixed
with its key's words, so ``amount: 50000`` and ``limit: 50000`` differ while the
same log line under ``log:1`` and ``log:2`` is one near-duplicate. Its *shingles* are the hashed runs of
``SHINGLE_WORDS`` consecutive words (one shingle of all words when there are fewer);
only the first ``MAX_WORDS`` words count. Two entries are *near-duplicates* when the
Jaccard similarity of their shingle sets is at least ``NEAR_DUP_JACCARD``.

``near_duplicate_clusters`` groups entries into connected components of the
near-duplicate graph (so A~B and B~C put A, B and C together):

* up to ``EXACT_LIMIT`` distinct shingle sets it compares every pair: exact;
* above, it uses MinHash with locality-sensitive hashing: one-permutation MinHash
  (``NUM_BINS`` bins, rotation densification) cut into bands of ``BAND_ROWS`` rows;
  entries sharing a band are candidates, and every candidate pair is verified with
  the exact Jaccard, so there are no false positives. What is approximate: a
  near-duplicate pair can be missed when no band matches (probability
  ``(1 - J**BAND_ROWS) ** (NUM_BINS / BAND_ROWS)``, about 2e-4 at J = 0.8), and in a
  bucket of more than ``BUCKET_WINDOW`` members each member is compared with the
  ``BUCKET_WINDOW`` members before it only. Entries with identical shingle sets are
  grouped exactly beforehand, so mass repetition costs O(n).

Work grows near-linearly with the number of entries and their words. Hashes are
BLAKE2b, so results do not depend on ``PYTHONHASHSEED``.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from .canonical import MEMO_CHARS, FrozenDict, FrozenList, Memo, remember_value

__all__ = [
    "EXACT_LIMIT",
    "NEAR_DUP_JACCARD",
    "Clusters",
    "entry_shingles",
    "entry_words",
    "jaccard",
    "near_duplicate_clusters",
    "shingles",
    "word_sets",
]

SHINGLE_WORDS = 3
MAX_WORDS = 1000
NEAR_DUP_JACCARD = 0.8
EXACT_LIMIT = 200
NUM_BINS = 64
BAND_ROWS = 4
BUCKET_WINDOW = 8
META_FIELDS = frozenset({"kind", "_compressed"})

_WORD = re.compile(r"\w+")
_MASK64 = (1 << 64) - 1
_BIN_BITS = NUM_BINS.bit_length() - 1


def _leaves(value: Any, out: list[str]) -> None:
    if isinstance(value, dict):
        for k in sorted(value):
            if k not in META_FIELDS:
                _leaves(value[k], out)
    elif isinstance(value, list):
        for v in value:
            _leaves(v, out)
    elif value is not None:
        out.append(str(value).lower() if not isinstance(value, bool) else ("true" if value else "false"))


def entry_words(key: str, value: Any) -> list[str]:
    """The words of an entry (see the module doc)."""
    parts: list[str] = []
    _leaves(value, parts)
    words: list[str] = []
    for part in parts:
        words.extend(_WORD.findall(part))
        if len(words) >= MAX_WORDS:
            return words[:MAX_WORDS]
    if len(words) < SHINGLE_WORDS:
        words = _WORD.findall(key.lower()) + words
    return words


def _h(text: str) -> int:
    return int.from_bytes(hashlib.blake2b(text.encode("utf-8"), digest_size=8).digest(), "little")


def shingles(words: Sequence[str]) -> frozenset[int]:
    """Hashed ``SHINGLE_WORDS``-word shingles; one shingle of all words when fewer; empty for none."""
    if not words:
        return frozenset()
    if len(words) < SHINGLE_WORDS:
        return frozenset((_h(" ".join(words)),))
    # _h inlined: a long entry has a thousand shingles
    blake, from_bytes, join = hashlib.blake2b, int.from_bytes, " ".join
    grams = zip(*(words[i:] for i in range(SHINGLE_WORDS)))
    return frozenset(from_bytes(blake(join(g).encode("utf-8"), digest_size=8).digest(), "little") for g in grams)


def jaccard(a: frozenset[int], b: frozenset[int]) -> float:
    if not a and not b:
        return 0.0
    inter = len(a & b)
    return inter / (len(a) + len(b) - inter)


@dataclass(frozen=True)
class Clusters:
    """Connected components of the near-duplicate graph over the given sets.

    ``labels[i]`` is the cluster of set ``i`` (the index of its first member), ``None``
    for an empty set (no words: never a duplicate). ``pairs`` counts the near-duplicate
    pairs found (exact below ``EXACT_LIMIT``; verified candidates above).
    """

    labels: tuple[int | None, ...]
    pairs: int
    exact: bool

    @property
    def counted(self) -> int:
        """Entries that have words (the ones that can be duplicates)."""
        return sum(1 for x in self.labels if x is not None)

    @property
    def clusters(self) -> int:
        return len({x for x in self.labels if x is not None})

    @property
    def redundant(self) -> int:
        """Entries beyond the first of their cluster."""
        return self.counted - self.clusters


class _UnionFind:
    def __init__(self, n: int) -> None:
        self.parent = list(range(n))

    def find(self, i: int) -> int:
        parent = self.parent
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    def union(self, a: int, b: int) -> None:
        ra, rb = self.find(a), self.find(b)
        if ra != rb:
            if ra < rb:
                self.parent[rb] = ra
            else:
                self.parent[ra] = rb


def _signature(s: frozenset[int]) -> tuple[int, ...]:
    """One-permutation MinHash with rotation densification (empty bins borrow the next
    non-empty bin's value, offset by the distance, so equal sets stay equal)."""
    bins: list[int | None] = [None] * NUM_BINS
    for h in s:
        b = h & (NUM_BINS - 1)
        v = h >> _BIN_BITS
        cur = bins[b]
        if cur is None or v < cur:
            bins[b] = v
    out = [0] * NUM_BINS
    for i in range(NUM_BINS):
        for d in range(NUM_BINS):
            found = bins[(i + d) % NUM_BINS]
            if found is not None:
                out[i] = (found + d * 0x9E3779B97F4A7C15) & _MASK64
                break
    return tuple(out)


# (sets, threshold, exact_limit) -> Clusters: a pure function of immutable sets, and the
# same sets are clustered again and again (a context is scored before a compression
# and by ``evaluate`` after it, the console scores what ``detect`` scored; the shingle
# caches hand every instance of a process the same set objects). Bounded by entries and by the
# bytes of the shingles its keys hold (a long text has one per word): cleared when full.
SHINGLE_BYTES = 100  # what one shingle takes in a frozenset, about: the int and its slot of the table
_CLUSTERS: Memo[tuple[tuple[frozenset[int], ...], float, int], Clusters] = Memo(1 << 8, chars=MEMO_CHARS)


def near_duplicate_clusters(sets: Sequence[frozenset[int]], threshold: float = NEAR_DUP_JACCARD,
                            *, exact_limit: int = EXACT_LIMIT) -> Clusters:
    """Cluster shingle sets by near-duplication (see the module doc for what is approximate)."""
    slot = (tuple(sets), threshold, exact_limit)
    clusters = _CLUSTERS.get(slot)
    if clusters is None:
        clusters = _CLUSTERS.put(slot, _clusters(slot[0], threshold, exact_limit),
                                 chars=SHINGLE_BYTES * sum(map(len, slot[0])))
    return clusters


def _clusters(sets: Sequence[frozenset[int]], threshold: float, exact_limit: int) -> Clusters:
    n = len(sets)
    uf = _UnionFind(n)
    groups: dict[frozenset[int], list[int]] = {}
    for i, s in enumerate(sets):
        if s:
            groups.setdefault(s, []).append(i)
    pairs = 0
    reps: list[int] = []
    weight: dict[int, int] = {}
    for members in groups.values():
        first = members[0]
        for m in members[1:]:
            uf.union(first, m)
        pairs += len(members) * (len(members) - 1) // 2
        reps.append(first)
        weight[first] = len(members)

    def check(i: int, j: int) -> None:
        nonlocal pairs
        a, b = sets[i], sets[j]
        small, large = (len(a), len(b)) if len(a) <= len(b) else (len(b), len(a))
        if small < threshold * large:  # Jaccard <= small/large: cannot reach the threshold
            return
        if jaccard(a, b) >= threshold:
            pairs += weight[i] * weight[j]
            uf.union(i, j)

    exact = len(reps) <= exact_limit
    if exact:
        reps.sort(key=lambda i: len(sets[i]))
        # check() inlined: this loop runs after every activity
        for x, i in enumerate(reps):
            a = sets[i]
            size_a = len(a)
            for j in reps[x + 1:]:
                b = sets[j]
                size_b = len(b)
                if size_a < threshold * size_b:
                    break  # sorted by size: every later set is larger still
                common = len(a & b)
                if common / (size_a + size_b - common) >= threshold:  # jaccard(a, b); neither is empty
                    pairs += weight[i] * weight[j]
                    uf.union(i, j)
    else:
        bands = NUM_BINS // BAND_ROWS
        buckets: dict[tuple[int, tuple[int, ...]], list[int]] = {}
        for i in sorted(reps):
            sig = _signature(sets[i])
            for band in range(bands):
                buckets.setdefault((band, sig[band * BAND_ROWS:(band + 1) * BAND_ROWS]), []).append(i)
        seen: set[tuple[int, int]] = set()
        for members in buckets.values():
            if len(members) < 2:
                continue
            for x in range(1, len(members)):
                j = members[x]
                for i in members[max(0, x - BUCKET_WINDOW):x]:
                    if (i, j) not in seen:
                        seen.add((i, j))
                        check(i, j)
    labels: list[int | None] = [None] * n
    for i, s in enumerate(sets):
        if s:
            labels[i] = uf.find(i)
    return Clusters(labels=tuple(labels), pairs=pairs, exact=exact)


# Two memories of entry_shingles for immutable values (context values), both bounded
# by entries and by the characters of the values' canonical texts (cleared when full):
# * (key, id(value)) -> (value, shingles): HISTORY keeps the same objects from one
#   activity to the next, so the score after every activity hashes only the new
#   entries. The entry holds the value itself: while it is cached its id cannot be
#   reused by another object.
# * (key, canonical text) -> shingles: every instance of a process writes equal values
#   (the same tool results, the same records) as new objects. The text tells equal
#   values from unequal ones (up to key order, which words are read in sorted anyway),
#   and was made when the value's tokens were counted (``canonical_text``).
_IMMUTABLE = frozenset({str, int, float, bool, type(None), FrozenDict, FrozenList})
_SHINGLES_BY_ID: Memo[tuple[Any, int], tuple[Any, frozenset[int]]] = Memo(1 << 15, chars=MEMO_CHARS)
_SHINGLES_BY_TEXT: Memo[tuple[Any, str], frozenset[int]] = Memo(1 << 12, chars=MEMO_CHARS)


def entry_shingles(key: str, value: Any) -> frozenset[int]:
    """``shingles(entry_words(key, value))``, remembered for immutable values (see above)."""
    if type(value) not in _IMMUTABLE:
        return shingles(entry_words(key, value))
    return remember_value(_SHINGLES_BY_ID, _SHINGLES_BY_TEXT, key, value, lambda: shingles(entry_words(key, value)),
                          cost=_set_bytes)


def _set_bytes(found: frozenset[int]) -> int:
    """About what a set of shingles takes (an int and a slot of the set's table each)."""
    return SHINGLE_BYTES * len(found)


def word_sets(entries: Iterable[tuple[str, Any]]) -> list[frozenset[int]]:
    return [entry_shingles(k, v) for k, v in entries]
