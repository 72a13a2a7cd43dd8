"""Round 37: dead letters written before they kept the entry's ``wake`` (and ``store``).

A dead letter of a due timer's wake-up, written by a layerflow from before ``wake`` was kept, has no
``wake``: requeued, its entry found the instance ``waiting`` (at rest) and was acknowledged without
firing the timer, which the timer scan had marked queued for a day. A worker now runs a waiting
instance whose timer (or a confirmation's timeout) is due whatever the entry says, and ``layerflow
worker dead`` names such a letter as one from an older layerflow instead of showing it as a plain
entry. The real Redis, database 14, a key prefix and a stream of this module's own.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from engine import Engine
from engine.cli import main
from engine.worker import DeadLetter, dead_letters, queue_client, requeue, run_worker, submit

from tests.engine.engine_helpers import redis_scratch
from tests.stores.test_lease_lapse_15 import wait_for

ROOT = Path(__file__).resolve().parents[2]
WAKE = ROOT / "tests" / "outsider_ops36" / "ops36_wake.bpmn"  # a one-second timer, then an activity
REDIS = "redis://127.0.0.1:6379/14"

#: a dead letter as the first layerflow with dead letters wrote it: no wake, no store, no format
OLD_LETTER = {"instance_id": "", "entry_id": "1700000000000-0", "error_type": "NotInWorkerStore",
              "error": "instance is not in this worker's store", "consumer": "old-worker", "group": "workers",
              "time": "2026-01-01T00:00:00+00:00", "deliveries": "5"}


@pytest.fixture
def scene(monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, Any]]:
    monkeypatch.delenv("OPS36_SIDE_EFFECTS", raising=False)
    monkeypatch.setenv("OPS36_SLOW_S", "0")
    with redis_scratch(REDIS, "w37dead") as name:
        client = queue_client(queue_url=REDIS)
        try:
            yield {"store": f"{REDIS}?prefix={name}", "stream": f"{name}-ready", "client": client}
        finally:
            client.close()


def cli(scene: dict[str, Any], *args: str) -> tuple[int, str, str]:
    out = CliRunner().invoke(main, [*args, "--store", scene["store"], "--stream", scene["stream"]])
    return out.exit_code, out.stdout, out.stderr


def waiting_with_a_due_timer(scene: dict[str, Any]) -> str:
    store, stream, client = scene["store"], scene["stream"], scene["client"]
    iid = submit(store, WAKE, {}, stream=stream, client=client)
    assert run_worker(store, client=client, stream=stream, stop_after=1, timer_interval=0,
                      consumer="first").statuses == {"waiting": 1}
    engine = Engine(store)
    wait_for(engine.due_timers, "the one-second timer to come due", timeout=10)
    return iid


def test_an_old_timer_dead_letter_is_listed_as_old_and_requeued_fires_the_timer(scene):
    store, stream, client = scene["store"], scene["stream"], scene["client"]
    iid = waiting_with_a_due_timer(scene)
    dead_id = client.xadd(f"{stream}:dead", {**OLD_LETTER, "instance_id": iid})

    code, out, err = cli(scene, "worker", "dead", "--json")
    assert code == 0, err
    [letter] = json.loads(out)["dead_letters"]
    assert (letter["id"], letter["instance_id"], letter["wake"], letter["store"]) == (dead_id, iid, "", ""), letter
    assert letter["format"] == 1 and letter["deliveries"] == 5, letter
    code, out, err = cli(scene, "worker", "dead")
    assert code == 0 and dead_id in out and iid in out, (out, err)
    assert "written by a layerflow from before dead letters kept their entry's wake and store" in out, out
    code, out, err = cli(scene, "list")
    assert code == 0 and f"dead letter {dead_id}" in out and "waiting" in out, (out, err)

    code, out, err = cli(scene, "worker", "requeue", dead_id)
    assert code == 0, err
    assert dead_letters(client, stream) == []
    [(_entry, fields)] = [row for row in client.xrange(stream) if row[1].get("instance_id") == iid][-1:]
    assert "wake" not in fields  # nothing to put back: the letter did not keep it

    stats = run_worker(store, client=client, stream=stream, stop_after=1, timer_interval=0, consumer="second")
    assert (stats.ran, stats.statuses) == (1, {"completed": 1}), stats
    assert Engine(store).load(iid).status == "completed"


def test_a_plain_entry_of_a_waiting_instance_whose_timer_is_not_due_is_acknowledged_unrun(scene):
    """The other side of it: an entry without wake for an instance waiting on a timer not yet due is
    acknowledged, nothing run (the timer scan wakes it when it comes due)."""
    store, stream, client = scene["store"], scene["stream"], scene["client"]
    iid = submit(store, WAKE, {}, stream=stream, client=client)
    assert run_worker(store, client=client, stream=stream, stop_after=1, timer_interval=0).statuses == {"waiting": 1}
    version = Engine(store).load(iid).version
    client.xadd(stream, {"instance_id": iid})
    stats = run_worker(store, client=client, stream=stream, stop_after=1, timer_interval=0)
    assert (stats.acked, stats.ran, stats.statuses) == (1, 0, {"waiting": 1}), stats
    assert Engine(store).load(iid).version == version


def test_a_new_letter_says_its_format_and_reading_odd_fields_does_not_crash(scene):
    letter = DeadLetter.from_entry("1-0", {"instance_id": "x", "deliveries": "five"})
    assert (letter.deliveries, letter.format, letter.wake) == (0, 1, "")
    client, stream = scene["client"], scene["stream"]
    client.xadd(f"{stream}:dead", {"instance_id": "gone", "entry_id": "1-0", "deliveries": "2", "wake": "timer",
                                   "store": "redis db 14 prefix 'x'", "format": "2"})
    [read] = dead_letters(client, stream)
    assert (read.format, read.wake, read.store) == (2, "timer", "redis db 14 prefix 'x'")
    entry_id = requeue(client, read.id, stream)
    assert client.xrange(stream, min=entry_id, max=entry_id)[0][1] == {
        "instance_id": "gone", "wake": "timer", "store": "redis db 14 prefix 'x'"}
