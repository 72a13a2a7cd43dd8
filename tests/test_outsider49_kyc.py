"""A bank's SRE runs KYC / anti-money-laundering case review (tests/outsider_kyc49/) on a fleet of
``layerflow worker`` processes sharing Redis DB 11, from README.md and ``--help`` alone.

The process: sanctions screening (a model step; its offline handler stands in, reading the sanctions
passages retrieval put in KNOWLEDGE from ``knowledge/sanctions/``), a PEP register lookup (an external
call), two analysts in parallel who may rate the customer differently (a join conflict that a second
person confirms: four eyes), and for a high rating the MLRO escalation sub-process, whose review window
(a timer) may run out while no worker runs.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.engine.engine_helpers import redis_scratch
from tests.engine.support_o44.support_scene import cli
from tests.stores.test_lease_lapse_15 import wait_for as _wait_for
from tests.stores.test_faults import OwnRedis

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
PROCESS = HERE / "outsider_kyc49" / "kyc49_review.bpmn"
REDIS = "redis://127.0.0.1:6379/11"
CLEAN = {"case_id": "K-clean", "customer_name": "Ann Smith", "country": "UK", "monthly_volume": 5000}
LISTED = {"case_id": "K-listed", "customer_name": "Blue Harbour Shipping Ltd", "country": "Panama",
          "monthly_volume": 5000}
AT_REST = ("waiting", "completed", "error")


@pytest.fixture
def fleet(tmp_path: Path) -> Iterator[dict[str, Any]]:
    """A key prefix and a stream of this test's own on DB 11 (removed afterwards), and the worker processes
    it starts (killed afterwards)."""
    with redis_scratch(REDIS, "o49") as name:
        env = dict(os.environ, PYTHONPATH=str(ROOT), KYC49_SIDE_EFFECTS=str(tmp_path / "side_effects.log"))
        env.pop("LAYERFLOW_STORE", None)
        sc: dict[str, Any] = {"name": name, "store": f"{REDIS}?prefix={name}", "stream": f"{name}-ready",
                              "procs": {}, "env": env, "tmp": tmp_path}
        try:
            yield sc
        finally:
            for proc in sc["procs"].values():
                if proc.poll() is None:
                    proc.kill()
                proc.wait(timeout=10)


def worker(sc: dict[str, Any], name: str, *extra: str, store: str | None = None) -> subprocess.Popen[str]:
    """``layerflow worker`` as the README starts it, on the test's stream."""
    proc = subprocess.Popen([sys.executable, "-m", "engine.cli", "worker", "--store", store or sc["store"],
                             "--stream", sc["stream"], "--consumer", name, "--timer-interval", "0.3", "--json",
                             *extra], env=sc["env"], cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=(sc["tmp"] / f"{name}.err").open("w"), text=True)
    sc["procs"][name] = proc
    return proc


def wait_for(check: Any, what: str, timeout: float = 20) -> Any:
    """Ask ``check`` four times a second: it runs `layerflow list` in this process, beside the workers."""
    return _wait_for(check, what, timeout, interval=0.25)


def worker_ready(sc: dict[str, Any], name: str) -> None:
    wait_for(lambda: "running the instances put on stream" in (sc["tmp"] / f"{name}.err").read_text(),
             f"worker {name} to start")


def stop(proc: subprocess.Popen[str]) -> dict[str, Any]:
    """SIGTERM, as an operator stops a worker: its stats."""
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 0, out
    return json.loads(out)


def submit(sc: dict[str, Any], data: dict[str, Any], count: int) -> list[str]:
    code, doc = cli(sc["store"], "submit", str(PROCESS), "--data", json.dumps(data), "--count", str(count),
                    "--stream", sc["stream"])
    assert code == 0, doc
    return list(doc["instance_ids"])


def plain(store: str, *args: str) -> tuple[int, str]:
    """`layerflow ...` without --json, as an operator reads it (stdout is no terminal: plain lines)."""
    from click.testing import CliRunner

    from engine.cli import main

    out = CliRunner().invoke(main, [*args, "--store", store])
    return out.exit_code, out.stdout


def rows(sc: dict[str, Any]) -> list[dict[str, Any]]:
    code, found = cli(sc["store"], "list")
    assert code == 0, found
    return list(found)


def all_at_rest(sc: dict[str, Any], ids: list[str]) -> list[dict[str, Any]] | None:
    found = [r for r in rows(sc) if r["instance_id"] in ids]
    return found if len(found) == len(ids) and all(r["status"] in AT_REST and not r["held_by"] for r in found) \
        else None


def settled(sc: dict[str, Any], ids: list[str], listed: list[str]) -> dict[str, str] | None:
    """id -> status once every case is at rest and the listed ones are through the MLRO window."""
    found = {r["instance_id"]: r["status"] for r in all_at_rest(sc, ids) or []}
    return found if found and all(found[i] == "completed" for i in listed) else None


def side_effects(sc: dict[str, Any]) -> Counter[tuple[str, str]]:
    log = sc["tmp"] / "side_effects.log"
    lines = log.read_text().split("\n") if log.exists() else []
    return Counter(tuple(line.split()[:2]) for line in lines if line)  # type: ignore[misc]


def dead(sc: dict[str, Any]) -> list[dict[str, Any]]:
    code, doc = cli(sc["store"], "worker", "dead", "--stream", sc["stream"])
    assert code == 0, doc
    return list(doc["dead_letters"])


# ----------------------------------------------------------------------------- the fleet

def test_twenty_one_cases_on_three_workers_one_killed_in_the_pep_lookup(fleet) -> None:
    """21 cases on three workers; the one whose PEP lookup hangs has its worker SIGKILLed mid-call. Another
    worker takes it over after --idle-ms and runs the lookup again (said on the tape), and nothing else: every
    other external call ran once per case, no case lost a write, and each ended where its data leads it."""
    hold = fleet["tmp"] / "hold"
    hold.write_text("hold")
    fleet["env"].update(KYC49_HOLD=str(hold), KYC49_SLOW_STEP="pep_check", KYC49_SLOW_CASE="K-slow")
    for name in ("w1", "w2", "w3"):
        worker(fleet, name, "--idle-ms", "1500")
    [slow] = submit(fleet, {**CLEAN, "case_id": "K-slow"}, 1)
    clean = submit(fleet, CLEAN, 10)
    listed = submit(fleet, LISTED, 10)

    wait_for(lambda: side_effects(fleet)[(slow, "pep_check")], "a worker to call the PEP register for K-slow")
    [holder] = [r["held_by"] for r in rows(fleet) if r["instance_id"] == slow]
    code, text = plain(fleet["store"], "inspect", slow)
    assert f"held_by\t{holder}" in text.splitlines(), text  # plain inspect names who runs it, as --json does
    fleet["procs"][holder].send_signal(signal.SIGKILL)
    assert fleet["procs"][holder].wait(timeout=10) == -signal.SIGKILL
    hold.unlink()  # the register answers again

    ids = [slow, *clean, *listed]
    found = wait_for(lambda: settled(fleet, ids, listed), "every case at rest, the listed ones through the MLRO window",
                     timeout=60)
    assert {i: found[i] for i in [slow, *clean]} == {i: "waiting" for i in [slow, *clean]}
    calls = side_effects(fleet)
    assert calls == Counter({**{(i, step): 1 for i in ids for step in ("pep_check", "analyst_b")},
                             (slow, "pep_check"): 2}), calls
    code, [retry] = cli(fleet["store"], "tape", slow, "--kind", "retry")
    assert retry["data"]["previous_consumer"] == holder and retry["data"]["activity_begun"] == "pep_check", retry
    for iid in ids:
        code, doc = cli(fleet["store"], "inspect", iid)
        history = doc["layers"]["L3"]
        assert {"screening_hit", "screening_score", "pep"} <= set(history), (iid, history)
        if iid in listed:
            assert history["risk_rating"] == "high" and history["notes_a"] == "volume 5000", (iid, history)
            assert history["screening_hit"] is True and history["account_frozen"] is True, (iid, history)
            assert history["sar_status"] == "filed" and doc["conflicts"] == []
            assert any(k.startswith("kb:sanctions/") for k in doc["layers"]["L2"]), doc["layers"]["L2"]
        else:
            [conflict] = doc["conflicts"]  # both analysts' writes reached the join
            assert conflict["values"] == {"analyst_a": "low", "analyst_b": "medium"}, (iid, conflict)
            assert [w["id"] for w in doc["waiting_for"]] == ["review_join/risk_rating"]
    assert not [r for r in rows(fleet) if r["instance_id"] in ids and r["held_by"]]
    assert dead(fleet) == []


def test_every_worker_stopped_the_mlro_window_runs_out_and_a_restarted_worker_fires_it_once(fleet) -> None:
    """The fleet is stopped (SIGTERM, as for a deploy) with cases inside the MLRO window; a deputy signs off a
    rating meanwhile (four eyes, from the CLI). The windows run out while no worker runs: nothing happens, but
    `timers` names them; the first worker started again fires each once and the cases complete."""
    w1 = worker(fleet, "w1", "--idle-ms", "5000")
    listed = submit(fleet, LISTED, 1)
    [clean] = submit(fleet, CLEAN, 1)
    wait_for(lambda: all_at_rest(fleet, [*listed, clean]), "the cases at the MLRO window and at the four eyes")
    stats = stop(w1)
    assert stats["statuses"] == {"waiting": 2} and stats["dead"] == 0, stats
    # the log says what each case waits for (it said `waiting` and no more)
    log = (fleet["tmp"] / "w1.err").read_text()
    assert f"instance {clean} (kyc49_review): waiting for confirmation review_join/risk_rating (due 20" in log, log
    for iid in listed:
        assert f"instance {iid} (kyc49_review): waiting for timer mlro_wait (due 20" in log, log
    code, doc = cli(fleet["store"], "resume", clean, "--answer", "review_join/risk_rating=high", "--by", "deputy")
    assert code == 3 and [w["task_id"] for w in doc["waiting_for"]] == ["mlro_wait"], doc
    assert doc["conflicts"][0]["resolution"]["reason"].startswith("a person (deputy) chose"), doc["conflicts"]

    cases = sorted([*listed, clean])
    due = wait_for(lambda: (lambda d: d if sorted(t["instance_id"] for t in d) == cases else None)(
        cli(fleet["store"], "timers")[1]["due"]), "the two MLRO windows to run out", timeout=10)
    assert {t["task_id"] for t in due} == {"mlro_wait"}
    assert {r["instance_id"]: r["status"] for r in rows(fleet)} == {i: "waiting" for i in cases}  # nobody fired them

    w2 = worker(fleet, "w2", "--idle-ms", "5000")
    wait_for(lambda: all(r["status"] == "completed" for r in rows(fleet)), "the restarted worker to fire the windows")
    assert stop(w2)["statuses"] == {"completed": 2}
    assert cli(fleet["store"], "timers")[1]["due"] == []
    for iid in cases:
        code, tape = cli(fleet["store"], "tape", iid, "--activity", "freeze")
        assert [e["kind"] for e in tape].count("begin") == 1, (iid, tape)
        code, doc = cli(fleet["store"], "inspect", iid)
        assert doc["layers"]["L3"]["account_frozen"] is True and doc["layers"]["L3"]["sar_status"] == "filed"


# ----------------------------------------------------------------------------- a worker on the wrong store

def test_a_worker_started_with_a_wrong_prefix_leaves_the_fleets_cases_to_the_right_workers(fleet) -> None:
    """One worker of the fleet started with a typo in its ``?prefix=``: it cannot run a single case of the
    store `submit` used. Before: it took its share of the stream, failed each entry and took it back itself
    (its own pending entries are the first it reclaims) until the fifth failure moved it to the dead letters;
    13 of 20 cases ended there while a worker on the right store stood idle beside it, and each needed a
    `worker requeue` by hand. Now the entry names the store it was submitted to, and a worker of another store
    leaves it to the workers of that store (it neither runs it nor counts it as a failed delivery), saying so."""
    wrong = f"{REDIS}?prefix={fleet['name']}typo"
    worker(fleet, "typo", "--idle-ms", "500", store=wrong)
    worker(fleet, "right", "--idle-ms", "500")
    worker_ready(fleet, "typo")
    worker_ready(fleet, "right")
    ids = submit(fleet, CLEAN, 8)  # the idle typo worker is served first, and is idle again at once
    found = wait_for(lambda: all_at_rest(fleet, ids), "every case run by the worker on the right store", timeout=60)
    assert [r["status"] for r in found] == ["waiting"] * 8  # at the four-eyes confirmation
    assert dead(fleet) == []
    typo = stop(fleet["procs"]["typo"])
    assert typo["dead"] == 0 and typo["ran"] == 0 and typo["other_store"] >= 1, typo
    log = (fleet["tmp"] / "typo.err").read_text()
    assert f"prefix {fleet['name']!r}" in log and f"prefix {fleet['name'] + 'typo'!r}" in log, log
    assert stop(fleet["procs"]["right"])["ran"] == 8


# ----------------------------------------------------------------------------- a case that failed

def test_a_case_a_worker_ran_into_an_error_is_inspected_replayed_and_resumed(fleet) -> None:
    """The case file came without ``monthly_volume``: analyst A's script fails on the worker. Before,
    `layerflow inspect ID` (plain) printed `error` in its header and nothing of what failed, where, or how to
    go on (only `--json` had it); a waiting case's plain inspect did not say what it waits for either. Now
    both are records of the plain listing (`error`, `fix`, `waiting`), as `run` prints them."""
    [iid] = submit(fleet, {k: v for k, v in CLEAN.items() if k != "monthly_volume"}, 1)
    w = worker(fleet, "w1", "--stop-after", "1")
    assert json.loads(w.communicate(timeout=60)[0])["statuses"] == {"error": 1}
    assert f"instance {iid} (kyc49_review): error [activity_failed] at analyst_a" in (fleet["tmp"] / "w1.err").read_text()

    code, text = plain(fleet["store"], "inspect", iid)
    assert code == 0, text
    lines = text.splitlines()
    [error] = [ln.split("\t") for ln in lines if ln.startswith("error\t")]
    assert error[1:3] == ["activity_failed", "analyst_a"] and "'monthly_volume'" in error[3], error
    [fix] = [ln for ln in lines if ln.startswith("fix\t")]
    assert f"layerflow resume {iid}" in fix and "--set KEY=VALUE" in fix, fix
    assert lines[1].startswith("error\t") and lines[2].startswith("fix\t"), lines[:3]  # before the layers
    code, doc = cli(fleet["store"], "inspect", iid)
    assert doc["error"]["task_id"] == "analyst_a" and doc["error"]["kind"] == error[1]

    # the tape says where the failure stopped analyst A's branch; replay rebuilds what inspect shows
    code, tape = cli(fleet["store"], "tape", iid, "--activity", "analyst_a")
    assert [e["kind"] for e in tape][-1] == "abort" and "monthly_volume" in tape[-1]["data"]["reason"], tape
    code, rebuilt = cli(fleet["store"], "replay", iid)
    assert code == 0 and rebuilt["layers"] == doc["layers"]

    code, doc = cli(fleet["store"], "resume", iid, "--set", "monthly_volume=250000")
    assert code == 3 and [w["id"] for w in doc["waiting_for"]] == ["review_join/risk_rating"], doc
    code, text = plain(fleet["store"], "inspect", iid)
    [waiting] = [ln.split("\t") for ln in text.splitlines() if ln.startswith("waiting\t")]
    assert waiting[1:4] == ["confirmation", "review_join/risk_rating", "review_join"] and waiting[4] > "2026", waiting
    assert not [ln for ln in text.splitlines() if ln.startswith(("error\t", "fix\t"))]
    code, doc = cli(fleet["store"], "resume", iid, "--answer", "review_join/risk_rating=high", "--by", "mlro-deputy")
    assert code == 3 and [w["task_id"] for w in doc["waiting_for"]] == ["mlro_wait"], doc
    [conflict] = doc["conflicts"]
    assert conflict["values"] == {"analyst_a": "high", "analyst_b": "medium"}
    assert conflict["resolution"]["value"] == "high" and conflict["resolution"]["resolver"] == "human"


# ----------------------------------------------------------------------------- Redis goes away

def test_redis_goes_away_mid_lookup_and_comes_back_nothing_is_lost(fleet) -> None:
    """The Redis that holds the store and the stream (a server of this test's own, appendonly) is killed while
    a worker waits on the PEP register for a case, and started again. The worker waits for it (saying so)
    instead of exiting; `submit` meanwhile creates nothing; afterwards every case is at rest, none in the dead
    letters, each external call run once but the one the outage interrupted (run again from the last save)."""
    server = OwnRedis(fleet["tmp"], durable=True)
    server.start()
    try:
        sc = {**fleet, "store": f"{server.url}?prefix=kyc", "stream": "kyc-ready"}
        hold = fleet["tmp"] / "hold"
        hold.write_text("hold")
        fleet["env"].update(KYC49_HOLD=str(hold), KYC49_SLOW_STEP="pep_check", KYC49_SLOW_CASE="K-slow")
        w1 = worker(sc, "w1", "--idle-ms", "1000")
        [slow] = submit(sc, {**CLEAN, "case_id": "K-slow"}, 1)
        others = submit(sc, LISTED, 2)
        wait_for(lambda: side_effects(sc)[(slow, "pep_check")], "the worker to call the PEP register")
        server.kill()
        code, doc = cli(sc["store"], "submit", str(PROCESS), "--data", json.dumps(CLEAN), "--stream", sc["stream"])
        assert code == 2 and doc["error"]["kind"] == "store_unavailable", doc
        hold.unlink()
        wait_for(lambda: "did not answer" in (fleet["tmp"] / "w1.err").read_text(), "the worker to wait for Redis")
        assert w1.poll() is None
        server.start()
        ids = [slow, *others]
        found = wait_for(lambda: settled(sc, ids, others), "the cases to come to rest after the outage", timeout=30)
        assert found[slow] == "waiting", found
        assert len(rows(sc)) == 3  # the submit refused during the outage left nothing
        assert dead(sc) == []
        calls = side_effects(sc)
        assert all(calls[(i, "pep_check")] == 1 and calls[(i, "analyst_b")] == 1 for i in others), calls
        assert calls[(slow, "analyst_b")] == 1 and calls[(slow, "pep_check")] in (1, 2), calls
        if calls[(slow, "pep_check")] == 2:  # its save was cut off: said on the tape
            code, [retry] = cli(sc["store"], "tape", slow, "--kind", "retry")
            assert retry["data"]["activity_begun"] == "pep_check", retry
        code, doc = cli(sc["store"], "inspect", slow)
        assert doc["conflicts"][0]["values"] == {"analyst_a": "low", "analyst_b": "medium"}
        assert stop(w1)["dead"] == 0
    finally:
        server.stop()


# ----------------------------------------------------------------------------- dead letters

def test_a_case_whose_tape_went_missing_is_dead_lettered_listed_as_such_and_retried_once_restored(fleet) -> None:
    """A case's tape key is gone from Redis (renamed away by hand, as an eviction would): the worker cannot
    rebuild it and dead-letters its entry. Before, `layerflow list` went on showing the case as `running` and
    held by nobody, which the README reads as "waits on the queue": nothing said it never would run. `list
    --stream` now names its dead letter. Restored and requeued, the case runs once, from where it was."""
    import redis

    client = redis.Redis.from_url(REDIS)
    [iid] = submit(fleet, CLEAN, 1)
    tape_key = f"{fleet['name']}:i:{{{iid}}}:t:main"
    client.rename(tape_key, f"{fleet['name']}:saved")
    w = worker(fleet, "w1", "--idle-ms", "200", "--max-deliveries", "2", "--stop-after", "1")
    assert json.loads(w.communicate(timeout=60)[0])["dead"] == 1
    [letter] = dead(fleet)
    assert letter["instance_id"] == iid and letter["error_type"] == "InvalidRecord" and tape_key in letter["error"]

    code, found = cli(fleet["store"], "list", "--stream", fleet["stream"])
    assert [(r["instance_id"], r["status"], r["held_by"], r.get("dead_letter")) for r in found] == [
        (iid, "running", None, letter["id"])], found
    code, text = plain(fleet["store"], "list", "--stream", fleet["stream"])
    assert f"dead letter {letter['id']}" in text and "layerflow worker requeue" in text, text

    client.rename(f"{fleet['name']}:saved", tape_key)  # restored from the backup
    code, doc = cli(fleet["store"], "worker", "requeue", letter["id"], "--stream", fleet["stream"])
    assert code == 0, doc
    w = worker(fleet, "w2", "--idle-ms", "200", "--stop-after", "1")
    assert json.loads(w.communicate(timeout=60)[0])["statuses"] == {"waiting": 1}
    code, found = cli(fleet["store"], "list", "--stream", fleet["stream"])
    assert [(r["status"], "dead_letter" in r) for r in found] == [("waiting", False)], found
    assert side_effects(fleet) == Counter({(iid, "pep_check"): 1, (iid, "analyst_b"): 1})
    client.close()
