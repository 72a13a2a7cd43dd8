"""Random processes with events inside multi-instance bodies, boundary events on multi-instance
activities, cycle timers, timer and signal event sub-processes and boundary events on nested
sub-processes run as their diagram says.

The block trees of test_random_processes_events gain these kinds (and keep theirs):

* ``mis``: a multi-instance sub-process (parallel or sequential, over a list or a count) as in
  test_random_processes_more, whose body now holds the event kinds too: message and signal
  catches, receive tasks, timers, event-based gateways, boundary timers and messages on user
  tasks and sub-processes. A message or signal the driver sends reaches every instance that
  waits for it (layerflow delivers it to every catch that waits for its name): the driver sends a
  boundary event's message once for all the runs of its activity that wait (one per instance),
  and again only for a run that began to wait later; that one reaches the earlier runs still
  waiting too (a non-interrupting boundary event waits anew after each message), whose side
  tasks then run once more: the reference adds those from the driver's log;
* ``bmi``: a multi-instance user task or sub-process (its instances wait for a person) with a
  boundary timer or message on the activity, interrupting (to a recovery block) or not (to a
  side task), that fires while the instances wait or never; or a cycle timer ("R2/PT1H") whose
  path (a side task) runs once per repetition, interrupting (then the activity is cancelled
  after the last one, inside a sub-process around both) or not;
* ``mco``: a multi-instance sub-process (parallel or sequential) whose instances each wait for a
  message correlated by their input item (``spiffworkflow:processVariableCorrelation``), then run
  a block; the driver sends one message per instance, in the order the tree says, each caught by
  its instance only (a message no instance waits for is refused and changes nothing);
* ``esc`` (test_random_processes_more's): a sub-process that throws an escalation between two
  blocks, caught by a non-interrupting escalation boundary event on it (a side task), drawn here
  inside multi-instance bodies too: each instance catches its own;
* ``emi``: a sequential multi-instance sub-process over a count whose instance ``k`` ends in an
  error end event, caught by an interrupting error boundary event on the activity;
* ``cyc``: a sub-process around an intermediate cycle timer ("R<k>/PT1H") whose path counts
  its repetitions; ``btc``: a user task with a cycle boundary timer, non-interrupting (a side
  task per repetition), or interrupting inside a sub-process (the side task per repetition, then
  the user task is cancelled);
* ``evt``: a user task beside a non-interrupting event sub-process started by a timer, a cycle
  timer (a day apart) or a signal: a signal one of the process, a timer one of a sub-process
  around the user task, or of the process as the process's first block (its timer runs from the
  start of the process, whichever path it takes later); the timer fires before the person
  answers (each repetition of a cycle) or never, the signal is sent once while they wait;
* ``nbe``: a sub-process inside a sub-process (script tasks, then a user task), each with a
  boundary timer or message, interrupting (to script tasks) or not (a side task); the events
  fire in the order the tree says (messages first, then timers by their hour) or never.

Not drawn: a non-interrupting boundary event on a multi-instance activity that each instance
triggers (an escalation each throws; test_events checks it catches every one: SpiffWorkflow 3.2
caught the first only). Not drawn, as SpiffWorkflow 3.2 cannot run them (``engine.validate`` refuses them, checked by
``test_validate_refuses_what_is_not_drawn``): a signal or message event sub-process inside a
sub-process (it never starts). Not drawn inside a multi-instance body: an event sub-process of
the process and a throw between branches (``evs``, ``thr``: one event would reach every
instance, or the instance a person answers first, which the reference does not model); a
person in the handler of a cycle event sub-process (its runs would overlap and write one key by
turns, as BPMN's shared data says, which the reference does not model either).

The driver is test_random_processes_events's (sends first, then the earliest timer, then a user
task: which one of those waiting, by ``x``, so that people answer in many orders; each step on
the instance loaded anew from a sqlite store, time on a fake clock). The final variables and the runs of every task (activity records of the main context
and of every multi-instance scope) must be the reference's, and every context must replay from
its tape to what it is.
"""

from __future__ import annotations

import tempfile
from collections import Counter
from dataclasses import dataclass, field, replace
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
from hypothesis import assume, example, given
from hypothesis import strategies as st

from context_layers import Layer, LayeredContext

from engine import Engine, load_process
from engine.governance import InstanceStateError
from engine.validate import validate_process

from engine_helpers import flow, script_task, variables, write_elements
from test_random_processes import _blocks, _expected, _has
from test_random_processes_events import (FAR, NEAR, Sends, _Clock, _due, _events, _events_expected, _EventWriter,
                                          _record_send, _timer)
from test_random_processes_more import _items, _more_expected, _nested


def _cycle(times: int, period: str = "PT1H") -> str:
    return (f'<bpmn:timerEventDefinition><bpmn:timeCycle>"R{times}/{period}"</bpmn:timeCycle>'
            "</bpmn:timerEventDefinition>")


@dataclass
class _ScopeWriter(_EventWriter):
    """A writer that also knows the kinds of the module doc. ``keyed`` (shared by the writers of
    nested blocks): the messages the driver sends to one instance each, by correlation, in order."""

    keyed: dict[str, list[dict[str, int]]] = field(default_factory=dict)

    def block(self, tree: Any, entry: str, known: list[str]) -> tuple[str, list[str], Any]:
        kind = tree[0]
        if kind == "mco":
            _, seq, n, order, body = tree
            sid = self.new("mo")
            name = f"e_{sid}"
            self.extras.append((0, f'  <bpmn:message id="{name}" name="{name}"/>\n  <bpmn:correlationProperty '
                                   f'id="ref_{sid}" name="ref_{sid}"><bpmn:correlationPropertyRetrievalExpression '
                                   f'messageRef="{name}"><bpmn:formalExpression>key</bpmn:formalExpression>'
                                   "</bpmn:correlationPropertyRetrievalExpression></bpmn:correlationProperty>\n"))
            inner, node, made = self._instance_body(sid, ("seq", [("mcatch", sid), body]), known, self.file)
            self.elements += [f'<bpmn:subProcess id="{sid}">{self._loop(sid, seq, "card", n)}'
                              f'{"".join(inner.elements)}</bpmn:subProcess>', flow(entry, sid)]
            self.keyed[name] = [{"key": i, "v": i * 7 + int(sid[2:])} for i in order if i < n]
            # over a count of n: x % (n + 1) instances, so the tree's n says how many at most
            return sid, known, ("mis", sid, "card", n, node, made)
        if kind == "mcatch":
            sid = tree[1]
            name = f"e_{sid}"
            correlation = (f"<spiffworkflow:processVariableCorrelation><spiffworkflow:propertyId>ref_{sid}"
                           f"</spiffworkflow:propertyId><spiffworkflow:expression>i_{sid}</spiffworkflow:expression>"
                           "</spiffworkflow:processVariableCorrelation>")
            self.elements += [f'<bpmn:intermediateCatchEvent id="{sid}_paid"><bpmn:messageEventDefinition '
                              f'messageRef="{name}"><bpmn:extensionElements><spiffworkflow:messageVariable>q_{sid}'
                              f"</spiffworkflow:messageVariable>{correlation}</bpmn:extensionElements>"
                              "</bpmn:messageEventDefinition></bpmn:intermediateCatchEvent>",
                              flow(entry, f"{sid}_paid"), script_task(f"{sid}_v", f"w_{sid} = q_{sid}['v']"),
                              flow(f"{sid}_paid", f"{sid}_v")]
            return f"{sid}_v", [*known, f"w_{sid}"], ("mcatch", sid, int(sid[2:]))
        if kind == "bmi":
            _, seq, n, body, trigger, interrupting, fires, recovery = tree
            aid = self.new("bm")
            if body == "user":
                activity = f'<bpmn:userTask id="{aid}">{self._loop(aid, seq, "card", n)}</bpmn:userTask>'
                node: Any = ("miu", aid, "card", n, self.n)
            else:
                inner, inner_node, made = self._instance_body(aid, ("user",), known, self.file)
                activity = (f'<bpmn:subProcess id="{aid}">{self._loop(aid, seq, "card", n)}'
                            f'{"".join(inner.elements)}</bpmn:subProcess>')
                node = ("mis", aid, "card", n, inner_node, made)
            # with no instance the activity ends at once: its boundary event never waits
            if trigger != "cycle":
                self.elements += [activity, flow(entry, aid)]
                rec = self._boundary(aid, trigger, interrupting, fires, recovery, known)
                return (f"{aid}_after" if interrupting else aid), known, ("bmi", n, node, rec, interrupting, fires)
            # a cycle timer runs its path once per repetition (two, an hour apart, or a thousand days:
            # never): a side task. Interrupting, it cancels the activity after the last one, inside a
            # sub-process around both (the paths end there)
            side = f"{aid}_side"
            parts = [f'<bpmn:boundaryEvent id="{aid}_b" attachedToRef="{aid}" cancelActivity="{str(interrupting).lower()}">'
                     f'{_cycle(2, "PT1H" if fires else "P1000D")}</bpmn:boundaryEvent>',
                     script_task(side, f"v_{side} = {self.n}"), f'<bpmn:endEvent id="{side}_end"/>',
                     flow(f"{aid}_b", side), flow(side, f"{side}_end")]
            rec = ("seq", [("task", side, [], self.n)] * 2)
            if not interrupting:
                self.elements += [activity, flow(entry, aid), *parts]
                return aid, known, ("bmi", n, node, rec, interrupting, fires)
            wrap = f"{aid}_in"
            self.elements += [f'<bpmn:subProcess id="{wrap}"><bpmn:startEvent id="{wrap}_start"/>{activity}'
                              f'{"".join(parts)}<bpmn:endEvent id="{wrap}_end"/>{flow(f"{wrap}_start", aid)}'
                              f'{flow(aid, f"{wrap}_end")}</bpmn:subProcess>', flow(entry, wrap)]
            return wrap, known, ("bmi", n, node, rec, interrupting, fires)
        if kind == "emi":
            _, n, k, scripts, recovery = tree
            sid = self.new("em")
            inner = replace(self, elements=[f'<bpmn:startEvent id="{sid}_start"/>'])
            mid, keys, before = inner._scripts(scripts, f"{sid}_start", [*known, f"i_{sid}"])
            made = [key for key in keys if key not in known and key != f"i_{sid}"]
            inner.elements += [f'<bpmn:exclusiveGateway id="{sid}_fail" default="{sid}_fail_d"/>', flow(mid, f"{sid}_fail"),
                               script_task(f"{sid}_out", f"r_{sid} = " + " + ".join([f"i_{sid}", *made])),
                               self._flow_id(f"{sid}_fail", f"{sid}_out", f"{sid}_fail_d"),
                               f'<bpmn:endEvent id="{sid}_end"/>', flow(f"{sid}_out", f"{sid}_end"),
                               f'<bpmn:endEvent id="{sid}_error"><bpmn:errorEventDefinition errorRef="{sid}_e"/>'
                               "</bpmn:endEvent>", flow(f"{sid}_fail", f"{sid}_error", f"i_{sid} == {k}")]
            self.n = inner.n
            self.elements.append(f'<bpmn:subProcess id="{sid}">{self._loop(sid, True, "card", n)}'
                                 f'{"".join(inner.elements)}</bpmn:subProcess>')
            self.extras.append((self.file, f'  <bpmn:error id="{sid}_e" name="{sid}_e" errorCode="{sid}_code"/>\n'))
            self.elements += [flow(entry, sid), f'<bpmn:boundaryEvent id="{sid}_caught" attachedToRef="{sid}">'
                              f'<bpmn:errorEventDefinition errorRef="{sid}_e"/></bpmn:boundaryEvent>',
                              f'<bpmn:exclusiveGateway id="{sid}_after"/>', flow(sid, f"{sid}_after")]
            rec_exit, _, rec = self.block(recovery, f"{sid}_caught", known)
            self.elements.append(flow(rec_exit, f"{sid}_after"))
            return f"{sid}_after", known, ("emi", sid, n, k, before, made, rec)
        if kind == "cyc":
            _, times = tree
            cid = self.new("cy")
            inner = [f'<bpmn:startEvent id="{cid}_start"/>',
                     f'<bpmn:intermediateCatchEvent id="{cid}_tick">{_cycle(times)}</bpmn:intermediateCatchEvent>',
                     script_task(f"{cid}_count", f"k_{cid} = k_{cid} + 1"), f'<bpmn:endEvent id="{cid}_end"/>',
                     flow(f"{cid}_start", f"{cid}_tick"), flow(f"{cid}_tick", f"{cid}_count"),
                     flow(f"{cid}_count", f"{cid}_end")]
            self.elements += [script_task(f"{cid}_init", f"k_{cid} = 0"), flow(entry, f"{cid}_init"),
                              f'<bpmn:subProcess id="{cid}">{"".join(inner)}</bpmn:subProcess>', flow(f"{cid}_init", cid)]
            return cid, [*known, f"k_{cid}"], ("cyc", cid, times)
        if kind == "btc":
            _, times, interrupting = tree
            uid = self.new("u")
            side = f"{uid}_side"
            parts = [f'<bpmn:userTask id="{uid}"/>',
                     f'<bpmn:boundaryEvent id="{uid}_b" attachedToRef="{uid}" cancelActivity="{str(interrupting).lower()}">'
                     f"{_cycle(times)}</bpmn:boundaryEvent>", script_task(side, f"v_{side} = {self.n}"),
                     f'<bpmn:endEvent id="{side}_end"/>', flow(f"{uid}_b", side), flow(side, f"{side}_end")]
            sides = [("task", side, [], self.n)] * times
            if not interrupting:
                self.elements += [*parts, flow(entry, uid)]
                return uid, [*known, f"v_{uid}"], ("seq", [*sides, ("user", uid, self.n)])
            sid = f"{uid}_in"
            self.elements += [f'<bpmn:subProcess id="{sid}"><bpmn:startEvent id="{sid}_start"/>{"".join(parts)}'
                              f'<bpmn:endEvent id="{sid}_end"/>{flow(f"{sid}_start", uid)}{flow(uid, f"{sid}_end")}'
                              "</bpmn:subProcess>", flow(entry, sid)]
            return sid, known, ("seq", sides)
        if kind == "evt":
            _, trigger, nested, fires, handler = tree
            sid = self.new("et")
            if trigger in ("signal", "message"):
                definition = self._event(f"e_{sid}", trigger == "signal")
            elif trigger == "timer":
                definition = _timer(NEAR.format(1) if fires else FAR)
            else:
                # a day apart: each run of the handler ends before the next starts (it waits for
                # no person: ``_overlapping``), so two runs never write one key by turns
                definition = _cycle(fires, "P1D") if fires else _timer(FAR)
            ev = replace(self, elements=[f'<bpmn:startEvent id="{sid}_on" isInterrupting="false">{definition}</bpmn:startEvent>'])
            ev_exit, _, on = ev.block(handler, f"{sid}_on", ["x"])
            ev.elements += [f'<bpmn:endEvent id="{sid}_on_end"/>', flow(ev_exit, f"{sid}_on_end")]
            self.n = ev.n
            handler_xml = f'<bpmn:subProcess id="{sid}" triggeredByEvent="true">{"".join(ev.elements)}</bpmn:subProcess>'
            uid = self.new("u")
            user = ("user", uid, self.n)
            if nested:
                self.elements += [f'<bpmn:subProcess id="{sid}_in"><bpmn:startEvent id="{sid}_in_start"/>'
                                  f'<bpmn:userTask id="{uid}"/><bpmn:endEvent id="{sid}_in_end"/>'
                                  f'{flow(f"{sid}_in_start", uid)}{flow(uid, f"{sid}_in_end")}{handler_xml}'
                                  "</bpmn:subProcess>", flow(entry, f"{sid}_in")]
                exit_ = f"{sid}_in"
            else:
                self.elements += [f'<bpmn:userTask id="{uid}"/>', flow(entry, uid)]
                self.handlers.append(handler_xml)
                exit_ = uid
            times = 0 if not fires else (1 if trigger != "cycle" else fires)
            if trigger in ("signal", "message") and fires:
                self.sends[f"e_{sid}"] = (trigger, {f"p_{sid}": self.n}, uid)
                return exit_, [*known, f"v_{uid}"], ("seq", [("sent", {f"p_{sid}": self.n}), on, user])
            return exit_, [*known, f"v_{uid}"], ("seq", [*[on] * times, user])
        if kind == "nbe":
            _, scripts, inner_event, outer_event, rec_in, rec_out = tree
            oid = self.new("no")
            sub = replace(self, elements=[f'<bpmn:startEvent id="{oid}_start"/>'])
            iid = sub.new("ni")
            inner = replace(sub, elements=[f'<bpmn:startEvent id="{iid}_start"/>'])
            mid, keys, before = inner._scripts(scripts, f"{iid}_start", known)
            mid, keys, user = inner.block(("user",), mid, keys)
            inner.elements += [f'<bpmn:endEvent id="{iid}_end"/>', flow(mid, f"{iid}_end")]
            sub.n = inner.n
            sub.elements += [f'<bpmn:subProcess id="{iid}">{"".join(inner.elements)}</bpmn:subProcess>',
                             flow(f"{oid}_start", iid)]
            fired_in = sub._nested_boundary(iid, inner_event, rec_in, known)
            exit_in = f"{iid}_after" if inner_event[1] else iid
            sub.elements += [f'<bpmn:endEvent id="{oid}_end"/>', flow(exit_in, f"{oid}_end")]
            self.n = sub.n
            self.elements += [f'<bpmn:subProcess id="{oid}">{"".join(sub.elements)}</bpmn:subProcess>', flow(entry, oid)]
            fired_out = self._nested_boundary(oid, outer_event, rec_out, known)
            return (f"{oid}_after" if outer_event[1] else oid), known, (
                "nbe", before, user, inner_event, fired_in, outer_event, fired_out)
        return super().block(tree, entry, known)

    def _boundary(self, aid: str, trigger: str, interrupting: bool, fires: bool, recovery: Any, known: list[str],
                  hours: int = 2) -> Any:
        """test_random_processes_events's boundary event; a timer that fires does so after ``hours``."""
        rec = super()._boundary(aid, trigger, interrupting, fires, recovery, known)
        if trigger == "timer" and fires and hours != 2:
            self.elements = [e.replace(f'"{NEAR.format(2)}"', f'"{NEAR.format(hours)}"') if f'id="{aid}_b"' in e else e
                             for e in self.elements]
        return rec

    def _nested_boundary(self, aid: str, event: tuple[str, bool, int], scripts: list[list[int]],
                         known: list[str]) -> Any:
        """The boundary event of ``nbe``: ``event`` is (trigger, interrupting, when: 0 never, else
        the hour a timer fires; a message that fires is sent at once). Returns what its path runs."""
        trigger, interrupting, when = event
        recovery = ("seq", [("task", reads) for reads in scripts])
        return self._boundary(aid, trigger, interrupting, when > 0, recovery, known, hours=max(when, 1))


def _scope_kinds(inner: st.SearchStrategy[Any]) -> list[st.SearchStrategy[Any]]:
    scripts = st.lists(st.lists(st.integers(0, 30), max_size=2), min_size=1, max_size=2)
    loop = (st.booleans(), st.sampled_from(["list", "card"]), st.integers(0, 3))
    nested_event = st.tuples(st.sampled_from(["timer", "message"]), st.booleans(), st.integers(0, 2))
    # two events that fire never fire at once (two messages, two timers of one hour): their order decides
    nested = st.tuples(st.just("nbe"), scripts, nested_event, nested_event, scripts, scripts).filter(
        lambda t: not (t[2][2] and t[3][2] and (0 if t[2][0] == "message" else t[2][2]) == (0 if t[3][0] == "message" else t[3][2])))
    return [
        *_events(inner),
        st.tuples(st.just("mis"), *loop, inner),
        st.tuples(st.just("mco"), st.booleans(), st.integers(1, 3), st.permutations(range(3)), inner),
        st.tuples(st.just("bmi"), st.booleans(), st.integers(0, 3), st.sampled_from(["user", "sub"]),
                  st.sampled_from(["timer", "message", "cycle"]), st.booleans(), st.booleans(), inner),
        st.tuples(st.just("esc"), inner, inner),
        st.tuples(st.just("emi"), st.integers(0, 3), st.integers(0, 2), scripts, inner),
        st.tuples(st.just("cyc"), st.integers(1, 3)),
        st.tuples(st.just("btc"), st.integers(1, 3), st.booleans()),
        # a timer event sub-process of the process: only as the first block (``_trees``)
        st.one_of(st.tuples(st.just("evt"), st.sampled_from(["timer", "cycle"]), st.just(True), st.integers(0, 2), inner),
                  st.tuples(st.just("evt"), st.just("signal"), st.just(False), st.integers(0, 1), inner)),
        nested,
    ]


def _trees() -> st.SearchStrategy[Any]:
    """Processes of one to three blocks, the first one possibly a user task beside a timer event
    sub-process of the process: its timer runs from the start of the process, whichever path the
    process takes later, and fires (if it does) while that first person waits."""
    first = st.tuples(st.just("evt"), st.sampled_from(["timer", "cycle"]), st.just(False), st.integers(0, 2),
                      _blocks(1, _scope_kinds))
    return st.builds(lambda head, rest: ("seq", head + rest), st.lists(first, max_size=1),
                     st.lists(_blocks(2, _scope_kinds), min_size=1, max_size=3))


def _scopes_expected(node: Any, env: dict[str, Any], runs: Counter[str]) -> None:
    kind = node[0]
    if kind == "mis":
        _, sid, source, _, body, made = node
        if source == "list":
            runs[f"{sid}_list"] += 1
        out = []
        for item in _items(env, node):
            scope = {**env, f"i_{sid}": item}  # what an instance sets stays in its scope
            _expected(body, scope, runs, _scopes_expected)
            out.append(item + sum(scope[k] for k in made))
            runs[f"{sid}_out"] += 1
        env[f"v_{sid}"] = out
        runs[sid] += 1
    elif kind == "miu":
        _more_expected(node, env, runs)
    elif kind == "esc":
        for part in node[1:]:
            _expected(part, env, runs, _scopes_expected)
    elif kind == "mcatch":
        _, sid, n = node
        item = env[f"i_{sid}"]
        env[f"q_{sid}"] = {"key": item, "v": item * 7 + n}  # the message sent to this instance
        env[f"w_{sid}"] = item * 7 + n
        runs[f"{sid}_v"] += 1
    elif kind == "bmi":
        _, n, activity, rec, interrupting, fires = node
        waits = env["x"] % (n + 1) > 0
        if fires and waits:
            _expected(rec, env, runs, _scopes_expected)
        if not (fires and waits and interrupting):
            _expected(activity, env, runs, _scopes_expected)
    elif kind == "emi":
        _, sid, n, k, before, made, rec = node
        out = []
        for item in range(env["x"] % (n + 1)):
            scope = {**env, f"i_{sid}": item}
            _expected(before, scope, runs, _scopes_expected)
            if item == k:
                _expected(rec, env, runs, _scopes_expected)
                return
            out.append(item + sum(scope[key] for key in made))
            runs[f"{sid}_out"] += 1
        env[f"v_{sid}"] = out
        runs[sid] += 1
    elif kind == "cyc":
        _, cid, times = node
        runs[f"{cid}_init"] += 1
        runs[f"{cid}_count"] += times
        env[f"k_{cid}"] = times
    elif kind == "nbe":
        _, before, user, inner_event, fired_in, outer_event, fired_out = node
        _expected(before, env, runs, _scopes_expected)
        # the events that fire, in order: a message at once, a timer at its hour (never two at once)
        order = sorted((0 if event[0] == "message" else event[2], which, event[1], rec)
                       for which, (event, rec) in enumerate([(inner_event, fired_in), (outer_event, fired_out)])
                       if event[2])
        inner_open = True  # the person still waits in the inner sub-process; the outer one is open while it does
        for _, which, interrupting, rec in order:
            if inner_open:
                _expected(rec, env, runs, _scopes_expected)
                # an interrupted inner sub-process's recovery (script tasks) runs on to the outer one's end
                inner_open = not interrupting
        if inner_open:
            _expected(user, env, runs, _scopes_expected)
    else:
        _events_expected(node, env, runs)


def _write(folder: Path, tree: Any) -> tuple[Path, Any, Sends]:
    w = _ScopeWriter(elements=['<bpmn:startEvent id="start"/>'])
    exit_, _, node = w.block(tree, "start", ["x"])
    w.elements += ['<bpmn:endEvent id="end"/>', flow(exit_, "end"), *w.handlers]
    extras = "".join(xml for _, xml in w.processes) + "".join(dict.fromkeys(xml for _, xml in w.extras))
    sends: Sends = dict(w.sends)
    for name, payloads in w.keyed.items():
        sends[name] = ("keyed", payloads, None)  # type: ignore[assignment]
    return write_elements(folder, "random", w.elements, extras), node, sends


def _answer(task_id: str) -> dict[str, int]:
    if task_id.startswith("mu") or task_id.startswith("bm"):
        return {f"r_{task_id}": int(task_id[2:])}
    return {f"v_{task_id}": int(task_id[1:])}


def _ours(path: Path, x: int, sends: Sends) -> tuple[Any, Counter[str], list[str], Counter[str]]:
    """test_random_processes_events's driver; runs counted in the main context and in the scope of
    every instance of a multi-instance activity (joined, or interrupted); and the side tasks that
    ran again (``_record_send``): a boundary event's message, sent for a run of its activity that
    has waited since the last one was sent (an instance that caught its correlated message later),
    reaches the runs of the earlier instances that still wait as well, and each runs its side task
    once more, as BPMN says (their non-interrupting boundary events wait anew)."""
    clock = _Clock()
    engine = Engine(store=f"sqlite:///{path.parent / 'instances.db'}", clock=clock)
    instance = engine.run(engine.start(load_process(path), {"x": x}))
    steps: list[str] = []
    sent: set[tuple[str, str]] = set()
    again: Counter[str] = Counter()
    while instance.status == "waiting" and len(steps) < 200:
        waiting = instance.waiting_for
        users = [w for w in waiting if w["kind"] == "user_task"]
        at = {w["task_id"]: w["id"] for w in users}
        events = [w for w in waiting if w["kind"] == "event" and w.get("event") in sends
                  and _due(sends[w["event"]][2], at, sent, w)]
        timers = sorted((datetime.fromisoformat(w["due"]).timestamp(), w["task_id"]) for w in waiting
                        if w["kind"] == "timer" and w["due"] is not None
                        and datetime.fromisoformat(w["due"]).timestamp() < clock.now + 10 * 86400)
        loaded = engine.load(instance.id)
        if events and sends[events[0]["event"]][0] == "keyed":
            # a message for one instance: the first of the tree's order that an instance waits for (the
            # others are refused, changing nothing: no instance waits for them, or not now)
            name, payloads = events[0]["event"], sends[events[0]["event"]][1]
            for payload in payloads:  # type: ignore[union-attr]
                try:
                    instance = engine.send_event(engine.load(instance.id), name, payload)
                except InstanceStateError:
                    continue
                steps.append(f"send {name} {payload['key']}")
                break
            else:
                raise AssertionError(f"no instance takes {name} {payloads}")
        elif events:
            kind, payload, gate = sends[events[0]["event"]]
            for item in _record_send(sent, events[0]["event"], waiting, at[gate] if gate is not None else None):
                again[item["task_id"].removesuffix("_b") + "_side"] += 1
            steps.append(f"send {events[0]['event']}")
            instance = engine.send_event(loaded, events[0]["event"], payload, kind=kind)
        elif timers:
            clock.now = max(clock.now, timers[0][0])
            steps.append(f"clock to {timers[0][1]}")
            instance = engine.resume(loaded)
        elif users:
            user = users[x % len(users)]  # which one of those waiting: by the start data
            steps.append(f"answer {user['task_id']}")
            instance = engine.complete_user_task(loaded, user["id"], _answer(user["task_id"]))
        else:
            break
    runs = Counter(record["activity"] for key, record in instance.main.layer(Layer.HISTORY).items()
                   if key.startswith("activity:"))
    for name, info in instance.branches.items():
        # a multi-instance scope: its activities ran, whether it was joined, is still open or was
        # cancelled after them (an error an instance threw, caught on the activity, closes them all)
        if "#" in str(info["branch_id"]) and info["status"] in ("joined", "scope", "cancelled"):
            before = instance.contexts[info["parent"]].get_snapshot(info["snapshot_id"]).layer(Layer.HISTORY)
            runs.update(record["activity"] for key, record in instance.contexts[name].layer(Layer.HISTORY).items()
                        if key.startswith("activity:") and key not in before)
    return instance, runs, steps, again


def check(tree: Any, x: int) -> None:
    folder = Path(tempfile.mkdtemp())
    path, node, sends = _write(folder, tree)
    report = validate_process(path)
    assert report.ok, ([(p.code, p.message) for p in report.problems], path.read_text())
    env: dict[str, Any] = {"x": x}
    runs: Counter[str] = Counter()
    _expected(node, env, runs, _scopes_expected)
    ours, ours_runs, steps, again = _ours(path, x, sends)
    text = path.read_text()
    assert ours.status == "completed", (tree, x, ours.status, ours.error, ours.waiting_for, steps, text)
    # the reference runs each instance's side task once; a message sent for a later instance reached
    # the earlier ones that still waited too (the driver's log, ``again``)
    tasks = Counter({tid: n for tid, n in runs.items() if not tid.endswith("_more")}) + again
    assert ours_runs == tasks, (ours_runs, tasks, steps, text)
    assert variables(ours.main) == env, (variables(ours.main), env, steps, text)
    for name, ctx in ours.contexts.items():
        assert LayeredContext.replay(ctx.tape) == ctx, (name, steps, text)


def _overlapping(tree: Any) -> bool:
    """Whether the handler of a cycle event sub-process waits for a person (then its runs overlap)."""
    if isinstance(tree, list):
        return any(_overlapping(part) for part in tree)
    if not isinstance(tree, tuple):
        return False
    if tree[0] == "evt" and tree[1] == "cycle":
        return any(_has(tree[4], kind) for kind in ("user", "btu", "bts", "thr", "bmi", "nbe", "btc"))
    return any(_overlapping(part) for part in tree[1:])


# no event sub-process of the process, no throw between branches inside a multi-instance body (see the module doc)
_MULTI = ("mis", "bmi", "emi", "mco")


# shapes that once failed, each fixed (see test_events and test_conformance): a timer event
# sub-process that never fires (the process waited for it after its last step); an interrupting
# boundary timer on a multi-instance sub-process whose instances wait (their sub-processes ran
# on); an error from one instance caught on the multi-instance activity (its output was collected);
# the path of a boundary event on the inner sub-process, ended inside the outer one, which a timer
# then interrupts (what the path wrote was lost); a parallel split in the handler of a cycle event
# sub-process (one repetition's path was lost); a multi-instance activity there (the cycle's end
# made its instances again); a multi-instance activity after a timer that interrupts one (it began
# while the interrupted one was open); the path of a timer event sub-process that waits for a person
# while the process splits (it wrote into the context of the branches' split, and their join failed)
@example(tree=("seq", [("evt", "timer", False, 0, ("user",))]), x=0)
@example(tree=("seq", [("bmi", False, 1, "sub", "timer", True, True, ("task", []))]), x=1)
@example(tree=("seq", [("emi", 1, 0, [[]], ("task", []))]), x=1)
@example(tree=("seq", [("nbe", [[]], ("message", False, 1), ("timer", True, 1), [[]], [[]])]), x=0)
@example(tree=("seq", [("evt", "cycle", True, 2, ("and", [("task", []), ("task", [])]))]), x=0)
@example(tree=("seq", [("evt", "cycle", False, 1, ("mis", False, "card", 1, ("task", [])))]), x=1)
@example(tree=("seq", [("bmi", False, 1, "user", "timer", True, True, ("mis", False, "card", 0, ("task", [])))]), x=1)
# an interrupting cycle on a multi-instance person's task: its first path ended before the second began
@example(tree=("seq", [("bmi", False, 1, "user", "cycle", True, True, ("task", []))]), x=1)
@example(tree=("seq", [("evt", "timer", False, 1, ("user",)), ("and", [("user",), ("user",)])]), x=3)
@example(tree=("seq", [("evt", "timer", False, 1, ("bts", "timer", False, True, [[]], ("task", []), ("task", [])))]),
         x=0)
# a non-interrupting message boundary event inside each of two parallel instances: one message reaches
# both waiting instances (each runs its side path once); the driver sent it again for the second
# instance, whose boundary event waited anew, and both ran their side paths twice
@example(tree=("seq", [("mis", False, "card", 2, ("bts", "message", False, True, [[]], ("task", []), ("task", [])))]), x=2)
# the same boundary event on a person's task in three parallel instances of an ``mco``: the message sent
# while the first two waited, and again once the third caught its correlated message, reached the first
# two again as well (5 side tasks, BPMN's count; the reference counted 3 before it read ``again``)
@example(tree=("seq", [("mco", False, 3, (0, 1, 2), ("btu", "message", False, True, ("task", [])))]), x=3)
# an error from the one instance of a multi-instance sub-process, inside a non-interrupting timer event
# sub-process, caught on the activity: its scope is closed as cancelled, and the task that ran in it counts
@example(tree=("seq", [("evt", "timer", False, 1, ("emi", 1, 0, [[]], ("task", []))), ("user",)]), x=1)
@given(tree=_trees(), x=st.integers(0, 12))
def test_a_random_process_with_scoped_events_runs_as_its_diagram_says(tree: Any, x: int) -> None:
    assume(not _nested(tree, _MULTI, ("evs", "thr", "evt")) and not _nested(tree, ("evt",), ("evs", "thr", "evt")))
    assume(not _overlapping(tree))
    check(tree, x)


@pytest.mark.parametrize(("trigger", "refused"), [("signal", True), ("message", True), ("timer", False), ("cycle", False)])
def test_validate_refuses_what_is_not_drawn(trigger: str, refused: bool) -> None:
    """An event sub-process inside a sub-process that a signal or message starts never starts in
    SpiffWorkflow 3.2: validate refuses it, naming its start event, and the fuzzer does not draw
    it; one a timer starts there runs (drawn)."""
    path, _, _ = _write(Path(tempfile.mkdtemp()), ("seq", [("evt", trigger, True, 1, ("task", []))]))
    problems = [(p.code, p.severity, p.element_id) for p in validate_process(path).problems]
    assert problems == ([("event_subprocess_never_starts", "error", "et1_on")] if refused else []), problems
