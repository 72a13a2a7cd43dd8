"""The ``DELETED`` marker: a key removed by a change, distinct from a written ``None``."""

from __future__ import annotations

from typing import Any

__all__ = ["DELETED", "Deleted"]


class Deleted:
    _instance: "Deleted | None" = None

    def __new__(cls) -> "Deleted":
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self) -> str:
        return "DELETED"

    def __reduce__(self) -> Any:
        return (Deleted, ())

    def to_json(self) -> dict[str, bool]:
        return {"$deleted": True}


DELETED = Deleted()
