"""An operator's day: instances resumed from another folder, after their files changed, twice at once."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from engine.cli import main

from engine_helpers import EXAMPLES, LOAN_CONFLICT


def _copy_loan(folder: Path) -> Path:
    folder.mkdir()
    for name in ("loan_approval.bpmn", "loan_approval.layerflow.yaml", "loan_handlers.py"):
        shutil.copy(EXAMPLES / name, folder / name)
    shutil.copytree(EXAMPLES / "knowledge", folder / "knowledge")
    return folder / "loan_approval.bpmn"


def test_resume_from_another_folder_finds_handlers_beside_the_process(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """Run with a relative BPMN path, resume from another working directory: the handler files
    beside the process are still found (the record keeps where the process was, not the cwd)."""
    _copy_loan(tmp_path / "proj")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    store = f"sqlite:///{tmp_path / 'day.db'}"
    runner = CliRunner()
    monkeypatch.chdir(tmp_path)
    started = runner.invoke(main, ["run", "proj/loan_approval.bpmn", "--data", json.dumps(LOAN_CONFLICT),
                                   "--store", store, "--json"], catch_exceptions=False)
    assert started.exit_code == 3, started.stderr
    instance_id = json.loads(started.stdout)["instance_id"]
    monkeypatch.chdir(elsewhere)
    resumed = runner.invoke(main, ["resume", instance_id, "--answer",
                                   "review_join/approval_status=pending_dual_approval", "--store", store, "--json"],
                            catch_exceptions=False)
    doc = json.loads(resumed.stdout)
    assert doc["error"] is None and doc["status"] == "completed", doc["error"]
    assert resumed.exit_code == 0
