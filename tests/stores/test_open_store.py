"""Choosing a backend by URL, stored format versions, and backend errors mapped to ours."""

from __future__ import annotations

import inspect
import json
import sqlite3
import uuid

import pytest

from context_layers.stores import (
    InvalidStoreURL,
    MemoryStore,
    StoreError,
    StoreFormatError,
    StoreUnavailable,
    open_store,
)
from context_layers.stores.sqlite import SQLiteStore, _mapped

from .conftest import REDIS_URL, drop_prefix, redis_or_skip


@pytest.mark.parametrize("url, message", [
    ("ftp://host/x", "unknown scheme 'ftp'"),
    ("postgres://db/x", "memory://, sqlite:///PATH, redis://HOST:PORT/DB"),
    ("runs.db", "no scheme"),
    ("sqlite://relative.db", "three slashes"),
    ("sqlite:///:memory:", "memory://"),
    ("sqlite:///", "names no file"),
    ("sqlite:///x.db?journal=off", "unknown option"),
    ("sqlite:///x.db?busy_timeout=abc", r"'sqlite:///x.db\?busy_timeout=abc': busy_timeout='abc' .*busy_timeout=30"),
    ("sqlite:///x.db?busy_timeout=-5", "busy_timeout='-5' is not a number of seconds"),
    ("sqlite:///x.db?busy_timeout=nan", "busy_timeout='nan'"),
    ("sqlite:///x.db?synchronous=bogus", r"'sqlite:///x.db\?synchronous=bogus': synchronous='bogus' .*off, normal"),
    ("sqlite:///x%FF.db", "no UTF-8 text"),
])
def test_bad_urls_say_what_to_write(url, message, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # a relative sqlite path that were accepted would land here
    with pytest.raises(InvalidStoreURL, match=message) as err:
        open_store(url)
    assert isinstance(err.value, ValueError) and err.value.kind == "invalid_config"
    assert list(tmp_path.iterdir()) == [], "a refused URL creates nothing"


def test_a_bad_sqlite_option_is_bad_input_for_the_cli(tmp_path):
    """Exit 2 with the URL and what to write, not a traceback."""
    from click.testing import CliRunner

    from engine.cli import main

    result = CliRunner().invoke(main, ["list", "--store", f"sqlite:///{tmp_path}/x.db?busy_timeout=soon"])
    assert result.exit_code == 2, result.output
    assert "busy_timeout='soon'" in result.output and "busy_timeout=30" in result.output


def test_sqlite_relative_and_absolute_paths(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    rel = open_store("sqlite:///data/deep/rel.db")
    assert isinstance(rel, SQLiteStore) and (tmp_path / "data" / "deep" / "rel.db").exists()
    absolute = open_store(f"sqlite:///{tmp_path}/abs/dir/x.db?synchronous=normal")
    assert (tmp_path / "abs" / "dir" / "x.db").exists()
    mode = absolute._conn().execute("PRAGMA journal_mode").fetchone()[0]  # type: ignore[attr-defined]
    assert mode == "wal"
    rel.close()
    absolute.close()


@pytest.mark.parametrize(("written", "name"), [
    ("path%20with%20space.db", "path with space.db"),
    ("caf%C3%A9%2350.db", "caf\u00e9#50.db"),
    ("100%25.db", "100%.db"),
])
def test_a_sqlite_url_is_percent_decoded(tmp_path, monkeypatch, written, name):
    """A URL spells a space as %20 (and '#', '?' and '%' must be escaped): the store is the file
    the URL names, not one with the escapes in its name."""
    monkeypatch.chdir(tmp_path)
    store = open_store(f"sqlite:///{tmp_path}/a%20folder/{written}?synchronous=normal")
    assert isinstance(store, SQLiteStore) and store.path == str(tmp_path / "a folder" / name)
    store.close()
    assert (tmp_path / "a folder" / name).exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a folder"]
    relative = open_store(f"sqlite:///{written}")
    relative.close()
    assert (tmp_path / name).exists()


def test_memory_urls():
    assert open_store("memory://") is not open_store("memory://")
    name = f"memory://shared-{uuid.uuid4().hex}"
    assert open_store(name) is open_store(name)
    assert isinstance(open_store(name), MemoryStore)


def test_redis_prefix_isolates_namespaces():
    redis_or_skip()
    a, b = (f"lftest-{uuid.uuid4().hex[:12]}" for _ in range(2))
    sep = "&" if "?" in REDIS_URL else "?"
    try:
        sa, sb = open_store(f"{REDIS_URL}{sep}prefix={a}"), open_store(f"{REDIS_URL}{sep}prefix={b}")
        sa.create({"id": "same", "process_id": "p", "status": "running"})
        assert sb.list_instances() == []
        sb.create({"id": "same", "process_id": "q", "status": "running"})
        assert sa.load("same")[0]["process_id"] == "p"
        sa.close()
        sb.close()
    finally:
        drop_prefix(REDIS_URL, a)
        drop_prefix(REDIS_URL, b)


def test_unreachable_redis_is_store_unavailable():
    with pytest.raises(StoreUnavailable, match="redis-server"):
        open_store("redis://127.0.0.1:1/0")


def test_newer_sqlite_formats_are_refused(tmp_path):
    path = tmp_path / "s.db"
    store = open_store(f"sqlite:///{path}")
    store.create({"id": "i", "process_id": "p", "status": "running"})
    store.close()
    with sqlite3.connect(path) as c:
        c.execute("UPDATE instances SET format = 99")
    store = open_store(f"sqlite:///{path}")
    with pytest.raises(StoreFormatError, match="format 99.*reads format 2"):
        store.load("i")
    store.close()
    with sqlite3.connect(path) as c:
        c.execute("UPDATE meta SET value = '99' WHERE key = 'format'")
    with pytest.raises(StoreFormatError):
        open_store(f"sqlite:///{path}")


def test_newer_snapshot_formats_are_refused():
    store = MemoryStore()
    store.create({"id": "i", "process_id": "p", "status": "running"})
    store.put_snapshot("i", "s", {"a": 1})
    store._instances["i"].snapshots["s"] = json.dumps({"format": 2, "root": {}})
    with pytest.raises(StoreFormatError):
        store.get_snapshot("i", "s")


def _subclasses(cls: type) -> list[type]:
    out = [cls]
    for sub in cls.__subclasses__():
        out += _subclasses(sub)
    return out


def test_every_redis_exception_is_mapped():
    import redis

    from context_layers.stores.redis import map_redis_error

    classes = {c for c in _subclasses(redis.exceptions.RedisError) if c.__module__.startswith("redis")}
    assert len(classes) > 10
    for cls in classes:
        try:
            exc = cls("boom")
        except (TypeError, ValueError):  # cluster redirects parse their message
            exc = cls.__new__(cls)
        mapped = map_redis_error(exc, "redis://x")
        assert isinstance(mapped, StoreError), cls
        if issubclass(cls, (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError)):
            assert isinstance(mapped, StoreUnavailable), cls


@pytest.mark.parametrize("cls", [c for c in _subclasses(sqlite3.Error) if inspect.isclass(c)])
def test_every_sqlite_exception_is_mapped(cls):
    with pytest.raises(StoreError):
        with _mapped("x.db"):
            raise cls("database is locked" if cls is sqlite3.OperationalError else "boom")
    if cls is sqlite3.OperationalError:
        with pytest.raises(StoreUnavailable):
            with _mapped("x.db"):
                raise cls("database is locked")


def test_bench_quick_runs(tmp_path):
    import os
    import re
    import subprocess
    import sys
    from pathlib import Path

    # the memory backend through every table; sqlite's and redis's tables are checked by
    # tests/test_benches.py (one quick run per backend is enough to keep the bench working)
    bench = Path(__file__).resolve().parents[2] / "bench" / "bench_store.py"
    out = subprocess.run([sys.executable, str(bench), "--quick", "--backends", "memory"],
                         env={**os.environ, "TMPDIR": str(tmp_path)}, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("store backends, 200 operations each\n"), out.stdout
    assert re.search(r"^\| memory \| [0-9.]+ \| [0-9.]+ \| [0-9,]+ \| [0-9,]+ \|$", out.stdout, re.M), out.stdout
    assert "| memory | first call |" in out.stdout and "| memory | 300 |" in out.stdout
    redis_or_skip()  # without Redis the bench skips its worker runs
    assert "| memory | 2 | threads |" in out.stdout


def test_public_names():
    import context_layers.stores as stores
    from context_layers.stores import Store

    for name in stores.__all__:
        assert hasattr(stores, name), name
    assert isinstance(MemoryStore(), Store), "the reference backend follows the protocol"


READ_ONLY = [["inspect", "some-id"], ["tape", "some-id"], ["replay", "some-id", "--until", "1"],
             ["snapshot", "some-id", "--list"], ["resume", "some-id"], ["cancel", "some-id", "--reason", "x"],
             ["rollback", "some-id", "--snapshot", "snap:main:1"], ["send", "some-id", "msg"]]


@pytest.mark.parametrize("args", READ_ONLY, ids=lambda a: a[0] + ("-list" if "--list" in a else ""))
@pytest.mark.parametrize("as_json", [False, True])
def test_a_command_on_stored_instances_creates_no_store(tmp_path, monkeypatch, args, as_json):
    """A store file that is not there is a wrong --store (or $LAYERFLOW_STORE): exit 2 naming the
    file and how to point at the right store; nothing is written (no file, no folder)."""
    from click.testing import CliRunner

    from engine.cli import main

    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("LAYERFLOW_STORE", raising=False)
    missing = tmp_path / "nonexistent" / "or" / "new.db"
    result = CliRunner().invoke(main, [*args, "--store", f"sqlite:///{missing}", *(["--json"] if as_json else [])])
    assert result.exit_code == 2, result.output
    message = json.loads(result.stdout)["error"]["message"] if as_json else result.stderr
    assert str(missing) in message and "--store" in message and "LAYERFLOW_STORE" in message
    if "some-id" in args:
        assert "instance 'some-id'" in message
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("args,empty", [(["list"], []), (["timers"], {"due": [], "fired": []}),
                                        (["timers", "--fire"], {"due": [], "fired": []})])
def test_a_listing_of_a_store_not_made_yet_is_empty_and_makes_none(tmp_path, monkeypatch, args, empty):
    """`list` and `timers` (from cron, before anything ran) on a fresh install: nothing to list,
    exit 0, a note naming the file on stderr; the default store is not created by asking."""
    from click.testing import CliRunner

    from engine.cli import main

    monkeypatch.delenv("LAYERFLOW_STORE", raising=False)
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))
    default = str(tmp_path / "data" / "layerflow" / "layerflow.db")
    plain = CliRunner().invoke(main, args)
    assert plain.exit_code == 0 and plain.stdout == "" and default in plain.stderr
    as_json = CliRunner().invoke(main, [*args, "--json"])
    assert as_json.exit_code == 0 and json.loads(as_json.stdout) == empty
    assert not (tmp_path / "data").exists()
    missing = tmp_path / "nonexistent" / "new.db"
    named = CliRunner().invoke(main, [*args, "--store", f"sqlite:///{missing}", "--json"])
    assert named.exit_code == 0 and json.loads(named.stdout) == empty and str(missing) in named.stderr
    assert not (tmp_path / "nonexistent").exists()


def test_a_store_that_is_there_is_read_and_a_relative_one_is_named_in_full(tmp_path, monkeypatch):
    from click.testing import CliRunner

    from engine.cli import main

    monkeypatch.chdir(tmp_path)
    open_store("sqlite:///runs.db").close()
    listed = CliRunner().invoke(main, ["list", "--store", "sqlite:///runs.db", "--json"])
    assert listed.exit_code == 0 and json.loads(listed.stdout) == []
    missing = CliRunner().invoke(main, ["inspect", "some-id", "--store", "sqlite:///other%20runs.db"])
    assert missing.exit_code == 2 and str(tmp_path / "other runs.db") in missing.stderr
    assert sorted(p.name for p in tmp_path.iterdir() if not p.name.startswith("runs.db")) == []
    with pytest.raises(StoreError, match="nothing was created"):
        open_store("sqlite:///other.db", create=False)
    assert not (tmp_path / "other.db").exists()
