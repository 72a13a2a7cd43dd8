"""The support escalation (tests/engine/support_o44/) in one process, from the CLI, the model's answers from
the stub's script (the fake completion here; the worker modules reach the stub server through litellm's real
client): four rounds, three reopens, the
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
from pathlib import Path
from typing import Any

import pytest

from tests.engine.support_o44.support_scene import MODEL, PROCESS, START, cli, drive, model_stub, scene
from tests.engine.support_o44.support_stub import SupportStub
from tests.outsider_model33.model33_stub import kind_of


@pytest.fixture
def stub(monkeypatch: pytest.MonkeyPatch) -> Any:
    with model_stub(monkeypatch, client_in_process=False) as server:
        yield server


def _requests(stub: SupportStub, since: int, kind: str) -> list[Any]:
    return [b["messages"] for b in stub.scripted.requests[since:] if kind_of(b) == kind]


def test_an_operator_s_snapshot_before_a_split_does_not_change_what_the_model_is_sent(stub: SupportStub) -> None:
    sent = {}
    for store, snapshot in (("memory://o44plain", False), ("memory://o44snap", True)):
        since = len(stub.scripted.requests)
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


def test_a_message_sent_to_a_ticket_still_on_the_queue_says_it_is_queued_not_that_it_waits_for_nothing(
        stub: SupportStub, tmp_path: Path) -> None:
    """The customer answers at once, before a worker has taken the submitted ticket: the refusal said the
    ticket "waits for: nothing", as if it had ended or lost its wait; it says the ticket is running (on the
    queue, or run by a worker) and does not wait for the message yet, and how to see when it does."""
    with scene(tmp_path, stub.url) as sc:
        code, doc = cli(sc["store"], "submit", str(PROCESS), "--data", json.dumps(START), "--stream", sc["stream"])
        [iid] = doc["instance_ids"]
        code, out = cli(sc["store"], "send", iid, "customer_reply", "--json-payload", '{"customer_message": "x"}')
        assert code == 2 and out["error"]["instance_status"] == "running", out
        message = out["error"]["message"]
        assert "waits for: nothing" not in message, message
        assert "customer_reply" in message and "queue" in message and f"layerflow inspect {iid}" in message, message
        code, shown = cli(sc["store"], "inspect", iid)
        assert shown["status"] == "running" and shown["version"] == 1, shown  # nothing of the send was saved
