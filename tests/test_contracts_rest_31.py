"""The REST API as a client that knows only DESIGN.md, the README and /openapi.json meets it (REST
round 31), against a real ``layerflow serve`` on the loan example of ``bpmn_examples/``:

- ``inspect``, ``compress`` (each action), ``config``, ``branch-evaluate`` and ``replay`` declare
  their answers (``InspectResult``, ``CompressResult``, ``ConfigResult``, ``BranchEvaluateResult``,
  ``ReplayDocument``), not a free object, and what the server answers is what they declare.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from test_contracts_rest import example_catalog, openapi_document, serving
from test_contracts_rest_30 import GOV, LOAN, _call, _check

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]
SNAP = "<the compression's snapshot>"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    folder = tmp_path_factory.mktemp("rest31")
    yield from serving(folder, example_catalog(folder))


@pytest.fixture(scope="module")
def openapi(server: str) -> dict[str, Any]:
    return openapi_document(server)


ROUTES = [
    ("post", f"{GOV}/inspect", "InspectResult", {"instance_id", "version", "status", "context", "layers", "tokens",
                                                  "attention", "compress_status", "conflicts", "branches",
                                                  "active_config", "preserved"}),
    ("post", f"{GOV}/compress", "CompressResult", {"instance_id", "version", "action", "context", "snapshot_id",
                                                    "tokens_before", "tokens_after"}),
    ("post", f"{GOV}/config", "ConfigResult", {"instance_id", "version", "activity_id", "config_version", "change",
                                                "config", "previous"}),
    ("post", f"{GOV}/branch-evaluate", "BranchEvaluateResult", {"instance_id", "version", "branch_id", "context",
                                                                 "status", "ok", "present", "missing"}),
    ("get", "/api/instances/{instance_id}/replay", "ReplayDocument", {"instance_id", "version", "context",
                                                                      "branch_id", "until", "tape_last_seq", "event",
                                                                      "tokens", "layers"}),
]


@pytest.mark.parametrize("method, path, schema, fields", ROUTES)
def test_the_answers_declare_their_fields(openapi: dict[str, Any], method: str, path: str, schema: str,
                                          fields: set[str]) -> None:
    declared = openapi["paths"][path][method]["responses"]["200"]["content"]["application/json"]["schema"]
    # was {"type": "object", "additionalProperties": true}: a client learnt nothing of the answer
    assert declared == {"$ref": f"#/components/schemas/{schema}"}, declared
    model = openapi["components"]["schemas"][schema]
    assert set(model["required"]) == fields, model["required"]
    assert model.get("additionalProperties") is True  # more may come (added, never renamed)


def test_the_answers_of_a_governance_session_are_the_declared_ones(server: str, openapi: dict[str, Any]) -> None:
    r = _call(server, "POST", "/api/instances", {"process_id": "loan_approval", "data": LOAN})
    assert r.status_code == 201, r.text
    iid = r.json()["instance_id"]
    replay = f"/api/instances/{iid}/replay"
    steps: list[tuple[str, str, Any, dict[str, Any] | None]] = [
        ("post", f"{GOV}/inspect", {"instance_id": iid}, None),
        ("post", f"{GOV}/inspect", {"instance_id": iid, "context": "finance_review", "layers": ["L3"],
                                    "metrics": ["top_keys", "attention_score"]}, None),
        (
            "post", f"{GOV}/compress", {"instance_id": iid, "action": "compress", "context": "finance_review",
                                          "max_tokens": 20}, None),
        (
            "post", f"{GOV}/compress", {"instance_id": iid, "action": "evaluate", "context": "finance_review",
                                          "before_snapshot_id": SNAP}, None),
        (
            "post", f"{GOV}/compress", {"instance_id": iid, "action": "decompress", "context": "finance_review",
                                          "snapshot_id": SNAP}, None),
        ("post", f"{GOV}/config", {"instance_id": iid, "activity_id": "disbursement_decision",
                                   "config": {"compressTokenThreshold": 5000}, "reason": "tighter"}, None),
        ("post", f"{GOV}/branch-evaluate", {"instance_id": iid, "required_keys": ["risk_level", "nope"]}, None),
        ("post", f"{GOV}/branch-evaluate", {"instance_id": iid, "branch_id": "finance_review",
                                            "required_keys": ["risk_level"]}, None),
        ("get", replay, None, None),
        ("get", replay, None, {"context": "finance_review", "until": 2}),
        ("get", replay, None, {"until": 0}),
    ]
    answers = []
    for method, path, body, params in steps:
        if isinstance(body, dict) and SNAP in body.values():  # the snapshot the compression took
            body = {k: answers[2]["snapshot_id"] if v == SNAP else v for k, v in body.items()}
        r = _call(server, method.upper(), path, body, **({"params": params} if params else {}))
        assert r.status_code == 200, f"{method} {path} {body or params}: {r.text[:400]}"
        _check(openapi, method, path.replace(iid, "{instance_id}"), r)
        answers.append(r.json())
    actions = [a["action"] for a in answers[2:5]]
    assert actions == ["compress", "evaluate", "decompress"], actions
    assert answers[6]["missing"] == ["nope"] and answers[6]["ok"] is False, answers[6]
    assert answers[9]["branch_id"] == "finance_review" and answers[9]["until"] == 2, answers[9]
    assert answers[10]["event"] is None and answers[8]["event"] is not None  # an empty replay has no event


BIG = 2 * 1024 * 1024  # over the default limit (1 MiB), under what a raised one takes


def _inject(server: str, iid: str, size: int, **kwargs: Any) -> Any:
    return _call(server, "POST", f"{GOV}/inject", {"instance_id": iid, "context": "finance_review",
                                                    "values": {"memo": "x" * size}}, **kwargs)


def _state(server: str, iid: str) -> tuple[int, int]:
    doc = _call(server, "GET", f"/api/instances/{iid}").json()
    return doc["version"], doc["tape_length"]


def _refused(openapi: dict[str, Any], r: Any, limit: int) -> None:
    assert r.status_code == 413, r.text[:300]  # was 200: ten megabytes were saved into the instance
    _check(openapi, "post", f"{GOV}/inject", r)
    error = r.json()["error"]
    assert error["kind"] == "payload_too_large" and error["limit"] == limit, error
    assert f"limit of {limit} bytes" in error["message"], error["message"]
    assert "--max-body-bytes" in error["message"] and "LAYERFLOW_MAX_BODY_BYTES" in error["message"], error


def test_a_body_over_the_limit_is_refused_and_nothing_is_written(server: str, openapi: dict[str, Any]) -> None:
    iid = _call(server, "POST", "/api/instances", {"process_id": "loan_approval", "data": LOAN}).json()["instance_id"]
    before = _state(server, iid)
    _refused(openapi, _inject(server, iid, BIG), 1024 * 1024)

    def chunks() -> Iterator[bytes]:  # no Content-Length: counted as it comes
        yield f'{{"instance_id": "{iid}", "context": "finance_review", "values": {{"memo": "'.encode()
        for _ in range(BIG // 65536):
            yield b"x" * 65536
        yield b'"}}'
    r = _call(server, "POST", f"{GOV}/inject", content=chunks(), headers={"content-type": "application/json"})
    _refused(openapi, r, 1024 * 1024)
    assert _state(server, iid) == before
    assert _inject(server, iid, 1000).status_code == 200  # under the limit: as before


def test_the_limit_is_raised_by_the_setting(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                           openapi: dict[str, Any]) -> None:
    catalog = example_catalog(tmp_path)
    monkeypatch.setenv("LAYERFLOW_MAX_BODY_BYTES", str(3 * 1024 * 1024))
    for url in serving(tmp_path, catalog):
        iid = _call(url, "POST", "/api/instances", {"process_id": "loan_approval", "data": LOAN}).json()["instance_id"]
        assert _inject(url, iid, BIG).status_code == 200
        _refused(openapi, _inject(url, iid, 4 * 1024 * 1024), 3 * 1024 * 1024)


def test_the_default_limit_is_the_one_documented(monkeypatch: pytest.MonkeyPatch) -> None:
    from click.testing import CliRunner

    from engine.api import DEFAULT_MAX_BODY_BYTES, create_app
    from engine.cli_serve import serve

    text = CliRunner().invoke(serve, ["--help"]).output
    assert f"default: {DEFAULT_MAX_BODY_BYTES} (1 MiB)" in " ".join(text.split()), text
    assert f"{DEFAULT_MAX_BODY_BYTES} bytes" in (ROOT / "README.md").read_text() or "1 MiB" in (
        ROOT / "README.md").read_text()
    monkeypatch.setenv("LAYERFLOW_MAX_BODY_BYTES", "ten megabytes")
    from context_layers.errors import ConfigError
    with pytest.raises(ConfigError, match="LAYERFLOW_MAX_BODY_BYTES='ten megabytes' is no positive number"):
        create_app()
