"""The extractive summary is the same in every process, whatever the string hash seed."""

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

SCRIPT = """
from context_layers.summarize import ExtractiveSummarizer
units = [f"Review {i}: the applicant {w} the loan terms and the risk {v} for branch {i % 7}."
         for i, (w, v) in enumerate([("accepted", "rules"), ("questioned", "limits"), ("signed", "notes"),
                                     ("rejected", "scores"), ("amended", "flags")] * 12)]
print(repr(ExtractiveSummarizer().summarize("\\n".join(units), 120)))
"""


def test_summary_does_not_depend_on_the_hash_seed() -> None:
    outputs = set()
    for seed in ("0", "1", "2", "3", "4", "5"):
        env = {**os.environ, "PYTHONHASHSEED": seed, "PYTHONPATH": str(ROOT)}
        out = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, out.stderr
        outputs.add(out.stdout)
    assert len(outputs) == 1, outputs
    assert "Review" in outputs.pop()
