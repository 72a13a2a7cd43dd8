"""Unseen processes, round 11: a small process of tests/engine/unseen11, written by hand by an outsider
who read DESIGN.md and the README only, driven through the REST governance API of a real server
(tests/engine/governance_helpers.ServerThread) and the model tools. A warranty claim splits: a
technician inspects the item (a user task, so the instance waits inside a parallel branch) while the
cost desk estimates (a script); both decide `outcome` and `cost`, and the join asks a person
(`humanConfirm`, no policy, no model) when they disagree. Checked: the bearer token on every
governance operation, bad bodies refused naming the field with nothing written, every change on the
tape, rollback of a branch then resume, the join's questions settled through `resolve`, the tools'
schemas as JSON Schema agreeing with what the server accepts, and `human_confirm`'s options (an
answer or a default given by label stands for the option's value). Every expectation was worked out
by hand from DESIGN.md and the README first."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import local_http
import jsonschema
import pytest

from engine import Engine
from engine.api import create_app

from governance_helpers import TOKEN, ServerThread

HERE = Path(__file__).resolve().parent / "unseen11"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
GOV = ("inspect", "compress", "inject", "resolve", "rollback", "config")
# price 150 < 200: the cost desk's script says replace, at the item's price; the technician says repair, 40
START = {"process_id": "warranty_claim", "data": {"price": 150, "serial": "SN-77"}}
INSPECTION = {"outcome": "repair", "cost": 40}


@pytest.fixture(scope="module")
def server() -> Iterator[ServerThread]:
    with ServerThread(create_app(Engine("memory://"), HERE, TOKEN)) as running:
        yield running


@pytest.fixture
def api(server: ServerThread) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=server.url, headers=AUTH, timeout=60) as client:
        yield client


def start(api: httpx.Client) -> str:
    """A warranty claim waiting for the technician's user task inside the parallel branch."""
    started = api.post("/api/instances", json=START)
    assert started.status_code in (200, 201), started.text
    doc = started.json()
    assert doc["status"] == "waiting" and [w["task_id"] for w in doc["waiting_for"]] == ["inspect_item"]
    return str(doc["instance_id"])


def state(api: httpx.Client, iid: str) -> tuple[int, int, list[dict[str, Any]]]:
    """(tape length over all contexts, instance version, the tape) as the API shows them."""
    tape = api.get(f"/api/instances/{iid}/tape").json()
    return len(tape["events"]), int(tape["version"]), tape["events"]


# ------------------------------------------------------------------ auth


def test_every_governance_operation_and_instance_read_needs_the_token(api: httpx.Client, server: ServerThread) -> None:
    """DESIGN: bearer-token auth on everything that changes state or returns instance data. With no
    token and with a wrong one, each governance operation, the tools, the instance, its tape and its
    confirmations get 401 (the README's "every /api/ endpoint but /api/health"); nothing is written."""
    iid = start(api)
    before = state(api, iid)[:2]
    bodies = {"inspect": {}, "compress": {"action": "compress", "context": "inspect_item"},
              "inject": {"context": "inspect_item", "key": "note", "value": "x"},
              "resolve": {"conflict_key": "outcome", "resolution": "repair", "reason": "r"},
              "rollback": {"context": "inspect_item", "snapshot_id": "snap:x"},
              "config": {"config": {"activityId": "settle_claim", "preserveKeys": ["settlement"]}}}
    for headers in ({}, {"Authorization": "Bearer not-the-token"}, {"Authorization": TOKEN}):
        with httpx.Client(base_url=server.url, headers=headers, timeout=30) as anon:
            for op in GOV:
                refused = anon.post(f"/api/context-governance/{op}", json={"instance_id": iid, **bodies[op]})
                assert refused.status_code == 401, (op, headers, refused.text)
                assert refused.json()["error"]["kind"] == "unauthorized"
            tool = anon.post("/api/context-governance/tools/context_inspect", json={"instance_id": iid, "arguments": {}})
            assert tool.status_code == 401
            for path in (f"/api/instances/{iid}", f"/api/instances/{iid}/tape", "/api/confirmations",
                         "/api/context-governance/tools"):
                assert anon.get(path).status_code == 401, path
    assert state(api, iid)[:2] == before
    assert local_http.get(f"{server.url}/api/health").status_code == 200


# ------------------------------------------------------------------ bad bodies


BAD = [
    ("inspect", {"instance_id": "no-such-claim"}, 404, "no-such-claim"),
    ("inspect", {"instance_id": None}, 422, "instance_id"),          # None: sent without it
    ("inspect", {"instance_id": 7}, 422, "instance_id"),
    ("inspect", {"context": "no_such_branch"}, 404, "no_such_branch"),
    ("inject", {"key": "note", "value": 1}, 409, "open branches"),            # main, branches not joined
    ("inject", {"context": "inspect_item", "key": "note", "value": 1, "layer": "L9"}, 422, "layer"),
    ("inject", {"context": "inspect_item", "key": "policy", "value": "anything"}, 403, "policy"),
    ("inject", {"context": "inspect_item", "key": "price", "value": 1, "layer": "L1"}, 403, "price"),
    ("inject", {"context": "inspect_item", "key": "x", "value": 1, "layer": "HISTORY"}, 403, "L3"),
    ("inject", {"context": "inspect_item", "key": "_mergedConflicts", "value": []}, 403, "_mergedConflicts"),
    ("inject", {"context": "inspect_item", "values": "outcome=scrap"}, 422, "values"),
    ("compress", {"context": "inspect_item", "action": "squash"}, 422, "action"),
    ("compress", {"context": "inspect_item", "action": "compress", "max_tokens": "lots"}, 422, "max_tokens"),
    ("compress", {"action": "compress"}, 409, "open branches"),
    ("rollback", {"context": "inspect_item", "snapshot_id": "snap:nope"}, 404, "snap:nope"),
    ("rollback", {"context": "inspect_item"}, 422, "snapshot_id"),
    ("rollback", {"context": "inspect_item", "snapshot_id": 5}, 422, "snapshot_id"),
    ("config", {"config": {"activityId": "no_such_task", "preserveKeys": ["x"]}}, 404, "no_such_task"),
    ("config", {"config": {"activityId": "settle_claim", "compressTokenThreshold": "big"}}, 422,
     "compressTokenThreshold"),
    ("config", {"config": {"activityId": "settle_claim", "preserveKeys": "settlement"}}, 422, "preserveKeys"),
    ("config", {"config": {"activityId": "settle_claim", "bogusField": 1}}, 422, "bogusField"),
    ("config", {"config": {"activityId": "settle_claim", "handler": "evil.py:run"}}, 422, "handler"),
    ("config", {"config": "preserve everything"}, 422, "config"),
    ("resolve", {"resolution": "repair", "reason": "r"}, 422, "conflict_key"),
    ("resolve", {"conflict_key": "outcome", "resolution": "repair"}, 422, "reason"),
    ("resolve", {"conflict_key": "claim_join/outcome", "resolution": "repair", "reason": "r"}, 404, "claim_join/outcome"),
]


def test_bad_bodies_are_refused_naming_the_field_and_write_nothing(api: httpx.Client) -> None:
    """Unknown instance / branch / snapshot / element: 404 naming it; wrong types and unknown names:
    422 naming the field; the layer rules: 403 naming the key (SYSTEM, PROCESS a second time, HISTORY
    asked for by name, an engine key); a change to main while its branches are open: 409. Nothing is
    written (README: "nothing half-written"); only a denied write is on the tape (DESIGN: denied writes
    are recorded), once, on the tape of the branch it was meant for (DESIGN: events carry the branch),
    naming the key. `resolve` before the join asks: 404."""
    iid = start(api)
    before = state(api, iid)
    for op, body, status, names in BAD:
        body = {k: v for k, v in {"instance_id": iid, **body}.items() if v is not None}
        refused = api.post(f"/api/context-governance/{op}", json=body)
        assert refused.status_code == status, (op, body, refused.text)
        assert names in refused.json()["error"]["message"], (op, body, refused.text)
        after = state(api, iid)
        new = after[2][before[0]:]
        if status == 403:
            (denied,) = new
            assert (denied["kind"], denied["data"]["note"], denied["data"]["op"]) == ("note", "governance_denied", "inject")
            assert denied["branch"] == "inspect_item" and denied["context"].startswith("main/inspect_item")
            assert denied["data"]["key"] == body["key"] and after[1] == before[1] + 1
        else:
            assert new == [] and after[1] == before[1], (op, body)
        before = after
    branch = api.post("/api/context-governance/inspect", json={"instance_id": iid, "context": "inspect_item"}).json()
    assert [layer for layer in ("L1", "L2", "L3", "L4", "L5") if set(branch[layer]["keys"]) - {"price", "serial",
            "_branch_id", "_snapshot_id"}] == []


# ------------------------------------------------------------------ a branch governed, rolled back, resumed, resolved


def test_branch_governance_lands_on_the_tape_then_rollback_resume_and_resolve(api: httpx.Client) -> None:
    """While the technician's task waits: snapshot the branch, inject a wrong outcome into it, change
    the settle step's config, roll the branch back; each is on the tape (actor api), the injected keys
    are gone from the branch and main never saw them. The technician then answers (repair, 40): the
    join meets the cost desk's (replace, 150) and asks a person about both keys; `resolve` settles
    them (one by `GATEWAY/KEY`, one by the bare key), each a `human_decision` with its reason, and the
    settle step reads what was chosen: settlement "repair:40", `settlement` preserved by the runtime
    config."""
    iid = start(api)
    gov = lambda op, **body: api.post(f"/api/context-governance/{op}", json={"instance_id": iid, **body})  # noqa: E731
    n0, _, _ = state(api, iid)

    snap = gov("snapshot", context="inspect_item")
    assert snap.status_code == 200, snap.text
    snapshot_id = snap.json()["snapshot_id"]
    injected = gov("inject", context="inspect_item", values={"outcome": "scrap", "note": "dented"})
    assert injected.status_code == 200 and injected.json()["written"] == {"outcome": "L4", "note": "L4"}
    assert gov("config", config={"activityId": "settle_claim", "preserveKeys": ["settlement"]}).status_code == 200
    rolled = gov("rollback", context="inspect_item", snapshot_id=snapshot_id)
    assert rolled.status_code == 200, rolled.text

    _, _, tape = state(api, iid)
    new = [(e["kind"], e["data"].get("note") or e["data"].get("op") if e.get("data") else None)
           for e in tape[n0:] if e["actor"] == "api"]
    assert ("snapshot", None) in new and ("restore", None) in new
    notes = [e["data"] for e in tape[n0:] if e["kind"] == "note"]
    assert [n.get("op") or n["note"] for n in notes] == ["inject", "config_change", "rollback"]
    writes = [e for e in tape[n0:] if e["kind"] == "write"]
    assert len(writes) == 2 and all(e["context"].startswith("main/inspect_item") for e in writes)

    branch = gov("inspect", context="inspect_item").json()
    assert "outcome" not in branch["L4"]["keys"] and "note" not in branch["L4"]["keys"]
    assert "outcome" not in gov("inspect").json()["L4"]["keys"]

    answered = api.post(f"/api/instances/{iid}/user-tasks/inspect_item", json={"data": INSPECTION})
    assert answered.status_code == 200, answered.text
    doc = answered.json()
    assert doc["status"] == "waiting"
    asked = {c["key"]: c["values"] for c in doc["conflicts"]}
    assert asked == {"outcome": {"inspect_item": "repair", "estimate_cost": "replace"},
                     "cost": {"inspect_item": 40, "estimate_cost": 150}}
    assert sorted(w["id"] for w in doc["waiting_for"]) == ["claim_join/cost", "claim_join/outcome"]

    first = gov("resolve", conflict_key="claim_join/outcome", resolution="repair", reason="technician saw a dent only")
    assert first.status_code == 200 and first.json()["status"] == "waiting"
    again = gov("resolve", conflict_key="claim_join/outcome", resolution="replace", reason="changed my mind")
    assert again.status_code == 409 and again.json()["error"]["kind"] == "already_answered"
    done = gov("resolve", conflict_key="cost", resolution=40, reason="the repair quote")
    assert done.status_code == 200, done.text
    final = done.json()
    assert final["status"] == "completed"
    assert (final["layers"]["L3"]["outcome"], final["layers"]["L3"]["cost"]) == ("repair", 40)
    assert final["layers"]["L3"]["settlement"] == "repair:40"
    assert {c["key"]: (c["resolution"]["value"], c["resolution"]["resolver"]) for c in final["conflicts"]} == {
        "outcome": ("repair", "human"), "cost": (40, "human")}
    decisions = [e["data"] for e in state(api, iid)[2] if e["kind"] == "note" and e["data"].get("note") == "human_decision"]
    assert [(d["key"], d["value"], d["reason"]) for d in decisions] == [
        ("outcome", "repair", "technician saw a dent only"), ("cost", 40, "the repair quote")]
    settle = gov("inspect", activity_id="settle_claim").json()
    assert "settlement" in settle["preserved"]


# ------------------------------------------------------------------ the model tools


def _arguments_from_examples(schema: dict[str, Any]) -> dict[str, Any]:
    """The arguments the schema itself suggests: each property with `examples` (on it or on its
    array items) and each required enum's first value."""
    args: dict[str, Any] = {}
    for name, prop in schema["properties"].items():
        for variant in [prop, *prop.get("anyOf", [])]:
            if "examples" in variant:
                args[name] = variant["examples"][0]
            elif variant.get("type") == "array" and "examples" in variant.get("items", {}):
                args[name] = [variant["items"]["examples"][0]]
            if name in args:
                break
        if name in schema.get("required", []) and name not in args and "enum" in prop:
            args[name] = prop["enum"][0]
    return args


def test_tool_schemas_are_json_schema_and_the_server_agrees_with_them(api: httpx.Client) -> None:
    """DESIGN: the four tools as function-calling schemas. Each is a valid JSON Schema (2020-12) of an
    object; the arguments built from the schema's own examples validate and run on the waiting
    claim (in its branch, where a change is allowed); arguments the schema refuses the server refuses
    too (422 naming the field), an unknown tool is 404."""
    iid = start(api)
    listed = api.get("/api/context-governance/tools")
    assert listed.status_code == 200
    tools = {t["function"]["name"]: t["function"]["parameters"] for t in listed.json() if t["type"] == "function"}
    assert set(tools) == {"context_inspect", "context_compress", "context_branch", "human_confirm"}
    own = {"human_confirm": {"message": "Repair or replace the item?",
                             "options": [{"label": "Repair it", "value": "repair"},
                                         {"label": "Replace it", "value": "replace"}]},
           "context_branch": {"required_keys": ["serial"]}}  # the description: evaluate needs it
    for name, schema in tools.items():
        jsonschema.Draft202012Validator.check_schema(schema)
        undocumented = [p for p, prop in schema["properties"].items() if not prop.get("description")
                        and p not in ("action", "message", "options", "context") and "enum" not in prop]
        assert not undocumented, (name, undocumented)  # a model has only the schema to go by
        assert schema["type"] == "object" and schema.get("additionalProperties") is False
        args = {**_arguments_from_examples(schema), **own.get(name, {})}
        if "context" in schema["properties"]:
            args["context"] = "inspect_item"
        jsonschema.validate(args, schema)
        ran = api.post(f"/api/context-governance/tools/{name}", json={"instance_id": iid, "arguments": args})
        assert ran.status_code == 200, (name, args, ran.text)

    bad = [("context_inspect", {"layers": ["L9"]}, "layers"), ("context_inspect", {"top": -1}, "top"),
           ("context_inspect", {"bogus": 1}, "bogus"), ("context_compress", {"action": "squash"}, "action"),
           ("context_compress", {}, "action"), ("context_branch", {"action": "fork"}, "action"),
           ("human_confirm", {"message": "ok?", "options": []}, "options"),
           ("human_confirm", {"message": "ok?", "options": ["yes", "no"]}, "options.0"),
           ("human_confirm", {"message": "ok?", "options": own["human_confirm"]["options"], "timeout": 0}, "timeout"),
           ("human_confirm", {"message": "", "options": own["human_confirm"]["options"]}, "message")]
    before = state(api, iid)[:2]
    for name, args, field in bad:
        schema_says = list(jsonschema.Draft202012Validator(tools[name]).iter_errors(args))
        refused = api.post(f"/api/context-governance/tools/{name}", json={"instance_id": iid, "arguments": args})
        if name != "context_inspect" or field != "layers":  # "L9" is a string: only the server knows the layers
            assert schema_says, (name, args)
        assert refused.status_code == 422 and field in refused.json()["error"]["message"], (name, args, refused.text)
    # a default none of the options offers is the server's to refuse (the schema cannot say it)
    refused = api.post("/api/context-governance/tools/human_confirm", json={"instance_id": iid, "arguments": {
        **own["human_confirm"], "default": "scrap"}})
    assert refused.status_code == 422 and "default" in refused.text
    assert state(api, iid)[:2] == before
    unknown = api.post("/api/context-governance/tools/context_delete", json={"instance_id": iid, "arguments": {}})
    assert unknown.status_code == 404 and "context_inspect" in unknown.text


def test_an_answer_or_default_given_by_label_is_the_options_value(api: httpx.Client) -> None:
    """The `human_confirm` schema: the default is "one of the options' values (or labels)", and a
    person may answer by label. DESIGN: an answer is one of the offered option values. So a label
    stands for its option's value: the model that asked reads `replace`, not `Replace it`, whether a
    person picked it by label or the timeout took the default given by label; the same for a join's
    question answered by label (`40 (from inspect_item)` -> 40, in `confirmations` and on the tape)."""
    iid = start(api)
    options = [{"label": "Repair it", "value": "repair"}, {"label": "Replace it", "value": "replace"}]
    tool = lambda args: api.post("/api/context-governance/tools/human_confirm",  # noqa: E731
                                 json={"instance_id": iid, "arguments": args})
    by_person = tool({"message": "Repair or replace?", "options": options}).json()["confirmation_id"]
    by_clock = tool({"message": "Ship a loaner?", "options": options, "default": "Replace it", "timeout": 0.2})
    assert by_clock.status_code == 200, by_clock.text
    timed = by_clock.json()["confirmation_id"]
    assert api.post(f"/api/confirmations/{by_person}", json={"value": "Replace it", "instance_id": iid}).status_code == 200
    time.sleep(0.4)
    assert api.post(f"/api/instances/{iid}/resume", json={}).status_code == 200
    asked = {c["id"]: c for c in api.get(f"/api/instances/{iid}").json()["confirmations"]}
    assert (asked[by_person]["answer"], asked[by_person]["timed_out"]) == ("replace", False)
    assert (asked[timed]["answer"], asked[timed]["timed_out"]) == ("replace", True)

    doc = api.post(f"/api/instances/{iid}/user-tasks/inspect_item", json={"data": INSPECTION}).json()
    assert "claim_join/cost" in [w["id"] for w in doc["waiting_for"]]
    assert api.post("/api/confirmations/claim_join/cost", json={"value": "40 (from inspect_item)", "instance_id": iid}).status_code == 200
    done = api.post("/api/confirmations/claim_join/outcome", json={"value": '"repair" (from inspect_item)', "instance_id": iid}).json()
    assert done["status"] == "completed" and done["layers"]["L3"]["settlement"] == "repair:40"
    answers = {c["id"]: c["answer"] for c in done["confirmations"]}
    assert (answers["claim_join/cost"], answers["claim_join/outcome"]) == (40, "repair")
    decided = [e["data"] for e in state(api, iid)[2] if e["kind"] == "note" and e["data"].get("note") == "human_decision"]
    assert [d["value"] for d in decided] == ["replace", 40, "repair"]
    assert json.dumps(decided).count("(from inspect_item)") == 0


def test_a_join_waiting_for_a_person_keeps_main_as_the_split_left_it(api: httpx.Client) -> None:
    """README: a join waiting for a person has changed nothing yet, and a change to a context whose
    branches are not yet joined gets 409 (inject, compress; rollback too, it would move main under
    the join's snapshot). Main still holds only what the split saw; the refusals write nothing, the
    questions stay open, and answering them runs the claim to its end."""
    iid = start(api)
    doc = api.post(f"/api/instances/{iid}/user-tasks/inspect_item", json={"data": INSPECTION}).json()
    assert sorted(w["id"] for w in doc["waiting_for"]) == ["claim_join/cost", "claim_join/outcome"]
    gov = lambda op, **body: api.post(f"/api/context-governance/{op}", json={"instance_id": iid, **body})  # noqa: E731
    snap = gov("snapshot")
    assert snap.status_code == 200 and snap.json()["layers"]["L3"] == [] and snap.json()["layers"]["L4"] == []
    before = state(api, iid)[:2]
    for op, body in (("inject", {"key": "outcome", "value": "scrap"}), ("compress", {"action": "compress"}),
                     ("rollback", {"snapshot_id": snap.json()["snapshot_id"]})):
        refused = gov(op, **body)
        assert refused.status_code == 409 and "open branches" in refused.text, (op, refused.text)
        assert state(api, iid)[:2] == before, op
    main = gov("inspect").json()
    assert main["L3"]["keys"] == [] and main["L4"]["keys"] == [] and main["status"] == "waiting"
    assert gov("resolve", conflict_key="claim_join/cost", resolution=150, reason="desk quote").status_code == 200
    done = gov("resolve", conflict_key="claim_join/outcome", resolution="replace", reason="desk").json()
    assert done["status"] == "completed" and done["layers"]["L3"]["settlement"] == "replace:150"
