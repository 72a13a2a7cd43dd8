"""The process-wide memories of pure functions (token counts, shingles, clusters, tool marks, summaries)
stay bounded by what they hold, not only by how many entries.

A worker runs instance after instance in one process; every instance brings values of its own
(an application, a model's answer), so every memory keeps meeting new texts. Bounded by entries
alone, a memory of 65,536 token counts keyed by their text holds gigabytes once the texts are long
model outputs. Each memory is bounded by the characters it holds too, and clears when full.
"""

from __future__ import annotations

import gc
import tracemalloc
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from context_layers import freeze
from context_layers.attention import classify_tool_entries
from context_layers.canonical import Memo
from context_layers.similarity import entry_shingles, near_duplicate_clusters
from context_layers.summarize import ExtractiveSummarizer
from context_layers.tokens import count_text, count_value

TEXT_CHARS = 250_000   # one long value: a model's answer, a document
FED = 40               # distinct ones: 10 M characters in all
HELD_BYTES = 7 << 20   # what any one memory may keep of them (its bound is 4 M characters)


def _long(i: int) -> str:
    return f"value {i}: " + "the applicant runs a bakery " * (TEXT_CHARS // 28)


def _feed_counts(i: int) -> None:
    count_text(_long(i))


def _feed_values(i: int) -> None:
    count_value(freeze({"id": i, "text": _long(i)}))


def _feed_shingles(i: int) -> None:
    entry_shingles("notes", freeze({"id": i, "text": _long(i)}))


def _feed_clusters(i: int) -> None:
    near_duplicate_clusters([frozenset(range(i * 20_000, (i + 1) * 20_000))])  # a long text's shingles


def _feed_tool_marks(i: int) -> None:
    classify_tool_entries([("tool:1", freeze({"kind": "tool_call_result", "tool": "bureau", "raw": _long(i)}))])


class _FirstWords(ExtractiveSummarizer):
    """The memory is the base class's; the summary itself need not cost anything here."""

    def _summarize(self, text: str, max_tokens: int) -> str:
        return text[:max_tokens]


def _feed_summaries(i: int) -> None:
    _FirstWords().summarize(_long(i), 50)


@pytest.fixture
def traced(request: pytest.FixtureRequest) -> Iterator[Callable[[], int]]:
    request.getfixturevalue("feed")(-1)  # what loads once (the token encoding) is not the memory's
    gc.collect()
    tracemalloc.start()
    start = tracemalloc.get_traced_memory()[0]

    def held() -> int:
        gc.collect()
        return tracemalloc.get_traced_memory()[0] - start

    try:
        yield held
    finally:
        tracemalloc.stop()


@pytest.mark.parametrize("feed", [_feed_counts, _feed_values, _feed_shingles, _feed_clusters, _feed_tool_marks, _feed_summaries],
                         ids=lambda f: f.__name__[len("_feed_"):])
def test_a_memory_fed_many_long_distinct_values_keeps_a_bounded_part_of_them(traced: Callable[[], int],
                                                                          feed: Callable[[int], None]) -> None:
    for i in range(FED):
        feed(i)
    held = traced()
    assert held < HELD_BYTES, f"{held / 2**20:.1f} MiB kept of {FED * TEXT_CHARS / 2**20:.0f} MiB of values fed"


def test_memo_clears_once_its_characters_would_pass_its_bound() -> None:
    memo: Memo[int, Any] = Memo(100, chars=10)
    memo.put(1, "a", chars=4)
    memo.put(2, "b", chars=4)
    assert set(memo) == {1, 2} and memo.chars == 8
    memo.put(3, "c", chars=4)  # 12 > 10: the older ones go
    assert set(memo) == {3} and memo.chars == 4
    memo.put(4, "d", chars=50)  # alone over the bound: kept alone, and gone with the next
    assert set(memo) == {4}
    memo.put(5, "e")
    assert set(memo) == {5} and memo.chars == 0
    memo.clear()
    assert not memo and memo.chars == 0
    counted: Memo[int, int] = Memo(3)
    for i in range(10):
        assert counted.put(i, i) == i and len(counted) <= 3
