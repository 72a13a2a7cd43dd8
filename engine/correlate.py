"""Message correlation: a message sent to the one waiting instance it is meant for, not by its id.

``Engine.correlate(name, payload, match={...})`` (``layerflow correlate``, ``POST /api/messages``)
finds the instances of the store that wait for message ``name`` and keeps those where

* SpiffWorkflow's own test takes the message: its correlation properties (``bpmn:correlationProperty``
  with a retrieval expression over the payload) agree with the keys the instance holds, as
  ``send_event`` checks them; and
* every ``match`` key resolves, in the context the catch waits in, to an equal value (canonical
  JSON, as a join compares values): Zeebe's correlation key, Camunda's business key.

Exactly one such instance gets the message (``Engine.send_event``); several are refused naming
them; none starts an instance of the one process given whose top-level message start event has
that name, else the refusal names what waits for what.

The search reads no tape it does not need: the store's listing of ``waiting`` instances, the record
head of each (``waiting_for``, no tape), and the whole record (its tapes) only of those whose
``waiting_for`` names the message.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from SpiffWorkflow.bpmn.specs.mixins.events.start_event import StartEvent

from context_layers import json_equal, thaw
from context_layers.canonical import freeze
from context_layers.errors import ContextKeyError, ContextValueError

from . import events, spiff
from .process import Process
from .store import InstanceRecords, Store, record_head

if TYPE_CHECKING:
    from .runtime import Engine, Instance

__all__ = ["MISSING", "check_match", "find", "starts_on", "waiting_rows"]

#: shown for a ``match`` key an instance does not have
MISSING = "(absent)"
_ABSENT = object()


def check_match(match: Mapping[str, Any] | None) -> dict[str, Any]:
    """``match`` as a plain dict of JSON values; a key that is no string or a value that is not
    JSON raises ``ContextValueError`` naming it."""
    if match is None:
        return {}
    if not isinstance(match, Mapping):
        raise ContextValueError("match", f"match must be an object of context keys and values, got {type(match).__name__}")
    for key, value in match.items():
        if not isinstance(key, str) or not key:
            raise ContextValueError(str(key), f"match keys must be non-empty context keys, got {key!r}")
        try:
            freeze(value)
        except (TypeError, ValueError) as err:
            raise ContextValueError(key, f"match[{key!r}]: {err}") from None
    return dict(match)


def waiting_rows(store: Store, name: str) -> list[str]:
    """Ids of the store's waiting instances whose ``waiting_for`` names message ``name``, oldest first;
    from the store's listing and each waiting instance's record head (no tape is read)."""
    if isinstance(store, InstanceRecords):
        ids = [s["instance_id"] for s in store.list_instances("waiting")]
    else:
        ids = [row["id"] for row in reversed(store.list()) if row.get("status") == "waiting"]
    found = []
    for iid in ids:
        try:
            head = record_head(store, iid)
        except ContextKeyError:
            continue  # deleted meanwhile
        if head.get("status") == "waiting" and any(
                w.get("kind") == "event" and w.get("event") == name and w.get("event_kind") == "message"
                for w in head.get("engine", {}).get("waiting_for", [])):
            found.append(iid)
    return found


def starts_on(process: Process, name: str) -> bool:
    """Whether ``process`` (run alone: no collaboration) has a top-level message start event for ``name``."""
    if spiff.is_collaboration(process.spec):
        return False
    return any(events.kind_of(d) == "message" and d.name == name
               for s in process.spec.start.outputs if isinstance(s, StartEvent)
               for d, _ in events._members(s))


def _values(instance: Instance, context: str, keys: Iterable[str]) -> dict[str, Any]:
    """The values ``keys`` resolve to (L0 to L5) in ``context``; ``_ABSENT`` for one it does not hold."""
    ctx = instance.contexts.get(context, instance.main)
    return {key: ctx.get(key, _ABSENT) for key in keys}


def _shown(values: Mapping[str, Any]) -> dict[str, Any]:
    return {key: MISSING if v is _ABSENT else thaw(v) for key, v in values.items()}


def find(engine: Engine, name: str, payload: Any = None, *, match: Mapping[str, Any] | None = None,
         process: Process | Iterable[Process] | None = None) -> Instance | Process:
    """The waiting instance message ``name`` is for (loaded), or the process to start for it (see the
    module doc). Raises ``InstanceStateError`` when several instances take it, ``ContextKeyError`` when
    none does and no process given starts on it (both name the instances that wait for the message and
    their values of the ``match`` keys), ``BadRequest`` when several processes start on it."""
    from .governance import BadRequest, InstanceStateError  # the engine's error tree (governance imports runtime)

    if not isinstance(name, str) or not name:
        raise BadRequest(f"the message's name must be a non-empty string, got {name!r}")
    wanted = check_match(match)
    asked = f"with match {wanted}" if wanted else "without match"
    hits: list[Instance] = []
    others: list[str] = []  # instances that wait for the message, with what they hold
    for iid in waiting_rows(engine.store, name):
        try:
            instance = engine.load(iid)
        except ContextKeyError:
            continue
        named, _, catches = events.takers(instance.workflow, name, payload)
        taken = [c for c in catches if all(v is not _ABSENT and json_equal(v, wanted[k])
                                           for k, v in _values(instance, c.context, wanted).items())]
        if taken:
            hits.append(instance)
            continue
        for c in named:
            held = _shown(_values(instance, c.context, wanted))
            why = "" if any(c is t for t in catches) else " (its correlation keys refuse this payload)"
            others.append(f"{iid} at {c.event_id} in context {c.context!r}"
                          + (f" with {held}" if held else "") + why)
    if len(hits) > 1:
        ids = ", ".join(i.id for i in hits)
        raise InstanceStateError(
            f"message {name!r} matches {len(hits)} waiting instances ({ids}) {asked}: it is for one; "
            "add match keys that tell them apart (--match KEY=VALUE), or send it to one by id "
            f"(`layerflow send ID {name}`)")
    if hits:
        return hits[0]
    given = [] if process is None else [process] if isinstance(process, Process) else list(process)
    starting = [p for p in given if starts_on(p, name)]
    if len(starting) > 1:
        raise BadRequest(f"no waiting instance takes message {name!r}, and several processes start on it "
                         f"({', '.join(p.id for p in starting)}): name the one to start")
    if starting:
        return starting[0]
    waits = "; ".join(others) if others else "no waiting instance waits for it"
    starts = (f"and no process given ({', '.join(p.id for p in given)}) starts on it" if given
              else "and no process was given to start on it")
    raise ContextKeyError(
        f"no waiting instance takes message {name!r} {asked}: {waits}; {starts}. Check the match "
        "values (`layerflow inspect ID` shows an instance's context), or name a process whose message start "
        f"event is {name!r}")
