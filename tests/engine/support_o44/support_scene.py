"""What the support escalation's worker tests share: a scene of their own on Redis DB 10 (a key prefix and a
stream of one test's own, removed afterwards), real ``layerflow worker`` processes with the model behind the
stub server, the CLI in this process (click's runner: litellm is imported once, in this process), and the
ticket's inputs, given the same way to a worker run and to a memory:// run."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import types
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

from tests.engine.engine_helpers import redis_scratch, stop_all
from tests.engine.support_o44.support_stub import SupportStub, fake_completion
from tests.stores.test_lease_lapse_15 import wait_for
from tests.test_outsider_ops36 import comparable as ops36_comparable

__all__ = ["MODEL", "PRESERVED", "PROCESS", "START", "cli", "comparable", "drive", "later", "model_stub", "scene",
           "wait_for", "worker"]

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent.parent
PROCESS = HERE / "support_escalation.bpmn"
REDIS = "redis://127.0.0.1:6379/10"
MODEL = "openai/stub-model"
START = {"ticket_id": "T-44", "customer": "ACME", "subject": "invoice export fails", "replies_sent": 0,
         "reopen_count": 0}
PRESERVED = ("severity", "sla_hours", "replies_sent", "reopen_count", "resolution")


@contextmanager
def scene(tmp_path: Path, stub_url: str) -> Iterator[dict[str, Any]]:
    with redis_scratch(REDIS, "o44") as name:
        procs: list[subprocess.Popen[str]] = []
        env = dict(os.environ, PYTHONPATH=str(ROOT), LAYERFLOW_MODEL_API_BASE=stub_url, LAYERFLOW_MODEL_API_KEY="test",
                   LAYERFLOW_RETRY_BASE_DELAY="0.01", LITELLM_LOCAL_MODEL_COST_MAP="True")
        env.pop("LAYERFLOW_STORE", None)
        try:
            yield {"name": name, "store": f"{REDIS}?prefix={name}", "stream": f"{name}-ready", "procs": procs,
                   "env": env, "tmp": tmp_path}
        finally:
            stop_all(procs)


@contextmanager
def model_stub(monkeypatch: Any, *, client_in_process: bool) -> Iterator[SupportStub]:
    """The stub server (for the workers' litellm, and this process's with ``client_in_process``); without it
    this process's CLI gets the same answers from the same script through the fake completion, without
    importing litellm (seconds). Every request, by either way, is in ``server.scripted.requests``."""
    import engine.llm

    monkeypatch.setenv("LAYERFLOW_MODEL_API_KEY", "test")
    monkeypatch.setenv("LAYERFLOW_RETRY_BASE_DELAY", "0.01")
    with SupportStub() as server:
        monkeypatch.setenv("LAYERFLOW_MODEL_API_BASE", server.url)
        if not client_in_process:
            monkeypatch.setattr(engine.llm, "load_litellm",
                                lambda: types.SimpleNamespace(completion=fake_completion(server.scripted)))
        yield server


def worker(sc: dict[str, Any], name: str, *extra: str) -> subprocess.Popen[str]:
    proc = subprocess.Popen([sys.executable, "-m", "engine.cli", "worker", "--store", sc["store"], "--stream",
                             sc["stream"], "--consumer", name, "--idle-ms", "1000", "--timer-interval", "0.3",
                             "--model", MODEL, "--json", *extra], env=sc["env"], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=(sc["tmp"] / f"{name}.err").open("w"), text=True)
    sc["procs"].append(proc)
    return proc


def cli(store: str, *args: str) -> tuple[int, Any]:
    """`layerflow ... --json` in this process: exit code and its JSON document."""
    from click.testing import CliRunner

    from engine.cli import main

    out = CliRunner().invoke(main, [*args, "--store", store, "--json"])
    try:
        return out.exit_code, json.loads(out.stdout)
    except ValueError:
        raise AssertionError(f"layerflow {' '.join(args)}: exit {out.exit_code}: {out.output} {out.exception!r}")


def later(days: float) -> str:
    return (datetime.now(timezone.utc) + timedelta(days=days)).strftime("%Y-%m-%dT%H:%M:%SZ")


def drive(store: str, iid: str, rounds: int = 4) -> list[dict[str, Any]]:
    """The customer and the engineer, from the CLI: each round the customer replies (round 1: two days of
    silence, the timer branch, `resume --now` three days on), the engineer proposes, a person settles the
    join's conflict on ``resolution``, and the customer reopens (three times) or is satisfied. The ``--json``
    document of every step, in order."""
    docs: list[dict[str, Any]] = []
    for rnd in range(rounds):
        if rnd == 1:
            code, doc = cli(store, "resume", iid, "--now", later(3 * rnd), "--model", MODEL)
        else:
            code, doc = cli(store, "send", iid, "customer_reply", "--json-payload",
                            json.dumps({"customer_message": f"still broken (round {rnd})"}), "--model", MODEL)
        docs.append(doc)
        assert code == 3 and [w["kind"] for w in doc["waiting_for"]] == ["user_task"], doc
        code, doc = cli(store, "resume", iid, "--answer", "human_work=" + json.dumps(
            {"resolution": f"replace-r{rnd}", "human_notes": "swap the plan"}), "--model", MODEL)
        docs.append(doc)
        assert code == 3 and [w["id"] for w in doc["waiting_for"]] == ["work_join/resolution"], doc
        pick = f"replace-r{rnd}" if rnd % 2 else f"refund-r{rnd}"
        code, doc = cli(store, "resume", iid, "--answer", f"work_join/resolution={pick}", "--model", MODEL)
        docs.append(doc)
        assert code == 3 and [w["kind"] for w in doc["waiting_for"]] == ["event"], doc
        code, doc = cli(store, "send", iid, "customer_response", "--json-payload",
                        json.dumps({"reopen": rnd < rounds - 1}), "--model", MODEL)
        docs.append(doc)
        assert code == (3 if rnd < rounds - 1 else 0), doc
    return docs


def comparable(events: list[dict[str, Any]], iid: str) -> list[str]:
    """test_outsider_ops36's comparable tape (times, ids, a takeover's ``retry`` note left out), and what else
    differs between two runs of the same ticket: the seqs a retry note moves on (inside branch snapshot ids,
    the requests' ``base_seq``), the stub's answer ids, and the clock in context_inspect's results (so a
    request holding it is compared by its text, not its hash or token count)."""
    out = []
    for text in ops36_comparable(events, iid):
        text = re.sub(r"(snap:[\w/@]+:)\d+", r"\1N", text)
        text = re.sub(r'(last_modified\\+": \\+")[^\\"]+', r"\1T", text)
        text = re.sub(r"\"latency_ms\": \d+", '"latency_ms": T', text)
        text = re.sub(r"chatcmpl-\d+", "chatcmpl-N", text)
        text = re.sub(r"\"(base_seq|keep|prefix_tokens|tokens)\": \d+", r'"\1": N', text)
        text = re.sub(r"\"sha256\": \"\w+\"", '"sha256": "H"', text)
        out.append(text)
    return out
