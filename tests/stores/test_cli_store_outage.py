"""The store stops answering while `layerflow run` / `resume` advance an instance: the command
ends with exit 1 and names the instance (its id in the `--json` document, not null) and how to
continue it, never a traceback. What was saved before stands and `resume` continues from it.

Each test starts a redis-server of its own (``OwnRedis``) and stops it mid-activity: the
handler of the second step writes a mark and waits, the test kills the server meanwhile and
then lets the handler go on (it writes the ``GO`` file; ``PAUSE`` only caps the wait).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from context_layers.stores import open_store
from engine import Engine, load_process

from .test_faults import OwnRedis

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]

BPMN = """<?xml version="1.0" encoding="UTF-8"?>
<bpmn:definitions xmlns:bpmn="http://www.omg.org/spec/BPMN/20100524/MODEL" id="steps_defs"
                  targetNamespace="https://layerflow.dev/tests">
  <bpmn:process id="steps" isExecutable="true">
    <bpmn:startEvent id="start"/>
    <bpmn:serviceTask id="s1"/>
    <bpmn:serviceTask id="s2"/>
    <bpmn:endEvent id="end"/>
    <bpmn:sequenceFlow id="f1" sourceRef="start" targetRef="s1"/>
    <bpmn:sequenceFlow id="f2" sourceRef="s1" targetRef="s2"/>
    <bpmn:sequenceFlow id="f3" sourceRef="s2" targetRef="end"/>
  </bpmn:process>
</bpmn:definitions>
"""

HANDLERS = """import os, time


def s1(ctx):
    return {"r1": 1}


def s2(ctx):
    with open(os.environ["MARK"], "a") as f:
        f.write(ctx.instance_id + "\\n")
    # wait until the test says go (it has done what it does mid-activity), at most PAUSE seconds
    go = os.environ.get("GO")
    deadline = time.monotonic() + float(os.environ.get("PAUSE", "0"))
    while time.monotonic() < deadline and not (go and os.path.exists(go)):
        time.sleep(0.01)
    return {"r2": 2}
"""


def write_process(folder: Path) -> Path:
    (folder / "steps.bpmn").write_text(BPMN)
    (folder / "steps.layerflow.yaml").write_text("s1: {handler: steps_handlers.py:s1}\n"
                                                  "s2: {handler: steps_handlers.py:s2}\n")
    (folder / "steps_handlers.py").write_text(HANDLERS)
    return folder / "steps.bpmn"


@pytest.mark.parametrize("command", ["run", "resume"])
@pytest.mark.parametrize("as_json", [True, False], ids=["json", "text"])
def test_store_down_mid_run_names_the_instance(tmp_path: Path, command: str, as_json: bool) -> None:
    server = OwnRedis(tmp_path, durable=True)
    server.start()
    try:
        bpmn = write_process(tmp_path)
        mark = tmp_path / "mark"
        iid = None
        if command == "run":
            args = ["run", str(bpmn)]
        else:
            iid = Engine(server.url).start(load_process(str(bpmn)), {}).instance_id
            args = ["resume", iid]
        go = tmp_path / "go"
        env = {**os.environ, "PYTHONPATH": str(ROOT), "MARK": str(mark), "PAUSE": "60", "GO": str(go)}
        proc = subprocess.Popen([sys.executable, "-m", "engine.cli", *args, "--store", server.url,
                                 *(["--json"] if as_json else [])], env=env, cwd=ROOT,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        deadline = time.monotonic() + 60
        while not (mark.exists() and mark.read_text()) and time.monotonic() < deadline:
            time.sleep(0.05)
        iid = mark.read_text().split()[0]
        server.kill()  # s2 is running: its save after the activity meets no server
        go.touch()
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 1, (proc.returncode, err[-2000:])
        assert "Traceback" not in err
        if as_json:
            doc = json.loads(out)
            assert (doc["instance_id"], doc["process_id"], doc["status"]) == (iid, "steps", "error")
            assert doc["error"]["kind"] == "store_unavailable"
            assert f"layerflow resume {iid}" in doc["error"]["message"]
        else:
            assert f"127.0.0.1:{server.port}" in err and f"layerflow resume {iid}" in err

        # the server comes back with what it committed (AOF): s1 stands, resume runs s2 again
        server.start()
        # the failed command's lease outlives the outage (it runs out within LEASE_TTL): let it go
        store = open_store(server.url)
        owner = store.lease_owner(iid)
        assert owner is not None and owner.startswith("cli-")
        assert store.release_lease(iid, owner)
        store.close()
        env["PAUSE"] = "0"
        done = subprocess.run([sys.executable, "-m", "engine.cli", "resume", iid, "--store", server.url, "--json"],
                              env=env, cwd=ROOT, capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, (done.stdout[-3000:], done.stderr[-2000:])
        layers = json.loads(done.stdout)["layers"]
        assert (layers["L3"]["r1"], layers["L3"]["r2"]) == (1, 2)
        assert mark.read_text().split() == [iid, iid]
    finally:
        server.stop()
