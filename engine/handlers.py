"""Activity handlers: registered Python functions, BPMN scripts, and the view they get.

A handler is ``fn(ctx: ActivityContext) -> dict | None``; a returned dict is written to
WORKING (auto-promotion decides the effective layer). Handlers are found, in order:

1. the config's ``handler``: a registered name (``@activity("name")``), or
   ``module:function`` / ``file.py:function`` (a file relative to the process folder);
2. a function registered under the task's BPMN id. The ``@activity`` names of a
   ``file.py`` that a process's config refers to belong to that process (``file_handlers``):
   loading the loan example's file must not make every other process's ``finance_review``
   task run the loan's handler;
3. the BPMN script of a script task;
4. nothing (plain tasks, manual tasks and user tasks just record their data).

A BPMN script runs with the resolved context keys as variables (thawed copies, loaded
only when the script reads them). The variables it assigns or changes, and only those,
become writes to WORKING; names starting with ``_`` stay local to the script. ``del x``
deletes ``x``. A ``ctx`` object (this module's ``ActivityContext``) is there too.

An instance of a multi-instance activity runs with a *scope*: names local to the
instance (its input item, its output item), read before the context and written to the
scope, never to the context, so the instances of one activity never see nor overwrite
each other's items. ``ActivityContext.scope`` holds them after the handler ran.
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import os
import sys
import types
from collections.abc import Callable, Iterator, Mapping
from contextvars import ContextVar
from pathlib import Path
from typing import Any

from context_layers import Layer, LayeredContext, json_equal, thaw
from context_layers.config import ActivityExtensionConfig
from context_layers.errors import ConfigError, ContextKeyError
from gateways.conditions import python_source

__all__ = [
    "ActivityContext",
    "BpmnError",
    "Handler",
    "HandlerRegistry",
    "REGISTRY",
    "activity",
    "ScriptNamespace",
    "run_script",
    "evaluate_expression",
    "load_handler_reference",
    "file_handlers",
]

class BpmnError(Exception):
    """Raised by an activity (a handler, a connector, a BPMN script, where it is ``BpmnError``):
    the activity throws the BPMN error ``code`` at its task instead of failing.

    An error boundary event on the task whose errorRef's errorCode is ``code`` (else one with
    no errorRef or no code: a catch-all) interrupts it and the process goes on along the
    boundary's path; else an error event sub-process of the enclosing scope, or an error
    boundary event of an enclosing sub-process, catches it, as BPMN says. Nothing catching
    it, the instance fails as for any other exception. What the activity wrote is dropped;
    ``payload`` (a JSON object) reaches the catching path (``engine.runtime``)."""

    def __init__(self, code: str, message: str | None = None, payload: Mapping[str, Any] | None = None) -> None:
        if not isinstance(code, str) or not code.strip():
            raise TypeError(f"BpmnError(code={code!r}): the code is the errorCode of the bpmn:error to throw, a "
                            "non-empty string")
        if message is not None and not isinstance(message, str):
            raise TypeError(f"BpmnError({code!r}, message={message!r}): the message is a string or None")
        if payload is not None and not isinstance(payload, Mapping):
            raise TypeError(f"BpmnError({code!r}, payload={payload!r}): the payload is a JSON object (a dict) "
                            "or None; wrap a single value, e.g. payload={'detail': value}")
        self.code = code.strip()
        self.message = message
        self.payload: dict[str, Any] = dict(payload or {})
        super().__init__(f"BPMN error {self.code!r}" + (f": {message}" if message else ""))


# the config of an activity that has none, validated once (the model is frozen): an ActivityContext
# is made for every activity, and validating an empty config costs more than running a small one
_NO_CONFIG = ActivityExtensionConfig()

Handler = Callable[["ActivityContext"], "Mapping[str, Any] | None"]


class HandlerRegistry:
    """Names -> handler functions. ``REGISTRY`` is the process-wide default."""

    def __init__(self, handlers: Mapping[str, Handler] | None = None) -> None:
        self._handlers: dict[str, Handler] = dict(handlers or {})

    def register(self, name: str, fn: Handler) -> Handler:
        self._handlers[name] = fn
        return fn

    def get(self, name: str) -> Handler | None:
        return self._handlers.get(name)

    def __contains__(self, name: object) -> bool:
        return name in self._handlers

    def names(self) -> list[str]:
        return sorted(self._handlers)

    def layered(self, overrides: Mapping[str, Handler] | None) -> "HandlerRegistry":
        """A registry that looks in ``overrides`` first, then in this one (read live)."""
        return _ChainedRegistry(dict(overrides or {}), self)


class _ChainedRegistry(HandlerRegistry):
    def __init__(self, own: dict[str, Handler], parent: HandlerRegistry) -> None:
        super().__init__(own)
        self._parent = parent

    def get(self, name: str) -> Handler | None:
        return self._handlers.get(name) or self._parent.get(name)

    def __contains__(self, name: object) -> bool:
        return name in self._handlers or name in self._parent

    def names(self) -> list[str]:
        return sorted({*self._handlers, *self._parent.names()})


REGISTRY = HandlerRegistry()


def activity(name: str, *, registry: HandlerRegistry | None = None) -> Callable[[Handler], Handler]:
    """Register a handler under a task id or a config ``handler`` name::

        @activity("risk_assessment")
        def assess(ctx: ActivityContext) -> dict:
            return {"risk_level": "low"}
    """
    def deco(fn: Handler) -> Handler:
        (registry or _LOADING.get() or REGISTRY).register(name, fn)
        return fn
    return deco


# the registry of the handler file being loaded (``_load_handler_reference``), if any
_LOADING: ContextVar["HandlerRegistry | None"] = ContextVar("layerflow_loading_handler_file", default=None)
_FILE_REGISTRIES: dict[str, "HandlerRegistry"] = {}


def file_handlers(ref: str, base_dir: Path | None) -> "HandlerRegistry | None":
    """The ``@activity`` names registered by the ``file.py`` of handler reference ``ref``
    (loading it if needed); None for a ``module:function`` reference, and for a file that is not
    there: it registers nothing, and only the step whose handler it is fails for it (naming it),
    not another step that looks for an ``@activity`` of its id (a person's answer to that one
    would be lost)."""
    module_ref = ref.rpartition(":")[0]
    if not module_ref.endswith(".py"):
        return None
    path = Path(module_ref)
    if not path.is_absolute() and base_dir is not None:
        path = base_dir / path
    if str(path.resolve()) not in _MODULES and not path.is_file():
        return None
    load_handler_reference(ref, base_dir)
    return _FILE_REGISTRIES.get(str(path.resolve()))


_MODULES: dict[str, types.ModuleType] = {}
# (reference, base_dir) -> handler: a handler file is loaded once per process run by the
# engine (as a module is imported once), so every new instance finds its handlers here
_REFERENCES: dict[tuple[str, str], Handler] = {}


def load_handler_reference(ref: str, base_dir: Path | None) -> Handler:
    """Resolve ``module:function`` or ``file.py:function`` (the file relative to ``base_dir``)."""
    key = (ref, str(base_dir) if base_dir is not None else os.getcwd())
    handler = _REFERENCES.get(key)
    if handler is None:
        handler = _REFERENCES[key] = _load_handler_reference(ref, base_dir)
    return handler


def _load_handler_reference(ref: str, base_dir: Path | None) -> Handler:
    module_ref, _, attr = ref.rpartition(":")
    if not module_ref or not attr:
        raise ConfigError(f"handler {ref!r} is neither a registered name nor 'module:function'")
    if module_ref.endswith(".py"):
        path = Path(module_ref)
        if not path.is_absolute() and base_dir is not None:
            path = base_dir / path
        key = str(path.resolve())
        path = Path(key)
        module = _MODULES.get(key)
        if module is None:
            if not path.is_file():
                raise ConfigError(f"handler {ref!r}: file {path} not found; paths are relative to the process folder: "
                                  "put the file back there, then `layerflow resume` the instance to retry the step")
            name = f"layerflow_handlers_{abs(hash(key)):x}_{path.stem}"
            spec = importlib.util.spec_from_file_location(name, path)
            assert spec is not None and spec.loader is not None
            module = importlib.util.module_from_spec(spec)
            sys.modules[name] = module
            own = _FILE_REGISTRIES.setdefault(key, HandlerRegistry())
            loading = _LOADING.set(own)  # its @activity names are its processes', not every process's
            try:
                spec.loader.exec_module(module)
            finally:
                _LOADING.reset(loading)
            _MODULES[key] = module
    else:
        try:
            module = importlib.import_module(module_ref)
        except ImportError as err:
            raise ConfigError(f"handler {ref!r}: cannot import module {module_ref!r}: {err}") from None
    fn = getattr(module, attr, None)
    if fn is None:
        registered = REGISTRY.get(attr)
        if registered is not None:
            return registered
        raise ConfigError(f"handler {ref!r}: {module_ref} has no function {attr!r}")
    if not callable(fn):
        raise ConfigError(f"handler {ref!r}: {attr!r} is not callable")
    return fn  # type: ignore[no-any-return]


class ActivityContext:
    """What a handler sees of the context during one activity.

    Reads resolve L0 -> L5 and return mutable copies; writes go through
    ``LayeredContext.write`` (auto-promotion, then the permission check) as the task.
    """

    __slots__ = ("context", "task_id", "task_name", "config", "instance_id", "data", "_actor", "documentation",
                 "scope", "scoped", "params")

    def __init__(self, context: LayeredContext, *, task_id: str, task_name: str | None = None,
                 config: ActivityExtensionConfig | None = None, instance_id: str | None = None,
                 data: Mapping[str, Any] | None = None, documentation: str | None = None,
                 scope: Mapping[str, Any] | None = None, scoped: "frozenset[str] | set[str] | None" = None) -> None:
        self.context = context
        self.task_id = task_id
        self.task_name = task_name or task_id
        self.config = config or _NO_CONFIG
        self.instance_id = instance_id
        self.data = dict(data or {})
        self.documentation = documentation
        self._actor = task_id
        #: names local to this run (a multi-instance item): read first, written here
        self.scope: dict[str, Any] = dict(scope or {})
        self.scoped: frozenset[str] = frozenset(scoped or ()) | frozenset(self.scope)
        #: a service task's spiffworkflow:serviceTaskOperator parameters, evaluated over the context
        self.params: dict[str, Any] = {}

    def get(self, key: str, default: Any = None) -> Any:
        if key in self.scoped:
            return self.scope.get(key, default)
        value = self.context.get(key, _MISSING)
        return default if value is _MISSING else thaw(value)

    def __getitem__(self, key: str) -> Any:
        if key in self.scoped:
            return self.scope[key]
        return thaw(self.context.resolve(key))

    def __contains__(self, key: object) -> bool:
        if isinstance(key, str) and key in self.scoped:
            return key in self.scope
        return key in self.context

    def write(self, layer: Layer | int | str, key: str, value: Any) -> Layer:
        """Write ``key`` through the layer rules (a scoped name: into the scope, reported as EPHEMERAL)."""
        if key in self.scoped:
            self.scope[key] = value
            return Layer.EPHEMERAL
        return self.context.write(layer, key, value, actor=self._actor)

    def delete(self, layer: Layer | int | str, key: str) -> Layer:
        return self.context.delete(layer, key, actor=self._actor)

    def layer(self, layer: Layer | int | str) -> dict[str, Any]:
        return {k: thaw(v) for k, v in self.context.layer(layer).items()}

    @property
    def knowledge(self) -> dict[str, Any]:
        """KNOWLEDGE (L2) items: ``{key: {"source", "confidence", "text", ...}}``."""
        return self.layer(Layer.KNOWLEDGE)

    def variables(self) -> dict[str, Any]:
        out = {k: thaw(v) for k, v in self.context.resolved().items() if k not in self.scoped}
        out.update(self.scope)
        return out

    def __repr__(self) -> str:
        return f"<ActivityContext {self.task_id} in {self.context.name!r}>"


_MISSING = object()


def write_result(actx: ActivityContext, result: Mapping[str, Any] | None) -> list[str]:
    """Write a handler's returned mapping to WORKING, skipping values the context already holds."""
    if result is None:
        return []
    if not isinstance(result, Mapping):
        raise TypeError(f"handler of {actx.task_id!r} returned {type(result).__name__}; return a dict of "
                        "keys to write to WORKING, or None")
    written = []
    ctx = actx.context
    for key, value in result.items():
        if key in actx.scoped:
            actx.scope[key] = value
            written.append(key)
            continue
        if holds_already(ctx, key, value):
            continue
        ctx.write(Layer.WORKING, key, value, actor=actx.task_id)
        written.append(key)
    return written


def holds_already(ctx: LayeredContext, key: str, value: Any) -> bool:
    """Whether writing ``value`` to ``key`` would be no write at all: the context holds that value
    already, and not in HISTORY. A key of HISTORY written again with its value (a loop's verdict that
    stays ``False`` round after round) is a write all the same: the activity record lists it, so the
    cliff after the activity keeps it for the step that reads it next, and the tape shows the decision."""
    current = ctx.get(key, _MISSING)
    return current is not _MISSING and json_equal(current, value) and ctx.locate(key) != Layer.HISTORY


class ScriptNamespace(dict):  # type: ignore[type-arg]
    """Globals of a script: context keys load on first read; assignments are tracked.

    A dict subclass works as ``exec`` globals: CPython looks names up through
    ``__getitem__`` (hence ``__missing__``) and stores through ``__setitem__`` when the
    globals are not an exact dict, also inside functions the script defines.
    """

    def __init__(self, context: LayeredContext, extra: Mapping[str, Any] | None = None,
                 scoped: "frozenset[str]" = frozenset()) -> None:
        super().__init__(extra or {})
        self._context = context
        self._scoped = scoped
        self._fixed = frozenset(dict.keys(self)) | {"__builtins__"} | scoped
        self.loaded: dict[str, Any] = {}
        self.assigned: dict[str, None] = {}
        self.deleted: dict[str, None] = {}

    def __missing__(self, key: str) -> Any:
        if key in self.deleted or key in self._scoped:
            raise KeyError(key)
        try:
            frozen = self._context.resolve(key)
        except ContextKeyError:
            raise KeyError(key) from None
        self.loaded[key] = frozen
        value = thaw(frozen)
        dict.__setitem__(self, key, value)
        return value

    def _unread(self, key: object) -> bool:
        """A context key the script has not read (yet): it is there, as in SpiffWorkflow's task data."""
        return (isinstance(key, str) and not dict.__contains__(self, key) and key not in self.deleted
                and key not in self._scoped and key in self._context)

    # ``'x' in globals()`` (or ``locals()``, ``vars()``) and ``dir()`` at a script's top level ask the
    # namespace itself: they see the context's keys, loaded or not, as a script under plain
    # SpiffWorkflow sees every key of its task data.
    def __contains__(self, key: object) -> bool:
        return dict.__contains__(self, key) or self._unread(key)

    def get(self, key: str, default: Any = None) -> Any:
        if dict.__contains__(self, key) or self._unread(key):
            return self[key]
        return default

    def keys(self) -> list[str]:  # type: ignore[override]
        return [*dict.keys(self), *(k for k in self._context.keys() if k.isidentifier() and self._unread(k))]

    def __iter__(self) -> Iterator[str]:
        return iter(self.keys())

    def __setitem__(self, key: str, value: Any) -> None:
        self.assigned[key] = None
        self.deleted.pop(key, None)
        dict.__setitem__(self, key, value)

    def __delitem__(self, key: str) -> None:
        if not dict.__contains__(self, key) and key not in self._context:
            raise KeyError(key)
        dict.pop(self, key, None)
        self.assigned.pop(key, None)
        self.deleted[key] = None

    def changes(self) -> tuple[dict[str, Any], list[str]]:
        """``(writes, deletes)``: what the script assigned or mutated, as context operations."""
        writes: dict[str, Any] = {}
        candidates = list(self.assigned) + [k for k in self.loaded if k not in self.assigned]
        for key in candidates:
            if key in self._fixed or key.startswith("_") or not dict.__contains__(self, key):
                continue
            value = dict.__getitem__(self, key)
            if isinstance(value, (types.ModuleType, type)) or callable(value):
                continue
            if key in self.assigned:
                if holds_already(self._context, key, value):
                    continue
            else:
                current = self._context.get(key, _MISSING)
                if current is not _MISSING and json_equal(current, value):
                    continue
            writes[key] = value
        deletes = [k for k in self.deleted if not k.startswith("_") and k not in self._scoped and k in self._context]
        return writes, deletes


# the names a BPMN script finds besides the context's keys and Python's builtins (validate knows them)
SCRIPT_GLOBALS = ("ctx", "BpmnError")


def run_script(script: str, actx: ActivityContext, *, filename: str = "<string>") -> list[str]:
    """Run a BPMN script against the context; return the keys it wrote or deleted.

    Errors propagate with the script's line in their traceback (``filename`` marks it).
    """
    ns = ScriptNamespace(actx.context, {"ctx": actx, "BpmnError": BpmnError, "__builtins__": __builtins__, **actx.scope},
                         actx.scoped)
    exec(_compiled(script, filename, "exec"), ns)
    for key in actx.scoped:
        if dict.__contains__(ns, key):
            actx.scope[key] = dict.__getitem__(ns, key)
        else:
            actx.scope.pop(key, None)
    writes, deletes = ns.changes()
    ctx = actx.context
    for key, value in writes.items():
        ctx.write(Layer.WORKING, key, value, actor=actx.task_id)
    for key in deletes:
        layer = ctx.locate(key)
        if layer is not None:
            ctx.delete(layer, key, actor=actx.task_id)
    return [*writes, *deletes]


def evaluate_expression(expression: str, context: LayeredContext, scope: Mapping[str, Any] | None = None) -> Any:
    """A BPMN condition (Python expression) over the resolved context; reads only what it names.
    ``scope`` (a multi-instance item, its collections) is read before the context."""
    ns = ScriptNamespace(context, {"__builtins__": __builtins__, **(scope or {})})
    return eval(_compiled(python_source(expression) or expression.strip(), "<condition>", "eval"), ns)


@functools.lru_cache(maxsize=1024)
def _compiled(source: str, filename: str, mode: str) -> types.CodeType:
    """A script or condition compiled once: a process runs the same ones on every instance
    and every loop pass (a code object is immutable; a SyntaxError is not kept)."""
    return compile(source, filename, mode)
