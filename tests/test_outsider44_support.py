"""The support escalation (tests/engine/support_o44/) in one process, from the CLI on memory:// stores,
with the model behind the stub server (litellm's real client): four rounds, three reopens, the
compressor firing, a conflict on ``resolution`` at every join, and what ``inspect``, ``tape`` and
``replay`` say about it.

What it found:

* the model was shown the split's ``_snapshot_id`` (``snap:main:134``), a position on the tape: any event
  added before a split (a worker's ``retry`` note after a takeover, an operator's ``layerflow snapshot``)
  changed every later request's bytes, so a ticket a worker took over sent the model other prompts than an
  undisturbed run (and missed the provider's prompt cache) though nothing the model decides on differed.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.engine.support_o44.support_scene import MODEL, PROCESS, START, cli, drive
from tests.engine.support_o44.support_stub import SupportStub
from tests.outsider_model33.model33_stub import kind_of


@pytest.fixture
def stub(monkeypatch: pytest.MonkeyPatch) -> Any:
    monkeypatch.setenv("LAYERFLOW_MODEL_API_KEY", "test")
    monkeypatch.setenv("LAYERFLOW_RETRY_BASE_DELAY", "0.01")
    with SupportStub() as server:
        monkeypatch.setenv("LAYERFLOW_MODEL_API_BASE", server.url)
        yield server


def _requests(stub: SupportStub, since: int, kind: str) -> list[Any]:
    bodies = [{k: v for k, v in r.items() if k != "_path"} for r in stub.requests[since:]]
    return [b["messages"] for b in bodies if kind_of(b) == kind]


def test_an_operator_s_snapshot_before_a_split_does_not_change_what_the_model_is_sent(stub: SupportStub) -> None:
    sent = {}
    for store, snapshot in (("memory://o44plain", False), ("memory://o44snap", True)):
        since = len(stub.requests)
        code, doc = cli(store, "run", str(PROCESS), "--data", json.dumps(START), "--model", MODEL)
        assert code == 3, doc
        if snapshot:  # an event on main's tape before the split, as a worker's retry note is
            code, snap = cli(store, "snapshot", doc["instance_id"])
            assert code == 0, snap
        drive(store, doc["instance_id"], rounds=1)
        # the agent's first turn, in the branch the split opened (its tool results carry the clock)
        sent[snapshot] = _requests(stub, since, "tools")[:1] + _requests(stub, since, "conflict")
    assert len(sent[False]) == 2
    assert sent[True] == sent[False]
    assert "snap:main" not in json.dumps(sent[True])
