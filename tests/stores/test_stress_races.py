"""Races between the parts users run at once: three ``layerflow worker`` processes and one
``layerflow serve`` on one Redis store, people answering through REST from several threads
(sometimes twice at once), and ``layerflow resume ID --answer`` racing a REST answer.

Every instance must then be as a serial run with the same answers leaves it (the Python API
on ``memory://``): completed, the same contexts, tapes that replay to them with seqs 1..n,
every activity completed once, every handler run once (no worker dies here, so at-least-once
is not enough), every person's step answered once, versions that only went up, no lease left,
no dead letter, no 5xx, no traceback.

``LAYERFLOW_STRESS=N`` multiplies the number of instances (1: the CI size, about 30).
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import local_http
import pytest

from context_layers import LayeredContext
from context_layers.stores import open_store
from engine import Engine, load_process
from engine.worker import dead_letters, queue_client, submit

from .test_faults import OwnRedis, free_port

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
CATALOG = Path(__file__).parent / "fixtures" / "stress"
SIZE = max(1, int(os.environ.get("LAYERFLOW_STRESS", "1")))
N_REVIEW, N_SIGN = 12 * SIZE, 18 * SIZE
TOKEN = "stress-token"
COUNTS = "stress:runs"  # the handlers' run counts (a hash outside the store's prefix)
DEADLINE = 45 + 60 * (SIZE - 1)  # seconds for the people's part
HANDLERS = {"stress_review": ("prepare", "score_a", "score_b", "check_c", "finish"),
            "stress_sign": ("draft", "seal")}


def answers_for(process_id: str, n: int) -> dict[str, Any]:
    """What the people answer for instance ``n`` (the same in the stress run and the serial one)."""
    if process_id == "stress_sign":
        return {"user_tasks": {"sign": {"signer": f"s{n}"}}, "confirmations": {}}
    return {"user_tasks": {"intake": {"level": n % 5}, "approve_a": {"verdict": "yes" if n % 2 else "no"}},
            # the branch's value of `decision` the person picks: score_a's or score_b's
            "confirmations": {"join/decision": (f"{'yes' if n % 2 else 'no'}-{n % 5}" if n % 3 else f"hold-{n}")}}


def serial_run(process_id: str, data: dict[str, Any], answers: dict[str, Any], *,
               via_rest: bool) -> dict[str, LayeredContext]:
    """The reference: the Python API on memory://, the timer made due by a clock of its own.
    ``via_rest``: started as POST /api/instances starts one (a ``started`` note first)."""
    now = [time.time()]
    engine = Engine("memory://", clock=lambda: now[0])
    instance = engine.start(load_process(CATALOG / f"{process_id}.bpmn"), data)
    if via_rest:
        instance.main.record("started", actor="api", data={"process_id": process_id, "via": "governance"})
    instance = engine.run(instance, answers=answers)
    for _ in range(5):
        if instance.status != "waiting":
            break
        now[0] += 60
        instance = engine.resume(instance, answers=answers)
    assert instance.status == "completed", (instance.status, instance.waiting_for, instance.error)
    return dict(instance.contexts)


def comparable(ctx: LayeredContext) -> list[Any]:
    """The layers in order, and the preserved keys, without the one clock reading they hold (when
    a join settled its conflicts): what a serial run must give the same."""
    layers = []
    for layer in range(6):
        items = []
        for key, value in ctx.layer(layer).items():
            if key == "_mergedConflicts":
                value = [{k: v for k, v in c.items() if k != "time"} for c in value]
            items.append([key, value])
        layers.append(items)
    return [layers, sorted(ctx.preserved)]


def layer_diff(ctx: LayeredContext, ref: LayeredContext) -> str:
    """Where two contexts differ, for the failure message."""
    out = []
    for layer in range(6):
        mine, theirs = dict(ctx.layer(layer)), dict(ref.layer(layer))
        for key in sorted(mine.keys() | theirs.keys()):
            if mine.get(key, "<absent>") != theirs.get(key, "<absent>"):
                out.append(f"L{layer} {key}: {mine.get(key, '<absent>')!r} here, "
                           f"{theirs.get(key, '<absent>')!r} serially")
        if mine == theirs and list(mine) != list(theirs):
            out.append(f"L{layer}: keys in another order: {list(mine)} here, {list(theirs)} serially")
    if ctx.preserved != ref.preserved:
        out.append(f"preserved {sorted(ctx.preserved)} here, {sorted(ref.preserved)} serially")
    return "; ".join(out) or "no difference in layers"


# ----------------------------------------------------------------------------- the parts

class Parts:
    """The server, the workers and the Redis they share; logs in ``tmp``."""

    def __init__(self, tmp: Path, redis: OwnRedis) -> None:
        self.tmp = tmp
        self.redis = redis
        self.store_url = f"{redis.url}?prefix=stress"
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.env = {**{k: v for k, v in os.environ.items() if k not in ("LAYERFLOW_API_TOKEN", "LAYERFLOW_STORE")},
                    "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep),
                    "LAYERFLOW_STRESS_COUNTS": f"{redis.url}|{COUNTS}", "LAYERFLOW_STRESS_STEP_SECONDS": "0.05",
                    "LAYERFLOW_STRESS_TIMER_STEP_SECONDS": "0.4"}
        self.procs: dict[str, subprocess.Popen[bytes]] = {}

    def spawn(self, name: str, *args: str) -> None:
        log = open(self.tmp / f"{name}.log", "wb")
        self.procs[name] = subprocess.Popen([sys.executable, "-m", "engine.cli", *args], cwd=self.tmp, env=self.env,
                                            stdout=log, stderr=subprocess.STDOUT)
        log.close()

    def start(self) -> None:
        self.spawn("serve", "serve", "--port", str(self.port), "--catalog", str(CATALOG), "--store", self.store_url,
                   "--token", TOKEN, "--log-level", "warning")
        for w in range(3):
            self.spawn(f"worker{w}", "worker", "--store", self.store_url, "--consumer", f"w{w}", "--idle-ms", "2000",
                       "--timer-interval", "0.3")
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            for name, proc in self.procs.items():
                assert proc.poll() is None, f"{name} exited with {proc.returncode}: {self.log(name)[-3000:]}"
            try:
                if local_http.get(f"{self.url}/api/health", timeout=1).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.1)
        raise AssertionError(f"layerflow serve did not answer: {self.log('serve')[-3000:]}")

    def log(self, name: str) -> str:
        path = self.tmp / f"{name}.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def stop(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.terminate()
        for proc in self.procs.values():
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=5)


@pytest.fixture
def parts(tmp_path: Path) -> Iterator[Parts]:
    redis = OwnRedis(tmp_path, durable=False)
    redis.start()
    p = Parts(tmp_path, redis)
    try:
        p.start()
        yield p
    finally:
        p.stop()
        redis.stop()


def client_of(parts: Parts) -> httpx.Client:
    """An API client that opens a connection per request: a pooled one that sat idle past the
    server's keep-alive may be closed by it just as a request goes out (a reset that says
    nothing about the API)."""
    return httpx.Client(base_url=parts.url, headers={"Authorization": f"Bearer {TOKEN}"}, timeout=60,
                        limits=httpx.Limits(max_keepalive_connections=0))


# ----------------------------------------------------------------------------- the people

class People:
    """Client threads that answer what the instances wait for, and what they saw."""

    def __init__(self, parts: Parts, instances: dict[str, tuple[str, int]]) -> None:
        self.parts = parts
        self.instances = instances  # id -> (process id, n)
        self.http = client_of(parts)
        self.lock = threading.Lock()
        self.timers: list[threading.Timer] = []
        self.todo = [(0.0, iid) for iid in instances]  # (not before, instance), by time.monotonic()
        self.cli_start = 1.0  # seconds until `layerflow resume` has loaded the instance (calibrated)
        self.done: set[str] = set()
        self.problems: list[str] = []
        self.statuses: Counter[int] = Counter()
        self.won: Counter[tuple[str, str]] = Counter()       # (instance, step) -> 2xx answers
        self.cli: Counter[str] = Counter()                   # outcome of each racing `layerflow resume`
        self.races: Counter[str] = Counter()                 # how each step was answered
        self.refusals: Counter[str] = Counter()              # 409s by kind
        self.versions: dict[str, list[int]] = defaultdict(list)   # as the one poller read them, in order
        self.answered_at: dict[str, list[int]] = defaultdict(list)  # versions answers reported
        self.rng = random.Random(7)

    def problem(self, text: str) -> None:
        with self.lock:
            self.problems.append(text)

    def post(self, iid: str, step: str, path: str, body: dict[str, Any]) -> int:
        try:
            r = self.http.post(path, json=body)
        except httpx.TransportError as err:
            self.problem(f"{iid} {step}: {type(err).__name__}: {err}")
            return 0
        with self.lock:
            self.statuses[r.status_code] += 1
        if r.status_code == 200:
            with self.lock:
                self.won[(iid, step)] += 1
                self.answered_at[iid].append(r.json()["version"])
        elif r.status_code != 409:  # a lost race is a 409 and nothing else
            self.problem(f"{iid} {step}: POST {path} -> {r.status_code} {r.text[:500]}")
        else:
            kind = r.json().get("error", {}).get("kind", "?")
            with self.lock:
                self.refusals[kind] += 1
            if kind not in ("invalid_state", "version_conflict", "already_answered"):
                self.problem(f"{iid} {step}: a 409 of an unexpected kind: {r.text[:500]}")
        return r.status_code

    def answer_rest(self, iid: str, item: dict[str, Any]) -> int:
        process_id, n = self.instances[iid]
        answers = answers_for(process_id, n)
        if item["kind"] == "user_task":
            return self.post(iid, item["task_id"], f"/api/instances/{iid}/user-tasks/{item['task_id']}",
                             {"data": answers["user_tasks"][item["task_id"]], "user": "stress"})
        # unnamed, as the CLI's answers are (a named person is in the join's resolution since round 18):
        # whichever surface answers, the context is the serial run's
        return self.post(iid, item["id"], f"/api/confirmations/{item['id']}",
                         {"instance_id": iid, "value": answers["confirmations"][item["id"]]})

    def answer_cli(self, iid: str, item: dict[str, Any]) -> None:
        process_id, n = self.instances[iid]
        answers = answers_for(process_id, n)
        key = item["task_id"] if item["kind"] == "user_task" else item["id"]
        value = answers["user_tasks"][key] if item["kind"] == "user_task" else answers["confirmations"][key]
        done = subprocess.run([sys.executable, "-m", "engine.cli", "resume", iid, "--answer",
                               f"{key}={json.dumps(value)}", "--store", self.parts.store_url, "--json"],
                              cwd=self.parts.tmp, env=self.parts.env, capture_output=True, text=True, timeout=120)
        if "Traceback" in done.stderr or done.returncode not in (0, 1, 2, 3):
            self.problem(f"{iid} {key}: layerflow resume exited {done.returncode}: {done.stderr[-2000:]}")
            return
        try:
            doc = json.loads(done.stdout)
        except ValueError:
            self.problem(f"{iid} {key}: layerflow resume --json printed no JSON: {done.stdout[-500:]!r}")
            return
        kind = (doc.get("error") or {}).get("kind") if done.returncode in (1, 2) else doc.get("status")
        with self.lock:
            self.cli[f"{done.returncode}:{kind}"] += 1

    def act(self, iid: str, item: dict[str, Any]) -> None:
        """Answer one waiting step: alone, twice at once, or through REST and the CLI at once."""
        how = self.rng.choice(["rest", "rest", "double", "cli"])
        step = item["task_id"] if item["kind"] == "user_task" else item["id"]
        with self.lock:
            self.races[how] += 1
        if how == "rest":
            self.answer_rest(iid, item)
            return
        gate = threading.Barrier(2)
        delay = self.rng.uniform(0.5, 1.2) * self.cli_start  # the REST answer lands about when the CLI loads

        def second() -> None:
            gate.wait()
            if how == "double":
                self.answer_rest(iid, item)
            else:
                time.sleep(delay)
                self.answer_rest(iid, item)

        other = threading.Thread(target=second)
        other.start()
        gate.wait()
        if how == "double":
            self.answer_rest(iid, item)
        else:
            self.answer_cli(iid, item)
        other.join()
        if how == "double":
            with self.lock:
                if self.won[(iid, step)] > 1:
                    self.problems.append(f"{iid} {step}: two REST answers at once both succeeded")

    def calibrate(self) -> None:
        """How long `layerflow resume` takes to get going here (the machine may be busy)."""
        began = time.monotonic()
        subprocess.run([sys.executable, "-m", "engine.cli", "resume", "no-such-instance", "--store",
                        self.parts.store_url, "--json"], cwd=self.parts.tmp, env=self.parts.env, capture_output=True,
                       timeout=120)
        self.cli_start = time.monotonic() - began

    def work(self, deadline: float) -> None:
        while time.monotonic() < deadline:
            with self.lock:
                if not self.todo:
                    if len(self.done) == len(self.instances):
                        return
                    iid = None
                else:
                    first = min(range(len(self.todo)), key=lambda i: self.todo[i][0])
                    iid = self.todo.pop(first)[1] if self.todo[first][0] <= time.monotonic() else None
            if iid is None:
                time.sleep(0.02)
                continue
            try:
                doc = self.http.get(f"/api/instances/{iid}").json()
            except httpx.TransportError as err:
                self.problem(f"{iid}: GET: {err}")
                doc = {"status": "?"}
            status = doc.get("status")
            if status == "completed" or status in ("error", "cancelled"):
                if status != "completed":
                    self.problem(f"{iid}: {status}: {doc.get('error')}")
                with self.lock:
                    self.done.add(iid)
                continue
            answerable = [w for w in doc.get("waiting_for", []) if w["kind"] in ("user_task", "confirmation")]
            later = 0.05  # running, or only a timer: look again soon
            if status == "waiting" and answerable:
                item = self.rng.choice(answerable)
                self.act(iid, item)
                if item.get("task_id") == "intake":
                    # approve_a is answered about when the timer beside it comes due (1 s after the fork)
                    # and a worker fires it; the pool looks again only after that
                    timer = threading.Timer(self.rng.uniform(0.8, 1.6), self.answer_approve_a, (iid,))
                    timer.start()
                    self.timers.append(timer)
                    later = 2.0
            with self.lock:
                self.todo.append((time.monotonic() + later, iid))

    def answer_approve_a(self, iid: str) -> None:
        try:
            doc = self.http.get(f"/api/instances/{iid}").json()
        except httpx.TransportError as err:
            self.problem(f"{iid}: GET: {err}")
            return
        item = next((w for w in doc.get("waiting_for", []) if w.get("task_id") == "approve_a"), None)
        if item is not None:
            with self.lock:
                self.races["beside the timer"] += 1
            self.answer_rest(iid, item)


# ----------------------------------------------------------------------------- the test

def test_workers_rest_and_cli_at_once_lose_nothing_and_run_nothing_twice(parts: Parts) -> None:
    store = open_store(parts.store_url)
    client = queue_client(queue_url=parts.redis.url)
    instances: dict[str, tuple[str, int]] = {}
    data: dict[str, dict[str, Any]] = {}
    via_rest: set[str] = set()
    http = client_of(parts)
    plan = [("stress_review", n) for n in range(N_REVIEW)] + [("stress_sign", n) for n in range(N_SIGN)]
    random.Random(3).shuffle(plan)
    for k, (process_id, n) in enumerate(plan):
        d = {"tag": f"{process_id}-{n}", "n": n}
        if k % 3 == 0:  # some started through REST (the server runs them to their first wait)
            r = http.post("/api/instances", json={"process_id": process_id, "data": d})
            assert r.status_code == 201, r.text
            iid = r.json()["instance_id"]
            via_rest.add(iid)
        else:  # the rest submitted to the workers
            iid = submit(store, CATALOG / f"{process_id}.bpmn", d, client=client)
        instances[iid] = (process_id, n)
        data[iid] = d

    people = People(parts, instances)
    people.calibrate()
    deadline = time.monotonic() + DEADLINE
    threads = [threading.Thread(target=people.work, args=(deadline,), name=f"person{i}") for i in range(8)]
    stop_polling = threading.Event()

    def poll_versions() -> None:  # what the store says, read by one thread in order: versions only go up
        while not stop_polling.wait(0.02):
            for s in store.list_instances():
                seen = people.versions[s["instance_id"]]
                if not seen or seen[-1] != s["version"]:
                    seen.append(s["version"])

    poller = threading.Thread(target=poll_versions)
    for t in (*threads, poller):
        t.start()
    for t in threads:
        t.join()
    for t in people.timers:
        t.join()
    stop_polling.set()
    poller.join()

    for name, proc in parts.procs.items():
        assert proc.poll() is None, f"{name} died: {parts.log(name)[-3000:]}"
    assert not people.problems, "\n".join(people.problems[:20])
    unfinished = {iid: store.load(iid)[0]["status"] for iid in instances if iid not in people.done}
    assert not unfinished, f"not completed in {DEADLINE} s: {unfinished}"

    # let the workers acknowledge what they hold (a given-back entry is taken over after idle_ms)
    settle = time.monotonic() + 15
    while client.xpending("layerflow:ready", "workers")["pending"] and time.monotonic() < settle:
        time.sleep(0.1)

    engine = Engine(store)
    runs = {k: int(v) for k, v in client.hgetall(COUNTS).items()}
    for iid, (process_id, n) in instances.items():
        final = engine.load(iid)
        assert final.status == "completed", (iid, final.status, final.error)
        reference = serial_run(process_id, data[iid], answers_for(process_id, n), via_rest=iid in via_rest)
        assert set(final.contexts) == set(reference), (iid, set(final.contexts), set(reference))
        completed: Counter[str] = Counter()
        inputs: Counter[str] = Counter()
        decisions: Counter[str] = Counter()
        for name, ctx in final.contexts.items():
            assert comparable(ctx) == comparable(reference[name]), (
                f"{iid} ({process_id} {n}): context {name!r} differs from a serial run: "
                f"{layer_diff(ctx, reference[name])}")
            tape = store.read_tape(iid, name)
            assert [e["seq"] for e in tape] == list(range(1, len(tape) + 1)), f"{iid} {name}: gap or duplicate seq"
            assert LayeredContext.replay(ctx.tape) == ctx, f"{iid} {name}: the tape does not replay to the context"
            for e in ctx.tape:
                if e.kind == "complete":
                    completed[e.data["task_id"]] += 1
                elif e.kind == "note" and e.data.get("note") == "user_input":
                    inputs[e.data["task_id"]] += 1
                elif e.kind == "note" and e.data.get("note") == "human_decision":
                    decisions[e.data["confirmation_id"]] += 1
        assert all(c == 1 for c in completed.values()), f"{iid}: an activity completed twice: {completed}"
        assert all(c == 1 for c in inputs.values()), f"{iid}: a user task took two answers: {inputs}"
        assert all(c == 1 for c in decisions.values()), f"{iid}: a confirmation answered twice: {decisions}"
        for activity in HANDLERS[process_id]:
            ran = runs.get(f"{data[iid]['tag']}:{activity}", 0)
            assert ran == 1, f"{iid} ({process_id} {n}): handler {activity!r} ran {ran} times"
        assert [c["id"] for c in final.confirmations if c.get("answered")] == (
            ["join/decision"] if process_id == "stress_review" else []), final.confirmations
        seen = people.versions[iid]
        assert seen == sorted(seen), f"{iid}: the version went down: {seen}"
        assert store.lease_owner(iid) is None, f"{iid}: a lease was left behind ({store.lease_owner(iid)})"
        assert not store.list_confirmations(iid), f"{iid}: a confirmation is still pending in the store"
        assert max(people.answered_at[iid], default=0) <= store.load(iid)[1]

    pending = client.xpending("layerflow:ready", "workers")
    assert pending["pending"] == 0, f"entries left unacknowledged: {pending}"
    assert dead_letters(client) == []
    assert 500 not in people.statuses and not any(code >= 500 for code in people.statuses), people.statuses
    for name in parts.procs:
        assert "Traceback" not in parts.log(name), f"{name}: {parts.log(name)[-4000:]}"
    races = dict(people.races)
    assert races.get("double") and races.get("cli") and races.get("beside the timer"), f"too few races: {races}"
    print(f"\nstress: {len(instances)} instances; answers {races}; HTTP {dict(people.statuses)}; "
          f"409s {dict(people.refusals)}; CLI {dict(people.cli)}")
    parts.stop()
    for name in sorted(parts.procs):
        if name.startswith("worker"):
            print(parts.log(name).strip().splitlines()[-1])
    http.close()
    store.close()
    client.close()
