"""Round 54, at scale: start data nested far deeper than layerflow keeps (200 levels).

Nested 300 deep it is refused naming the key and the limit; nested thousands deep Python's JSON
parser gives up first, and the refusal said the file "is not valid JSON" (it is): it says now
that the data is nested too deep, the limit, and what to do. Nothing is created either way.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BPMN = ROOT / "bpmn_examples" / "exclusive_default.bpmn"


def _nested(depth: int) -> str:
    return '{"deep": ' + '{"n": ' * depth + "1" + "}" * depth + "}"


@pytest.mark.parametrize("depth", [300, 5000])
def test_data_nested_too_deep_is_refused_naming_the_limit_and_nothing_is_created(tmp_path: Path, depth: int) -> None:
    data = tmp_path / "deep.json"
    data.write_text(_nested(depth))
    db = tmp_path / "runs.db"
    done = subprocess.run([sys.executable, "-m", "engine.cli", "run", str(BPMN), "--data", str(data),
                           "--store", f"sqlite:///{db}", "--json"], cwd=ROOT, capture_output=True, text=True,
                          env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"}, timeout=120)
    assert done.returncode == 2, done.stderr
    doc = json.loads(done.stdout)
    assert doc["instance_id"] is None
    message = doc["error"]["message"]
    assert str(data) in message and "nested" in message and "200" in message
    assert "not valid JSON" not in message
    listed = subprocess.run([sys.executable, "-m", "engine.cli", "list", "--store", f"sqlite:///{db}", "--json"],
                            cwd=ROOT, capture_output=True, text=True, env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"},
                            timeout=120)
    assert json.loads(listed.stdout) == []
