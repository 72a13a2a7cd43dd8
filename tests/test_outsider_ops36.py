"""An operations team runs layerflow at scale with workers sharing a Redis server, from README.md and
DESIGN.md alone.

The process (tests/outsider_ops36/ops36_claims.bpmn and its .layerflow.yaml): a model triage (the
offline handler stands in for the model) -> a slow external check (a handler that records each run
of it) -> intake (a person) -> a parallel finance / risk assessment that disagree on ``payout`` -> a
join that asks a person -> a one-second cool-off timer -> settle. Real ``layerflow worker``
processes, ``layerflow submit``, the CLI and the REST API (the app ``layerflow serve`` runs, in this
process: one process start less) work on redis://127.0.0.1:6379/14 with key prefixes of this module's
own (removed afterwards).

What the team found:

* ``layerflow list`` showed an instance a worker was running as ``waiting`` with no ``held_by``
  when the worker had woken it for its due timer: ``held_by`` was looked up for ``running``
  instances only, so an operator saw it waiting for the timer while it ran (and ``inspect`` had no
  ``held_by`` at all). Every instance someone runs right now now names who.
* A timer's wake-up entry that went to the dead letters (a worker started on the wrong ``--store``
  took it) was requeued without its ``wake``: the worker on the right store then acknowledged it
  without firing the due timer (the instance was ``waiting``, at rest), and the timer scan had
  marked that due time queued for a day. A dead letter now keeps the entry's ``wake``, and
  ``requeue`` puts it back with it.
* ``layerflow resume`` refused beside a worker said the holder's lease "runs out within 60 s" (the
  CLI's own lease time); a worker's lease lasts its ``--idle-ms`` (30 s unless set). It says so now.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from fastapi.testclient import TestClient

from engine.api import create_app
from tests.engine.engine_helpers import redis_scratch, stop_all
from tests.stores.test_lease_lapse_15 import wait_for

ROOT = Path(__file__).resolve().parent
OPS = ROOT / "outsider_ops36"
CLAIMS = OPS / "ops36_claims.bpmn"
WAKE = OPS / "ops36_wake.bpmn"
REDIS = "redis://127.0.0.1:6379/14"
TOKEN = "ops36-token"


@pytest.fixture
def scene(tmp_path: Path) -> Iterator[dict[str, Any]]:
    """A key prefix and stream of one test's own on DB 14; its keys, and the processes it started, go
    afterwards."""
    procs: list[subprocess.Popen[str]] = []
    side = tmp_path / "side_effects.log"
    side.write_text("")
    env = dict(os.environ, PYTHONPATH=str(ROOT.parent), OPS36_SIDE_EFFECTS=str(side), OPS36_SLOW_S="1.0")
    with redis_scratch(REDIS, "workers36") as name:
        try:
            yield {"name": name, "store": f"{REDIS}?prefix={name}", "stream": f"{name}-ready", "procs": procs,
                   "env": env, "side": side, "tmp": tmp_path}
        finally:
            stop_all(procs)


def cli(scene: dict[str, Any], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "engine.cli", *args, "--store", scene["store"]], capture_output=True,
                          text=True, env=scene["env"], cwd=ROOT.parent, timeout=60)


def look(scene: dict[str, Any], *args: str) -> tuple[int, Any]:
    """`layerflow ... --json` in this process (click's runner: the workers it works beside are real
    processes, the CLI's own start-up is not the point): exit code and its JSON document."""
    from click.testing import CliRunner

    from engine.cli import main

    out = CliRunner().invoke(main, [*args, "--store", scene["store"], "--json"])
    return out.exit_code, json.loads(out.stdout)


def worker(scene: dict[str, Any], name: str) -> subprocess.Popen[str]:
    proc = subprocess.Popen([sys.executable, "-m", "engine.cli", "worker", "--store", scene["store"], "--stream",
                             scene["stream"], "--consumer", name, "--idle-ms", "1000", "--timer-interval", "0.3",
                             "--json"], env=scene["env"], cwd=ROOT.parent, stdout=subprocess.PIPE,
                            stderr=(scene["tmp"] / f"{name}.err").open("w"), text=True)
    scene["procs"].append(proc)
    return proc


def side_effects(scene: dict[str, Any]) -> list[tuple[str, int]]:
    """(instance id, pid) of every run of ``slow_check``, in order."""
    rows = [line.split() for line in scene["side"].read_text().splitlines()]
    return [(iid, int(pid)) for iid, pid in rows]


def comparable(events: list[dict[str, Any]], iid: str) -> list[str]:
    """A tape as JSON lines without what differs between two runs of the same claim (times, ids,
    the actor a worker signs with), and without the takeover's own ``retry`` note."""
    out = []
    for event in events:
        if event.get("kind") == "note" and (event.get("data") or {}).get("note") == "retry":
            continue
        event = {k: v for k, v in event.items() if k not in ("time", "seq")}
        text = json.dumps(event, sort_keys=True).replace(iid, "IID")
        # snapshots and branch contexts are named by a seq, which the retry note moves on by one
        text = re.sub(r"(snap:\w+:|@)\d+", r"\1N", text)
        text = re.sub(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}", "UUID", text)
        text = re.sub(r"\"(created|updated|time|timestamp|deadline|answered_at|due)\": [0-9.e+]+", r'"\1": T', text)
        text = re.sub(r"\"(due|time|answered_at_iso|created_iso)\": \"[^\"]+\"", r'"\1": "T"', text)
        out.append(text)
    return out


def test_a_fleet_of_workers_survives_a_kill_and_a_sigterm_and_answers_from_cli_and_rest(scene):
    """Three workers take three claims. One is SIGKILLed inside the slow check: another takes the entry
    over after --idle-ms, runs the check again (a ``retry`` note says so), and the claim ends as an
    uninterrupted run of it does. One gets SIGTERM inside the check: it finishes and saves it, exits 0
    with its stats. While a worker holds a claim, ``layerflow resume`` is refused (exit 2, naming the
    holder) and a REST resume answers it once the worker let go. Timers fire through the workers."""
    workers = {name: worker(scene, name) for name in ("w1", "w2", "w3")}
    by_pid = {proc.pid: name for name, proc in workers.items()}
    code, doc = look(scene, "submit", str(CLAIMS), "--data", '{"claim_id": "C-7", "amount": 8000}', "--count", "3",
                     "--stream", scene["stream"])
    assert code == 0, doc
    assert set(doc) == {"instance_ids", "stream"} and doc["stream"] == scene["stream"]
    ids = doc["instance_ids"]

    # the first check to start: its worker dies with it
    killed_iid, pid = wait_for(lambda: side_effects(scene)[:1], "a first slow check")[0]
    killed = by_pid[pid]
    workers[killed].send_signal(signal.SIGKILL)
    # the next check started elsewhere: SIGTERM there, the check finishes and is saved
    termed_iid, pid = wait_for(lambda: [
        r for r in side_effects(scene)[1:] if by_pid.get(r[1]) not in (None, killed)][:1], "a second slow check")[0]
    termed = by_pid[pid]
    workers[termed].send_signal(signal.SIGTERM)
    # while a worker holds a claim: `list` names it, `resume` is refused naming it, nothing changed
    code, rows = look(scene, "list")
    running = {r["instance_id"]: r["held_by"] for r in rows if r["held_by"]}
    assert running.get(termed_iid) == termed, rows
    code, refused = look(scene, "resume", termed_iid, "--answer", 'intake={"ok": true}')
    assert code == 2, refused
    assert refused["error"]["kind"] == "invalid_state" and termed in refused["error"]["message"], refused
    # how long a dead holder blocks it: a worker's lease lasts its --idle-ms (1 s here), not the CLI's 60 s
    assert "runs out within 60 s" not in refused["error"]["message"] and "--idle-ms" in refused["error"]["message"]
    # the REST API the server runs (`layerflow serve --store` this store), in this process
    with TestClient(create_app(scene["store"], OPS, TOKEN), headers={"Authorization": f"Bearer {TOKEN}"}) as api:
        # REST waits for the lease (up to 5 s) or comes after the save: the answer is taken either way
        reply = api.post(f"/api/instances/{termed_iid}/resume",
                         json={"answers": {"user_tasks": {"intake": {"ok": True}}}})
        assert reply.status_code == 200, reply.text
        assert reply.json()["waiting_for"][0]["id"] == "join/payout", reply.json()

        assert workers[killed].wait(timeout=10) == -signal.SIGKILL
        stats = json.loads(workers[termed].communicate(timeout=20)[0])
        assert workers[termed].returncode == 0 and stats["consumer"] == termed and stats["acked"] >= 1, stats
        assert "received SIGTERM" in (scene["tmp"] / f"{termed}.err").read_text()

        # every claim comes to intake; one by the CLI, the rest through REST, the conflict answered too
        def all_at_intake() -> bool:
            code, rows = look(scene, "list")
            return {r["instance_id"] for r in rows if r["status"] == "waiting" and not r["held_by"]} >= set(ids)
        wait_for(all_at_intake, "every claim at intake")
        baseline = next(iid for iid in ids if iid not in (killed_iid, termed_iid))
        for iid in ids:  # the CLI answers one claim, REST the others (the killed one and its baseline alike)
            if iid not in (killed_iid, baseline):
                code, out = look(scene, "resume", iid, "--answer", 'intake={"ok": true}', "--answer",
                                 "join/payout=4000")
                assert code == 3, out  # waiting for the cool-off timer
                assert [w["kind"] for w in out["waiting_for"]] == ["timer"]
                continue
            reply = api.post(f"/api/instances/{iid}/resume", json={"answers": {
                "user_tasks": {"intake": {"ok": True}}, "confirmations": {"join/payout": 4000}}})
            assert reply.status_code == 200 and reply.json()["status"] == "waiting", reply.text

        def all_completed() -> list[dict[str, Any]] | None:
            code, rows = look(scene, "list")
            return rows if all(r["status"] == "completed" for r in rows if r["instance_id"] in ids) else None
        rows = wait_for(all_completed, "the workers to fire every cool-off timer")
        assert all(r["held_by"] is None for r in rows), rows

    runs = [iid for iid, _ in side_effects(scene)]
    assert {iid: runs.count(iid) for iid in ids} == {iid: 2 if iid == killed_iid else 1 for iid in ids}, runs
    code, retry = look(scene, "tape", killed_iid, "--kind", "retry")
    [note] = retry
    assert note["data"]["previous_consumer"] == killed and note["data"]["activity_begun"] == "slow_check", note

    # the killed claim ends exactly as an uninterrupted run of it: nothing applied twice, nothing lost
    code, stored = look(scene, "inspect", killed_iid)
    code, alone = look(scene, "inspect", baseline)
    assert stored["status"] == alone["status"] == "completed"
    assert comparable([stored["layers"]], killed_iid) == comparable([alone["layers"]], baseline)
    code, tape = look(scene, "tape", killed_iid)
    code, alone_tape = look(scene, "tape", baseline)
    assert comparable(tape, killed_iid) == comparable(alone_tape, baseline)


def test_a_timer_s_wake_up_dead_lettered_and_requeued_fires_the_timer_and_list_shows_who_runs_it(scene, monkeypatch):
    """A worker started on the wrong --store takes a timer's wake-up entry and dead-letters it (the
    instance is not in its store; a memory:// one here: an entry names the Redis or sqlite store it was
    queued for, and a worker of another such store leaves it to that store's workers, uncounted, see
    tests/test_outsider49_kyc.py). The operator sees it in ``layerflow worker dead``, stops that worker
    and requeues the letter: the right worker fires the timer (it acknowledged the entry without running
    the waiting instance, and the scan had marked the due time queued for a day). While it runs the slow
    check after the timer, ``list`` and ``inspect`` name it as the holder (it said ``waiting``, held by
    nobody)."""
    from engine.worker import enqueue_due_timers, queue_client, run_worker, submit
    from engine import Engine

    monkeypatch.setenv("OPS36_SIDE_EFFECTS", str(scene["side"]))
    monkeypatch.setenv("OPS36_SLOW_S", "0.8")
    client = queue_client(queue_url=REDIS)
    stream, store = scene["stream"], scene["store"]
    try:
        iid = submit(store, WAKE, {}, stream=stream, client=client)
        assert run_worker(store, client=client, stream=stream, stop_after=1, timer_interval=0,
                          consumer="right").statuses == {"waiting": 1}
        time.sleep(1.05)  # the cool-off is due; the scan puts the wake-up on the stream
        assert enqueue_due_timers(Engine(store), client, stream, interval=0.1) == 1
        wrong = run_worker(f"memory://{scene['name']}gone", client=client, stream=stream, stop_after=1,
                           timer_interval=0, consumer="wrong", max_deliveries=1)
        assert wrong.dead == 1

        code, dead = look(scene, "worker", "dead", "--stream", stream)
        [letter] = dead["dead_letters"]
        assert code == 0 and letter["instance_id"] == iid and letter["wake"] == "timer", dead
        code, requeued = look(scene, "worker", "requeue", letter["id"], "--stream", stream)
        assert code == 0 and requeued["requeued"] == letter["id"], requeued

        stop = threading.Event()
        stats: list[Any] = []
        thread = threading.Thread(target=lambda: stats.append(run_worker(
            store, client=client, stream=stream, stop_after=1, timer_interval=0, consumer="right", stop=stop)))
        thread.start()
        try:
            wait_for(lambda: side_effects(scene), "the slow check after the timer", timeout=5)
            code, rows = look(scene, "list")
            assert [(r["status"], r["held_by"]) for r in rows] == [("waiting", "right")], rows
            code, doc = look(scene, "inspect", iid)
            assert doc["held_by"] == "right", doc.get("held_by")
        finally:
            thread.join(timeout=10)
            stop.set()
        assert stats[0].ran == 1 and stats[0].statuses == {"completed": 1}, stats
        code, doc = look(scene, "inspect", iid)
        assert doc["status"] == "completed" and doc["held_by"] is None
    finally:
        client.close()


def test_two_writers_the_stale_one_is_refused_naming_the_instance_and_both_versions(scene, monkeypatch):
    """Two clerks load the same waiting claim; the first answers intake, the second answers on what it
    read: refused, naming the instance, the version it expected and the stored one, nothing written. A
    REST change that carries a stale ``expected_version`` gets 409 the same way."""
    from context_layers.errors import VersionConflict
    from engine import Engine, load_process

    monkeypatch.setenv("OPS36_SLOW_S", "0")
    first, second = Engine(scene["store"]), Engine(scene["store"])
    claim = first.run(first.start(load_process(CLAIMS), {"claim_id": "C-8", "amount": 8000}))
    assert claim.status == "waiting"
    mine, theirs = first.load(claim.id), second.load(claim.id)
    read = theirs.version
    done = first.complete_user_task(mine, "intake", {"ok": True})
    with pytest.raises(VersionConflict) as refused:
        second.complete_user_task(theirs, "intake", {"ok": False})
    message = str(refused.value)
    assert claim.id in message and f"expected version {read}" in message and f"stored version {done.version}" in message
    stored = first.load(claim.id)
    assert stored.version == done.version and stored.main.resolve("ok") is True

    with TestClient(create_app(scene["store"], OPS, TOKEN), headers={"Authorization": f"Bearer {TOKEN}"}) as api:
        reply = api.post("/api/context-governance/inject", json={
            "instance_id": claim.id, "key": "note", "value": "late", "expected_version": read})
        assert reply.status_code == 409, reply.text
        error = reply.json()["error"]
        assert error["kind"] == "version_conflict" and f"version {done.version}" in error["message"] \
            and f"version {read}" in error["message"], error
    assert first.load(claim.id).version == done.version
