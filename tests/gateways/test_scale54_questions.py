"""Round 54, at scale: many branches writing long values to one key at a join.

The person's question (``build_human_request``) and the errors that name every conflict
(``FAIL_ON_CONFLICT``, an answer that picks no option) quote each value briefly: 50 branches of
a 20,000-character text once made a question of a megabyte, each option's label carrying its
value whole. The options' values, the conflicts' records and the answers stay whole.
"""

from __future__ import annotations

from typing import Any

import pytest

from context_layers.config import ActivityExtensionConfig
from context_layers.errors import MergeConflictError
from gateways import MergedConflict
from gateways.conflicts import conflict_error
from gateways.policy import ESCALATE, InvalidAnswerError, build_human_request, match_answer

BRANCHES = 50
LONG = 20_000


def _conflict(n: int = BRANCHES, size: int = LONG) -> MergedConflict:
    values: dict[str, Any] = {f"b{i}": f"option {i} " + "x" * size for i in range(n)}
    return MergedConflict("decision", "none", values, tuple(values))


def test_the_question_of_many_long_values_quotes_each_briefly_and_offers_it_whole() -> None:
    conflict = _conflict()
    request = build_human_request(conflict, gateway_id="join", config=ActivityExtensionConfig())
    assert len(request.message) < BRANCHES * 400 + 1_000
    assert "b49 wants \"option 49 x" in request.message and f"{LONG + 12} characters" in request.message
    branch_options = [o for o in request.options if o["value"] != ESCALATE]
    assert [o["value"] for o in branch_options] == list(conflict.values.values())  # whole
    assert all(len(o["label"]) < 400 for o in request.options)
    assert len({o["label"] for o in request.options}) == len(request.options)  # a label still picks one
    picked = match_answer(request, branch_options[7]["label"])
    assert picked["value"] == conflict.values["b7"]


def test_a_short_value_is_quoted_whole() -> None:
    conflict = _conflict(n=2, size=10)
    request = build_human_request(conflict, gateway_id="join", config=ActivityExtensionConfig())
    assert 'b0 wants "option 0 xxxxxxxxxx"' in request.message
    assert request.options[1]["label"] == '"option 1 xxxxxxxxxx" (from b1)'


def test_an_answer_that_picks_no_option_is_refused_briefly() -> None:
    request = build_human_request(_conflict(), gateway_id="join", config=ActivityExtensionConfig())
    with pytest.raises(InvalidAnswerError) as err:
        match_answer(request, "y" * LONG)
    assert len(str(err.value)) < BRANCHES * 400 + 1_000
    assert "'join/decision'" in str(err.value)


def test_fail_on_conflict_names_every_branch_briefly_and_keeps_the_values_whole() -> None:
    conflict = _conflict()
    err = conflict_error([conflict], gateway_id="join", why="and mergeStrategy is FAIL_ON_CONFLICT")
    assert isinstance(err, MergeConflictError)
    assert len(str(err)) < BRANCHES * 400 + 1_000
    assert all(f"b{i}=" in str(err) for i in range(BRANCHES))
    assert err.conflicts[0]["conflicting_values"]["b3"] == conflict.values["b3"]
