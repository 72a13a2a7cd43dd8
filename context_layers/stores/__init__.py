"""Where instances, tapes, snapshots, confirmations and leases are kept.

``open_store(url)`` picks the backend::

    memory://                 this process only, a new empty store (tests)
    memory://NAME             the same store for every open of NAME in this process
    sqlite:///relative.db     one file, no server (the default; parent dirs are created)
    sqlite:////abs/path.db    ... with an absolute path (percent-decoded: %20 is a space)
    redis://host:6379/0       many workers on many machines; ?prefix=NAME namespaces the keys
    rediss://...              the same over TLS

Every backend follows the ``Store`` protocol (``base.py``); one contract suite
(``tests/stores``) runs against all of them. All of them store long tape values in
content-addressed parts (``tape_parts.py``) and read them back whole;
``open_store(url, tape_part_bytes=None)`` stores them whole (the form before parts). The redis backend is imported only when
a ``redis://`` URL is opened.
"""

from __future__ import annotations

import math
import os
import threading
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, unquote, urlencode, urlsplit, urlunsplit

from .base import (
    BLOB_MIN_BYTES,
    STORE_FORMAT,
    BlobStats,
    Confirmation,
    ConfirmationAnswered,
    ConfirmationNotFound,
    InstanceExists,
    InstanceNotFound,
    InstanceSummary,
    InvalidAnswer,
    InvalidRecord,
    InvalidStoreURL,
    JSONText,
    Store,
    StoreError,
    StoreFormatError,
    StoreNotFound,
    StoreUnavailable,
    TapeSequenceError,
    VersionConflict,
    json_text,
)
from .instances import InstanceRecords, load_instance, save_instance
from .memory import MemoryStore

__all__ = [
    "BLOB_MIN_BYTES",
    "STORE_FORMAT",
    "SCHEMES",
    "BlobStats",
    "Confirmation",
    "ConfirmationAnswered",
    "ConfirmationNotFound",
    "InstanceExists",
    "InstanceNotFound",
    "InstanceRecords",
    "InstanceSummary",
    "InvalidAnswer",
    "InvalidRecord",
    "InvalidStoreURL",
    "JSONText",
    "MemoryStore",
    "Store",
    "StoreError",
    "StoreFormatError",
    "StoreNotFound",
    "StoreUnavailable",
    "TapeSequenceError",
    "VersionConflict",
    "default_store_url",
    "json_text",
    "load_instance",
    "open_store",
    "save_instance",
]

SCHEMES = ("memory://", "sqlite:///PATH", "redis://HOST:PORT/DB", "rediss://HOST:PORT/DB")

_named_memory: dict[str, MemoryStore] = {}
_named_lock = threading.Lock()


def default_store_url() -> str:
    """``sqlite:///`` + ``$XDG_DATA_HOME/layerflow/layerflow.db`` (``~/.local/share`` when unset)."""
    base = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return "sqlite:///" + str(Path(base) / "layerflow" / "layerflow.db")


def open_store(url: str, *, create: bool = True, **options: Any) -> Store:
    """The store ``url`` names (see the module doc); ``options`` go to the backend.

    ``create=False``: a sqlite file that is not there raises ``StoreNotFound`` and nothing is
    written (what reads stored instances must not leave an empty store behind a wrong path)."""
    if not isinstance(url, str) or "://" not in url:
        raise InvalidStoreURL(f"store URL {url!r} has no scheme; use one of {', '.join(SCHEMES)}")
    scheme = url.split("://", 1)[0].lower()
    if scheme == "memory":
        name = url.split("://", 1)[1].strip("/")
        if not name:
            return MemoryStore(url, **options)
        with _named_lock:
            store = _named_memory.get(name)
            if store is None:
                store = _named_memory[name] = MemoryStore(url, **options)
            return store
    if scheme == "sqlite":
        from .sqlite import SQLiteStore

        path, params = _sqlite_path(url)
        if "busy_timeout" in params:
            text = params.pop("busy_timeout")
            try:
                seconds = float(text)
            except ValueError:
                seconds = math.nan
            if not math.isfinite(seconds) or seconds < 0:
                raise InvalidStoreURL(f"store URL {url!r}: busy_timeout={text!r} is not a number of seconds; "
                                      "write busy_timeout=30 (how long a write waits for another writer)")
            options.setdefault("busy_timeout", seconds)
        if "synchronous" in params:
            mode = params.pop("synchronous")
            if mode.upper() not in ("OFF", "NORMAL", "FULL", "EXTRA"):
                raise InvalidStoreURL(f"store URL {url!r}: synchronous={mode!r} is not a mode; use off, normal, "
                                      "full or extra")
            options.setdefault("synchronous", mode)
        if params:
            raise InvalidStoreURL(f"store URL {url!r}: unknown option(s) {', '.join(params)}; "
                                  "sqlite takes synchronous= and busy_timeout=")
        if not create and not path.is_file():
            raise StoreNotFound(f"there is no layerflow store at {path.absolute()} (store URL {url!r}), so no instance "
                                "either; nothing was created. Point --store (or $LAYERFLOW_STORE) at the store the "
                                "instances were run with: sqlite:///relative.db or sqlite:////absolute/path.db, "
                                "redis://HOST:PORT/DB; `layerflow run` creates a store")
        return SQLiteStore(path, url=url, **options)
    if scheme in ("redis", "rediss", "unix"):
        from .redis import RedisStore

        parts = urlsplit(url)
        query = dict(parse_qsl(parts.query, keep_blank_values=True))  # ?prefix= is an error, not the default
        prefix = query.pop("prefix", None)
        if prefix is not None:
            options.setdefault("prefix", prefix)
        if prefix is not None:  # rebuilt only then: urlunsplit would turn redis:///0 into redis:/0
            url = urlunsplit(parts._replace(query=urlencode(query)))
        return RedisStore(url, **options)
    raise InvalidStoreURL(f"store URL {url!r} has the unknown scheme {scheme!r}; use one of {', '.join(SCHEMES)}")


def _sqlite_path(url: str) -> tuple[Path, dict[str, str]]:
    rest = url.split("://", 1)[1]
    rest, _, query = rest.partition("?")
    if not rest.startswith("/"):
        raise InvalidStoreURL(f"store URL {url!r}: write sqlite:///relative.db or sqlite:////absolute/path.db "
                              "(three slashes, then the path)")
    # a URL escapes what it cannot hold as it is: a space is %20, '#', '?' and '%' must be escaped
    try:
        path = unquote(rest[1:], errors="strict")
    except UnicodeDecodeError:
        raise InvalidStoreURL(f"store URL {url!r}: its path has a %-escape that is no UTF-8 text; escape the "
                              "file name's bytes as UTF-8 (a space is %20), or write the name as it is") from None
    if not path or path == ":memory:":
        raise InvalidStoreURL(f"store URL {url!r} names no file; for a store that lives in memory use memory://")
    return Path(path).expanduser(), dict(parse_qsl(query))
