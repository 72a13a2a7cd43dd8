"""A law firm's legal-operations engineer builds a commercial contract review from the README alone.

The process (tests/outsider_legal47/contract_review.bpmn, its .layerflow.yaml and legal_handlers.py):
a person's intake (counterparty, value, jurisdiction, the contract text), clause extraction (a model
step with an outputSchema; offline here, its handler stands in), an inclusive split into legal (model),
commercial (a person, with a 72-hour boundary timer) and security (a handler that throws NO_DPA, caught
by an error boundary) reviews, a join that settles ``risk_rating`` by a policy ranking and ``redlines``
by a person, and an XOR that sends a high-risk contract back to renegotiation. Round 1's person answers
through ``--answers``, round 2's at a terminal through ``resume``. Driven only by ``layerflow`` commands
run as subprocesses (the model path: test_outsider47_legal_model.py).
"""

from __future__ import annotations

import json
import os
import pty
import select
import shlex
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
HERE = ROOT / "tests" / "outsider_legal47"
BPMN = HERE / "contract_review.bpmn"
ENV = {**os.environ, "PYTHONPATH": str(ROOT), "NO_COLOR": "1"}
ROUND2_OPTIONS = [["mutual indemnity"], ["payment in 60 days"], "$escalate"]


def layerflow(*args: str, code: int | None = 0) -> subprocess.CompletedProcess[str]:
    done = subprocess.run([sys.executable, "-m", "engine.cli", *args], capture_output=True, text=True, env=ENV,
                          timeout=120)
    if code is not None:
        assert done.returncode == code, (args, done.stdout[-2000:], done.stderr[-2000:])
    return done


def doc_of(*args: str, code: int | None = 0) -> dict[str, Any]:
    return json.loads(layerflow(*args, "--json", code=code).stdout)


def at_a_terminal(*args: str, choice: bytes) -> tuple[int, str]:
    """``layerflow ARGS`` with a terminal for stdin/stdout: answers the first question with ``choice``."""
    pid, fd = pty.fork()
    if pid == 0:  # the child: layerflow at a terminal
        os.execvpe(sys.executable, [sys.executable, "-m", "engine.cli", *args], ENV)
    seen, answered = b"", False
    while True:
        ready, _, _ = select.select([fd], [], [], 60)
        assert ready, seen.decode(errors="replace")
        try:
            chunk = os.read(fd, 4096)
        except OSError:  # the child closed the terminal
            break
        if not chunk:
            break
        seen += chunk
        if not answered and b"choose 1-" in seen:
            os.write(fd, choice + b"\n")
            answered = True
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status), seen.decode(errors="replace")


@pytest.fixture(scope="module")
def reviewed(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Round 1 answered by --answers, then waiting at round 2's redlines; then answered at a terminal."""
    store = f"sqlite:///{tmp_path_factory.mktemp('legal47') / 'runs.db'}"
    first = doc_of("run", str(BPMN), "--data", str(HERE / "start.json"), "--answers", str(HERE / "answers.json"),
                   "--store", store, code=3)
    iid = first["instance_id"]
    code, screen = at_a_terminal("resume", iid, "--store", store, choice=b"2")
    return {"store": store, "id": iid, "first": first, "code": code, "screen": screen,
            "final": doc_of("inspect", iid, "--store", store)}


def test_round_one_by_answers_file_round_two_waits_for_the_partner(reviewed: dict[str, Any]) -> None:
    first = reviewed["first"]
    assert first["status"] == "waiting" and first["error"] is None
    (wait,) = first["waiting_for"]
    assert (wait["kind"], wait["id"], wait["task_id"]) == ("confirmation", "review_join/redlines", "review_join")
    one, rating, two = first["conflicts"]
    assert (one["key"], one["resolution"]["resolver"]) == ("redlines", "human")
    assert one["values"] == {"legal_review": ["cap liability at 12 months of fees"],
                             "commercial_review": ["payment in 60 days"]}
    assert rating["key"] == "risk_rating" and rating["resolution"]["resolver"] == "policy"
    assert rating["resolution"]["value"] == "high"                      # the ranking: the most cautious stands
    assert two["key"] == "redlines" and two["resolution"] is None
    assert two["base_value"] == ["cap liability at 12 months of fees"]   # round 1's decision is round 2's base
    open_one = [c for c in first["confirmations"] if not c.get("answered")]
    assert [o["value"] for o in open_one[0]["options"]] == ROUND2_OPTIONS
    history = first["layers"]["L3"]
    assert history["negotiation_round"] == 1 and history["event:no_dpa"]["kind"] == "event"
    assert history["security_escalated"] is True                         # the error boundary's path ran
    assert "activity:extract_clauses#2" in history                       # the loop ran extraction again


def test_round_two_answered_at_a_terminal_completes(reviewed: dict[str, Any]) -> None:
    assert reviewed["code"] == 0, reviewed["screen"]
    assert "Partner, pick the redlines to send." in reviewed["screen"]
    final = reviewed["final"]
    assert final["status"] == "completed" and final["waiting_for"] == []
    resolution = final["conflicts"][-1]["resolution"]
    assert resolution["value"] == ["payment in 60 days"] and resolution["resolver"] == "human"


def test_compression_keeps_the_preserved_keys(reviewed: dict[str, Any]) -> None:
    final, store, iid = reviewed["final"], reviewed["store"], reviewed["id"]
    (compression,) = final["compressions"]
    assert compression["activity_id"] == "sign_off" and "token_threshold" in compression["triggers"]
    assert compression["tokens_after"] < compression["tokens_before"]
    history = final["layers"]["L3"]
    assert {k: history[k] for k in ("counterparty", "contract_value", "risk_rating", "liability_cap")} == {
        "counterparty": "Acme GmbH", "contract_value": 250000, "risk_rating": "medium", "liability_cap": "raised"}
    assert "contract_text" not in history and "compaction:1" in history
    # the context just before the compression still has the whole contract
    before = doc_of("replay", iid, "--until", str(compression["event_seq"] - 1), "--store", store)
    assert "Clause 14." in before["layers"]["L3"]["contract_text"]
    # and rolling HISTORY back to the compression's snapshot brings it back, as a tape event
    back = doc_of("rollback", iid, "--snapshot", compression["snapshot_id"], "--layers", "L3", "--store", store)
    assert back["restored_layers"] == ["L3"] and "Clause 14." in back["layers"]["L3"]["contract_text"]
    assert back["layers"]["L3"]["risk_rating"] == "medium"


def test_a_misspelt_preserve_key_is_named_by_validate_and_by_the_compression(tmp_path: Path) -> None:
    for name in ("contract_review.bpmn", "legal_handlers.py"):
        shutil.copy(HERE / name, tmp_path / name)
    config = (HERE / "contract_review.layerflow.yaml").read_text()
    typo = config.replace("risk_rating, liability_cap]", "risk_ratings, liability_cap]").replace(
        "risk_rating: [high", "risk_ratng: [high")
    assert typo.count("risk_ratings") == 1 and typo.count("risk_ratng") == 1
    (tmp_path / "contract_review.layerflow.yaml").write_text(typo)
    bpmn = str(tmp_path / "contract_review.bpmn")
    checked = layerflow("validate", bpmn)
    assert "preserveKeys of 'sign_off' name 'risk_ratings'" in checked.stdout + checked.stderr
    assert "conflictPolicy ranking 'risk_ratng'" in checked.stdout + checked.stderr
    assert (checked.stdout + checked.stderr).count("did you mean 'risk_rating'") == 2
    # run with the preserveKeys slip alone; the partner's answer fits both rounds: the compression names it
    (tmp_path / "contract_review.layerflow.yaml").write_text(typo.replace("risk_ratng: [high", "risk_rating: [high"))
    answers = json.loads((HERE / "answers.json").read_text())
    answers["confirmations"]["review_join/redlines"] = ["payment in 60 days"]
    (tmp_path / "answers.json").write_text(json.dumps(answers))
    done = layerflow("run", bpmn, "--data", str(HERE / "start.json"), "--answers", str(tmp_path / "answers.json"),
                     "--store", "memory://", "--json")
    doc = json.loads(done.stdout)
    assert doc["status"] == "completed" and "risk_rating" not in doc["layers"]["L3"]
    slip = "it folded 'risk_rating' (preserveKeys name 'risk_ratings', which no layer holds: a misspelling of 'risk_rating'?"
    assert slip in done.stderr
    assert any(note.startswith(slip) for note in doc["compressions"][0]["notes"])


def test_a_refused_answer_names_the_resume_to_paste_with_its_store(tmp_path: Path) -> None:
    """The partner answers with the branch's name instead of its value: refused (exit 2), and the
    `layerflow resume` the message offers works when pasted (it names the store the run used)."""
    answers = json.loads((HERE / "answers.json").read_text())
    answers["confirmations"]["review_join/redlines"] = "legal_review"
    (tmp_path / "answers.json").write_text(json.dumps(answers))
    store = f"sqlite:///{tmp_path / 'my runs.db'}"
    done = layerflow("run", str(BPMN), "--data", str(HERE / "start.json"), "--answers", str(tmp_path / "answers.json"),
                     "--store", store, code=2)
    command = done.stderr.split("(`", 1)[1].split("`)", 1)[0]
    assert command.startswith("layerflow resume ") and f"--store '{store}'" in command, done.stderr
    pasted = command.replace("layerflow ", "", 1).replace("VALUE", "'[\"payment in 60 days\"]'")
    resumed = subprocess.run(f"{shlex.quote(sys.executable)} -m engine.cli {pasted} --json", shell=True,
                             capture_output=True, text=True, env=ENV, timeout=120)
    assert resumed.returncode == 3, resumed.stderr       # round 2 waits for the partner again
    assert json.loads(resumed.stdout)["conflicts"][0]["resolution"]["value"] == ["payment in 60 days"]
    gone = layerflow("run", str(BPMN), "--data", str(HERE / "start.json"), "--answers", str(tmp_path / "answers.json"),
                     "--store", "memory://", code=2)
    assert "layerflow resume" not in gone.stderr and "memory:// lives only in this command" in gone.stderr


def test_a_branch_id_that_ran_in_two_rounds_says_which_context_it_shows(reviewed: dict[str, Any]) -> None:
    """The legal branch ran once per negotiation round: `--context legal_review` shows the latest round,
    and says so, naming the other one to ask for in full."""
    done = layerflow("replay", reviewed["id"], "--context", "legal_review", "--until", "3", "--store", reviewed["store"],
                     "--json")
    assert json.loads(done.stdout)["context"] == "main/legal_review@40"
    assert ("branch 'legal_review' ran in 2 contexts: main/legal_review@16, main/legal_review@40; this is "
            "main/legal_review@40, the latest") in done.stderr
