"""Round 33 gap: the path of a non-interrupting boundary event on a sub-process forks as the event
is caught. An escalation (or signal) thrown inside the sub-process is caught at the throw, but
SpiffWorkflow runs the sub-process's next steps before the boundary event's task: the path forked
only then, so its merge base already held what those steps wrote, and a key both the sub-process
and the path changed after the throw came back with the path's value, silently."""

from __future__ import annotations

from pathlib import Path

import pytest

from context_layers import Layer, LayeredContext
from engine import Engine, Instance, load_process

from engine_helpers import flow, write_elements

THROWS = {
    "escalation": ('<bpmn:escalationEventDefinition escalationRef="esc"/>',
                   '<bpmn:escalation id="esc" name="esc" escalationCode="LATE"/>\n'),
    "signal": ('<bpmn:signalEventDefinition signalRef="sig"/>', '<bpmn:signal id="sig" name="late"/>\n'),
}


def _late_fork(tmp_path: Path, kind: str, side_status: str = "escalated") -> Path:
    """``prepare`` sets status; inside ``work`` the event is thrown, then ``finish`` changes status;
    the non-interrupting boundary event ``heard`` on ``work`` starts ``escalate``, which changes it too."""
    definition, declaration = THROWS[kind]
    sub = ('<bpmn:subProcess id="work"><bpmn:startEvent id="w_start"/>'
           f'<bpmn:intermediateThrowEvent id="raise">{definition}</bpmn:intermediateThrowEvent>'
           '<bpmn:scriptTask id="finish"><bpmn:script>status = "done"</bpmn:script></bpmn:scriptTask>'
           '<bpmn:endEvent id="w_end"/>'
           + flow("w_start", "raise") + flow("raise", "finish") + flow("finish", "w_end") + "</bpmn:subProcess>")
    return write_elements(tmp_path, "late_fork", [
        '<bpmn:startEvent id="start"/>',
        '<bpmn:scriptTask id="prepare"><bpmn:script>status = "open"</bpmn:script></bpmn:scriptTask>',
        sub,
        f'<bpmn:boundaryEvent id="heard" attachedToRef="work" cancelActivity="false">{definition}</bpmn:boundaryEvent>',
        f'<bpmn:scriptTask id="escalate"><bpmn:script>status = "{side_status}"\nsaw = "x"'
        '</bpmn:script></bpmn:scriptTask>',
        '<bpmn:endEvent id="side_end"/>',
        '<bpmn:scriptTask id="close"><bpmn:script>closed = True</bpmn:script></bpmn:scriptTask>',
        '<bpmn:endEvent id="end"/>',
        flow("start", "prepare"), flow("prepare", "work"), flow("work", "close"), flow("close", "end"),
        flow("heard", "escalate"), flow("escalate", "side_end"),
    ], extra=declaration)


def _run(tmp_path: Path, path: Path) -> tuple[Engine, Instance]:
    engine = Engine(f"sqlite:///{tmp_path / 'gaps33.db'}")
    instance = engine.run(engine.start(load_process(path), {}))
    assert instance.status == "completed", instance.error
    return engine, instance


@pytest.mark.parametrize("kind", sorted(THROWS))
def test_a_key_the_sub_process_and_the_boundary_path_both_change_after_the_throw_is_a_conflict(
        tmp_path: Path, kind: str) -> None:
    """Forked at the throw, the path's merge base holds status "open": the sub-process changed it
    to "done" and the path to "escalated", a conflict, listed and settled by the side-path rule
    (the flow the path left keeps its value), never a silent pick of the path's value."""
    engine, instance = _run(tmp_path, _late_fork(tmp_path, kind))
    main = instance.main
    assert main.layer(Layer.HISTORY)["status"] == "done"
    (conflict,) = [c for c in instance.conflicts if c["key"] == "status"]  # merged as the process ends
    assert conflict["gateway_id"] == "late_fork.EndJoin" and conflict["base_value"] == "open"
    assert sorted(conflict["values"].values()) == ["done", "escalated"]
    assert conflict["resolution"]["value"] == "done" and conflict["resolution"]["resolver"] == "strategy"
    # the path ran from the context as it stood at the throw: 'finish' had not run yet
    (side,) = [n for n, i in instance.branches.items() if i.get("gateway") == "heard"]
    fork = instance.contexts[side].tape[0]
    assert instance.main.get_snapshot(fork.data["snapshot_id"]).get("status") == "open"
    # what the path changed alone still comes back
    assert main.resolve("saw") == "x" and main.resolve("closed") is True
    _replays(engine, instance)


def _replays(engine: Engine, instance: Instance) -> None:
    """Each context rebuilt from its own tape, and from the instance's whole tape as JSON gives it
    (a branch takes the snapshot it forked from, the one taken at the catch, from its parent's events)."""
    contexts = engine.load(instance.id).contexts
    whole = [{"context": name, **e.to_dict()} for name, ctx in contexts.items() for e in ctx.tape]
    for name, ctx in contexts.items():
        assert LayeredContext.replay(ctx.tape).as_dict() == ctx.as_dict()
        assert LayeredContext.replay(whole, name=name).as_dict() == ctx.as_dict()


def test_a_path_that_changes_the_key_as_the_sub_process_did_is_no_conflict(tmp_path: Path) -> None:
    """Changed identically on both sides: taken, no conflict (as at a join)."""
    engine, instance = _run(tmp_path, _late_fork(tmp_path, "escalation", side_status="done"))
    assert instance.main.resolve("status") == "done"
    assert not [c for c in instance.conflicts if c["key"] == "status"]


def test_a_non_interrupting_escalation_event_sub_process_reads_and_merges_against_the_throw(tmp_path: Path) -> None:
    """The same race through a non-interrupting escalation event sub-process of the sub-process: it
    reads status as it stood at the throw, and the clash with what the sub-process wrote after the
    throw is listed, the sub-process's value kept (it runs first, right after the throw)."""
    esp = ('<bpmn:subProcess id="on_esc" triggeredByEvent="true">'
           '<bpmn:startEvent id="e_start" isInterrupting="false">'
           '<bpmn:escalationEventDefinition escalationRef="esc"/></bpmn:startEvent>'
           '<bpmn:scriptTask id="escalate"><bpmn:script>seen = status\nstatus = "escalated"</bpmn:script>'
           '</bpmn:scriptTask><bpmn:endEvent id="e_end"/>'
           + flow("e_start", "escalate") + flow("escalate", "e_end") + "</bpmn:subProcess>")
    sub = ('<bpmn:subProcess id="work"><bpmn:startEvent id="w_start"/>'
           '<bpmn:scriptTask id="prepare"><bpmn:script>status = "open"</bpmn:script></bpmn:scriptTask>'
           f'<bpmn:intermediateThrowEvent id="raise">{THROWS["escalation"][0]}</bpmn:intermediateThrowEvent>'
           '<bpmn:scriptTask id="finish"><bpmn:script>status = "done"</bpmn:script></bpmn:scriptTask>'
           '<bpmn:endEvent id="w_end"/>' + esp
           + flow("w_start", "prepare") + flow("prepare", "raise") + flow("raise", "finish") + flow("finish", "w_end")
           + "</bpmn:subProcess>")
    path = write_elements(tmp_path, "late_esp", [
        '<bpmn:startEvent id="start"/>', sub, '<bpmn:endEvent id="end"/>', flow("start", "work"), flow("work", "end"),
    ], extra=THROWS["escalation"][1])
    engine, instance = _run(tmp_path, path)
    assert instance.main.resolve("status") == "done" and instance.main.resolve("seen") == "open"
    (conflict,) = [c for c in instance.conflicts if c["key"] == "status"]
    assert (conflict["gateway_id"], conflict["base_value"]) == ("on_esc", "open")
    assert sorted(conflict["values"].values()) == ["done", "escalated"]
    _replays(engine, instance)


def test_a_split_at_an_earlier_snapshot_forks_there_and_refuses_another_contexts() -> None:
    """``ContextSplitter.split(at=)``: the branches start from that snapshot, whatever the context did
    since, and nothing more is taken; a snapshot of another context is refused, naming both."""
    from gateways import ContextSplitter

    ctx = LayeredContext()
    ctx.write(Layer.WORKING, "status", "open", actor="prepare")
    caught = ctx.snapshot(label="split:heard", actor="heard")
    ctx.write(Layer.WORKING, "status", "done", actor="finish")
    (branch,) = ContextSplitter().split(ctx, "heard", ["escalate"], at=caught)
    assert branch.snapshot_id == caught.id and branch.context.resolve("status") == "open"
    assert [e.data["note"] for e in ctx.tape if e.kind.value == "note"] == ["split"]
    assert sum(1 for e in ctx.tape if e.kind.value == "snapshot") == 1
    other, length = LayeredContext(name="other"), len(ctx.tape)
    with pytest.raises(ValueError, match=r"split 'heard': the snapshot 'snap:other:\d+' was taken in context 'other', "
                                         r"not in 'main'"):
        ContextSplitter().split(ctx, "heard", ["escalate"], at=other.snapshot())
    assert len(ctx.tape) == length  # nothing half-written
