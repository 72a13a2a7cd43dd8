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
from engine.validate import validate_process

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


# ----- what validate refuses, naming the file, the line, the element and what to do ---------------------


def _mutated(tmp_path: Path, name: str, *replace: tuple[str, str]) -> Path:
    """A copy of ``links/<name>.bpmn`` with the given replacements (each must match once)."""
    text = (LINKS / f"{name}.bpmn").read_text(encoding="utf-8")
    for old, new in replace:
        assert text.count(old) == 1, old
        text = text.replace(old, new)
    path = tmp_path / f"{name}.bpmn"
    path.write_text(text, encoding="utf-8")
    return path


def _line(path: Path, needle: str) -> int:
    return next(n for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1) if needle in line)


REFUSED = {
    # name: (file, replacements, code, element, the line's text, what the message says)
    "a throw whose link no catch of its level has": (
        "two_pages", (('id="Link_catch_page3" name="page3"', 'id="Link_catch_page3" name="page_3"'),),
        "link_unmatched", "Event_to_page3", 'id="Event_to_page3"',
        ("link throw event 'Event_to_page3' jumps to link 'page3'", "no link catch event of process 'two_pages'",
         "the path would end there", '<bpmn:linkEventDefinition name="page3"/>', "did you mean 'page_3'")),
    "a throw in a sub-process whose link is caught one level up only": (
        "in_subprocess", (('id="Link_inner_catch" name="next"', 'id="Link_inner_catch" name="onwards"'),),
        "link_unmatched", "Event_inner_next", 'id="Event_inner_next"',
        ("no link catch event of subProcess 'Activity_check' has that name", "'Event_top_here' has it in another "
         "process level, and a link never leaves its own")),
    "two catches of one link in one level": (
        "several_throws", (('<bpmn:endEvent id="EndEvent_1"/>', '<bpmn:endEvent id="EndEvent_1"/>\n'
                            '    <bpmn:intermediateCatchEvent id="Event_review_2"><bpmn:linkEventDefinition '
                            'id="Link_review_2" name="review"/></bpmn:intermediateCatchEvent>'),),
        "link_duplicate", "Event_review_2", 'id="Event_review_2"',
        ("link catch event 'Event_review_2' catches link 'review', as 'Event_review' does in process "
         "'several_throws'", "a link has one catch event", "rename one of the links")),
    "a sequence flow into a catch": (
        "loop_back", (('sourceRef="Gateway_more" targetRef="Event_again"', 'sourceRef="Gateway_more" '
                                                                           'targetRef="Event_work"'),),
        "link_flow", "Event_work", 'id="Flow_again"',
        ("link catch event 'Event_work' has an incoming sequence flow 'Flow_again'", "BPMN forbids a link event "
         "to be both the target and the source of sequence flows", "point it at the element after 'Event_work'")),
    "a sequence flow out of a throw": (
        "two_pages", (('<bpmn:sequenceFlow id="Flow_6"', '<bpmn:sequenceFlow id="Flow_x" sourceRef="Event_to_page2" '
                                                         'targetRef="Activity_total"/>\n    <bpmn:sequenceFlow id="Flow_6"'),),
        "link_flow", "Event_to_page2", 'id="Flow_x"',
        ("link throw event 'Event_to_page2' has an outgoing sequence flow 'Flow_x'", "the run would fork there",
         "delete the flow, or draw it from the element before 'Event_to_page2'")),
    "a throw with no link name": (
        "two_pages", (('id="Link_throw_page2" name="page2"', 'id="Link_throw_page2"'),),
        "link_name_missing", "Event_to_page2", 'id="Event_to_page2"',
        ("link throw event 'Event_to_page2' has a linkEventDefinition with no name", "give its linkEventDefinition "
         "the name of the link catch event in process 'two_pages' it jumps to")),
    "a catch with no link name": (
        "two_pages", (('id="Link_catch_page2" name="page2"', 'id="Link_catch_page2"'),),
        "link_name_missing", "Event_from_page1", 'id="Event_from_page1"',
        ("link catch event 'Event_from_page1' has a linkEventDefinition with no name", "it never runs",
         "give its linkEventDefinition the name the throw events use")),
}


@pytest.mark.parametrize("name", list(REFUSED))
def test_validate_refuses_a_link_it_cannot_pair_and_says_what_to_do(tmp_path: Path, name: str) -> None:
    base, replace, code, element, at, says = REFUSED[name]
    path = _mutated(tmp_path, base, *replace)
    result = CliRunner().invoke(main, ["validate", str(path)])
    assert result.exit_code == 2, result.output
    rows = [r for r in result.output.splitlines() if f"element {element!r}" in r and "warning" not in r]
    assert len(rows) == 1, result.output
    assert rows[0].startswith(f"{path}:{_line(path, at)}: element {element!r}: "), rows[0]
    for words in says:
        assert words in rows[0], (words, rows[0])
    codes = [p.code for p in validate_process(path, discover_config=False).errors]
    assert code in codes and "spiff_validation" not in codes, codes  # not SpiffWorkflow's cruder word too
    run = CliRunner().invoke(main, ["run", str(path), "--json", "--store", "memory://"])
    assert run.exit_code == 2 and element in json.loads(run.stdout)["error"]["message"]


def test_a_catch_no_throw_jumps_to_is_a_warning(tmp_path: Path) -> None:
    path = _mutated(tmp_path, "in_subprocess",
                    ('id="Link_inner_catch" name="next"', 'id="Link_inner_catch" name="onwards"'))
    result = CliRunner().invoke(main, ["validate", str(path)])
    row = next(r for r in result.output.splitlines() if "element 'Event_inner_here'" in r)
    assert "warning" in row and "no link throw event of subProcess 'Activity_check' jumps to it" in row, row


def test_a_throw_names_its_catch_by_target_as_camunda_writes_it(tmp_path: Path) -> None:
    """BPMN's ``<bpmn:target>`` (the catch's linkEventDefinition id) pairs a throw whatever the names."""
    path = _mutated(tmp_path, "two_pages",
                    ('id="Link_throw_page3" name="page3"/>', 'id="Link_throw_page3" name="to the total">'
                     "<bpmn:target>Link_catch_page3</bpmn:target></bpmn:linkEventDefinition>"))
    assert CliRunner().invoke(main, ["validate", str(path)]).exit_code == 0
    ours = _run_ours(path, CASES["a process cut by two link pairs"])
    assert variables(ours.main)["total"] == 33 and "Event_from_page2" in path_of(ours.workflow)


def test_branches_of_a_split_that_meet_at_one_link_catch_are_a_warning(tmp_path: Path) -> None:
    """Two throws of one link in two branches of a parallel split merge the branches at the catch,
    as two flows into one task would: the join after it may fire early (``split_branches_merged``)."""
    path = _mutated(tmp_path, "parallel_branch",
                    ('sourceRef="Activity_fraud" targetRef="Gateway_join"', 'sourceRef="Activity_fraud" '
                                                                            'targetRef="Event_fraud_limits"'),
                    ('<bpmn:endEvent id="EndEvent_1"/>', '<bpmn:endEvent id="EndEvent_1"/>\n'
                     '    <bpmn:intermediateThrowEvent id="Event_fraud_limits"><bpmn:linkEventDefinition '
                     'name="limits"/></bpmn:intermediateThrowEvent>'))
    report = validate_process(path, discover_config=False)
    [merged] = [p for p in report.problems if p.code == "split_branches_merged"]
    assert merged.element_id == "Event_limits" and "'Activity_credit', 'Activity_fraud'" in merged.message


@pytest.mark.parametrize("case", [c for c in CASES if not CASES[c].answers])
def test_the_spec_layerflow_parses_runs_the_links_under_plain_spiffworkflow(case: str, tmp_path: Path) -> None:
    """The jump is in the spec, not in the engine: SpiffWorkflow with no driver runs it as the
    drawn process runs."""
    from SpiffWorkflow.bpmn.workflow import BpmnWorkflow

    from engine.spiff import LayerflowBpmnParser

    linked = LINKS / f"{CASES[case].name}.bpmn"
    parser = LayerflowBpmnParser()
    parser.add_bpmn_file(str(linked))
    wf = BpmnWorkflow(parser.get_spec(CASES[case].name), parser.get_subprocess_specs(CASES[case].name))
    wf.task_tree.data.update(CASES[case].data)
    wf.do_engine_steps()
    assert wf.is_completed()
    plain, _ = run_plain(_drawn_with_flows(linked, tmp_path / "flows"), CASES[case].data, {})
    assert [p for p in path_of(wf) if p not in _link_ids(linked)] == path_of(plain)


# ----- validate's path checks take the jump: a problem drawn across a link is still found ----------


def _process(body: str, pid: str = "across") -> str:
    return ('<?xml version="1.0" encoding="UTF-8"?>\n<bpmn:definitions xmlns:bpmn="http://www.omg.org/spec/'
            f'BPMN/20100524/MODEL" id="Definitions_{pid}" targetNamespace="https://layerflow.dev/tests/links">\n'
            f'  <bpmn:process id="{pid}" isExecutable="true">\n{body}\n  </bpmn:process>\n</bpmn:definitions>\n')


def _link(kind: str, eid: str, name: str) -> str:
    tag = "intermediateThrowEvent" if kind == "throw" else "intermediateCatchEvent"
    return f'    <bpmn:{tag} id="{eid}"><bpmn:linkEventDefinition name="{name}"/></bpmn:{tag}>'


def _flows(*pairs: str) -> str:
    return "\n".join(f'    <bpmn:sequenceFlow id="Flow_{i}" sourceRef="{p.split(">")[0]}" targetRef="{p.split(">")[1]}"/>'
                     for i, p in enumerate(pairs, 1))


ACROSS = {
    # an exclusive gateway's two paths meet at a parallel join, one of them through a link
    "join_never_complete": ("Gateway_join", "\n".join([
        '    <bpmn:startEvent id="StartEvent_1"/>',
        '    <bpmn:exclusiveGateway id="Gateway_choose" default="Flow_3"/>',
        '    <bpmn:task id="Activity_a"/>', '    <bpmn:task id="Activity_b"/>',
        _link("throw", "Event_to_b", "b"), _link("catch", "Event_b", "b"),
        '    <bpmn:parallelGateway id="Gateway_join"/>', '    <bpmn:endEvent id="EndEvent_1"/>',
        _flows("StartEvent_1>Gateway_choose", "Gateway_choose>Activity_a", "Gateway_choose>Event_to_b",
               "Event_b>Activity_b", "Activity_a>Gateway_join", "Activity_b>Gateway_join", "Gateway_join>EndEvent_1"),
    ]),
        "joins flows that come from different paths of 'Gateway_choose'"),
    # the call that starts the process again is reached on every run, but only through a link
    "call_activity_recursion": ("Activity_again", "\n".join([
        '    <bpmn:startEvent id="StartEvent_1"/>', _link("throw", "Event_to_call", "call"),
        _link("catch", "Event_call", "call"), '    <bpmn:callActivity id="Activity_again" calledElement="across"/>',
        '    <bpmn:endEvent id="EndEvent_1"/>',
        _flows("StartEvent_1>Event_to_call", "Event_call>Activity_again", "Activity_again>EndEvent_1"),
    ]), "every run of it calls again (across -> across)"),
}


@pytest.mark.parametrize("code", list(ACROSS))
def test_validate_finds_a_path_problem_that_only_a_link_jump_reveals(tmp_path: Path, code: str) -> None:
    element, body, says = ACROSS[code]
    path = tmp_path / "across.bpmn"
    path.write_text(_process(body), encoding="utf-8")
    found = [p for p in validate_process(path, discover_config=False).problems if p.code == code]
    assert [p.element_id for p in found] == [element], found
    assert says in found[0].message, found[0].message
    # drawn with flows instead of the link, the same problem: the link hid it, nothing else
    flat = _drawn_with_flows(path, tmp_path / "flat")
    assert [p.element_id for p in validate_process(flat, discover_config=False).problems if p.code == code] == [element]


def test_a_scope_without_a_start_event_names_where_its_path_begins_not_a_link_catch(tmp_path: Path) -> None:
    path = tmp_path / "across.bpmn"
    path.write_text(_process("\n".join([
        '    <bpmn:task id="Activity_first"/>', _link("throw", "Event_to_end", "end"), _link("catch", "Event_end", "end"),
        '    <bpmn:endEvent id="EndEvent_1"/>', _flows("Activity_first>Event_to_end", "Event_end>EndEvent_1")])),
        encoding="utf-8")
    [problem] = [p for p in validate_process(path, discover_config=False).problems if p.code == "no_start_event"]
    assert "a sequence flow from it to 'Activity_first' (no flow leads there)" in problem.message, problem.message


@pytest.mark.parametrize("name", ["two_pages", "loop_back", "several_throws"])
def test_the_diagram_draws_each_jump_dotted_from_throw_to_catch(name: str) -> None:
    path = LINKS / f"{name}.bpmn"
    process = etree.parse(str(path)).getroot().find(f"{BPMN}process")
    throws = [el for el in process if el.tag == f"{BPMN}intermediateThrowEvent" and el.get("id") in _link_ids(path)]
    catch_of = {el.find(f"{BPMN}linkEventDefinition").get("name"): el.get("id")
                for el in process if el.tag == f"{BPMN}intermediateCatchEvent" and el.get("id") in _link_ids(path)}
    expected = {(t.get("id"), catch_of[t.find(f"{BPMN}linkEventDefinition").get("name")]) for t in throws}
    diagram = parse_bpmn(path)
    assert {(e.source, e.target) for e in diagram.edges if e.kind == "link"} == expected
    assert all(e.kind == "flow" for e in diagram.edges if (e.source, e.target) not in expected)
    svg = etree.fromstring(render_svg(diagram).encode())
    drawn = {(g.get("data-source"), g.get("data-target")): g for g in svg.iter("{http://www.w3.org/2000/svg}g")
             if "edge-link" in (g.get("class") or "").split()}
    assert set(drawn) == expected
    for g in drawn.values():
        line = g.find("{http://www.w3.org/2000/svg}polyline")
        assert line.get("stroke-dasharray") == "2 4" and len(line.get("points").split()) >= 2
        assert "jumps to" in g.find("{http://www.w3.org/2000/svg}title").text
    # the layout places the catch after its throw, as it places a flow's target after its source
    # (loop_back's jump goes back: a loop, drawn under everything)
    for throw, catch in expected if name != "loop_back" else ():
        assert diagram.nodes[catch].x > diagram.nodes[throw].x
