"""The web console: a page to watch instances and answer confirmations, served by
``layerflow serve`` at ``/`` from the same app as the REST API.

The page (``engine/static``: plain HTML, CSS and a small hand-written script, nothing
fetched from elsewhere) asks for the API token once, keeps it in session storage and
sends it as ``Authorization: Bearer`` on every call. It holds no data itself: all it
shows comes from documented REST endpoints, the governance API's and the four read
endpoints this module adds (tag ``console`` in the OpenAPI schema)::

    GET /api/instance-summaries?status=&limit=          the instances list, one row each
    GET /api/instances/{id}/diagram.svg                  the process diagram with the instance's marks
    GET /api/processes/{process_id}/diagram.svg          a catalog process's diagram, unmarked
    GET /api/instances/{id}/replay?context=&until=SEQ    a context rebuilt from its tape, per key

They sit under ``/api/``, so ``engine.api``'s middleware asks them for the token like
every other endpoint that returns instance data. The page and its files are open
(they carry no data) and are sent with a Content-Security-Policy that allows nothing
but this server.
"""

from __future__ import annotations

import threading
from datetime import UTC, datetime
from enum import Enum
from pathlib import Path
from typing import Annotated, Any
from xml.etree.ElementTree import ParseError

from fastapi import Depends, FastAPI, Query
from fastapi import Path as PathParam
from fastapi.responses import FileResponse, Response
from fastapi.security import HTTPBearer
from fastapi.staticfiles import StaticFiles
from starlette.types import Scope

from context_layers import DELETED, Layer, LayeredContext, thaw
from context_layers.errors import ContextKeyError, LayerflowError, ProcessError
from context_layers.stores import StoreError, StoreUnavailable
from context_layers.tape import EventKind

from .api import ConsoleSummary, ReplayDocument, answer_responses, route_responses
from .diagram import Diagram, marks_of, parse_bpmn, render_svg
from .governance import GovernanceService, event_document, mark_dead_letters, moved_keys
from .process import definition_version
from .runtime import Instance, Status

__all__ = ["STATIC_DIR", "mount_console", "replay_document", "summary_of", "unreadable_summary"]

STATIC_DIR = Path(__file__).resolve().parent / "static"
ID_PATTERN = r"^[\w.:@-]+$"
PathId = Annotated[str, PathParam(pattern=ID_PATTERN, max_length=200)]

#: What the page may load and call: this server only; no inline script or style.
SECURITY_HEADERS = {
    "Content-Security-Policy": ("default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
                                "connect-src 'self'; font-src 'self'; base-uri 'none'; form-action 'self'; "
                                "frame-ancestors 'none'"),
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-cache",
}
_SVG: dict[int | str, dict[str, Any]] = {200: {"content": {"image/svg+xml": {"schema": {"type": "string"}}},
              "description": "an SVG document (UTF-8)"}}


class _ConsoleFiles(StaticFiles):
    """The page's script and style sheet, with the security headers."""

    async def get_response(self, path: str, scope: Scope) -> Any:
        response = await super().get_response(path, scope)
        response.headers.update(SECURITY_HEADERS)
        return response


def mount_console(app: FastAPI) -> None:
    """Add the console's page, its files and its documented read endpoints to ``app``
    (made by ``engine.api.create_app``, whose ``app.state.service`` they read)."""
    service: GovernanceService = app.state.service
    # Declared for the OpenAPI schema; engine.api's middleware checks the token on /api/*.
    bearer = HTTPBearer(auto_error=False, description="the server's API token (LAYERFLOW_API_TOKEN)")
    summaries = _SummaryCache()
    tags: list[str | Enum] = ["console"]
    auth = [Depends(bearer)]

    @app.get("/api/instance-summaries", response_model=None, tags=tags, dependencies=auth,
             responses={200: {"model": list[ConsoleSummary], "description": "the instances, newest first"},
                        **route_responses("instance_summaries")})
    def instance_summaries(status: Annotated[Status | None, Query(description="only this status")] = None,
                           limit: Annotated[int, Query(ge=1, le=500)] = 100,
                           process_id: Annotated[str | None, Query(description="only this process's")] = None,
                           ) -> list[dict[str, Any]]:
        """The instances list, newest first: id, process, status, version, started, updated,
        the definition it runs (``definition_version``), its dead letter (``dead_letter``, only on an
        unfinished one a worker dead-lettered), what the instance waits for, total tokens of the main context, open conflicts, error."""
        rows = service.list_instances(status, process_id=process_id)[:limit]
        out = []
        for row in rows:
            summary = summaries.get(service, row)
            if summary is not None:
                out.append(dict(summary))  # a copy: a dead letter comes and goes at one version (a requeue)
        mark_dead_letters(out, app.state.dead_letters() if out else {})
        return out

    @app.get("/api/instances/{instance_id}/diagram.svg", response_class=Response,
             responses={**route_responses("instance_diagram"), **_SVG},
             tags=tags, dependencies=auth)
    def instance_diagram(instance_id: PathId) -> Response:
        """The process diagram (from the BPMN's diagram interchange, else a layered layout) with
        the instance's marks: finished, current and failed elements, branches waiting at their
        join, joins with a conflict (each branch's value) or a resolved one (the value that won)."""
        instance = service.load(instance_id)
        diagram = _diagram(_bpmn_path(service, instance), instance.process_id)
        definition = instance.process.definition()
        drawn = ("" if definition["on_disk"] in ("same", "unknown") else
                 f" - drawn from the BPMN as it reads now; the instance runs version {definition['version']}, "
                 "the one it started with")
        svg = render_svg(diagram, marks_of(instance),
                         title=f"{diagram.name or diagram.process_id}: instance {instance.id} ({instance.status}){drawn}")
        return _svg_response(svg)

    @app.get("/api/processes/{process_id}/diagram.svg", response_class=Response,
             responses={**route_responses("process_diagram"), **_SVG},
             tags=tags, dependencies=auth)
    def process_diagram(process_id: PathId) -> Response:
        """A catalog process's diagram, without marks."""
        entry = service.catalog.entries().get(process_id)
        if entry is None or service.catalog.directory is None:
            known = ", ".join(sorted(service.catalog.entries())) or "none"
            raise ContextKeyError(f"process {process_id!r} is not in the catalog; registered: {known}")
        diagram = _diagram(service.catalog.directory / entry["file"], process_id)
        return _svg_response(render_svg(diagram, title=f"Process {diagram.name or process_id}"))

    @app.get("/api/instances/{instance_id}/replay", response_model=None, tags=tags, dependencies=auth,
             responses=answer_responses("replay", ReplayDocument, "the context rebuilt from its tape"))
    def replay(instance_id: PathId,
               context: Annotated[str | None, Query(max_length=300, description="a context name or branch id "
                                                    "(default: main)")] = None,
               until: Annotated[int | None, Query(ge=0, description="the sequence number of the context's tape to "
                                                  "stop at (default: all of it)")] = None) -> dict[str, Any]:
        """A context as it was at a sequence number of its tape, rebuilt from the tape alone
        (as `layerflow replay`): per layer its token count and its keys, each with value,
        tokens, whether it is preserved, and the tape event that wrote it (activity, actor,
        seq; for a branch, keys it inherited are traced into the parent's tape)."""
        instance = service.load(instance_id)
        ctx = service.context_of(instance, context)
        return {"instance_id": instance.id, "version": instance.version, **replay_document(instance, ctx, until)}

    @app.get("/", include_in_schema=False)
    def page() -> FileResponse:
        index = STATIC_DIR / "index.html"
        if not index.is_file():
            raise ContextKeyError(f"the console's page {index} is not installed; reinstall layerflow")
        return FileResponse(index, media_type="text/html", headers=SECURITY_HEADERS)

    app.mount("/console", _ConsoleFiles(directory=STATIC_DIR, check_dir=False), name="console")


# ============================================================================ helpers

def _svg_response(svg: str) -> Response:
    return Response('<?xml version="1.0" encoding="UTF-8"?>\n' + svg, media_type="image/svg+xml",
                    headers={"X-Content-Type-Options": "nosniff", "Cache-Control": "no-store",
                             "Content-Security-Policy": "default-src 'none'; style-src 'unsafe-inline'"})


_diagrams: dict[tuple[str, str, float], Diagram] = {}
_diagrams_lock = threading.Lock()


def _diagram(path: Path, process_id: str) -> Diagram:
    """The parsed, laid-out diagram of a file's process (cached by file and modification time)."""
    try:
        mtime = path.stat().st_mtime
    except OSError:
        raise ContextKeyError(f"the BPMN file {path} of process {process_id!r} is gone; restore it or start the "
                              "process again from the catalog") from None
    key = (str(path), process_id, mtime)
    with _diagrams_lock:
        hit = _diagrams.get(key)
    if hit is not None:
        return hit
    try:
        diagram = parse_bpmn(path, process_id)
    except (ValueError, ParseError, OSError) as err:
        raise ProcessError(f"{path}: cannot draw process {process_id!r}: {err}") from None
    with _diagrams_lock:
        if len(_diagrams) > 64:
            _diagrams.clear()
        _diagrams[key] = diagram
    return diagram


def _bpmn_path(service: GovernanceService, instance: Instance) -> Path:
    """The instance's BPMN file as it was started; the catalog's file of that process when moved."""
    for p in instance.process.paths[:1]:
        if Path(p).is_file():
            return Path(p)
    entry = service.catalog.entries().get(instance.process_id)
    if entry is not None and service.catalog.directory is not None:
        return service.catalog.directory / str(entry["file"])
    raise ContextKeyError(f"the BPMN file of instance {instance.id} ({', '.join(instance.process.paths) or '?'}) is "
                          f"gone and the catalog has no process {instance.process_id!r}")


def _iso(t: float | None) -> str | None:
    if not t:
        return None
    return datetime.fromtimestamp(t, tz=UTC).isoformat(timespec="seconds").replace("+00:00", "Z")


def summary_of(instance: Instance) -> dict[str, Any]:
    """One row of the instances list."""
    return {
        "instance_id": instance.id, "id": instance.id, "process_id": instance.process_id, "status": instance.status,
        "version": instance.version, "started": _iso(instance.created), "updated": _iso(instance.updated),
        "definition_version": definition_version(instance.process.digests),
        "waiting_for": [dict(w) for w in instance.waiting_for],
        "tokens_total": instance.main.token_report()["total"],
        # a cancelled conflict (its question closed with its join or instance) is settled by nobody
        "open_conflicts": sum(1 for c in instance.conflicts if c.get("resolution") is None and not c.get("cancelled")),
        "error": instance.error,
    }


def unreadable_summary(row: dict[str, Any], err: LayerflowError) -> dict[str, Any]:
    """The row of an instance whose record cannot be loaded: what the store's listing knows, and the damage
    as its ``error`` (``layerflow inspect ID`` names it too)."""
    return {
        "instance_id": row["id"], "id": row["id"], "process_id": row.get("process_id"), "status": row.get("status"),
        "version": row.get("version"), "started": None, "updated": _iso(row.get("updated")),
        "definition_version": None, "waiting_for": [], "tokens_total": None, "open_conflicts": 0,
        "error": {"kind": err.kind, "message": str(err), "task_id": None},
    }


class _SummaryCache:
    """Rows by (instance id, version): the list refreshes every few seconds, instances change rarely."""

    def __init__(self, size: int = 2048) -> None:
        self._rows: dict[tuple[str, int], dict[str, Any]] = {}
        self._lock = threading.Lock()
        self._size = size

    def get(self, service: GovernanceService, row: dict[str, Any]) -> dict[str, Any] | None:
        key = (str(row["id"]), int(row.get("version") or 0))
        with self._lock:
            hit = self._rows.get(key)
        if hit is not None:
            return hit
        try:
            summary = summary_of(service.load(key[0]))
        except ContextKeyError:
            return None  # deleted meanwhile
        except StoreUnavailable:
            raise
        except StoreError as err:
            # one damaged record (a lost tape: the instance a worker dead-lettered) is a row that names the
            # damage, not a list nobody can load; not kept: it reads again once the record is restored
            return unreadable_summary(row, err)
        with self._lock:
            if len(self._rows) >= self._size:
                self._rows.clear()
            self._rows[key] = summary
        return summary


def _writers(instance: Instance, ctx: LayeredContext, until: int | None, depth: int = 0
             ) -> dict[tuple[int, str], dict[str, Any]]:
    """(layer, key) -> the tape event that set the key's current value in that layer."""
    out: dict[tuple[int, str], dict[str, Any]] = {}
    for e in ctx.tape:
        if until is not None and e.seq > until:
            break
        if e.kind == EventKind.FORK and e.snapshot is not None and depth < 32:
            parent = instance.contexts.get(e.snapshot.context)
            if parent is not None:
                out.update(_writers(instance, parent, e.snapshot.seq, depth + 1))
        # a move at activity end is no write: a value another hand left in WORKING (an operator's
        # inject, a join's) keeps its writer in HISTORY, not the activity whose completion moved it
        moved = {key: out[(Layer.WORKING, key)] for key in moved_keys(e)
                 if (Layer.WORKING, key) in out and out[(Layer.WORKING, key)]["activity"] != e.activity}
        for layer, key, value in e.changes:
            if value is DELETED:
                out.pop((layer, key), None)
            else:
                out[(layer, key)] = moved[key] if layer == Layer.HISTORY and key in moved else {
                    "activity": e.activity, "actor": e.actor, "seq": e.seq, "kind": e.kind,
                    "context": ctx.name, "branch": e.branch}
    return out


def replay_document(instance: Instance, ctx: LayeredContext, until: int | None) -> dict[str, Any]:
    """The context ``ctx`` of ``instance`` rebuilt from its tape up to ``until``, per key."""
    last = ctx.tape[-1].seq if len(ctx.tape) else 0
    stop = last if until is None else min(until, last)
    rebuilt = LayeredContext.replay(ctx.tape, until=stop, name=ctx.name)
    writers = _writers(instance, ctx, stop)
    event = next((e for e in ctx.tape if e.seq == stop), None)
    layers: dict[str, Any] = {}
    for layer in Layer:
        view = rebuilt.layer(layer)
        keys = [{"key": k, "value": thaw(v), "tokens": rebuilt.key_tokens(layer, k),
                 "preserved": k in rebuilt.preserved, "written_by": writers.get((int(layer), k))}
                for k, v in view.items()]
        layers[str(layer)] = {"name": layer.name, "tokens": sum(k["tokens"] for k in keys), "keys": keys}
    # the tape's end under both names, REST's and `layerflow replay --json`'s (``tape_end``)
    return {"context": ctx.name, "branch_id": ctx.branch_id, "until": stop, "until_requested": until,
            "tape_last_seq": last, "tape_end": last,
            "event": event_document(ctx.name, event) if event is not None else None,
            "tokens": rebuilt.token_report(), "layers": layers}
