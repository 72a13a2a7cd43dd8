"""One error tree for layerflow, each error with a stable ``kind``.

::

    LayerflowError (kind)
    ├── ContextWriteDenied          kind="permission_denied"   a layer rule refused a write/delete
    ├── ContextValueError (TypeError) kind="invalid_value"     a value is not JSON-compatible
    ├── ContextKeyError (KeyError)  kind="not_found"           a key, snapshot or anchor is absent
    ├── ConfigError (ValueError)    kind="invalid_config"      ActivityExtensionConfig / config file
    ├── ProcessError                kind="invalid_process"     a BPMN file that does not validate
    ├── ActivityError               kind="activity_failed"     a handler, script or model call failed
    ├── MergeConflictError          kind="merge_conflict"      a join could not resolve conflicts
    ├── VersionConflict             kind="version_conflict"    a stale instance version was saved
    ├── StoreError                  kind="store_error"         the store tree: see context_layers/stores/base.py
    │                                                          (store_unavailable, already_exists, tape_sequence, ...)
    ├── ModelError                  kind="model_error"         the model could not be reached / answered badly
    │   └── engine.llm.ModelCallFailed                          ... with model, api_base, attempts, task id
    └── (engine) governance and API errors:
        ├── engine.governance.BadRequest          kind="bad_request"    a request that cannot be carried out
        ├── engine.governance.InvalidAnswer       kind="invalid_answer" an answer that is not an offered option
        ├── engine.governance.InstanceStateError  kind="invalid_state"  e.g. a change to a context with open branches
        └── engine.api.Unauthorized               kind="unauthorized"   no or wrong bearer token

The REST API maps ``kind`` to a status code in one place; the CLI maps it to an exit
code. Messages name the file, task id, key or layer and say what to do.
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "LayerflowError",
    "ContextWriteDenied",
    "ContextValueError",
    "ContextKeyError",
    "ConfigError",
    "ProcessError",
    "ActivityError",
    "MergeConflictError",
    "VersionConflict",
    "ModelError",
]


def _rebuilt(cls: type["LayerflowError"], args: tuple[Any, ...], state: dict[str, Any]) -> "LayerflowError":
    err = cls.__new__(cls)
    Exception.__init__(err, *args)
    err.__dict__.update(state)
    return err


class LayerflowError(Exception):
    kind = "error"

    def __reduce__(self) -> tuple[Any, ...]:
        """Pickle and copy as built (message and every attribute): the subclasses take other
        arguments than their message, which ``Exception``'s own reduce would pass them."""
        return (_rebuilt, (type(self), self.args, dict(self.__dict__)))

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "message": str(self)}


class ContextWriteDenied(LayerflowError):
    kind = "permission_denied"

    def __init__(self, key: str, requested: Any, effective: Any, reason: str, *, op: str = "write") -> None:
        self.key = key
        self.requested = requested
        self.effective = effective
        self.reason = reason
        self.op = op  # "write" or "delete"
        self.context: str | None = None  # the context the write was meant for, when a caller knows it
        self.task_id: str | None = None  # the element the write was for (a payload's catch event), when known
        where = f"{effective}" if effective == requested else f"{effective} (requested {requested}, auto-promoted)"
        what = f"delete of key {key!r} from" if op == "delete" else f"write of key {key!r} to"
        super().__init__(f"{what} {where} denied: {reason}")

    @property
    def target(self) -> Any:
        """The layer the write asked for (DESIGN.md: "the key, the target and the effective layer")."""
        return self.requested

    # the names ``to_dict`` and the message use
    @property
    def target_layer(self) -> Any:
        return self.requested

    @property
    def requested_layer(self) -> Any:
        return self.requested

    @property
    def effective_layer(self) -> Any:
        """The layer whose rule refused the write (the one already holding the key, after auto-promotion)."""
        return self.effective

    @property
    def layer(self) -> Any:
        return self.effective

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "message": str(self),
            "key": self.key,
            "requested_layer": str(self.requested),
            "effective_layer": str(self.effective),
            "reason": self.reason,
            **({"task_id": self.task_id} if self.task_id else {}),
        }


class ContextValueError(LayerflowError, TypeError):
    kind = "invalid_value"

    def __init__(self, key: str, detail: str, *, of_key: bool = False, layer: Any = None,
                 where: str | None = None) -> None:
        self.key = key
        self.layer = layer  # the layer the write asked for, when it was a write to one
        # where the value was met: "written to L4 WORKING", or a caller's own words ("in branch 'risk'")
        place = where or (f"written to {layer} {layer.name}" if layer is not None else "")
        place = f" {place}" if place else ""
        if of_key:  # the key itself is what cannot be kept
            super().__init__(f"key {key!r}{place} cannot name a context entry: it {detail}")
        else:
            super().__init__(f"value for key {key!r}{place} is not JSON-compatible: {detail}; "
                             "write a JSON value: null, true or false, a finite number, a string, a list or an object "
                             "with string keys")


class ContextKeyError(LayerflowError, KeyError):
    kind = "not_found"
    key: str | None = None  # the context key read, when a read of one found it in no layer

    def __str__(self) -> str:  # KeyError quotes its message; keep it readable
        return str(self.args[0]) if self.args else ""


class ConfigError(LayerflowError, ValueError):
    kind = "invalid_config"

    def __init__(self, message: str, *, problems: list[dict[str, Any]] | None = None) -> None:
        self.problems = problems or []
        super().__init__(message)

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "message": str(self), "problems": self.problems}


class ProcessError(LayerflowError):
    kind = "invalid_process"

    def __init__(self, message: str, *, problems: list[Any] | None = None) -> None:
        self.problems = problems or []
        super().__init__(message)


class ActivityError(LayerflowError):
    kind = "activity_failed"

    def __init__(self, message: str, *, task_id: str | None = None, line: int | None = None) -> None:
        self.task_id = task_id
        self.line = line
        super().__init__(message)

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "message": str(self), "task_id": self.task_id}


class MergeConflictError(LayerflowError):
    kind = "merge_conflict"

    def __init__(self, message: str, *, conflicts: list[Any] | None = None, gateway_id: str | None = None) -> None:
        self.conflicts = conflicts or []
        self.gateway_id = gateway_id
        super().__init__(message)


class VersionConflict(LayerflowError):
    kind = "version_conflict"


class ModelError(LayerflowError):
    kind = "model_error"
