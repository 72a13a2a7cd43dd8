"""Calls an outsider writes from the seed's examples and DESIGN.md: the instance id in the
query, camelCase field names, the seed's inspect answer (``keys``), inject of one key,
the seed's ActivityExtensionConfig as the config body, and the model tools over REST."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from engine.api import create_app
from governance_helpers import NOTES, TOKEN, make_catalog

AUTH = {"Authorization": f"Bearer {TOKEN}"}


@pytest.fixture
def client(tmp_path):
    with TestClient(create_app("memory://", make_catalog(tmp_path), TOKEN)) as c:
        yield c


@pytest.fixture
def iid(client) -> str:
    r = client.post("/api/instances", json={"process_id": "notes_review", "data": NOTES}, headers=AUTH)
    assert r.status_code == 201, r.text
    return str(r.json()["instance_id"])


def test_inspect_with_the_seeds_metrics_lists_the_keys_it_counts(client, iid):
    r = client.post("/api/context-governance/inspect", headers=AUTH, json={
        "instance_id": iid, "layers": ["L3", "L4"],
        "metrics": ["token_count", "key_count", "attention_score", "last_modified", "size_bytes"],
        "filter": {"key_prefix": "risk_*", "modified_after": "2026-01-01T00:00:00Z"}})
    assert r.status_code == 200, r.text
    l3 = r.json()["L3"]
    assert {"token_count", "key_count", "attention_score", "keys"} <= set(l3)
    assert l3["key_count"] == len(l3["keys"]) and all(k.startswith("risk_") for k in l3["keys"])


def test_the_instance_id_may_come_in_the_query(client, iid):
    r = client.post(f"/api/context-governance/inspect?instance_id={iid}", headers=AUTH,
                    json={"layers": ["L3"], "metrics": ["key_count"]})
    assert r.status_code == 200, r.text
    assert r.json()["instance_id"] == iid
    r = client.post(f"/api/context-governance/inject?instance_id={iid}", headers=AUTH, json={"values": {"hint": 1}})
    assert r.status_code == 200, r.text
    missing = client.post("/api/context-governance/inspect", headers=AUTH, json={"layers": ["L3"]})
    assert missing.status_code == 422 and "instance_id" in missing.json()["error"]["message"]
    unknown = client.post("/api/context-governance/inspect?instance_id=nope", headers=AUTH, json={})
    assert unknown.status_code == 404, unknown.text
    assert client.post(f"/api/context-governance/inspect?instance_id={iid}", json={}).status_code == 401


def test_camel_case_field_names_are_taken(client, iid):
    r = client.post("/api/context-governance/inspect", headers=AUTH, json={
        "instanceId": iid, "layers": ["L3"], "filter": {"keyPrefix": "risk_", "modifiedAfter": "2026-01-01T00:00:00Z"}})
    assert r.status_code == 200, r.text
    assert all(k.startswith("risk_") for k in r.json()["L3"]["keys"])
    r = client.post("/api/context-governance/compress", headers=AUTH, json={
        "instanceId": iid, "action": "compress", "targetLayers": ["L3"], "preserveKeys": ["risk_level"],
        "maxTokens": 300})
    assert r.status_code == 200, r.text
    assert r.json()["changed"] and r.json()["snapshot_id"]
    both = client.post("/api/context-governance/compress", headers=AUTH, json={
        "instance_id": iid, "action": "evaluate", "snapshot_id": "a", "snapshotId": "b"})
    assert both.status_code == 422 and "snapshotId" in both.json()["error"]["message"]


def test_inject_takes_one_key_and_value(client, iid):
    r = client.post("/api/context-governance/inject", headers=AUTH,
                    json={"instance_id": iid, "layer": "L4", "key": "hint", "value": {"a": 1}})
    assert r.status_code == 200, r.text
    assert r.json()["written"] == {"hint": "L4"}
    doc = client.get(f"/api/instances/{iid}", headers=AUTH).json()
    assert doc["layers"]["L4"]["hint"] == {"a": 1}
    half = client.post("/api/context-governance/inject", headers=AUTH, json={"instance_id": iid, "key": "x"})
    assert half.status_code == 422 and "value" in half.json()["error"]["message"]


def test_config_takes_the_seeds_activity_extension_config(client, iid):
    seed = {"activityId": "approve",
            "contextStrategy": {"preserveKeys": ["risk_level", "assessment_id"], "compressTokenThreshold": 4000},
            "mergeStrategy": "MERGE_WITH_CONFLICT_DETECT"}
    r = client.post("/api/context-governance/config", headers=AUTH, json={"instance_id": iid, "config": seed})
    assert r.status_code == 200, r.text
    assert r.json()["activity_id"] == "approve"
    r = client.post("/api/context-governance/config", headers=AUTH, json={"instance_id": iid, **seed})
    assert r.status_code == 200, r.text
    assert r.json()["activity_id"] == "approve" and r.json()["config_version"] == 2
    clash = client.post("/api/context-governance/config", headers=AUTH,
                        json={"instance_id": iid, "activity_id": "collect", "config": seed})
    assert clash.status_code == 422 and "activityId" in clash.json()["error"]["message"]


def test_the_model_tools_are_served_over_rest(client, iid):
    r = client.get("/api/context-governance/tools", headers=AUTH)
    assert r.status_code == 200, r.text
    assert [t["function"]["name"] for t in r.json()] == ["context_inspect", "context_compress", "context_branch",
                                                         "human_confirm"]
    r = client.post("/api/context-governance/tools/context_inspect", headers=AUTH,
                    json={"instance_id": iid, "arguments": {"layers": ["L3", "L4"], "metrics": ["token_count"]}})
    assert r.status_code == 200, r.text
    assert set(r.json()["L3"]) == {"token_count"}
    r = client.post("/api/context-governance/tools/context_branch", headers=AUTH,
                    json={"instance_id": iid, "arguments": {"action": "snapshot", "layers": ["L2", "L3", "L4"]}})
    assert r.status_code == 200 and r.json()["snapshot_id"], r.text
    r = client.post("/api/context-governance/tools/human_confirm", headers=AUTH, json={"instance_id": iid, "arguments": {
        "type": "conflict_resolution", "message": "pick", "timeout": 300,
        "options": [{"label": "yes", "value": "approved"}, {"label": "no", "value": "rejected"}]}})
    assert r.status_code == 200 and r.json()["status"] == "pending", r.text
    bad = client.post("/api/context-governance/tools/context_compress", headers=AUTH,
                      json={"instance_id": iid, "arguments": {"action": "shrink"}})
    assert bad.status_code == 422 and "action" in bad.json()["error"]["message"]
    assert client.post("/api/context-governance/tools/nope", headers=AUTH,
                       json={"instance_id": iid, "arguments": {}}).status_code == 404
    assert client.post("/api/context-governance/tools/context_inspect", headers=AUTH,
                       json={"instance_id": "nope", "arguments": {}}).status_code == 404
    assert client.post("/api/context-governance/tools/context_inspect",
                       json={"instance_id": iid, "arguments": {}}).status_code == 401


def test_inspect_answers_with_the_seeds_dto_fields(client):
    from governance_helpers import LOAN_CONFLICT
    doc = client.post("/api/instances", json={"process_id": "loan_approval", "data": LOAN_CONFLICT}, headers=AUTH).json()
    r = client.post("/api/context-governance/inspect", headers=AUTH, json={"instance_id": doc["instance_id"]})
    assert r.status_code == 200, r.text
    body = r.json()
    infos = body["layer_infos"]
    assert [i["layer_id"] for i in infos] == ["L0", "L1", "L2", "L3", "L4", "L5"]
    l3 = infos[3]
    assert l3["token_count"] == doc["tokens"]["L3"] and l3["key_count"] == len(doc["layers"]["L3"])
    assert {"size_bytes", "last_modified", "top_keys"} <= set(l3) and all(isinstance(k, str) for k in l3["top_keys"])
    assert body["attention_score"] == body["attention"]
    assert body["merged_conflicts"] == body["conflicts"] and body["merged_conflicts"][0]["key"] == "approval_status"
    assert body["branch_infos"] == body["branches"] and body["compress_status"]
    scores = body["knowledge_scores"]
    assert scores and {s["key"] for s in scores} == set(doc["layers"]["L2"])
    assert all(0 <= s["confidence"] <= 1 and s["source"] for s in scores)
