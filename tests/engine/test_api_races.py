"""The REST API when people answer at once: a second answer to a confirmation (two people at
once, a retry) is 409 ``already_answered`` naming the first answer, not 404.

``tests/stores/test_stress_races.py`` finds such races with real processes; these pin them down.
"""

from __future__ import annotations

from typing import Any

import pytest
from fastapi.testclient import TestClient

from engine.api import create_app
from governance_helpers import LOAN_CONFLICT, TOKEN, make_catalog

AUTH = {"Authorization": f"Bearer {TOKEN}"}


@pytest.mark.parametrize("how", ["confirmation", "resolve"])
def test_a_second_answer_to_a_confirmation_is_409_already_answered(tmp_path, how):
    with TestClient(create_app("memory://", make_catalog(tmp_path), TOKEN)) as client:
        started = client.post("/api/instances", json={"process_id": "loan_approval", "data": LOAN_CONFLICT},
                              headers=AUTH).json()
        iid = started["instance_id"]

        def answer(value: str) -> Any:
            if how == "confirmation":
                return client.post("/api/confirmations/review_join/approval_status", headers=AUTH,
                                   json={"instance_id": iid, "value": value, "user": "ann" if value == "approved"
                                         else "bob"})
            return client.post("/api/context-governance/resolve", headers=AUTH, json={
                "instance_id": iid, "conflict_key": "approval_status", "resolution": value, "reason": "r",
                "user": "ann" if value == "approved" else "bob"})

        first = answer("approved")
        assert first.status_code == 200 and first.json()["status"] == "completed", first.text
        second = answer("rejected")
        assert second.status_code == 409, second.text
        error = second.json()["error"]
        assert error["kind"] == "already_answered", error
        assert "'approved'" in error["message"] and "ann" in error["message"], error
        doc = client.get(f"/api/instances/{iid}", headers=AUTH).json()
        assert doc["layers"]["L3"]["approval_status"] == "approved"
