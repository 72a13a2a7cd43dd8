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


def test_a_catalog_says_which_files_and_process_ids_it_leaves_out(tmp_path: Path) -> None:
    """Two files defining one process id, and a file that is no XML: the server listed the first
    and said nothing of the others (`layerflow serve` now prints these as warnings)."""
    from engine.governance import Catalog

    loan = (EXAMPLES / "loan_approval.bpmn").read_text(encoding="utf-8")
    (tmp_path / "a_loan.bpmn").write_text(loan, encoding="utf-8")
    (tmp_path / "b_loan_copy.bpmn").write_text(loan, encoding="utf-8")
    (tmp_path / "c_broken.bpmn").write_text("<bpmn:definitions", encoding="utf-8")
    catalog = Catalog(tmp_path)
    assert catalog.entries() == {"loan_approval": {"id": "loan_approval", "name": "Loan approval",
                                                   "file": "a_loan.bpmn"}}
    problems = catalog.problems()
    assert len(problems) == 2
    assert problems[0].startswith("b_loan_copy.bpmn: process 'loan_approval' is left out") and "a_loan.bpmn" in problems[0]
    assert problems[1].startswith("c_broken.bpmn: left out of the catalog") and "layerflow validate" in problems[1]


@pytest.mark.parametrize("command", ["run", "validate"])
def test_a_path_the_system_refuses_is_bad_input_not_a_traceback(tmp_path: Path, command: str) -> None:
    name = str(tmp_path / ("a" * 300 + ".bpmn"))
    result = CliRunner().invoke(main, [command, name, "--json"] + (["--store", "memory://"] if command == "run" else []))
    assert result.exit_code == 2, result.output
    assert result.exception is None or isinstance(result.exception, SystemExit)
    assert "File name too long" in (result.stdout + result.stderr)
