import os
import shutil
import tempfile
from pathlib import Path

from hypothesis import HealthCheck, settings

# CI runs a bounded profile; `HYPOTHESIS_PROFILE=thorough pytest` explores more.
settings.register_profile("ci", max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("dev", max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("thorough", max_examples=2000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci" if os.environ.get("CI") else "dev"))


def _scratch_in_memory() -> None:
    """Put ``tmp_path`` (and ``tempfile``'s files) on tmpfs when the machine has one with room.

    The suite's sqlite stores commit with ``synchronous=FULL``: an fsync per save, a few ms
    each on a disk (far more on a busy shared one), thousands of saves in a run. No test can
    tell an fsync from none (nothing here cuts the power; a killed process loses nothing the
    page cache holds), so they are only waiting. An explicit ``TMPDIR`` is left alone."""
    shm = Path("/dev/shm")
    if "TMPDIR" in os.environ or not shm.is_dir() or not os.access(shm, os.W_OK):
        return
    try:
        if shutil.disk_usage(shm).free < 2 * 1024**3:
            return
        root = shm / f"layerflow-tests-{os.getuid()}"
        root.mkdir(mode=0o700, exist_ok=True)
        if root.is_symlink() or root.stat().st_uid != os.getuid():
            return  # not ours
    except OSError:
        return
    tempfile.tempdir = str(root)


_scratch_in_memory()
