"""Twenty support tickets at once on three ``layerflow worker`` processes (tests/engine/support_o44/, Redis
DB 10, the model behind the stub server through litellm's real client in the workers): every ticket is
classified once (one model call each, whatever worker took it), ``list`` and ``inspect`` say where each
stands, ``replay`` rebuilds what ``inspect`` shows, and the CLI answers tickets while the workers hold others.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.engine.support_o44.support_scene import (MODEL, PRESERVED, PROCESS, START, cli, model_stub, scene,
                                                    wait_for, worker)
from tests.engine.support_o44.support_stub import SupportStub
from tests.outsider_model33.model33_stub import kind_of


@pytest.fixture
def stub(monkeypatch: pytest.MonkeyPatch) -> Any:
    with model_stub(monkeypatch, client_in_process=False) as server:
        yield server


def test_twenty_tickets_on_three_workers_each_classified_once(stub: SupportStub, tmp_path: Path) -> None:
    with scene(tmp_path, stub.url) as sc:
        for name in ("w1", "w2", "w3"):
            # no takeover is wanted here: a lease of 5 s, so a stall of a loaded machine does not end one
            # (a lease that ends mid-step lets another worker run the step again, as it must)
            worker(sc, name, "--idle-ms", "5000")
        code, doc = cli(sc["store"], "submit", str(PROCESS), "--data", json.dumps(START), "--count", "20",
                        "--stream", sc["stream"])
        assert code == 0 and len(doc["instance_ids"]) == 20, doc
        ids = doc["instance_ids"]

        # the CLI answers the first tickets at rest while the workers still hold others
        answered: list[str] = []
        seen_held: set[str] = set()

        def answer_some() -> bool:
            code, rows = cli(sc["store"], "list")
            seen_held.update(r["held_by"] for r in rows if r["held_by"])
            for r in rows:
                if len(answered) < 3 and r["status"] == "waiting" and not r["held_by"] \
                        and r["instance_id"] not in answered:
                    code, out = cli(sc["store"], "send", r["instance_id"], "customer_reply", "--json-payload",
                                    '{"customer_message": "still broken"}', "--model", MODEL)
                    assert code == 3, out
                    assert [w["task_id"] for w in out["waiting_for"]] == ["human_work"], out["waiting_for"]
                    answered.append(r["instance_id"])
            return len(answered) == 3 and all(r["status"] == "waiting" and not r["held_by"] for r in rows) \
                and len(rows) == 20
        wait_for(answer_some, "every ticket classified", timeout=180)
        assert seen_held <= {"w1", "w2", "w3"} and seen_held, seen_held

        code, rows = cli(sc["store"], "list")
        assert sorted(r["instance_id"] for r in rows) == sorted(ids)
        bodies = [{k: v for k, v in r.items() if k != "_path"} for r in stub.requests]  # the workers' (HTTP)
        assert sum(kind_of(b) == "classify" for b in bodies) == 20, [kind_of(b) for b in bodies]
        for iid in ids:
            code, tape = cli(sc["store"], "tape", iid)
            calls = [e for e in tape if (e.get("data") or {}).get("note") == "llm_call" and e["activity"] == "classify"]
            assert len(calls) == 1 and calls[0]["data"]["status"] == "ok", (iid, calls)
            assert not [e for e in tape if (e.get("data") or {}).get("note") == "retry"], iid
            code, shown = cli(sc["store"], "inspect", iid)
            code, rebuilt = cli(sc["store"], "replay", iid)
            assert rebuilt["layers"] == shown["layers"], iid
            want = ["human_work"] if iid in answered else ["two_days", "wait_customer"]
            assert sorted(w["task_id"] for w in shown["waiting_for"]) == want, (iid, shown["waiting_for"])
            for key in PRESERVED[:2]:
                assert shown["layers"]["L3"][key] == {"severity": "high", "sla_hours": 8}[key]
