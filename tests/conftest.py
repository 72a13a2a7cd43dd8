import os
import shutil
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

# CI runs a bounded, derandomized profile (the same examples every run: a landing is decided by the
# code, not by the draw; the explicit @examples pin what earlier draws found); the dev profile draws
# anew each run, and `HYPOTHESIS_PROFILE=thorough pytest` explores more.
settings.register_profile("ci", max_examples=60, deadline=None, derandomize=True,
                          suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("dev", max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("thorough", max_examples=2000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci" if os.environ.get("CI") else "dev"))


def _tmpfs() -> Path | None:
    """A folder of ours on tmpfs (``/dev/shm``) with room to spare, or None."""
    shm = Path("/dev/shm")
    try:
        if not shm.is_dir() or not os.access(shm, os.W_OK) or shutil.disk_usage(shm).free < 2 * 1024**3:
            return None
        root = shm / f"layerflow-tests-{os.getuid()}"
        root.mkdir(mode=0o700, exist_ok=True)
        if root.is_symlink() or root.stat().st_uid != os.getuid():
            return None  # not ours
    except OSError:
        return None
    return root


@pytest.fixture(scope="session", autouse=True)
def _scratch_on_tmpfs(tmp_path_factory: pytest.TempPathFactory) -> None:
    """``tmp_path`` on tmpfs when the machine has one (an explicit ``TMPDIR`` is left alone).

    The suite's sqlite stores commit with ``synchronous=FULL``: an fsync per save, a few ms
    each on a disk (far more on a busy shared one), thousands of saves in a run. No test can
    tell an fsync from none (nothing here cuts the power; a killed process loses nothing the
    page cache holds), so they only waited. pyproject's ``tmp_path_retention_policy`` keeps
    only failed tests' folders, so a run leaves little behind in memory."""
    root = None if "TMPDIR" in os.environ else _tmpfs()
    if root is None:
        return
    saved = tempfile.tempdir
    tempfile.tempdir = str(root)  # read once, by the base folder's creation just below
    try:
        tmp_path_factory.getbasetemp()
    finally:
        tempfile.tempdir = saved
