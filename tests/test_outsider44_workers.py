"""A newcomer runs a customer-support escalation (tests/engine/support_o44/) on ``layerflow worker``
processes sharing Redis DB 10, the model behind the OpenAI-compatible stub server reached through litellm's
real client, from README.md ("Many workers", "Stores from Python", the model sections) alone.

The worker that runs the ticket's first model step is SIGKILLed while it waits for the model; another
takes the entry over after ``--idle-ms`` and runs the step again. The ticket then goes four rounds (three
reopens) from the CLI, and its tape must be the tape of a memory:// run of the same inputs.
"""

from __future__ import annotations

import json
import signal
from pathlib import Path
from typing import Any

import pytest

from tests.engine.support_o44.support_scene import (MODEL, PRESERVED, PROCESS, START, cli, comparable, drive,
                                                    model_stub, scene, wait_for, worker)
from tests.engine.support_o44.support_stub import SupportStub


@pytest.fixture
def stub(monkeypatch: pytest.MonkeyPatch) -> Any:
    with model_stub(monkeypatch, client_in_process=False) as server:
        yield server


def _hashes(tape: list[dict[str, Any]]) -> list[str]:
    return [e["data"]["request"]["sha256"] for e in tape if (e.get("data") or {}).get("note") == "llm_call"
            and (e["data"].get("purpose") == "conflict_resolution" or e["activity"] == "classify"
                 or e["actor"] == "classify")]


def test_a_worker_killed_while_the_model_answers_leaves_the_ticket_to_another_with_the_same_tape(
        stub: SupportStub, tmp_path: Path) -> None:
    with scene(tmp_path, stub.url) as sc:
        workers = {name: worker(sc, name) for name in ("w1", "w2")}
        # two tickets: the first model call of one is held until its worker is killed, the other worker
        # runs the second meanwhile
        stub.hold("classify")
        code, doc = cli(sc["store"], "submit", str(PROCESS), "--data", json.dumps(START), "--count", "2",
                        "--stream", sc["stream"])
        assert code == 0, doc
        assert stub.held.wait(120), "no worker asked the model"  # a worker imports litellm first: seconds, more on a busy machine

        # the worker waiting for the model holds its ticket (within the step's llm.timeout of 5 s)
        code, rows = cli(sc["store"], "list")
        held = [r for r in rows if r["status"] == "running" and r["held_by"] in workers]
        assert held, [(r["status"], r["held_by"]) for r in rows]
        holder = held[0]["held_by"]
        workers[holder].send_signal(signal.SIGKILL)
        assert workers[holder].wait(timeout=10) == -signal.SIGKILL
        stub.release()

        # while the other worker takes it over: the same inputs, undisturbed, in memory
        mem = f"memory://{sc['name']}"
        code, run = cli(mem, "run", str(PROCESS), "--data", json.dumps(START), "--model", MODEL)
        assert code == 3, run
        alone = run["instance_id"]
        drive(mem, alone)
        code, alone_tape = cli(mem, "tape", alone)
        code, alone_final = cli(mem, "inspect", alone)

        def at_rest() -> Any:
            code, rows = cli(sc["store"], "list")
            return rows if len(rows) == 2 and all(r["status"] == "waiting" and not r["held_by"] for r in rows) else None
        wait_for(at_rest, "the other worker to take the ticket over", timeout=120)
        retried = []
        for iid in doc["instance_ids"]:
            code, retry = cli(sc["store"], "tape", iid, "--kind", "retry")
            retried += [(iid, note["data"]) for note in retry]
        [(iid, note)] = retried
        assert note["previous_consumer"] == holder and note["activity_begun"] == "classify", note
        code, waiting = cli(sc["store"], "inspect", iid)
        assert sorted(w["task_id"] for w in waiting["waiting_for"]) == ["two_days", "wait_customer"], waiting

        docs = drive(sc["store"], iid)
        assert docs[-1]["status"] == "completed", docs[-1]
        code, tape = cli(sc["store"], "tape", iid)
        code, final = cli(sc["store"], "inspect", iid)

    assert comparable(tape, iid) == comparable(alone_tape, alone)
    assert comparable([final["layers"]], iid) == comparable([alone_final["layers"]], alone)
    # what holds no clock was sent byte for byte as in the undisturbed run: each classification (and the
    # summaries asked on its request) and each conflict's prompt
    assert _hashes(tape) == _hashes(alone_tape) and len(_hashes(tape)) == 15
    for key in PRESERVED:
        assert key in final["layers"]["L3"], key
