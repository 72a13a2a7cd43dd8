"""The support escalation's compressions (tests/engine/support_o44/): four rounds, three reopens, on a
memory:// store from the CLI; the model's answers come from the stub's script in this process (the fake
completion: test_outsider44_support and the worker modules take litellm's real client). The compressor
fires after the model steps of every round, and no preserved key is ever missing from the context once
written: checked at every event of the tape, replayed from the tape alone.
"""

from __future__ import annotations

import json
import types
from typing import Any

import pytest

from context_layers import Layer, LayeredContext
from tests.engine.support_o44.support_scene import MODEL, PRESERVED, PROCESS, START, cli, drive
from tests.engine.support_o44.support_stub import answers, fake_completion
from tests.outsider_model33.model33_stub import Scripted


@pytest.fixture
def ticket(monkeypatch: pytest.MonkeyPatch) -> Any:
    import engine.llm

    monkeypatch.setattr(engine.llm, "load_litellm",
                        lambda: types.SimpleNamespace(completion=fake_completion(Scripted(answers()))))
    store = "memory://o44compression"
    code, doc = cli(store, "run", str(PROCESS), "--data", json.dumps(START), "--model", MODEL)
    assert code == 3, doc
    docs = drive(store, doc["instance_id"])
    return store, doc["instance_id"], docs[-1]


def test_every_round_compresses_and_no_preserved_key_is_ever_lost(ticket: Any) -> None:
    store, iid, done = ticket
    assert done["status"] == "completed"
    by_activity = [c["activity_id"] for c in done["compressions"]]
    assert by_activity.count("classify") == 4 and "agent_work" in by_activity, by_activity
    assert all(c["tokens_after"] < c["tokens_before"] for c in done["compressions"]), done["compressions"]
    code, noted = cli(store, "tape", iid, "--kind", "compression")
    assert len(noted) == len(done["compressions"]), noted

    code, tape = cli(store, "tape", iid)
    main = [e for e in tape if e["context"] == "main"]
    present: set[str] = set()
    for event in main:
        ctx = LayeredContext.replay(tape, name="main", until=event["seq"])
        held = {key for key in PRESERVED if key in ctx}
        assert present <= held, (event["seq"], event["kind"], present - held)
        present |= held
    assert present == set(PRESERVED)
    final = LayeredContext.replay(tape, name="main")
    assert {k: final.layer(Layer.HISTORY)[k] for k in ("reopen_count", "replies_sent", "severity")} == {
        "reopen_count": 3, "replies_sent": 4, "severity": "high"}
    assert final.resolve("resolution") == "replace-r3"
    conflicts = final.resolve("_mergedConflicts")
    assert [c["resolution"]["value"] for c in conflicts] == ["refund-r0", "replace-r1", "refund-r2", "replace-r3"]


def test_inspect_replay_and_the_run_document_agree(ticket: Any) -> None:
    store, iid, done = ticket
    code, shown = cli(store, "inspect", iid)
    code, rebuilt = cli(store, "replay", iid)
    assert shown["layers"] == rebuilt["layers"] == done["layers"]
    assert [c["resolution"]["value"] for c in done["conflicts"]] == ["refund-r0", "replace-r1", "refund-r2",
                                                                       "replace-r3"]
    assert done["tape_length"] == len(cli(store, "tape", iid)[1])
