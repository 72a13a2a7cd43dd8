"""MergedConflict read the way the seed writes it: ``conflictingValues`` a list of the distinct
values, ``sourceBranches`` a list of names, ``resolution`` null until resolved; the Python names
keep their branch -> value mapping too."""

from __future__ import annotations

from typing import Any

import pytest

from gateways import DELETED, ConflictDetector, MergedConflict

BASE = {"approval_status": "pending", "amount": 120000}
BRANCHES = {"branch_finance": {**BASE, "approval_status": "approved"},
            "branch_risk": {**BASE, "approval_status": "rejected"},
            "branch_compliance": {**BASE, "approval_status": "rejected"}}


@pytest.fixture()
def conflict() -> MergedConflict:
    [c] = ConflictDetector().detect_conflicts(BASE, BRANCHES)
    return c


CHECKS: list[tuple[str, Any]] = [
    ("values as the seed's list", lambda c: c.conflicting_values == ["approved", "rejected"]),
    ("values as a tuple", lambda c: c.conflicting_values == ("approved", "rejected")),
    ("a value is in it", lambda c: "approved" in c.conflicting_values and "rejected" in c.conflicting_values),
    ("a value that is not", lambda c: "pending" not in c.conflicting_values),
    ("branch -> value", lambda c: c.conflicting_values["branch_finance"] == "approved"),
    ("the mapping", lambda c: c.conflicting_values == {"branch_finance": "approved", "branch_risk": "rejected",
                                                       "branch_compliance": "rejected"}),
    ("a wrong list", lambda c: c.conflicting_values != ["rejected", "approved"]),
    ("branches as a list", lambda c: c.source_branches == ["branch_finance", "branch_risk", "branch_compliance"]),
    ("branches as a tuple", lambda c: c.source_branches == ("branch_finance", "branch_risk", "branch_compliance")),
    ("seed names", lambda c: (c.baseValue, c.conflictingValues, c.sourceBranches) == (
        "pending", ["approved", "rejected"], ["branch_finance", "branch_risk", "branch_compliance"])),
    ("branch values", lambda c: c.values == {"branch_finance": "approved", "branch_risk": "rejected",
                                             "branch_compliance": "rejected"}),
    ("unresolved", lambda c: c.resolution is None),
]


@pytest.mark.parametrize("check", [c for _, c in CHECKS], ids=[n for n, _ in CHECKS])
def test_conflict_reads_as_the_seed_and_as_python(conflict: MergedConflict, check: Any) -> None:
    assert check(conflict)


def test_a_deletion_is_one_of_the_values() -> None:
    [c] = ConflictDetector().detect_conflicts({"k": 1}, [{"k": 2}, {}])
    assert c.conflicting_values == [2, DELETED] and DELETED in c.conflicting_values
    assert c.conflictingValues == [2, {"$deleted": True}]


def test_the_seeds_constructor() -> None:
    c = MergedConflict("approval_status", "pending", ["approved", "rejected"], ["branch_finance", "branch_risk"])
    assert c.conflicting_values == ["approved", "rejected"]
    assert c.conflicting_values["branch_risk"] == "rejected"
    assert c.source_branches == ["branch_finance", "branch_risk"]
    assert hash(c) == hash(MergedConflict("approval_status", "pending", ["approved", "rejected"],
                                          ("branch_finance", "branch_risk")))
