"""Round 36: `layerflow worker --model M` loads the model client (litellm, seconds to import) when it
starts, before it claims an entry. It imported litellm at its first model call instead, with the entry
claimed and its lease running: with a short `--idle-ms` another worker took the instance over while the
first one was still importing. Run against the tests' OpenAI-compatible stub, never a real provider."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from engine import Engine
from engine.worker import submit

from engine_helpers import chain_bpmn, redis_scratch
from stub_llm import Reply, StubLLM

ROOT = Path(__file__).resolve().parents[2]
REDIS = "redis://127.0.0.1:6379/8"  # this module's own database
CONFIG = ("draft_letter:\n  llm:\n    model: openai/configured\n    instructions: Draft a one-line letter.\n"
          "    outputKeys: [letter]\n")


@pytest.fixture
def store() -> Iterator[str]:
    with redis_scratch(REDIS, "g36") as prefix:
        yield f"{REDIS}?prefix={prefix}"


def test_a_worker_with_a_model_loads_its_client_before_it_claims_an_entry(store: str, tmp_path: Path) -> None:
    path = tmp_path / "letter.bpmn"
    path.write_text(chain_bpmn("letter", ['<bpmn:task id="draft_letter"/>']), encoding="utf-8")
    (tmp_path / "letter.layerflow.yaml").write_text(CONFIG, encoding="utf-8")
    stream = store.rsplit("=", 1)[1] + "ready"  # of this test's own prefix (no ':' in it)
    iid = submit(store, path, {"supplier": "Acme"}, stream=stream)
    with StubLLM() as stub:
        stub.push(Reply.json({"letter": "Dear Acme"}))
        env = {**os.environ, "PYTHONPATH": str(ROOT), "LAYERFLOW_MODEL_API_BASE": stub.url,
               "LAYERFLOW_MODEL_API_KEY": "test"}
        env.pop("LITELLM_LOCAL_MODEL_COST_MAP", None)
        worker = subprocess.run(
            [sys.executable, "-m", "engine.cli", "worker", "--store", store, "--stream", stream, "--stop-after", "1",
             "--timer-interval", "0", "--model", "openai/stub", "--json"],
            env=env, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert worker.returncode == 0, worker.stderr
    assert json.loads(worker.stdout)["statuses"] == {"completed": 1}, worker.stdout
    done = Engine(store).load(iid)
    assert done.main.resolve("letter") == "Dear Acme" and stub.requests[0]["model"] == "stub"

    # the log says when the client was ready, before the worker takes work
    lines = worker.stderr.splitlines()
    ready = [n for n, line in enumerate(lines) if "model client for 'openai/stub' ready" in line]
    running = [n for n, line in enumerate(lines) if "running the instances put on stream" in line]
    assert ready and running and ready[0] < running[0], worker.stderr
    assert re.search(r"litellm loaded in [0-9.]+s", lines[ready[0]]), lines[ready[0]]
