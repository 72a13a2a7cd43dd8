"""What a plain (non-editable) install ships: every package and every example file.

`layerflow demo loan` and `layerflow serve` read ``bpmn_examples/`` beside the ``engine``
package (``engine/cli.py`` EXAMPLES); from a wheel that folder is only there when
``pyproject.toml`` lists it with patterns that match every file in it. A file added to
the examples with a new suffix (a form schema, a second DMN folder) fails here until the
package data says so.
"""

from __future__ import annotations

import tomllib
from pathlib import Path, PurePosixPath

ROOT = Path(__file__).resolve().parents[1]


def _setuptools() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]


def _shipped(rel: str, patterns: list[str]) -> bool:
    # setuptools' package-data globs: "*" stays within one path segment
    return any(PurePosixPath(rel).match(p) and len(PurePosixPath(rel).parts) == len(PurePosixPath(p).parts)
               for p in patterns)


def test_every_top_level_package_ships() -> None:
    packages = set(_setuptools()["packages"])
    for name in ("context_layers", "gateways", "engine", "bpmn_examples"):
        assert name in packages, f"{name} is not in [tool.setuptools] packages"
    for sub in (ROOT / "context_layers").iterdir():
        if (sub / "__init__.py").exists():
            assert f"context_layers.{sub.name}" in packages, f"context_layers.{sub.name} would not ship"


def test_every_example_file_ships() -> None:
    patterns = _setuptools()["package-data"]["bpmn_examples"]
    files = [p.relative_to(ROOT / "bpmn_examples").as_posix()
             for p in (ROOT / "bpmn_examples").rglob("*")
             if p.is_file() and "__pycache__" not in p.parts]
    assert "loan_approval.bpmn" in files and "loan_approval.layerflow.yaml" in files
    missing = [f for f in files if not f.endswith(".py") and not _shipped(f, patterns)]
    assert not missing, f"bpmn_examples files a wheel would leave out (add to package-data): {missing}"


def test_the_pattern_check_can_fail() -> None:
    patterns = _setuptools()["package-data"]["bpmn_examples"]
    assert _shipped("claim_triage.dmn", patterns)
    assert _shipped("knowledge/risk_rules/credit_risk_rules.md", patterns)
    assert not _shipped("forms/review.schema.json", patterns)
    assert not _shipped("knowledge/deep/er/doc.md", patterns)
