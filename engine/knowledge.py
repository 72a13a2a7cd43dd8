"""KNOWLEDGE (L2) retrieval: a ``Retriever`` protocol and an embedded BM25 default.

The default reads the documents shipped beside a process,
``<process folder>/knowledge/<collection>/*.md`` (and ``*.txt``), split into passages
at blank lines and headings. Passages are ranked by BM25; each hit's ``confidence`` is
the share of the query's information (IDF-weighted query terms the collection uses at
all) that the passage contains, in [0, 1]: 1.0 when every such query term appears in
it, whatever its length or the size of the collection. Hits under the activity's
``confidenceThreshold`` are dropped by the engine.

Deterministic: same documents and query, same hits in the same order.
"""

from __future__ import annotations

import math
import re
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

__all__ = ["Hit", "Retriever", "BM25Retriever", "tokenize"]

_WORD = re.compile(r"[0-9a-z\u00c0-\u024f\u4e00-\u9fff]+")
_STOP = frozenset(
    "a an and are as at be by for from has have if in is it its of on or that the this to was were will with "
    "not no than then which who when where what".split())


def _stem(word: str) -> str:
    """A few English suffixes, enough for "industries" to find "industry" and
    "blacklisted" to find "blacklist"."""
    if len(word) > 4 and word.endswith("ies"):
        return word[:-3] + "y"
    for suffix in ("ing", "ed"):
        if len(word) > len(suffix) + 3 and word.endswith(suffix):
            return word[: -len(suffix)]
    if len(word) > 3 and word.endswith("s") and not word.endswith("ss"):
        return word[:-1]
    return word


def tokenize(text: str) -> list[str]:
    return [_stem(w) for w in _WORD.findall(text.lower()) if w not in _STOP and len(w) > 1]


@dataclass(frozen=True)
class Hit:
    collection: str
    source: str          # file path relative to the knowledge folder, with the passage number
    text: str
    score: float         # raw BM25
    confidence: float    # in [0, 1]

    @property
    def key(self) -> str:
        return f"kb:{self.source}"

    def to_value(self) -> dict[str, object]:
        return {"kind": "knowledge", "collection": self.collection, "source": self.source,
                "confidence": round(self.confidence, 4), "text": self.text}


class Retriever(Protocol):
    def retrieve(self, collection: str, query: str, *, top_k: int = 3) -> list[Hit]: ...


@dataclass
class _Passage:
    source: str
    text: str
    terms: Counter[str]
    length: int


class _Collection:
    def __init__(self, name: str, passages: list[_Passage]) -> None:
        self.name = name
        self.passages = passages
        self.avg_len = (sum(p.length for p in passages) / len(passages)) if passages else 0.0
        df: Counter[str] = Counter()
        for p in passages:
            df.update(p.terms.keys())
        n = len(passages)
        self.idf = {t: math.log(1 + (n - d + 0.5) / (d + 0.5)) for t, d in df.items()}


# resolved collection folder -> (signature of its files, index)
_INDEXES: dict[str, tuple[tuple[tuple[str, int, int], ...], "_Collection"]] = {}


class BM25Retriever:
    """BM25 over passages of ``root/<collection>/*.md|*.txt`` (collections load lazily)."""

    k1 = 1.5
    b = 0.75

    #: how long a collection read stands before its folder is looked at again (an Engine keeps its
    #: retriever while it runs: a document added or edited is seen within this time)
    recheck_seconds = 1.0

    def __init__(self, root: str | Path | None) -> None:
        self.root = Path(root) if root is not None else None
        self._collections: dict[str, _Collection] = {}
        self._read_at: dict[str, float] = {}
        self._present: dict[str, bool] = {}  # whether the collection's folder was there at the last read

    def collections(self) -> list[str]:
        if self.root is None or not self.root.is_dir():
            return []
        return sorted(p.name for p in self.root.iterdir() if p.is_dir())

    def has_collection(self, name: str) -> bool:
        """Whether collection ``name`` (a folder name) is a folder of the root, as the last read of it
        found (``name in collections()`` without listing the root at every retrieval)."""
        if type(self).collections is not BM25Retriever.collections:
            return name in self.collections()  # a retriever of the application's own lists its collections
        self._load(name)
        return self._present.get(name, False)

    def _load(self, name: str) -> _Collection:
        # an Engine keeps its retriever as long as it runs, and a folder added or a document
        # edited since must be read again (the shared index below is reused while the files'
        # names, sizes and times are the same); listing the folder costs more than a search of
        # a small collection, so a read stands for ``recheck_seconds``
        now = time.monotonic()
        known = self._collections.get(name)
        if known is not None and now - self._read_at.get(name, -math.inf) < self.recheck_seconds:
            return known
        self._read_at[name] = now
        folder = self.root / name if self.root is not None else None
        present = self._present[name] = folder is not None and folder.is_dir()
        files = sorted([*folder.glob("*.md"), *folder.glob("*.txt")]) if folder is not None and present else []
        # Indexes are shared by every retriever of this Python process (a new Engine does
        # not tokenize the documents again) while the files are the same: same names,
        # sizes and modification times.
        signature = tuple((p.name, st.st_size, st.st_mtime_ns) for p in files for st in (p.stat(),))
        where = str(folder.resolve()) if folder is not None else ""
        shared = _INDEXES.get(where)
        if shared is not None and shared[0] == signature and shared[1].name == name:
            coll = shared[1]
        else:
            passages: list[_Passage] = []
            for path in files:
                for i, text in enumerate(_split_passages(path.read_text(encoding="utf-8-sig")), start=1):
                    terms = tokenize(text)
                    if terms:
                        passages.append(_Passage(f"{name}/{path.name}#{i}", text, Counter(terms), len(terms)))
            coll = _Collection(name, passages)
            if folder is not None:
                _INDEXES[where] = (signature, coll)
        self._collections[name] = coll
        return coll

    def retrieve(self, collection: str, query: str, *, top_k: int = 3) -> list[Hit]:
        coll = self._load(collection)
        q_terms = list(dict.fromkeys(tokenize(query)))
        if not coll.passages or not q_terms:
            return []
        # Terms the collection never uses carry no information about its passages.
        total_info = sum(coll.idf[t] for t in q_terms if t in coll.idf)
        if total_info <= 0:
            return []
        scored: list[tuple[float, float, int, _Passage]] = []
        for idx, p in enumerate(coll.passages):
            score = 0.0
            covered = 0.0
            for t in q_terms:
                tf = p.terms.get(t)
                if not tf:
                    continue
                idf = coll.idf[t]
                covered += idf
                norm = tf + self.k1 * (1 - self.b + self.b * p.length / (coll.avg_len or 1))
                score += idf * tf * (self.k1 + 1) / norm
            if score > 0:
                scored.append((score, covered / total_info, idx, p))
        scored.sort(key=lambda s: (-s[0], s[2]))
        return [Hit(collection, p.source, p.text, round(score, 6), min(1.0, conf))
                for score, conf, _, p in scored[:top_k]]


def _split_passages(text: str) -> Sequence[str]:
    """Passages: a heading starts a new one, blank lines separate paragraphs; a heading
    stays with the paragraph under it so a hit keeps its title."""
    passages: list[str] = []
    heading = ""
    for block in re.split(r"\n\s*\n", text):
        block = block.strip()
        if not block:
            continue
        lines = block.splitlines()
        if all(line.lstrip().startswith("#") for line in lines):
            heading = " ".join(line.lstrip("# ").strip() for line in lines)
            continue
        if lines[0].lstrip().startswith("#"):
            heading = lines[0].lstrip("# ").strip()
            body = "\n".join(lines[1:]).strip()
        else:
            body = block
        passages.append(f"{heading}: {body}" if heading else body)
    return passages
