"""Process diagrams as SVG, drawn on the server from the BPMN file.

Shapes and edges come from the file's diagram interchange (``bpmndi:BPMNShape``
bounds, ``bpmndi:BPMNEdge`` waypoints). A file without it (most hand-written BPMN,
the examples here) gets a simple layered layout: columns by longest path from the
start events (the back edges of loops set aside), rows of a grid filled by a
depth-first walk (a path stays on its row, the other branches of a split go below,
a long edge keeps the cells it crosses free), orthogonal edges, loops drawn under
everything.

A link throw event goes on at its catch event with no flow between them (``engine.links``):
the jump is an edge of its own (``Edge.kind == "link"``), laid out as a flow is and drawn
dotted, so a path cut by a link still reads as one.

An instance's state is drawn as marks (``Marks``, built by ``marks_of``):

* ``done``: finished activities, events and gateways;
* ``current``: what runs or waits now (a user task, a join waiting for a person);
* ``failed``: the task the instance failed in;
* ``waiting``: the branches of a split that are open and idle, i.e. wait at their join;
* ``conflicts``: joins with an open conflict, with each branch's value; resolved ones
  are drawn too, with the value that won.

The SVG is built with ElementTree (every name and value from the file or the context
is escaped) and styled with presentation attributes only, so it looks the same on its
own and inside the console page, whose Content-Security-Policy forbids inline styles.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from itertools import pairwise
from pathlib import Path
from typing import Any
from xml.etree import ElementTree as ET

from . import links

__all__ = ["ConflictMark", "Diagram", "Edge", "Marks", "Node", "marks_of", "parse_bpmn", "render_svg"]

BPMN = "{http://www.omg.org/spec/BPMN/20100524/MODEL}"
BPMNDI = "{http://www.omg.org/spec/BPMN/20100524/DI}"
DC = "{http://www.omg.org/spec/DD/20100524/DC}"
DI = "{http://www.omg.org/spec/DD/20100524/DI}"
SVG = "http://www.w3.org/2000/svg"

# BPMN element (local name) -> the shape family drawn for it.
_EVENTS = {"startEvent", "endEvent", "intermediateCatchEvent", "intermediateThrowEvent", "boundaryEvent"}
_GATEWAYS = {"exclusiveGateway", "parallelGateway", "inclusiveGateway", "eventBasedGateway", "complexGateway"}
_ACTIVITIES = {"task", "serviceTask", "userTask", "scriptTask", "manualTask", "sendTask", "receiveTask",
               "businessRuleTask", "callActivity", "subProcess", "transaction", "adHocSubProcess"}
_GATEWAY_GLYPH = {"exclusiveGateway": "\u00d7", "parallelGateway": "+", "inclusiveGateway": "\u25cb",
                  "eventBasedGateway": "\u2b20", "complexGateway": "*"}
_TASK_GLYPH = {"userTask": "person", "serviceTask": "service", "scriptTask": "script", "manualTask": "manual",
               "businessRuleTask": "rule", "callActivity": "call", "subProcess": "sub-process",
               "sendTask": "send", "receiveTask": "receive"}

# Layout sizes (px): what the layered layout gives each kind of node.
TASK_W, TASK_H = 132, 64
EVENT_D = 36
GATEWAY_D = 50
RANK_GAP, ROW_GAP, MARGIN = 56, 36, 24

# Presentation: (fill, stroke, stroke-width, dash) per node state; flags draw over it.
_STATE_STYLE = {
    "idle": ("#ffffff", "#8a8f98", "1.5", None),
    "done": ("#e7f4ea", "#2e7d32", "2", None),
    "current": ("#e3efff", "#1f5fbf", "3", None),
    "failed": ("#fdeaea", "#b3261e", "3", None),
}
_WAITING = ("#fff6e0", "#a15c00", "2.5", "6 4")
_CONFLICT = ("#fdeaea", "#b3261e", "3.5", None)
_EDGE_STYLE = {"idle": ("#8a8f98", "1.5", None), "taken": ("#2e7d32", "2", None),
               "waiting": ("#a15c00", "2.5", "6 4")}
_LINK_DASH = "2 4"  # apart from a waiting branch's "6 4"
_TEXT = "#1d2330"


# ============================================================================ the model

@dataclass(frozen=True)
class Node:
    id: str
    kind: str  # the BPMN local name: serviceTask, parallelGateway, startEvent, ...
    name: str | None
    x: float = 0.0
    y: float = 0.0
    w: float = 0.0
    h: float = 0.0

    @property
    def family(self) -> str:
        if self.kind in _EVENTS:
            return "event"
        if self.kind in _GATEWAYS:
            return "gateway"
        return "activity"

    @property
    def label(self) -> str:
        return self.name or self.id

    @property
    def cx(self) -> float:
        return self.x + self.w / 2

    @property
    def cy(self) -> float:
        return self.y + self.h / 2


@dataclass(frozen=True)
class Edge:
    id: str
    source: str
    target: str
    name: str | None = None
    points: tuple[tuple[float, float], ...] = ()
    # "flow": a sequence flow; "link": a link throw event's jump to its catch event, which no flow
    # draws (a modeler's off-page connector); "message": a collaboration's message flow between two
    # pools; the last two are drawn dotted, so a path reads on across them
    kind: str = "flow"


@dataclass(frozen=True)
class Diagram:
    """A process's flow nodes and sequence flows, placed (``laid_out``: from the file's DI or not)."""

    process_id: str
    name: str | None
    nodes: dict[str, Node]
    edges: tuple[Edge, ...]
    from_interchange: bool

    @property
    def width(self) -> float:
        xs = [n.x + n.w for n in self.nodes.values()] + [p[0] for e in self.edges for p in e.points]
        return max(xs, default=0.0)

    @property
    def height(self) -> float:
        ys = [n.y + n.h for n in self.nodes.values()] + [p[1] for e in self.edges for p in e.points]
        return max(ys, default=0.0)


@dataclass(frozen=True)
class ConflictMark:
    """A conflict at a join: the key, the value at the split, each branch's value; ``resolution``
    (``{"value", "resolver", "reason"}``) once it is settled; ``cancelled`` when its question closed
    with its join's scope, so nobody will settle it."""

    gateway_id: str
    key: str
    base_value: Any
    values: Mapping[str, Any]
    resolution: Mapping[str, Any] | None = None
    cancelled: bool = False
    base_absent: bool = False  # the key was not set at the split (``base_value`` None stands for that)

    @property
    def open(self) -> bool:
        return self.resolution is None and not self.cancelled


@dataclass(frozen=True)
class Marks:
    done: frozenset[str] = frozenset()
    current: frozenset[str] = frozenset()
    failed: frozenset[str] = frozenset()
    waiting: frozenset[str] = frozenset()
    conflicts: tuple[ConflictMark, ...] = ()

    def state(self, node_id: str) -> str:
        if node_id in self.failed:
            return "failed"
        if node_id in self.current:
            return "current"
        if node_id in self.done:
            return "done"
        return "idle"

    def open_conflict_at(self, node_id: str) -> bool:
        return any(c.gateway_id == node_id and c.open for c in self.conflicts)


# ============================================================================ parsing

def _local(tag: str) -> str:
    return tag.rsplit("}", 1)[-1]


def parse_bpmn(source: str | Path | bytes, process_id: str | None = None) -> Diagram:
    """The flow nodes and sequence flows of one process (default: the first executable one),
    placed by the file's diagram interchange when it has a shape for every node, else laid out.
    A collaboration's id gives its executable pools together, its message flows drawn between
    them as edges of their own (``Edge.kind == "message"``, dashed as a link's jump is)."""
    if isinstance(source, bytes):
        root = ET.fromstring(source)
    else:
        root = ET.parse(str(source)).getroot()
    processes = list(root.iter(f"{BPMN}process"))
    if not processes:
        raise ValueError("the BPMN file defines no bpmn:process")
    collaboration = None
    if process_id is not None and not any(p.get("id") == process_id for p in processes):
        collaboration = next((c for c in root.iter(f"{BPMN}collaboration") if c.get("id") == process_id), None)
    if collaboration is not None:
        refs = [p.get("processRef") for p in collaboration.iter(f"{BPMN}participant")]
        pools = [p for p in processes if p.get("id") in refs and p.get("isExecutable", "true").lower() != "false"]
        messages = [Edge(str(f.get("id")), str(f.get("sourceRef")), str(f.get("targetRef")), f.get("name"),
                         kind="message") for f in collaboration.iter(f"{BPMN}messageFlow") if f.get("id")]
        return _placed(root, str(collaboration.get("id")), collaboration.get("name"), pools, messages)
    if process_id is None:
        proc = next((p for p in processes if p.get("isExecutable", "true").lower() != "false"), processes[0])
    else:
        found = [p for p in processes if p.get("id") == process_id]
        if not found:
            known = ", ".join(str(p.get("id")) for p in processes)
            raise ValueError(f"the BPMN file has no process {process_id!r}; processes: {known}")
        proc = found[0]
    return _placed(root, str(proc.get("id")), proc.get("name"), [proc], [])


def _placed(root: Any, ident: str, name: str | None, procs: list[Any], extra: list[Edge]) -> Diagram:
    nodes: dict[str, Node] = {}
    edges: list[Edge] = []
    for proc in procs:
        for el in proc:
            kind = _local(el.tag)
            eid = el.get("id")
            if not eid:
                continue
            if kind == "sequenceFlow":
                if el.get("sourceRef") and el.get("targetRef"):
                    edges.append(Edge(eid, str(el.get("sourceRef")), str(el.get("targetRef")), el.get("name")))
            elif kind in _EVENTS or kind in _GATEWAYS or kind in _ACTIVITIES:
                nodes[eid] = Node(eid, kind, el.get("name"))
        for el in proc:
            if links.is_link_throw(el) and el.get("id"):
                edges.extend(Edge(f"{el.get('id')}->{catch.get('id')}", str(el.get("id")), str(catch.get("id")),
                                  links.link_name(el) or None, kind="link")
                             for catch in links.catch_of(el, proc) if catch.get("id"))
    edges.extend(extra)
    edges = [e for e in edges if e.source in nodes and e.target in nodes]

    shapes: dict[str, tuple[float, float, float, float]] = {}
    waypoints: dict[str, tuple[tuple[float, float], ...]] = {}
    for shape in root.iter(f"{BPMNDI}BPMNShape"):
        bounds = shape.find(f"{DC}Bounds")
        ref = shape.get("bpmnElement")
        if ref and bounds is not None:
            try:
                shapes[ref] = tuple(float(bounds.get(a, "0")) for a in ("x", "y", "width", "height"))  # type: ignore[assignment]
            except ValueError:
                continue
    for edge in root.iter(f"{BPMNDI}BPMNEdge"):
        ref = edge.get("bpmnElement")
        try:
            pts = tuple((float(w.get("x", "0")), float(w.get("y", "0"))) for w in edge.iter(f"{DI}waypoint"))
        except ValueError:
            continue
        if ref and len(pts) >= 2:
            waypoints[ref] = pts

    diagram = Diagram(ident, name, nodes, tuple(edges), from_interchange=False)
    if nodes and all(n in shapes for n in nodes):
        return _from_interchange(diagram, shapes, waypoints)
    return layered_layout(diagram)


def _from_interchange(diagram: Diagram, shapes: Mapping[str, tuple[float, float, float, float]],
                      waypoints: Mapping[str, tuple[tuple[float, float], ...]]) -> Diagram:
    placed = {i: Node(n.id, n.kind, n.name, *shapes[i]) for i, n in diagram.nodes.items()}
    min_x = min([n.x for n in placed.values()] + [p[0] for e in diagram.edges for p in waypoints.get(e.id, ())])
    min_y = min([n.y for n in placed.values()] + [p[1] for e in diagram.edges for p in waypoints.get(e.id, ())])
    dx, dy = MARGIN - min_x, MARGIN - min_y  # modelers place diagrams anywhere; start at the margin
    placed = {i: Node(n.id, n.kind, n.name, n.x + dx, n.y + dy, n.w, n.h) for i, n in placed.items()}
    edges = []
    for e in diagram.edges:
        pts = waypoints.get(e.id)
        if pts:
            points = tuple((x + dx, y + dy) for x, y in pts)
        else:
            points = _straight(placed[e.source], placed[e.target])
        edges.append(Edge(e.id, e.source, e.target, e.name, points, e.kind))
    return Diagram(diagram.process_id, diagram.name, placed, tuple(edges), from_interchange=True)


def _straight(a: Node, b: Node) -> tuple[tuple[float, float], ...]:
    return ((a.x + a.w, a.cy), (b.x, b.cy)) if b.cx >= a.cx else ((a.cx, a.y + a.h), (b.cx, b.y))


# ============================================================================ layered layout

def _size(kind: str) -> tuple[float, float]:
    if kind in _EVENTS:
        return EVENT_D, EVENT_D
    if kind in _GATEWAYS:
        return GATEWAY_D, GATEWAY_D
    return TASK_W, TASK_H


def _back_edges(nodes: Sequence[str], edges: Sequence[Edge]) -> set[str]:
    """Edges that close a cycle in a depth-first walk from the sources (start events first)."""
    out: dict[str, list[Edge]] = {n: [] for n in nodes}
    indegree = {n: 0 for n in nodes}
    for e in edges:
        out[e.source].append(e)
        indegree[e.target] += 1
    roots = [n for n in nodes if indegree[n] == 0] + list(nodes)
    colour: dict[str, int] = {}
    back: set[str] = set()
    for root in roots:
        if root in colour:
            continue
        stack: list[tuple[str, int]] = [(root, 0)]
        colour[root] = 1
        while stack:
            node, i = stack.pop()
            if i < len(out[node]):
                stack.append((node, i + 1))
                e = out[node][i]
                c = colour.get(e.target)
                if c is None:
                    colour[e.target] = 1
                    stack.append((e.target, 0))
                elif c == 1:
                    back.add(e.id)
            else:
                colour[node] = 2
    return back


def layered_layout(diagram: Diagram) -> Diagram:
    """Place nodes in ranks, left to right; deterministic for a given file."""
    ids = list(diagram.nodes)
    if not ids:
        return diagram
    back = _back_edges(ids, diagram.edges)
    forward = [e for e in diagram.edges if e.id not in back and e.source != e.target]

    # ranks: longest path from the sources (Kahn's order over the forward edges)
    preds: dict[str, list[str]] = {n: [] for n in ids}
    succs: dict[str, list[str]] = {n: [] for n in ids}
    for e in forward:
        preds[e.target].append(e.source)
        succs[e.source].append(e.target)
    rank: dict[str, int] = {}
    pending = {n: len(preds[n]) for n in ids}
    queue = [n for n in ids if pending[n] == 0]
    while queue:
        n = queue.pop(0)
        rank[n] = max((rank[p] + 1 for p in preds[n]), default=0)
        for s in succs[n]:
            pending[s] -= 1
            if pending[s] == 0:
                queue.append(s)
    for n in ids:  # unreachable leftovers of a malformed graph: after everything
        rank.setdefault(n, max(rank.values(), default=-1) + 1)

    # rows: a grid filled by a depth-first walk; a node takes its walker's row when that
    # cell (and the cells a long edge to it crosses) are free, else the next free row below
    row: dict[str, int] = {}
    taken: set[tuple[int, int]] = set()

    def claim(n: str, via: str | None, wanted: int) -> None:
        first = rank[via] + 1 if via is not None else rank[n]
        r = wanted
        while any((k, r) in taken for k in range(first, rank[n] + 1)):
            r += 1
        row[n] = r
        taken.update((k, r) for k in range(first, rank[n] + 1))

    for source in sorted(ids, key=lambda n: (len(preds[n]) > 0, ids.index(n))):  # sources first
        if source in row:
            continue
        claim(source, None, 0)
        stack = [(source, iter(succs[source]))]
        while stack:
            parent, children = stack[-1]
            child = next(children, None)
            if child is None:
                stack.pop()
            elif child not in row:
                claim(child, parent, row[parent])
                stack.append((child, iter(succs[child])))

    ranks = max(rank.values()) + 1
    rank_w = [max((_size(diagram.nodes[n].kind)[0] for n in ids if rank[n] == k), default=0.0) for k in range(ranks)]
    rank_x, x = [], float(MARGIN)
    for w in rank_w:
        rank_x.append(x)
        x += w + RANK_GAP
    row_h = TASK_H + ROW_GAP
    placed = {}
    for n, node in diagram.nodes.items():
        w, h = _size(node.kind)
        cx = rank_x[rank[n]] + rank_w[rank[n]] / 2
        cy = MARGIN + 14 + TASK_H / 2 + row[n] * row_h  # 14: room for a gateway's name above it
        placed[n] = Node(node.id, node.kind, node.name, cx - w / 2, cy - h / 2, w, h)

    bottom = max(n.y + n.h for n in placed.values())
    edges = []
    for i, e in enumerate(diagram.edges):
        a, b = placed[e.source], placed[e.target]
        if e.id in back or e.source == e.target:  # a loop: under everything, back to the target
            lane = bottom + 22 + 10 * (i % 3)
            points: tuple[tuple[float, float], ...] = (
                (a.cx, a.y + a.h), (a.cx, lane), (b.cx, lane), (b.cx, b.y + b.h))
        else:
            gaps = (rank_x[rank[e.source]] + rank_w[rank[e.source]] + RANK_GAP / 2, rank_x[rank[e.target]] - RANK_GAP / 2)
            points = _route(a, b, splits=len(succs[e.source]) > 1, gap_after_a=gaps[0], gap_before_b=gaps[1])
            others = [n for n in placed.values() if n.id not in (a.id, b.id)]
            if any(_crosses(points, n) for n in others):  # a long edge blocked by a node: along a channel
                points = _channel(a, b, gaps[0], gaps[1], splits=len(succs[e.source]) > 1)
        edges.append(Edge(e.id, e.source, e.target, e.name, points, e.kind))
    return Diagram(diagram.process_id, diagram.name, placed, tuple(edges), from_interchange=False)


def _route(a: Node, b: Node, *, splits: bool, gap_before_b: float, gap_after_a: float
           ) -> tuple[tuple[float, float], ...]:
    """Orthogonal route from ``a`` to ``b`` (``b`` in a later rank): straight along a row;
    out of a splitting gateway through its top or bottom corner; into a gateway through
    its top or bottom corner; else with an elbow in a gap between the ranks."""
    if abs(a.cy - b.cy) < 0.5:
        return (a.x + a.w, a.cy), (b.x, b.cy)
    down = b.cy > a.cy
    if a.family == "gateway" and (splits or b.family != "gateway"):
        return (a.cx, a.y + a.h if down else a.y), (a.cx, b.cy), (b.x, b.cy)
    if b.family == "gateway":
        return (a.x + a.w, a.cy), (b.cx, a.cy), (b.cx, b.y if down else b.y + b.h)
    mid = gap_before_b if b.x - (a.x + a.w) < 3 * RANK_GAP else gap_after_a
    return (a.x + a.w, a.cy), (mid, a.cy), (mid, b.cy), (b.x, b.cy)


def _channel(a: Node, b: Node, gap_after_a: float, gap_before_b: float, *, splits: bool
             ) -> tuple[tuple[float, float], ...]:
    """Along the free channel under ``a``'s row (rows below are filled later, so it is the
    emptier side), then up or down in the gap before ``b``."""
    y = a.cy + (TASK_H + ROW_GAP) / 2
    if a.family == "gateway" and splits:
        start: tuple[tuple[float, float], ...] = ((a.cx, a.y + a.h), (a.cx, y))
    else:
        start = ((a.x + a.w, a.cy), (gap_after_a, a.cy), (gap_after_a, y))
    return (*start, (gap_before_b, y), (gap_before_b, b.cy), (b.x, b.cy))


def _crosses(points: Sequence[tuple[float, float]], node: Node, pad: float = 2.0) -> bool:
    """Whether an orthogonal polyline runs through a node's box."""
    x0, y0, x1, y1 = node.x - pad, node.y - pad, node.x + node.w + pad, node.y + node.h + pad
    for (ax, ay), (bx, by) in pairwise(points):
        if abs(ay - by) < 0.5 and y0 < ay < y1 and min(ax, bx) < x1 and max(ax, bx) > x0:
            return True
        if abs(ax - bx) < 0.5 and x0 < ax < x1 and min(ay, by) < y1 and max(ay, by) > y0:
            return True
    return False


# ============================================================================ marks of an instance

def marks_of(instance: Any) -> Marks:
    """The marks of an ``engine.runtime.Instance``: task states from its workflow, open
    branches from its branch contexts, conflicts from its bookkeeping."""
    from SpiffWorkflow.util.task import TaskState

    from .spiff import bpmn_id_of

    done: set[str] = set()
    current: set[str] = set()
    failed: set[str] = set()
    workflow = getattr(instance, "workflow", None)
    if workflow is not None:
        for task in workflow.get_tasks():
            ident = bpmn_id_of(task)
            if task.state == TaskState.COMPLETED:
                done.add(ident)
            elif task.state in (TaskState.READY, TaskState.STARTED, TaskState.WAITING):
                current.add(ident)
            elif task.state == TaskState.ERROR:
                failed.add(ident)
    for wait in getattr(instance, "waiting_for", ()) or ():
        if wait.get("task_id"):
            current.add(str(wait["task_id"]))
    if getattr(instance, "status", None) == "completed":
        current.clear()
    if getattr(instance, "error_task", None):
        failed.add(str(instance.error_task))

    # an open branch waits when none of its activities is running: it arrived at its join
    waiting: set[str] = set()
    for name, info in (getattr(instance, "branches", None) or {}).items():
        if info.get("status") != "open" or name not in instance.contexts:
            continue
        path = {e.activity for e in instance.contexts[name].tape if e.activity}
        if info.get("branch_id"):
            path.add(str(info["branch_id"]))
        if not path & current:
            waiting |= path

    conflicts = tuple(
        ConflictMark(str(c.get("gateway_id")), str(c.get("key")), c.get("base_value"),
                     dict(c.get("values") or {}), c.get("resolution"), bool(c.get("cancelled")),
                     bool(c.get("base_absent")))
        for c in getattr(instance, "conflicts", ()) or ())
    return Marks(frozenset(done - current), frozenset(current), frozenset(failed), frozenset(waiting), conflicts)


# ============================================================================ SVG

def _short(value: Any, limit: int = 28) -> str:
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, sort_keys=True, default=str)
    text = json.dumps(text, ensure_ascii=False) if isinstance(value, str) else text
    return text if len(text) <= limit else text[: limit - 1] + "\u2026"


def _wrap(text: str, width: int, lines: int) -> list[str]:
    words, out, line = text.split(), [], ""
    for word in words:
        if not line:
            line = word
        elif len(line) + 1 + len(word) <= width:
            line += " " + word
        else:
            out.append(line)
            line = word
    if line:
        out.append(line)
    out = [w if len(w) <= width else w[: width - 1] + "\u2026" for w in out]
    if len(out) > lines:
        out = out[:lines]
        out[-1] = out[-1][: width - 1].rstrip() + "\u2026"
    return out


def _state_words(state: str, waiting: bool, conflict: bool) -> str:
    words = {"idle": "not reached", "done": "finished", "current": "current", "failed": "failed"}[state]
    if waiting:
        words += ", branch waiting at its join"
    if conflict:
        words += ", conflict to resolve"
    return words


def _sub(parent: ET.Element, tag: str, **attrs: Any) -> ET.Element:
    return ET.SubElement(parent, tag, {k.rstrip("_").replace("_", "-"): str(v) for k, v in attrs.items()
                                       if v is not None})


def _fmt(v: float) -> str:
    return f"{v:.1f}".rstrip("0").rstrip(".")


def render_svg(diagram: Diagram, marks: Marks | None = None, *, title: str | None = None,
               legend: bool = True) -> str:
    """The diagram as a standalone SVG document (UTF-8 text)."""
    marks = marks or Marks()
    callouts = _callouts(diagram, marks)
    width = max([diagram.width] + [c[0] + c[2] for c in callouts]) + MARGIN
    height = max([diagram.height] + [c[1] + c[3] for c in callouts]) + MARGIN
    legend_h = 30 if legend else 0
    width = max(width, 560 if legend else 0)
    svg = ET.Element("svg", {"xmlns": SVG, "viewBox": f"0 0 {_fmt(width)} {_fmt(height + legend_h)}",
                             "width": _fmt(width), "height": _fmt(height + legend_h), "role": "img",
                             "aria-labelledby": "diagram-title diagram-desc", "class": "bpmn-diagram",
                             "font-family": "system-ui, -apple-system, 'Segoe UI', Roboto, sans-serif",
                             "data-process": diagram.process_id,
                             "data-layout": "interchange" if diagram.from_interchange else "layered"})
    _sub(svg, "title", id="diagram-title").text = title or f"Process {diagram.name or diagram.process_id}"
    _sub(svg, "desc", id="diagram-desc").text = _description(diagram, marks)
    defs = _sub(svg, "defs")
    for name, (colour, _, _) in _EDGE_STYLE.items():
        marker = _sub(defs, "marker", id=f"arrow-{name}", viewBox="0 0 10 10", refX="9", refY="5",
                      markerUnits="userSpaceOnUse", markerWidth="10", markerHeight="10", orient="auto-start-reverse")
        _sub(marker, "path", d="M0,0 L10,5 L0,10 z", fill=colour)
    _sub(svg, "rect", x=0, y=0, width=_fmt(width), height=_fmt(height + legend_h), fill="#ffffff")

    edges_g = _sub(svg, "g", class_="edges")
    for e in diagram.edges:
        state = _edge_state(e, marks)
        colour, stroke_w, dash = _EDGE_STYLE[state]
        jump = e.kind == "link"
        g = _sub(edges_g, "g", class_=f"edge edge-{state}" + (f" edge-{e.kind}" if e.kind != "flow" else ""),
                 data_id=e.id, data_source=e.source, data_target=e.target, data_kind=e.kind)
        if jump:
            dash = _LINK_DASH
            _sub(g, "title").text = (f"link {e.name or ''!r}: {e.source} jumps to {e.target} (a link event, "
                                     "no sequence flow)")
        elif e.kind == "message":
            dash = _LINK_DASH
            _sub(g, "title").text = f"message flow {e.name or e.id}: {e.source} \u2192 {e.target} (between pools)"
        else:
            _sub(g, "title").text = f"{e.name or e.id}: {e.source} \u2192 {e.target}"
        _sub(g, "polyline", points=" ".join(f"{_fmt(x)},{_fmt(y)}" for x, y in e.points), fill="none",
             stroke=colour, stroke_width=stroke_w, stroke_dasharray=dash, stroke_linejoin="round",
             marker_end=f"url(#arrow-{state})")
        if e.name and not jump:  # a link's name labels its events already
            (x1, y1), (x2, y2) = e.points[0], e.points[1]
            _sub(g, "text", x=_fmt((x1 + x2) / 2 + 4), y=_fmt(min(y1, y2) - 5), font_size="10",
                 fill="#4a5160").text = e.name[:40]

    nodes_g = _sub(svg, "g", class_="nodes")
    for node in diagram.nodes.values():
        _node(nodes_g, node, marks)

    notes = _sub(svg, "g", class_="callouts")
    for x, y, w, h, mark, lines in callouts:
        _callout(notes, diagram.nodes[mark.gateway_id], x, y, w, h, mark, lines)

    if legend:
        _legend(svg, height + 4)
    return ET.tostring(svg, encoding="unicode")


def _description(diagram: Diagram, marks: Marks) -> str:
    jumps = sum(1 for e in diagram.edges if e.kind == "link")
    messages = sum(1 for e in diagram.edges if e.kind == "message")
    parts = [f"{len(diagram.nodes)} elements, {len(diagram.edges) - jumps - messages} flows"
             + (f", {jumps} link jump{'s' if jumps > 1 else ''}" if jumps else "")
             + (f", {messages} message flow{'s' if messages > 1 else ''}" if messages else "")]
    for label, ids in (("finished", marks.done), ("current", marks.current), ("failed", marks.failed),
                       ("waiting branch", marks.waiting)):
        shown = [diagram.nodes[i].label for i in diagram.nodes if i in ids]
        if shown:
            parts.append(f"{label}: {', '.join(shown)}")
    for c in marks.conflicts:
        values = "; ".join(f"{b} = {_short(v, 60)}" for b, v in c.values.items())
        state = ("cancelled" if c.cancelled else "open") if c.resolution is None \
            else f"resolved to {_short(c.resolution.get('value'), 60)}"
        parts.append(f"conflict on {c.key} at {c.gateway_id} ({state}): {values}")
    return ". ".join(parts) + "."


def _edge_state(e: Edge, marks: Marks) -> str:
    if e.source in marks.waiting and (e.target in marks.waiting or e.target in marks.current):
        return "waiting"
    if e.source in marks.done and (e.target in marks.done or e.target in marks.current or e.target in marks.failed):
        return "taken"
    return "idle"


def _node(parent: ET.Element, node: Node, marks: Marks) -> None:
    state = marks.state(node.id)
    waiting = node.id in marks.waiting
    conflict = marks.open_conflict_at(node.id)
    fill, stroke, stroke_w, dash = _STATE_STYLE[state]
    if waiting:
        fill, stroke, stroke_w, dash = (fill if state != "idle" else _WAITING[0]), *_WAITING[1:]
    if conflict:
        fill, stroke, stroke_w, dash = _CONFLICT
    classes = ["node", f"node-{node.family}", f"state-{state}"] + (["waiting"] if waiting else []) + (
        ["conflict"] if conflict else [])
    g = _sub(parent, "g", class_=" ".join(classes), id=f"node-{node.id}", data_id=node.id, data_kind=node.kind,
             data_state=state)
    _sub(g, "title").text = f"{node.label} ({node.kind} {node.id}): {_state_words(state, waiting, conflict)}"
    paint = {"fill": fill, "stroke": stroke, "stroke_width": stroke_w, "stroke_dasharray": dash}
    if node.family == "event":
        r = min(node.w, node.h) / 2
        if node.kind == "endEvent":
            paint["stroke_width"] = "4"
        _sub(g, "circle", cx=_fmt(node.cx), cy=_fmt(node.cy), r=_fmt(r), **paint)
        if node.name:
            for i, line in enumerate(_wrap(node.name, 18, 2)):
                _sub(g, "text", x=_fmt(node.cx), y=_fmt(node.y + node.h + 15 + 14 * i), text_anchor="middle",
                     font_size="12", fill=_TEXT).text = line
    elif node.family == "gateway":
        cx, cy, hw, hh = node.cx, node.cy, node.w / 2, node.h / 2
        _sub(g, "polygon", points=f"{_fmt(cx)},{_fmt(cy - hh)} {_fmt(cx + hw)},{_fmt(cy)} "
                                  f"{_fmt(cx)},{_fmt(cy + hh)} {_fmt(cx - hw)},{_fmt(cy)}", **paint)
        _sub(g, "text", x=_fmt(cx), y=_fmt(cy + 7), text_anchor="middle", font_size="20", font_weight="bold",
             fill=stroke).text = _GATEWAY_GLYPH.get(node.kind, "")
        if node.name:
            for i, line in enumerate(_wrap(node.name, 18, 2)):
                _sub(g, "text", x=_fmt(cx), y=_fmt(node.y - 8 - 13 * (len(_wrap(node.name, 18, 2)) - 1 - i)),
                     text_anchor="middle", font_size="12", fill=_TEXT).text = line
    else:
        _sub(g, "rect", x=_fmt(node.x), y=_fmt(node.y), width=_fmt(node.w), height=_fmt(node.h), rx="9", **paint)
        lines = _wrap(node.label, max(8, int(node.w / 7.6)), 3)
        top = node.cy - (len(lines) - 1) * 7.5 + 5
        for i, line in enumerate(lines):
            _sub(g, "text", x=_fmt(node.cx), y=_fmt(top + 15 * i), text_anchor="middle", font_size="13",
                 fill=_TEXT).text = line
        glyph = _TASK_GLYPH.get(node.kind)
        if glyph:
            _sub(g, "text", x=_fmt(node.x + 6), y=_fmt(node.y + 12), font_size="9", fill="#5b6270").text = glyph
    badge = {"done": "\u2713", "current": "\u25b6", "failed": "!"}.get(state)
    if conflict:
        badge = "!"
    if badge:
        bx, by = (node.x + node.w - 2, node.y + 2) if node.family == "activity" else (node.x + node.w, node.y)
        _sub(g, "circle", cx=_fmt(bx), cy=_fmt(by), r="8", fill=stroke)
        _sub(g, "text", x=_fmt(bx), y=_fmt(by + 4), text_anchor="middle", font_size="11", font_weight="bold",
             fill="#ffffff").text = badge


_CallOut = tuple[float, float, float, float, ConflictMark, list[str]]


def _callouts(diagram: Diagram, marks: Marks) -> list[_CallOut]:
    """Boxes under their joins listing each conflict's branch values; stacked when several."""
    out: list[_CallOut] = []
    below: dict[str, float] = {}
    for mark in marks.conflicts:
        node = diagram.nodes.get(mark.gateway_id)
        if node is None:
            continue
        head = (f"Resolved: {mark.key}" if mark.resolution is not None
                else f"Cancelled: {mark.key}" if mark.cancelled else f"Conflict on {mark.key}")
        lines = [head] + [f"{branch}: {_short(value)}" for branch, value in mark.values.items()]
        if mark.resolution is not None:
            lines.append(f"\u2192 {_short(mark.resolution.get('value'))} ({mark.resolution.get('resolver', '?')})")
        else:
            lines.append("not set before" if mark.base_absent else f"was {_short(mark.base_value)}")
        w = max(7.6 * max(len(line) for line in lines) + 20, 150.0)
        h = 16.0 * len(lines) + 12
        y = below.get(mark.gateway_id, node.y + node.h + 30)
        x = node.cx + 14  # right of the join's bottom corner, where a branch's edge may come in
        # keep clear of the nodes right under the join: below the lowest one it would cover
        covered = [n.y + n.h for n in diagram.nodes.values()
                   if n.id != node.id and n.x < x + w and n.x + n.w > x and n.y + n.h > y - 4 and n.y < y + h]
        if covered:
            y = max(covered) + 26
        below[mark.gateway_id] = y + h + 8
        out.append((x, y, w, h, mark, lines))
    return out


def _callout(parent: ET.Element, node: Node, x: float, y: float, w: float, h: float, mark: ConflictMark,
             lines: list[str]) -> None:
    resolved = not mark.open
    stroke = "#5b6270" if resolved else "#b3261e"
    state = "open" if mark.open else "cancelled" if mark.resolution is None else "resolved"
    g = _sub(parent, "g", class_="callout " + state, data_gateway=mark.gateway_id,
             data_key=mark.key)
    _sub(g, "title").text = " \u2014 ".join(lines)
    _sub(g, "line", x1=_fmt(node.cx + node.w / 4), y1=_fmt(node.cy + node.h / 4), x2=_fmt(x + 18), y2=_fmt(y),
         stroke=stroke, stroke_width="1.5", stroke_dasharray="3 3")
    _sub(g, "rect", x=_fmt(x), y=_fmt(y), width=_fmt(w), height=_fmt(h), rx="6",
         fill="#ffffff" if resolved else "#fff5f4", stroke=stroke, stroke_width="1.5")
    for i, line in enumerate(lines):
        _sub(g, "text", x=_fmt(x + 10), y=_fmt(y + 20 + 16 * i), font_size="13",
             font_weight="bold" if i == 0 else None, fill=stroke if i == 0 else _TEXT,
             class_="callout-line").text = line


def _legend(svg: ET.Element, y: float) -> None:
    g = _sub(svg, "g", class_="legend", transform=f"translate({MARGIN},{_fmt(y)})")
    items = [("finished", _STATE_STYLE["done"]), ("current", _STATE_STYLE["current"]),
             ("waiting branch", _WAITING), ("conflict", _CONFLICT), ("not reached", _STATE_STYLE["idle"])]
    x = 0.0
    for label, (fill, stroke, stroke_w, dash) in items:
        _sub(g, "rect", x=_fmt(x), y="4", width="18", height="14", rx="3", fill=fill, stroke=stroke,
             stroke_width=stroke_w, stroke_dasharray=dash)
        _sub(g, "text", x=_fmt(x + 24), y="15", font_size="12", fill=_TEXT).text = label
        x += 24 + 7.2 * len(label) + 18

