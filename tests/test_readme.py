"""The README's commands work when pasted: the demo command, the tour block and the
Python API example run here, in a scratch folder beside the examples."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()


@pytest.fixture
def scratch(tmp_path: Path) -> tuple[Path, dict[str, str]]:
    (tmp_path / "bpmn_examples").symlink_to(ROOT / "bpmn_examples")
    env = {**os.environ, "LAYERFLOW_STORE": f"sqlite:///{tmp_path / 'readme.db'}"}
    env.pop("LAYERFLOW_MODEL_API_BASE", None)
    return tmp_path, env


def test_the_first_command_runs_the_demo(scratch) -> None:
    cwd, env = scratch
    first = next(line for line in README.splitlines() if "layerflow demo loan" in line)
    command = first.split("&&", 1)[1].split("#", 1)[0].strip()
    out = subprocess.run(command, shell=True, cwd=cwd, env=env, capture_output=True, text=True, timeout=120,
                         stdin=subprocess.DEVNULL)
    assert out.returncode == 0, out.stderr
    assert "completed" in out.stdout


def test_the_second_command_is_what_ci_runs() -> None:
    second = [line for line in README.splitlines() if "python -m pytest" in line][0]
    command = second.split("#", 1)[0].strip()
    assert command in (ROOT / ".ci" / "run").read_text()


def test_the_tour_runs(scratch) -> None:
    cwd, env = scratch
    block = re.search(r"<!-- readme-test[^>]*-->\s*```bash\n(.*?)```", README, re.S)
    assert block, "README lost its tour block"
    script = "set -e\n" + block.group(1)
    out = subprocess.run(["bash", "-c", script], cwd=cwd, env=env, capture_output=True, text=True, timeout=300,
                         stdin=subprocess.DEVNULL)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-3000:]
    assert "completed" in out.stdout
    assert '"status": "completed"' in (cwd / "result.json").read_text()


def test_the_python_example_runs(scratch) -> None:
    cwd, env = scratch
    section = README.split("## The Python API", 1)[1]
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    out = subprocess.run([sys.executable, "-c", code], cwd=cwd, env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "denied" in out.stdout and "completed approved" in out.stdout
