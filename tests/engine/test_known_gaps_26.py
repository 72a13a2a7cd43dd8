"""Gaps closed in round 26.

(a) The engine's clock (``Engine(clock=...)``) fixed confirmation deadlines, ``answered_at`` and
    timers, but every tape event was stamped with the wall clock (``LayeredContext._emit`` read
    ``time.time()``), and so were the instance record's ``created`` and ``updated``: a test, a
    simulation or a ``resume --now`` got a tape whose times disagreed with the rest of the instance.
    Now each context carries the clock that stamps its events (``LayeredContext(clock=...)``; a
    branch forked at a split takes its parent's; the engine gives every context it starts or
    loads its own clock), on every path: the Python API, the CLI's ``--now``, REST, workers; the
    stores list an instance by the ``created``/``updated`` its record carries; the terminal prompt
    counts a confirmation's deadline down on the clock that set it.
(b) The seed's ``_splitSnapshot`` JSON: DESIGN.md names no such document (a split writes only
    ``contextInject``, ``_branch_id`` and ``_snapshot_id`` into a branch's WORKING, and its snapshot is
    structurally shared, never deep-copied), so no interface was added: what it carries is the
    ``split`` note plus the snapshot the note names (README maps the fields), checked in (a).
(c) A worker's ``retry`` note (a takeover from a dead worker) could not say which activity the dead
    worker had begun. Workers now SET ``<stream>:begun:<instance id>`` on the queue's Redis before each
    activity (task id and the saved version it starts from; the non-worker paths write nothing), and
    the takeover's note names it as ``activity_begun`` when it began after the last save.
"""

from __future__ import annotations

import json
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from click.testing import CliRunner

from context_layers import LayeredContext
from context_layers.stores import InstanceRecords, open_store
from engine import Engine, Instance, load_process
from engine.cli import main

from engine_helpers import EXAMPLES

HERE = Path(__file__).parent / "gaps26"
PARALLEL_USER_TASK = EXAMPLES / "parallel_user_task.bpmn"
REVIEW = {"user_tasks": {"review": {"approved": True, "reviewer": "ann"}}}
T0 = 1_000_000_000.0  # 2001-09-09, far from any wall clock a test runs on


class Clock:
    """An engine clock that stands still until the test moves it."""

    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def times(instance: Instance) -> dict[str, set[float]]:
    return {name: {e.time for e in ctx.tape} for name, ctx in instance.contexts.items()}


# ============================================================ (a) the engine's clock stamps the tape

def test_engine_clock_stamps_every_tape_event_and_the_record(tmp_path: Path) -> None:
    store = f"sqlite:///{tmp_path / 'clock.db'}"
    clock = Clock(T0)
    engine = Engine(store, clock=clock)
    instance = engine.run(engine.start(load_process(PARALLEL_USER_TASK), {"title": "T"}))
    assert instance.status == "waiting" and len(instance.contexts) == 3  # main and the split's two branches
    assert times(instance) == {name: {T0} for name in instance.contexts}
    assert (instance.created, instance.updated) == (T0, T0)
    # the seed's _splitSnapshot (snapshotId, splitGatewayId, timestamp, branchIds, context) is the split
    # note and the snapshot it names (README): its time is now the engine's clock too
    split = next(e for e in instance.main.tape if e.data.get("note") == "split")
    assert (split.data["gateway_id"], sorted(split.data["branches"]), split.time) == (
        "fork", ["estimate", "review"], T0)
    assert instance.main.get_snapshot(split.data["snapshot_id"]).label == "split:fork"

    clock.now = T0 + 60
    again = Engine(store, clock=clock)  # loaded from the store: its contexts take this engine's clock
    loaded = again.load(instance.id)
    assert times(loaded) == times(instance) and (loaded.created, loaded.updated) == (T0, T0)
    done = again.resume(loaded, answers=REVIEW)
    assert done.status == "completed"
    new = [e for e in done.main.tape if e.seq > len(instance.main.tape)]
    assert new and {e.time for e in new} == {T0 + 60}
    assert (done.created, done.updated) == (T0, T0 + 60)
    for ctx in done.contexts.values():  # the times replay as they were written
        rebuilt = LayeredContext.from_dict(ctx.to_dict())
        assert rebuilt == ctx and rebuilt.tape.to_list() == ctx.tape.to_list()
    record = InstanceRecords(open_store(store)).load(done.id)
    assert (record["created"], record["updated"]) == (T0, T0 + 60)


def test_without_a_clock_the_tape_keeps_the_wall_clock() -> None:
    before = time.time()
    engine = Engine("memory://")
    instance = engine.run(engine.start(load_process(PARALLEL_USER_TASK), {"title": "T"}))
    after = time.time()
    assert all(before <= t <= after for ts in times(instance).values() for t in ts)
    assert before <= instance.created <= instance.updated <= after


def test_a_context_takes_a_clock_and_its_branches_inherit_it() -> None:
    from gateways import ContextSplitter

    ctx = LayeredContext(system={"policy": "p"}, clock=Clock(T0))
    ctx.write("L4", "amount", 10, actor="submit")
    splitter = ContextSplitter()
    a, b = splitter.split(ctx, "gw", ["a", "b"])
    a.context.write("L4", "x", 1, actor="a")
    b.context.write("L4", "x", 2, actor="b")
    splitter.join(ctx, [a, b], {"mergeStrategy": "LAST_WRITER_WINS"})
    assert {e.time for c in (ctx, a.context, b.context) for e in c.tape} == {T0}
    [conflict] = ctx.get("_mergedConflicts")
    assert conflict["time"] == "2001-09-09T01:46:40.000Z"  # T0: the join's log is on the context's clock too


def test_resume_now_stamps_the_tape_with_the_moment_it_names(tmp_path: Path) -> None:
    store = f"sqlite:///{tmp_path / 'cli.db'}"
    runner = CliRunner()
    started = runner.invoke(main, ["run", str(PARALLEL_USER_TASK), "--data", json.dumps({"title": "T"}),
                                   "--store", store, "--json"], catch_exceptions=False)
    assert started.exit_code == 3, started.output
    iid = json.loads(started.stdout)["instance_id"]
    answers = tmp_path / "answers.json"
    answers.write_text(json.dumps(REVIEW))
    now = datetime(2031, 1, 6, 9, 0, tzinfo=timezone.utc).timestamp()
    resumed = runner.invoke(main, ["resume", iid, "--answers", str(answers), "--now", "2031-01-06T09:00:00Z",
                                   "--store", store, "--json"], catch_exceptions=False)
    assert resumed.exit_code == 0, resumed.output
    done = Engine(store).load(iid)
    first = json.loads(started.stdout)["tape_length"]
    later = [e.time for ctx in done.contexts.values() for e in ctx.tape if e.time > time.time() + 3600]
    assert later, "the resumed run's events are stamped by the wall clock, not by --now"
    assert all(now <= t < now + 600 for t in later)
    assert len([e for ctx in done.contexts.values() for e in ctx.tape]) > first
    assert now <= done.updated < now + 600 and done.created < now


def test_rest_api_stamps_the_tape_with_its_engine_s_clock(tmp_path: Path) -> None:
    from fastapi.testclient import TestClient

    from engine.api import create_app

    catalog = tmp_path / "catalog"
    catalog.mkdir()
    (catalog / PARALLEL_USER_TASK.name).write_text(PARALLEL_USER_TASK.read_text())
    clock = Clock(T0)
    engine = Engine("memory://gaps26rest", clock=clock)
    auth = {"Authorization": "Bearer gaps26-token"}
    with TestClient(create_app(engine, catalog, "gaps26-token")) as client:
        made = client.post("/api/instances", json={"process_id": "parallel_user_task", "data": {"title": "T"}},
                           headers=auth)
        assert made.status_code == 201, made.text
        iid = made.json()["instance_id"]
        clock.now = T0 + 5
        done = client.post(f"/api/instances/{iid}/resume", json={"answers": REVIEW}, headers=auth)
        assert done.status_code == 200 and done.json()["status"] == "completed", done.text
        tape = client.get(f"/api/instances/{iid}/tape", headers=auth).json()["events"]
    assert {e["time"] for e in tape} == {T0, T0 + 5}


def test_worker_stamps_its_takeover_note_and_run_with_its_engine_s_clock(tmp_path: Path) -> None:
    from engine.worker import WorkerStats, _run_to_rest

    store = open_store(f"sqlite:///{tmp_path / 'worker.db'}")
    clock = Clock(T0)
    engine = Engine(InstanceRecords(store), clock=clock)
    iid = engine.start(load_process(PARALLEL_USER_TASK), {"title": "T"}).id
    clock.now = T0 + 7
    retry = {"entry_id": "1-0", "delivery": 2, "previous_consumer": "doomed", "consumer": "heir"}
    _run_to_rest(engine, "1-0", iid, WorkerStats("heir"), store=store, retry=retry)
    instance = engine.load(iid)
    note = next(e for e in instance.main.tape if e.data.get("note") == "retry")
    assert note.time == T0 + 7
    assert times(instance)["main"] == {T0, T0 + 7}


# ============================================================ (c) the takeover names the activity begun

REDIS = "redis://127.0.0.1:6379/10"
# another round's fixture, used as it is: prepare, two parallel checks, then slow_step, which sleeps
# on its first attempt (``$LAYERFLOW_TEST_SLOW_MARKER`` not there yet) so its worker can be killed in it
SLOW = Path(__file__).parents[1] / "stores" / "fixtures" / "slow_process.bpmn"
ROOT = Path(__file__).resolve().parents[2]


def test_takeover_retry_note_names_the_activity_the_dead_worker_had_begun(tmp_path: Path,
                                                                          monkeypatch: Any) -> None:
    import os
    import signal
    import subprocess
    import sys

    from engine.worker import queue_client, run_worker, submit

    from engine_helpers import redis_scratch

    with redis_scratch(REDIS, "gaps26") as prefix:
        store = f"sqlite:///{tmp_path / 'workers.db'}"
        stream = f"{prefix}-ready"
        client = queue_client(queue_url=REDIS)
        marker = tmp_path / "slow_step.started"
        monkeypatch.setenv("LAYERFLOW_TEST_SLOW_MARKER", str(marker))
        code = ("import sys; from engine.worker import run_worker; run_worker(sys.argv[1], queue_url=sys.argv[2], "
                "stream=sys.argv[3], consumer='doomed', idle_ms=500, timer_interval=0, stop_after=1)")
        doomed = subprocess.Popen([sys.executable, "-c", code, store, REDIS, stream], cwd=ROOT,
                                  env={**os.environ, "PYTHONPATH": str(ROOT)}, stderr=subprocess.DEVNULL)
        try:
            iid = submit(store, SLOW, {"amount": 21}, queue_url=REDIS, stream=stream, client=client)
            deadline = time.monotonic() + 30
            while not (marker.exists() and marker.read_text()):
                assert doomed.poll() is None and time.monotonic() < deadline, "the worker never reached slow_step"
                time.sleep(0.02)
            doomed.send_signal(signal.SIGKILL)  # in the middle of slow_step
            doomed.wait(timeout=10)
            stats = run_worker(store, queue_url=REDIS, stream=stream, consumer="heir", idle_ms=500, block_ms=100,
                               timer_interval=0, stop_after=1, client=client)
            assert stats.reclaimed >= 1 and stats.statuses == {"completed": 1}, stats  # (busy while the lease ran out)
            tape = Engine(store).load(iid).main.tape
            [retry] = [e for e in tape if e.data.get("note") == "retry"]
            assert retry.data["previous_consumer"] == "doomed"
            assert retry.data["activity_begun"] == "slow_step", retry.data
            # begun after the last save, and run again after the note, once on the tape
            [again] = [e.seq for e in tape if e.kind == "begin" and e.activity == "slow_step"]
            assert again > retry.seq
            assert not client.exists(f"{stream}:begun:{iid}"), "the marker goes once the instance is at rest"
        finally:
            if doomed.poll() is None:
                doomed.kill()
                doomed.wait()
            client.delete(stream)
            client.close()


def test_the_store_lists_an_instance_as_saved_by_the_engine_s_clock(tmp_path: Path) -> None:
    """``layerflow list`` / ``GET /api/instances`` read the store's created/updated: the engine's saves
    set them (a store's own clock stays for records that carry no times, and for leases)."""
    from engine_helpers import redis_scratch

    with redis_scratch(REDIS, "gaps26") as prefix:
        for url in ("memory://gaps26list", f"sqlite:///{tmp_path / 'list.db'}", f"{REDIS}?prefix={prefix}"):
            clock = Clock(T0)
            engine = Engine(url, clock=clock)
            instance = engine.start(load_process(PARALLEL_USER_TASK), {"title": "T"})
            clock.now = T0 + 30
            engine.run(instance)
            [row] = [r for r in open_store(url).list_instances() if r["instance_id"] == instance.id]
            assert (row["created"], row["updated"]) == (T0, T0 + 30), url


def test_the_terminal_prompt_counts_a_deadline_down_on_the_engine_s_clock(monkeypatch: Any) -> None:
    """A confirmation's deadline is set by the engine's clock (``resume --now``: NOW + timeout); the
    person's countdown read the wall clock, so under ``--now`` it showed days left instead of the timeout."""
    import engine.cli as cli
    from engine.confirm import TerminalPrompt

    monkeypatch.setattr(cli, "stdin_is_terminal", lambda *a: True)
    clock = Clock(T0)
    prompt = cli._asker(cli._Out(False), False, False, clock=clock)
    assert isinstance(prompt, TerminalPrompt) and prompt.clock is clock
