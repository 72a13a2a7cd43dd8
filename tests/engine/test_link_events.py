"""BPMN link events: a link throw event goes on at the link catch event of its name, in its process
level (``engine.links``, connected as ``engine.spiff`` parses the throw; SpiffWorkflow 3.2 reads
neither).

Each process of ``tests/engine/links/`` is cut by links as modelers cut a big diagram; drawn again
with plain sequence flows instead (``_drawn_with_flows``: every flow into a throw goes where its
catch's flow goes), it must take the same path (the activities, in order) to the same variables,
under layerflow (the Python API, ``run --json`` and the tape) and under plain SpiffWorkflow 3.2.
``validate`` refuses a link it cannot pair, naming the file, the line, the element and what to do.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any, NamedTuple

import pytest
from click.testing import CliRunner
from lxml import etree

from engine import Engine, load_process
from engine.cli import main
from engine.diagram import layered_layout, parse_bpmn, render_svg

from engine_helpers import path_of, run_plain, variables

LINKS = Path(__file__).resolve().parent / "links"
ROOT = Path(__file__).resolve().parents[2]
BPMN = "{http://www.omg.org/spec/BPMN/20100524/MODEL}"


class Case(NamedTuple):
    name: str  # tests/engine/links/<name>.bpmn, process id <name>
    data: dict[str, Any]
    answers: dict[str, dict[str, Any]]  # user task id -> what the person enters


CASES: dict[str, Case] = {
    "a process cut by two link pairs": Case("two_pages", {"amount": 10}, {}),
    "a link inside a sub-process, beside a link of the same name one level up": Case("in_subprocess", {}, {}),
    "a link that jumps back, guarded by an exclusive gateway": Case("loop_back", {"limit": 3}, {}),
    "the loop through the link, once": Case("loop_back", {"limit": 1}, {}),
    "a link throw in one branch of a parallel split": Case("parallel_branch", {}, {}),
    "several throws to one catch, the first": Case("several_throws", {"amount": 500}, {}),
    "several throws to one catch, the other": Case("several_throws", {"amount": 5}, {}),
    "a user task after a link catch": Case("user_task_after_link", {"customer": "Ann"},
                                           {"Activity_approve": {"approved": True}}),
}


def _link_ids(path: Path) -> set[str]:
    root = etree.parse(str(path)).getroot()
    return {el.get("id") for el in root.iter() if el.find(f"{BPMN}linkEventDefinition") is not None}


def _drawn_with_flows(path: Path, folder: Path) -> Path:
    """The same process with sequence flows instead of its links: a flow into a throw goes to the
    target of its catch's outgoing flow, and the link events and the catches' flows are gone."""
    tree = etree.parse(str(path))
    for scope in [*tree.getroot().iter(f"{BPMN}process"), *tree.getroot().iter(f"{BPMN}subProcess")]:
        flows = list(scope.iterchildren(f"{BPMN}sequenceFlow"))
        catches = {el.find(f"{BPMN}linkEventDefinition").get("name"): el
                   for el in scope.iterchildren(f"{BPMN}intermediateCatchEvent")
                   if el.find(f"{BPMN}linkEventDefinition") is not None}
        after = {f.get("sourceRef"): f for f in flows}
        for throw in [el for el in scope.iterchildren(f"{BPMN}intermediateThrowEvent")
                      if el.find(f"{BPMN}linkEventDefinition") is not None]:
            catch = catches[throw.find(f"{BPMN}linkEventDefinition").get("name")]
            for flow in flows:
                if flow.get("targetRef") == throw.get("id"):
                    flow.set("targetRef", after[catch.get("id")].get("targetRef"))
            scope.remove(throw)
        for catch in catches.values():
            scope.remove(after[catch.get("id")])
            scope.remove(catch)
    folder.mkdir(exist_ok=True)
    drawn = folder / path.name
    tree.write(str(drawn), xml_declaration=True, encoding="UTF-8")
    assert not _link_ids(drawn)
    return drawn


def _run_ours(path: Path, case: Case) -> Any:
    engine = Engine()
    instance = engine.run(engine.start(load_process(path), case.data), answers={"user_tasks": case.answers})
    assert instance.status == "completed", instance.error or instance.waiting_for
    return instance


def _activities(instance: Any) -> list[tuple[str, str | None]]:
    """The tape's activity order: every context's begin events, (context, activity)."""
    return [(name, e.activity) for name, ctx in sorted(instance.contexts.items())
            for e in ctx.tape if e.kind == "begin"]


@pytest.mark.parametrize("case", list(CASES))
def test_a_linked_process_runs_as_the_one_drawn_with_flows(case: str, tmp_path: Path) -> None:
    linked = LINKS / f"{CASES[case].name}.bpmn"
    drawn = _drawn_with_flows(linked, tmp_path / "flows")
    ours, with_flows = _run_ours(linked, CASES[case]), _run_ours(drawn, CASES[case])
    links = _link_ids(linked)
    path = path_of(ours.workflow)
    assert [p for p in path if p not in links] == path_of(with_flows.workflow)
    assert links & set(path), "the links were jumped through, not around"
    assert variables(ours.main) == variables(with_flows.main)
    assert _activities(ours) == _activities(with_flows)
    plain, data = run_plain(drawn, CASES[case].data, CASES[case].answers)
    assert path_of(with_flows.workflow) == path_of(plain)
    assert variables(ours.main) == data


def _comparable(layer: dict[str, Any]) -> dict[str, Any]:
    """A layer without what differs between any two runs: a snapshot id counts tape events, and a
    merged conflict carries the time it was resolved."""
    kept = {k: v for k, v in layer.items() if k != "_snapshot_id"}
    if "_mergedConflicts" in kept:
        kept["_mergedConflicts"] = [{k: v for k, v in c.items() if k != "time"} for c in kept["_mergedConflicts"]]
    return kept


@pytest.mark.parametrize("case", list(CASES))
def test_run_json_of_a_linked_process_gives_the_layers_of_the_one_drawn_with_flows(case: str, tmp_path: Path) -> None:
    linked = LINKS / f"{CASES[case].name}.bpmn"
    drawn = _drawn_with_flows(linked, tmp_path / "flows")
    (tmp_path / "answers.json").write_text(json.dumps({"user_tasks": CASES[case].answers}))
    docs = []
    for path in (linked, drawn):
        result = CliRunner().invoke(main, ["run", str(path), "--json", "--store", "memory://", "--data",
                                           json.dumps(CASES[case].data), "--answers", str(tmp_path / "answers.json")])
        docs.append(json.loads(result.stdout))
        assert (docs[-1]["status"], result.exit_code) == ("completed", 0), docs[-1]["error"]
    ours, with_flows = docs
    for layer in ("L0", "L1", "L2", "L3", "L4", "L5"):
        assert _comparable(ours["layers"][layer]) == _comparable(with_flows["layers"][layer]), layer
    assert ours["conflicts"] == with_flows["conflicts"]


def test_the_branches_of_a_split_with_a_link_in_one_are_named_by_their_first_elements() -> None:
    """The branch of the credit check runs through a link before it joins: its id is still the id of
    its first element, and the join's BRANCH_PRIORITY (which names it) decides the conflict."""
    instance = _run_ours(LINKS / "parallel_branch.bpmn", CASES["a link throw in one branch of a parallel split"])
    [conflict] = instance.conflicts
    assert conflict["gateway_id"] == "Gateway_join" and conflict["key"] == "status"
    assert conflict["values"] == {"Activity_credit": "credit checked", "Activity_fraud": "fraud checked"}
    assert conflict["resolution"]["value"] == "credit checked"  # as plain SpiffWorkflow: its last branch
    assert variables(instance.main)["approved"] is True


def test_a_user_task_after_a_link_waits_is_saved_and_resumed_in_a_new_process(tmp_path: Path) -> None:
    store = f"sqlite:///{tmp_path / 'links.db'}"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}

    def cli(*args: str) -> dict[str, Any]:
        done = subprocess.run([sys.executable, "-m", "engine.cli", *args, "--json", "--store", store],
                              capture_output=True, text=True, env=env, cwd=tmp_path, check=False)
        return dict(json.loads(done.stdout))

    first = cli("run", str(LINKS / "user_task_after_link.bpmn"), "--data", '{"customer": "Ann"}')
    assert first["status"] == "waiting" and [w["task_id"] for w in first["waiting_for"]] == ["Activity_approve"]
    (tmp_path / "answers.json").write_text(json.dumps({"user_tasks": {"Activity_approve": {"approved": True}}}))
    done = cli("resume", first["instance_id"], "--answers", str(tmp_path / "answers.json"))
    assert done["status"] == "completed", done["error"]
    assert done["layers"]["L3"]["sent"] == "offer for Ann"
    inspected = cli("inspect", first["instance_id"])
    replayed = cli("replay", first["instance_id"], "--until", "1000000")
    assert json.dumps(replayed["layers"], sort_keys=True).encode() == json.dumps(inspected["layers"],
                                                                                 sort_keys=True).encode()
    assert replayed["layers"] == done["layers"]
    engine = Engine(store=store)
    loaded = engine.load(first["instance_id"])
    assert [a for _, a in _activities(loaded)] == ["Activity_prepare", "Activity_approve", "Activity_send"]


@pytest.mark.parametrize("name", sorted(p.stem for p in LINKS.glob("*.bpmn")))
def test_validate_accepts_every_linked_process_and_the_diagram_draws_it(name: str) -> None:
    result = CliRunner().invoke(main, ["validate", str(LINKS / f"{name}.bpmn")])
    assert result.exit_code == 0 and "warning" not in result.output, result.output
    diagram = layered_layout(parse_bpmn(LINKS / f"{name}.bpmn"))
    svg = render_svg(diagram)
    process = etree.parse(str(LINKS / f"{name}.bpmn")).getroot().find(f"{BPMN}process")
    drawn = {el.get("id") for el in process} & _link_ids(LINKS / f"{name}.bpmn")  # a sub-process is one shape
    assert drawn and set(diagram.nodes) >= drawn and svg.startswith("<svg")
