"""A conflict across layers is resolved in the lowest layer involved; a branch's value left in
WORKING must not move over that resolution when the next activity completes.

Found by test_random_governed (dev profile): branch ``x4`` injected ``i0=0`` and its activity moved it
into HISTORY; branch ``x8`` injected ``i0=1`` at an exclusive choice and held it in WORKING (its inner
parallel join put the split's value back). The join ``j2`` asked a person, who chose 0, yet the next
activity moved x8's WORKING value over the answer: the process ended with ``i0 == 1``.
"""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner

from engine.cli import main

HERE = Path(__file__).resolve().parent / "cross_layer"


def _run(tmp_path: Path, answer: int) -> dict:
    answers = tmp_path / "answers.json"
    answers.write_text(json.dumps({"confirmations": {"j2/i0": answer}}), encoding="utf-8")
    result = CliRunner().invoke(main, ["run", str(HERE / "governed.bpmn"), "--store", "memory://",
                                       "--answers", str(answers), "--json"], catch_exceptions=False)
    return json.loads(result.stdout)


def test_a_persons_answer_to_a_conflict_across_layers_is_what_the_process_ends_with(tmp_path: Path) -> None:
    for answer in (0, 1):
        doc = _run(tmp_path, answer)
        assert doc["status"] == "completed", doc["error"]
        [conflict] = doc["conflicts"]
        assert conflict["key"] == "i0" and conflict["values"] == {"x4": 0, "x8": 1}, conflict
        assert conflict["resolution"]["value"] == answer, conflict
        assert doc["layers"]["L3"]["i0"] == answer, doc["layers"]["L3"]
        assert "i0" not in doc["layers"]["L4"]
