"""The web console: a page served by ``layerflow serve`` at ``/`` (work in progress)."""

from __future__ import annotations

from fastapi import FastAPI

__all__ = ["mount_console"]


def mount_console(app: FastAPI) -> None:
    """Add the console's page and its documented read endpoints to ``app``."""
