"""Collaborations: several executable pools that exchange messages, run as one instance.

A BPMN collaboration draws each party of a conversation as a pool (a participant whose
``processRef`` names its process) and the messages between them as message flows.
SpiffWorkflow runs one (``BpmnParser.get_collaboration``): a workflow whose start starts
every executable pool's process as a call activity, and whose end waits for them all.
layerflow runs that workflow (``load_process`` picks it, ``engine.validate`` decides when),
and adds:

* **a context per pool.** The collaboration's start splits as a parallel gateway does
  (``spiff.LayerflowCollaborationStart``): each pool's process runs in a branch of its own,
  forked from the instance's context (SYSTEM and PROCESS, the ``--data``, shared as at any
  split; WORKING, HISTORY and KNOWLEDGE its own), branch id = the pool's process id. One
  pool never reads nor overwrites what another pool wrote. At the collaboration's end join
  (``<collaboration id>.EndJoin``) the pools' contexts merge as parallel branches do (a key
  two pools set to different values is a conflict, resolved as any join's).
* **messages, payload included, from pool to pool.** A message one pool throws is caught by
  the catch event of the pool its message flow leads to (SpiffWorkflow matches the message's
  name). The payload is evaluated in the sender's context and written into the receiver's
  context as any message the process throws itself is (``events.catch_thrown``): WORKING, the
  layer rules, an ``event:<catch id>`` record.
* **messages wait for their receiver.** SpiffWorkflow drops a message nobody waits for at the
  moment it is thrown into ``workflow.bpmn_events`` (for the application to deliver). In a
  collaboration the receiving pool may simply not be there yet (the sender ran first): such a
  message is handed to SpiffWorkflow again whenever the instance has nothing else to run
  (``deliver_pending``), until a pool catches it. ``bpmn_events`` is saved with the workflow,
  so a message waiting for a pool that waits for a person survives a save and a resume.
* **the receiver knows its sender.** A message a pool throws carries the element that threw it
  and that pool's process (``spiff._InterruptAwareEvents.catch``, saved with a message that
  waits). The receiving catch event's ``event:<catch id>`` record (and the tape event that
  completes it) gets ``sent_from``: ``{"participant", "process", "element", "message_flow"}``,
  the participant (pool) id and the message flow id read from the collaboration
  (``sender_of``), so an auditor of the receiver's tape sees where the data came from.
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import Any

from lxml import etree
from SpiffWorkflow.bpmn.specs.event_definitions.message import MessageEventDefinition

from . import spiff

__all__ = ["deliver_pending", "pending_messages", "sender_of"]

_BPMN = "{http://www.omg.org/spec/BPMN/20100524/MODEL}"


def pending_messages(workflow: Any) -> list[Any]:
    """The messages a pool threw that no pool has caught yet (oldest first)."""
    return [e for e in workflow.bpmn_events if isinstance(e.event_definition, MessageEventDefinition)]


def deliver_pending(workflow: Any) -> bool:
    """Hand the messages no pool caught yet to SpiffWorkflow again; True when one was caught.
    Only a collaboration's: a message a single process throws to nobody is for the outside."""
    if not spiff.is_collaboration(workflow.spec):
        return False
    caught = False
    for event in pending_messages(workflow):
        if workflow.event_manager.catch(event, internal=False):
            workflow.bpmn_events.remove(event)
            caught = True
    return caught


@lru_cache(maxsize=64)
def _drawing(paths: tuple[str, ...], collaboration_id: str) -> tuple[dict[str, str], tuple[tuple[str, str, str], ...]]:
    """(process id -> participant id, message flows as (id, sourceRef, targetRef)) of a collaboration."""
    parser = etree.XMLParser(resolve_entities=False, no_network=True)
    for path in paths:
        if Path(path).suffix.lower() == ".dmn":
            continue
        try:
            root = etree.parse(path, parser).getroot()
        except (OSError, etree.XMLSyntaxError):
            continue
        for collab in root.iter(f"{_BPMN}collaboration"):
            if collab.get("id") != collaboration_id:
                continue
            pools = {str(p.get("processRef")): str(p.get("id")) for p in collab.iter(f"{_BPMN}participant")
                     if p.get("processRef")}
            flows = tuple((str(f.get("id")), str(f.get("sourceRef")), str(f.get("targetRef")))
                          for f in collab.iter(f"{_BPMN}messageFlow"))
            return pools, flows
    return {}, ()


def sender_of(paths: tuple[str, ...], collaboration_id: str, sent_from: dict[str, Any], receiver: str,
              receiving_process: str) -> dict[str, Any]:
    """Who sent the message catch event ``receiver`` (in pool ``receiving_process``) caught:
    ``sent_from`` (the throwing element and its pool's process) with the pool's participant id and
    the message flow drawn from the thrower (or its pool) to the receiver (or its pool): None
    where the collaboration draws none."""
    pools, flows = _drawing(tuple(paths), collaboration_id)
    element, process = str(sent_from.get("element")), str(sent_from.get("process"))
    sender_pool, receiver_pool = pools.get(process), pools.get(receiving_process)
    drawn = [fid for fid, source, target in flows
             if source in (element, sender_pool) and target in (receiver, receiver_pool)]
    # the flow between the two elements first, then one that ends or starts at a pool's border
    exact = [fid for fid, source, target in flows if source == element and target == receiver]
    found = exact or drawn
    return {"participant": sender_pool, "process": process, "element": element,
            "message_flow": found[0] if found else None}
