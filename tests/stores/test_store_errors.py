"""What a user sees when the store is the problem: a bad URL, a Redis that does not answer,
a sqlite file that is damaged or read-only, another process that saved first. Always a
message that names the URL / file and says what to do; on the CLI one JSON document with
``--json``, exit 2 when the ``--store`` given cannot be used, exit 1 when the store fails
or another writer wins while a command runs; never a traceback, never a half-written save.
"""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from context_layers.stores import InvalidStoreURL, StoreError, StoreUnavailable, open_store
from context_layers.stores.sqlite import SQLiteStore, _mapped
from engine import Engine
from engine.cli import main
from engine.runtime import Engine as RuntimeEngine
from engine.worker import queue_client

from .conftest import REDIS_URL, redis_or_skip

ROOT = Path(__file__).resolve().parents[2]
REVIEW = ROOT / "bpmn_examples" / "parallel_user_task.bpmn"
ANSWER = 'review={"approved": true, "reviewer": "ann"}'


def invoke(*args: str) -> Result:
    result = CliRunner().invoke(main, list(args))
    assert result.exception is None or isinstance(result.exception, SystemExit), \
        f"a traceback instead of a message: {result.exception!r}\n{result.output}"
    return result


def json_error(result: Result) -> dict:
    doc = json.loads(result.stdout)  # exactly one JSON document
    assert doc["status"] == "error"
    return doc["error"]


# ----------------------------------------------------------------------------- bad URLs

@pytest.mark.parametrize("url, message", [
    ("redis://127.0.0.1:6379/abc", "the database 'abc' is not a number"),        # redis-py: silently db 0
    ("redis://127.0.0.1:6379/0/extra", "the database '0/extra' is not a number"),
    ("redis://127.0.0.1:6379/0?prefx=mine", "unknown option 'prefx'"),            # redis-py: TypeError later
    ("redis://127.0.0.1:6379/0?prefix=", "prefix '' is not usable"),             # was: the default prefix
    ("redis://127.0.0.1:notaport/0", "the port is not a number"),               # redis-py: bare ValueError
    ("redis:///0", "names no host"),
])
def test_bad_redis_urls_are_refused_before_any_connection(url, message):
    with pytest.raises(InvalidStoreURL, match=message) as err:
        open_store(url)
    assert url.split("?")[0] in str(err.value) and "redis://" in str(err.value)
    result = invoke("list", "--store", url, "--json")
    assert result.exit_code == 2
    error = json_error(result)
    assert error["kind"] == "invalid_config" and message in error["message"]


def test_a_bad_queue_url_is_refused_too():
    with pytest.raises(InvalidStoreURL, match="the database 'zero' is not a number"):
        queue_client(queue_url="redis://127.0.0.1:6379/zero")


def test_a_database_the_server_lacks_is_named():
    redis_or_skip()
    base = REDIS_URL.split("?")[0].rsplit("/", 1)[0]
    with pytest.raises(InvalidStoreURL, match="has no database 999"):
        open_store(f"{base}/999")


def test_an_unreachable_redis_says_what_to_do():
    result = invoke("list", "--store", "redis://127.0.0.1:1/0", "--json")
    assert result.exit_code == 2
    error = json_error(result)
    assert error["kind"] == "store_unavailable"
    assert "cannot reach the redis store redis://127.0.0.1:1/0" in error["message"]
    assert "Start redis-server there" in error["message"] and ".." not in error["message"]


# ----------------------------------------------------------------------------- sqlite files

@pytest.mark.parametrize("content, message", [
    pytest.param(b"hello, not a database at all", "is not a layerflow store or is damaged", id="text"),
    pytest.param(bytes(range(256)) * 40, "is not a layerflow store or is damaged", id="binary"),
])
def test_a_corrupted_sqlite_file_is_named(tmp_path, content, message):
    path = tmp_path / "store.db"
    path.write_bytes(content)
    with pytest.raises(StoreError, match=message) as err:
        open_store(f"sqlite:///{path}")
    assert str(path) in str(err.value) and "restore this one from a backup" in str(err.value)
    assert path.read_bytes() == content, "nothing was written"
    result = invoke("list", "--store", f"sqlite:///{path}", "--json")
    assert result.exit_code == 2 and message in json_error(result)["message"]


def test_a_sqlite_path_that_cannot_be_a_file(tmp_path):
    folder = tmp_path / "store.db"
    folder.mkdir()
    with pytest.raises(StoreError, match="the path must name a file"):
        open_store(f"sqlite:///{folder}")
    blocker = tmp_path / "plain-file"
    blocker.write_text("x")
    with pytest.raises(StoreError, match="its folder cannot be created") as err:  # was: a bare OSError
        open_store(f"sqlite:///{blocker / 'store.db'}")
    assert str(blocker / "store.db") in str(err.value)


def test_a_read_only_sqlite_store_says_so():
    with pytest.raises(StoreError, match="is read-only .*Make the file and its folder writable"):
        with _mapped("/data/store.db"):
            raise sqlite3.OperationalError("attempt to write a readonly database")


def test_a_store_failing_mid_command_ends_it_with_a_message(tmp_path, monkeypatch):
    """The file turned read-only after the instance was loaded: exit 1 and the JSON document,
    no traceback, and the stored instance is as it was."""
    url = f"sqlite:///{tmp_path / 'store.db'}"
    started = invoke("run", str(REVIEW), "--data", _title(tmp_path), "--store", url, "--json")
    assert started.exit_code == 3
    iid = json.loads(started.stdout)["instance_id"]
    before = open_store(url).load(iid)

    def read_only(self, *args, **kwargs):
        with _mapped(self.path):
            raise sqlite3.OperationalError("attempt to write a readonly database")

    monkeypatch.setattr(SQLiteStore, "save", read_only)
    result = invoke("resume", iid, "--answer", ANSWER, "--store", url, "--json")
    assert result.exit_code == 1
    error = json_error(result)
    assert error["kind"] == "store_error" and str(tmp_path / "store.db") in error["message"]
    monkeypatch.undo()
    assert open_store(url).load(iid) == before


# ----------------------------------------------------------------------------- two writers

@pytest.mark.parametrize("backend", ["sqlite", "redis"])
def test_resume_that_loses_to_another_writer_says_so(backend, tmp_path, monkeypatch, request):
    """`layerflow resume ID` in two shells: the second to save gets a version conflict,
    reported (exit 1, one JSON document naming the instance), and what the first saved stands."""
    if backend == "sqlite":
        url = f"sqlite:///{tmp_path / 'store.db'}"
    else:
        import uuid

        from .conftest import drop_prefix

        redis_or_skip()
        prefix = f"lftest-{uuid.uuid4().hex[:12]}"
        url = f"{REDIS_URL}{'&' if '?' in REDIS_URL else '?'}prefix={prefix}"
        request.addfinalizer(lambda: drop_prefix(REDIS_URL, prefix))
    started = invoke("run", str(REVIEW), "--data", _title(tmp_path), "--store", url, "--json")
    iid = json.loads(started.stdout)["instance_id"]
    original = RuntimeEngine.resume
    won = {}

    def the_other_shell_saves_first(self, instance, **kwargs):
        other = Engine(url)  # another process: its own handle on the store
        mine = other.load(instance.id)
        other.complete_user_task(mine, "review", {"approved": False, "reviewer": "bob"})
        won["version"] = mine.version
        return original(self, instance, **kwargs)

    monkeypatch.setattr(RuntimeEngine, "resume", the_other_shell_saves_first)
    result = invoke("resume", iid, "--answer", ANSWER, "--store", url, "--json")
    assert result.exit_code == 1
    error = json_error(result)
    assert error["kind"] == "version_conflict" and error["instance_id"] == iid
    assert "saved by another process" in error["message"] and f"layerflow inspect {iid}" in error["message"]
    monkeypatch.undo()
    final = Engine(url).load(iid)
    assert final.version == won["version"], "the loser wrote nothing"
    assert final.status == "completed" and final.main.resolve("reviewer") == "bob"
    tape = final.main.tape.to_list()
    assert [e["seq"] for e in tape] == list(range(1, len(tape) + 1))


def _title(tmp_path: Path) -> str:
    path = tmp_path / "title.json"
    path.write_text('{"title": "T"}')
    return str(path)


# ----------------------------------------------------------------------------- the queue

def test_submit_to_a_queue_that_does_not_answer_leaves_nothing(tmp_path):
    from engine.worker import submit

    url = f"sqlite:///{tmp_path / 'store.db'}"
    with pytest.raises(StoreUnavailable, match=r"the queue's Redis redis://127.0.0.1:1/0 did not answer"):
        submit(url, ROOT / "bpmn_examples" / "loan_approval.bpmn", {"amount": 1}, queue_url="redis://127.0.0.1:1/0")
    assert open_store(url).list_instances() == [], "no `running` instance that no worker will hear of"


def test_a_worker_whose_queue_does_not_answer_says_so(tmp_path):
    result = invoke("worker", "--store", f"sqlite:///{tmp_path / 'store.db'}", "--queue", "redis://127.0.0.1:1/0",
                    "--stop-after", "1", "--json")
    assert result.exit_code == 2  # bad input, as for a --store that does not answer and for submit
    error = json_error(result)
    assert error["kind"] == "store_unavailable" and "--queue" in error["message"]


# ----------------------------------------------------------------------------- leases on the CLI

def test_resume_is_refused_while_a_worker_runs_the_instance(tmp_path):
    """A worker (or another `resume`) holds the instance's lease: `resume` changes nothing and
    says who holds it, instead of running the same activities beside it."""
    url = f"sqlite:///{tmp_path / 'store.db'}"
    iid = json.loads(invoke("run", str(REVIEW), "--data", _title(tmp_path), "--store", url, "--json").stdout)[
        "instance_id"]
    store = open_store(url)
    before = store.load(iid)
    assert store.acquire_lease(iid, "worker-7", 30)
    result = invoke("resume", iid, "--answer", ANSWER, "--store", url, "--json")
    assert result.exit_code == 2
    error = json_error(result)
    assert error["kind"] == "invalid_state" and "worker-7" in error["message"] and error["instance_id"] == iid
    assert "lease runs out within the time it took it for (a worker's --idle-ms" in error["message"]
    assert store.load(iid) == before and store.lease_owner(iid) == "worker-7"
    store.release_lease(iid, "worker-7")
    assert invoke("resume", iid, "--answer", ANSWER, "--store", url, "--json").exit_code == 0


def test_resume_holds_the_lease_while_it_runs(tmp_path, monkeypatch):
    url = f"sqlite:///{tmp_path / 'store.db'}"
    iid = json.loads(invoke("run", str(REVIEW), "--data", _title(tmp_path), "--store", url, "--json").stdout)[
        "instance_id"]
    store = open_store(url)
    original = RuntimeEngine.resume
    owners = []

    def resume(self, instance, **kwargs):
        owners.append(store.lease_owner(instance.id))
        assert not store.acquire_lease(instance.id, "a-worker", 30), "a worker handed the instance leaves it alone"
        return original(self, instance, **kwargs)

    monkeypatch.setattr(RuntimeEngine, "resume", resume)
    assert invoke("resume", iid, "--answer", ANSWER, "--store", url, "--json").exit_code == 0
    assert len(owners) == 1 and owners[0].startswith("cli-")
    assert store.lease_owner(iid) is None, "released when the command ends"


def test_send_is_refused_while_a_worker_runs_the_instance(tmp_path):
    url = f"sqlite:///{tmp_path / 'store.db'}"
    claim = tmp_path / "claim.json"
    claim.write_text('{"claim_id": "CL-1"}')
    iid = json.loads(invoke("run", str(ROOT / "bpmn_examples" / "message_wait.bpmn"), "--data", str(claim),
                            "--store", url, "--json").stdout)["instance_id"]
    store = open_store(url)
    before = store.load(iid)
    assert store.acquire_lease(iid, "worker-7", 30)
    result = invoke("send", iid, "documents_received", "--json-payload", '{"files": []}', "--store", url, "--json")
    assert result.exit_code == 2 and "worker-7" in json_error(result)["message"]
    assert store.load(iid) == before
    store.release_lease(iid, "worker-7")
    result = invoke("send", iid, "documents_received", "--json-payload", '{"files": []}', "--store", url, "--json")
    assert result.exit_code in (0, 3) and store.lease_owner(iid) is None


@pytest.mark.parametrize("command", [["submit", str(ROOT / "bpmn_examples" / "loan_approval.bpmn")],
                                     ["worker", "--stop-after", "1"]])
def test_workers_refuse_a_store_of_their_own_process(command):
    """`submit --store memory://` used to report an instance id that no worker could ever find."""
    result = invoke(*command, "--store", "memory://", "--queue", "redis://127.0.0.1:1/0", "--json")
    assert result.exit_code == 2
    error = json_error(result)
    assert error["kind"] == "invalid_config" and "lives only in this process" in error["message"]
    assert "sqlite:///FILE" in error["message"]
