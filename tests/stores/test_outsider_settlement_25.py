"""Outsider round 25: an operator runs trade settlement at scale as the README says, with a process of
its own (``settlement25/trade_settlement.bpmn``: enrich, match the confirmation and check the cash in
parallel, a join whose disagreement goes to settlement ops, then book).

Real parts only: ``layerflow serve`` and two ``layerflow worker`` processes (the module's three
subprocesses, stopped by pid) on the shared Redis, database 13, under a prefix, stream and group of the
module's own; trades submitted with ``layerflow submit``; ops answer over REST; one worker is killed
with SIGKILL in the middle of a booking and the other takes the trade over.
"""

from __future__ import annotations

import importlib
import json
import os
import signal
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest
from click.testing import CliRunner

from context_layers import ActivityExtensionConfig, LayeredContext
from context_layers.stores import open_store
from engine import Engine
from gateways import MergedConflict
from gateways.policy import build_human_request

from .conftest import REDIS_URL, drop_prefix, redis_or_skip
from .test_stores_outsider_18 import Procs, base_env, redis_store_url, wait_for

pytestmark = pytest.mark.slow

HERE = Path(__file__).parent / "settlement25"
BPMN = HERE / "trade_settlement.bpmn"
TOKEN = "settle-25"
DB13 = urlsplit(REDIS_URL)._replace(path="/13", query="").geturl()
CONFIRMATION = "settle_join/settlement_status"
BULK = 14


def trade(trade_id: str, *, confirmation: str = "matched", cash: float = 1_000_000) -> dict[str, Any]:
    return {"trade_id": trade_id, "quantity": 100, "price": 187.5, "confirmation": confirmation,
            "cash_available": cash}


def cli(*args: str) -> Any:
    importlib.import_module("engine.cli_worker")  # registers submit / worker
    from engine.cli import main

    return CliRunner().invoke(main, list(args), catch_exceptions=False)


class Day:
    """One operator's day on one Redis store: a server, two workers, and the steps taken on it,
    each once (a test asks for the step it checks; the order the tests run in does not matter)."""

    def __init__(self, tmp: Path, procs: Procs) -> None:
        self.tmp, self.procs = tmp, procs
        self.tag = f"outsider25-{uuid.uuid4().hex[:10]}"
        self.store = redis_store_url(self.tag, DB13)
        self.stream, self.group = f"{self.tag}:ready", self.tag
        self.attempts, self.gate, self.started = tmp / "attempts", tmp / "gate", tmp / "started"
        self.env = base_env(tmp, LAYERFLOW_API_TOKEN=TOKEN, LF25_ATTEMPTS=str(self.attempts),
                            LF25_GATE=str(self.gate), LF25_STARTED=str(self.started), LF25_SLOW_TRADE="T-SLOW")
        self.server = procs.start(tmp, "serve", "--host", "127.0.0.1", "--port", "0", "--catalog", str(HERE),
                                  "--store", self.store, env=self.env, name="serve")
        self.workers = {name: procs.start(tmp, "worker", "--store", self.store, "--queue", DB13, "--stream",
                                          self.stream, "--group", self.group, "--consumer", name, "--idle-ms",
                                          "1000", "--timer-interval", "0.3", env=self.env, name=name)
                        for name in ("wa", "wb")}
        self.base = self._served_at()
        self.http = httpx.Client(base_url=self.base, headers={"Authorization": f"Bearer {TOKEN}"}, timeout=30)
        self.done: dict[str, Any] = {}

    def _served_at(self) -> str:
        err = self.tmp / "serve.err"
        wait_for(lambda: "serving" in err.read_text() or self.server.poll() is not None, "the server to listen")
        line = next((ln for ln in err.read_text().splitlines() if "serving" in ln), "")
        assert " on http://" in line, err.read_text()
        return line.split(" on ", 1)[1].split()[0]

    def log(self, name: str) -> str:
        return (self.tmp / f"{name}.err").read_text()

    def once(self, step: str, fn: Any) -> Any:
        if step not in self.done:
            self.done[step] = fn()
        return self.done[step]

    def submit(self, *trades: dict[str, Any]) -> list[str]:
        ids = []
        for data in trades:
            out = cli("submit", str(BPMN), "--data", json.dumps(data), "--store", self.store, "--queue", DB13,
                      "--stream", self.stream, "--group", self.group, "--json")
            assert out.exit_code == 0, out.output
            ids += json.loads(out.stdout)["instance_ids"]
        return ids

    def doc(self, instance_id: str) -> dict[str, Any]:
        got = self.http.get(f"/api/instances/{instance_id}")
        assert got.status_code == 200, got.text
        return got.json()

    def wait_status(self, instance_id: str, status: str, timeout: float = 20) -> dict[str, Any]:
        wait_for(lambda: self.doc(instance_id)["status"] == status, f"{instance_id} to be {status}", timeout)
        return self.doc(instance_id)

    def bookings(self) -> dict[str, list[int]]:
        """trade id -> the pids that ran its booking, in order."""
        seen: dict[str, list[int]] = {}
        for line in (self.attempts.read_text() if self.attempts.exists() else "").split("\n"):
            if line:
                trade_id, pid = line.split()
                seen.setdefault(trade_id, []).append(int(pid))
        return seen

    # ----------------------------------------------------------------------------- the steps

    def bulk(self) -> list[str]:
        def run() -> list[str]:
            ids = self.submit(*(trade(f"T-{i:04d}") for i in range(BULK)))
            for iid in ids:
                self.wait_status(iid, "completed")
            return ids
        return self.once("bulk", run)

    def broken(self) -> str:
        """A trade whose confirmation does not match: a worker takes it to the join, which asks ops."""
        def run() -> str:
            (iid,) = self.submit(trade("T-BREAK", confirmation="unmatched"))
            self.wait_status(iid, "waiting")
            return iid
        return self.once("broken", run)

    def answered(self) -> dict[str, Any]:
        def run() -> dict[str, Any]:
            iid = self.broken()
            got = self.http.post(f"/api/confirmations/{CONFIRMATION}",
                                 json={"value": "ready", "instance_id": iid, "user": "olga"})
            assert got.status_code == 200, got.text
            return got.json()
        return self.once("answered", run)

    def killed(self) -> dict[str, Any]:
        """SIGKILL the worker that books T-SLOW, in the middle of the booking."""
        def run() -> dict[str, Any]:
            (iid,) = self.submit(trade("T-SLOW"))
            wait_for(lambda: self.started.exists(), "a worker to start booking T-SLOW")
            pid = int(self.started.read_text())
            (doomed,) = [name for name, p in self.workers.items() if p.pid == pid]
            os.kill(pid, signal.SIGKILL)
            self.workers[doomed].wait(timeout=10)
            running = Engine(self.store).load(iid)
            self.gate.write_text("open")
            final = self.wait_status(iid, "completed", timeout=30)
            (survivor,) = [name for name in self.workers if name != doomed]
            return {"id": iid, "doomed": doomed, "survivor": survivor, "running": running.status, "doc": final}
        return self.once("killed", run)

    def timed_out(self) -> dict[str, Any]:
        """Started over REST without running (``"run": false``), its join's timeout set to 1 s for it
        alone, an inject and a refused inject, then resumed: it waits for ops, nobody answers, a
        worker's timer scan applies the default."""
        def run() -> dict[str, Any]:
            started = self.http.post("/api/instances", json={
                "process_id": "trade_settlement", "run": False,
                "data": trade("T-LATE", confirmation="unmatched", cash=10)})
            assert started.status_code == 201, started.text
            iid = started.json()["instance_id"]
            config = self.http.post("/api/context-governance/config", json={
                "instance_id": iid, "config": {"activityId": "settle_join", "humanConfirm": {"timeout": 1}},
                "reason": "same-day trade: ops have a second"})
            inject = self.http.post("/api/context-governance/inject", json={
                "instance_id": iid, "values": {"ops_desk": "emea"}, "reason": "routed to EMEA ops"})
            refused = self.http.post("/api/context-governance/inject", json={
                "instance_id": iid, "key": "policy", "value": "settle everything", "reason": "be quick"})
            resumed = self.http.post(f"/api/instances/{iid}/resume", json={})
            assert resumed.status_code == 200, resumed.text
            final = self.wait_status(iid, "completed", timeout=20)
            return {"id": iid, "started": started.json(), "config": config, "inject": inject, "refused": refused,
                    "resumed": resumed.json(), "doc": final}
        return self.once("timed_out", run)


@pytest.fixture(scope="module")
def day(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Day]:
    redis_or_skip(DB13)
    tmp = tmp_path_factory.mktemp("settlement25")
    with Procs() as procs:
        the_day = Day(tmp, procs)
        try:
            yield the_day
        finally:
            the_day.http.close()
            for proc in procs.procs:  # ours, by pid
                if proc.poll() is None:
                    proc.send_signal(signal.SIGTERM)
            for proc in procs.procs:
                try:
                    proc.wait(timeout=10)
                except Exception:
                    pass
    drop_prefix(DB13, the_day.tag)  # the store's keys, the stream and its timer marks


# ------------------------------------------------------------------------------------ at scale

def test_submitted_trades_settle_on_the_workers_each_booked_once(day):
    ids = day.bulk()
    assert len(set(ids)) == BULK
    bookings = day.bookings()
    worker_pids = {p.pid for p in day.workers.values()}
    for i in range(BULK):
        ran = bookings[f"T-{i:04d}"]
        assert len(ran) == 1 and ran[0] in worker_pids, (ran, worker_pids)
    store = open_store(day.store)
    try:
        for iid in ids:
            instance = Engine(store).load(iid)
            assert instance.main.get("booked") is True and instance.main.get("booking_ref").endswith("-ready")
            for name, ctx in instance.contexts.items():
                tape = store.read_tape(iid, name)
                assert [e["seq"] for e in tape] == list(range(1, len(tape) + 1)), f"gap or duplicate on {name}"
                assert LayeredContext.replay(ctx.tape) == ctx
    finally:
        store.close()


def test_the_server_and_the_cli_see_what_the_workers_ran(day):
    ids = set(day.bulk())
    listed = day.http.get("/api/instances")
    assert listed.status_code == 200
    statuses = {row["id"]: row["status"] for row in listed.json() if row["id"] in ids}
    assert statuses == dict.fromkeys(ids, "completed")
    out = cli("list", "--store", day.store, "--json")
    assert out.exit_code == 0, out.output
    listed_by_cli = {r["instance_id"]: r["status"] for r in json.loads(out.stdout)}
    assert {iid: listed_by_cli[iid] for iid in ids} == dict.fromkeys(ids, "completed")


def test_a_missed_entry_target_is_in_the_compression_notes(day):
    """compressMessageThreshold 4 after the booking: the latest activity is kept whole, so HISTORY keeps
    more entries than the target int(0.5 x 4) = 2; the run says so instead of only target_met false."""
    doc = day.doc(day.bulk()[0])
    (comp,) = doc["compressions"]
    assert comp["activity_id"] == "book_settlement" and comp["target_met"] is False
    left = len(doc["layers"]["L3"])
    assert comp["notes"][0].startswith(f"target of 2 HISTORY entries not met ({left} entries after, {left - 2} over): "
                                       "the latest finished activity (book_settlement) is kept whole"), comp["notes"]


# ---------------------------------------------------------------------------- ops over REST

def test_a_break_waits_for_ops_with_a_prompt_of_whole_sentences(day):
    iid = day.broken()
    pending = day.http.get("/api/confirmations")
    assert pending.status_code == 200
    (mine,) = [c for c in pending.json() if c["instance_id"] == iid]
    assert mine["id"] == CONFIRMATION
    assert mine["message"].startswith("Settlement ops must confirm the settlement status. Parallel branches of "
                                      "'settle_join' disagree on 'settlement_status'"), mine["message"]
    assert {o["value"] for o in mine["options"]} == {"break", "ready", "hold", "$escalate"}


@pytest.mark.parametrize("message, shown", [
    ("Ops must confirm", "Ops must confirm. Parallel"),
    ("Ops must confirm.", "Ops must confirm. Parallel"),
    ("Ops, confirm?", "Ops, confirm? Parallel"),
    ("  Ops must confirm  ", "Ops must confirm. Parallel"),
])
def test_a_confirm_message_is_a_sentence_of_its_own(message, shown):
    conflict = MergedConflict("settlement_status", None, ["break", "ready"], ["match_confirmation", "check_cash"])
    config = ActivityExtensionConfig.model_validate({"humanConfirm": {"message": message, "default": "hold"}})
    request = build_human_request(conflict, gateway_id="settle_join", config=config)
    assert request.message.startswith(shown), request.message


def test_ops_answer_over_rest_and_the_server_books_it(day):
    done = day.answered()
    iid = day.broken()
    assert done["status"] == "completed", done
    history = done["layers"]["L3"]
    assert history["booking_ref"] == "BK-T-BREAK-ready" and history["booked"] is True
    (conflict,) = done["conflicts"]
    assert conflict["resolution"]["resolver"] == "human" and conflict["resolution"]["value"] == "ready"
    assert day.bookings()["T-BREAK"] == [day.server.pid], "the server ran the rest of the instance"
    assert not [c for c in day.http.get("/api/confirmations").json() if c["instance_id"] == iid]


def test_a_second_answer_is_refused_naming_the_first(day):
    day.answered()
    again = day.http.post(f"/api/confirmations/{CONFIRMATION}",
                          json={"value": "break", "instance_id": day.broken(), "user": "piet"})
    assert again.status_code == 409, again.text
    body = again.json()["error"]
    assert body["kind"] == "already_answered" and 'answered "ready" by olga' in body["message"]


# ------------------------------------------------------------------------------ a crash

def test_a_worker_killed_mid_booking_is_taken_over_by_the_other(day):
    killed = day.killed()
    assert killed["running"] == "running", "nothing of the killed booking was committed"
    doomed, survivor = day.workers[killed["doomed"]], day.workers[killed["survivor"]]
    assert doomed.returncode == -signal.SIGKILL and survivor.poll() is None
    assert day.bookings()["T-SLOW"] == [doomed.pid, survivor.pid], "run again by the survivor"
    assert killed["doc"]["layers"]["L3"]["booking_ref"] == "BK-T-SLOW-ready"
    store = open_store(day.store)
    try:
        tape = [e for name in Engine(store).load(killed["id"]).contexts for e in store.read_tape(killed["id"], name)]
    finally:
        store.close()
    begins = [e for e in tape if e["kind"] == "begin" and (e.get("data") or {}).get("task_id") == "book_settlement"]
    assert len(begins) == 1, "the killed attempt left nothing on the tape"


# ------------------------------------------------------------- a timeout, and a late answer

def test_run_false_starts_nothing_and_a_config_change_applies_before_the_join(day):
    late = day.timed_out()
    started = late["started"]
    assert started["status"] == "running" and started["waiting_for"] == []
    assert "activity:enrich_trade" not in started["layers"]["L3"], "no step ran"
    assert late["config"].status_code == 200 and late["config"].json()["config"]["humanConfirm"]["timeout"] == 1
    (asked,) = late["resumed"]["confirmations"]
    assert asked["timeout"] == 1 and asked["default"] == "hold" and late["resumed"]["status"] == "waiting"


def test_a_worker_applies_the_timeout_and_the_trade_is_held(day):
    doc = day.timed_out()["doc"]
    (conflict,) = doc["conflicts"]
    assert conflict["resolution"]["value"] == "hold" and conflict["resolution"]["resolver"] == "policy"
    assert doc["layers"]["L3"]["booking_ref"] == "BK-T-LATE-hold"
    assert day.bookings()["T-LATE"][0] in {p.pid for p in day.workers.values()}, "a worker ran it on"


@pytest.mark.parametrize("value", ["ready", "hold"])
def test_a_late_answer_to_a_completed_instance_gets_advice_that_holds(day, value):
    """Equal to the default or not, an answer to the confirmation itself is refused once the timeout
    settled it; the advice for a completed instance is a rollback, which works on it."""
    iid = day.timed_out()["id"]
    late = day.http.post(f"/api/confirmations/{CONFIRMATION}", json={"value": value, "instance_id": iid})
    assert late.status_code == 409, late.text
    body = late.json()["error"]
    assert body["kind"] == "already_answered" and body["answer"] == "hold"
    message = body["message"]
    assert f"Instance {iid} is completed: nothing runs again" in message and "no rollback" not in message
    assert f"layerflow rollback {iid} SNAPSHOT_ID" in message and "POST /api/context-governance/rollback" in message
    # by its id alone: T-BREAK's confirmation has that id too, and ops answered it
    answered = day.answered()["instance_id"]
    by_id = day.http.post(f"/api/confirmations/{CONFIRMATION}", json={"value": value})
    assert by_id.status_code == 409 and by_id.json()["error"]["kind"] == "already_answered", by_id.text
    assert f"answered already in instances {', '.join(sorted([iid, answered]))}" in by_id.json()["error"]["message"]


def test_the_advised_rollback_works_on_the_completed_instance(day):
    iid = day.timed_out()["id"]

    def events(**params: str) -> list[dict[str, Any]]:
        got = day.http.get(f"/api/instances/{iid}/tape", params={"context": "main", **params})
        assert got.status_code == 200, got.text
        return list(got.json()["events"])

    (join,) = events(kind="join")
    before_join = [e["data"]["snapshot_id"] for e in events(kind="snapshot") if e["seq"] < join["seq"]]
    assert before_join
    back = day.http.post("/api/context-governance/rollback", json={
        "instance_id": iid, "snapshot_id": before_join[-1], "reason": "ops re-decide T-LATE"})
    assert back.status_code == 200, back.text
    after = day.doc(iid)
    assert after["status"] == "completed" and "booking_ref" not in after["layers"]["L3"]
    (restore,) = events(kind="rollback")
    assert restore["data"]["reason"] == "ops re-decide T-LATE"


def test_a_resume_passes_the_timeout_s_own_value_and_refuses_another(day):
    """README: to a resume, an answer equal to what the timeout gave passes (unused: the instance is
    completed); another value is the late answer, refused as on the confirmation's own path."""
    iid = day.timed_out()["id"]

    def resume(value: str) -> httpx.Response:
        return day.http.post(f"/api/instances/{iid}/resume", json={"answers": {"confirmations": {CONFIRMATION: value}}})

    same = resume("hold")
    assert same.status_code == 200 and same.json()["status"] == "completed", same.text
    assert same.json()["notices"] == [f"answer '{CONFIRMATION}' was not used: instance {iid} is completed and "
                                      "waits for nothing"]
    other = resume("ready")
    assert other.status_code == 409 and other.json()["error"]["kind"] == "already_answered", other.text


# --------------------------------------------------------------------------- the tape

def test_tape_kind_denied_lists_the_refused_inject(day):
    late = day.timed_out()
    assert late["refused"].status_code == 403, late["refused"].text
    out = cli("tape", late["id"], "--kind", "denied", "--store", day.store, "--json")
    assert out.exit_code == 0, out.output
    (denied,) = json.loads(out.stdout)
    assert (denied["data"]["note"], denied["data"]["op"], denied["data"]["key"]) == ("governance_denied", "inject",
                                                                                     "policy")
    plain = cli("tape", late["id"], "--kind", "denied", "--store", day.store)
    assert 'op="inject", key="policy", requested_layer="L4", effective_layer="L0"' in plain.stdout, plain.stdout


def test_the_plain_tape_says_what_an_inject_and_a_config_change_did(day):
    late = day.timed_out()
    assert late["inject"].status_code == 200, late["inject"].text
    inject = cli("tape", late["id"], "--kind", "inject", "--store", day.store).stdout
    assert 'op="inject", layer="L4", keys=["ops_desk"], reason="routed to EMEA ops"' in inject, inject
    config = cli("tape", late["id"], "--kind", "config", "--store", day.store).stdout
    assert 'activity_id="settle_join", config_version=1, mode="merge"' in config, config
    assert 'reason="same-day trade: ops have a second"' in config and '"timeout": 1' in config, config


def test_the_processes_ran_to_the_end_without_tracebacks(day):
    day.killed()
    day.timed_out()
    for name in ("serve", *day.workers):
        assert "Traceback" not in day.log(name), day.log(name)[-3000:]
