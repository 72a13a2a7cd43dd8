"""Gaps closed in round 20.

(a) Start data the process refuses (not a JSON object, a SYSTEM key, an engine record's key, a value its
    start form refuses) is refused before the store or the queue is opened: ``run`` / ``demo loan`` with
    ``--store sqlite:///X`` make no file, with ``--store redis://...`` write no key, and ``submit`` puts
    nothing on the queue; with a bad ``--store`` too, the data's error is the one reported
    (``engine.runtime.check_start``, shared by the three and by ``Engine.start``).
(b) A store's ``get_snapshot`` asked for an engine snapshot (``snap:CONTEXT:SEQ``: a split's base, ``layerflow
    snapshot``), which lives on the tape and not among the stored snapshots, says so and gives the exact
    ``layerflow replay ID --until SEQ`` that rebuilds it; the command given does.
(c) Pinned: every REST path that answers a join's confirmation answers 400 ``invalid_answer`` for an answer
    that is not among the conflict's allowed values (a typo, or a ``humanConfirm`` option of another JSON type
    than the conflict's values), as the README says, naming the join, the key and the option, nothing applied.
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from engine.cli import main

from engine_helpers import LOAN, redis_scratch

REDIS = "redis://127.0.0.1:6379/10"
ORDER_INTAKE = Path(__file__).resolve().parent / "fixtures" / "start_forms" / "order_intake.bpmn"

# (process, --data, what the error names): each refused by the checks a start makes
BAD_STARTS = {
    "not_an_object": (LOAN, "[1, 2]", "must hold an object"),
    "system_key": (LOAN, '{"policy": "anything goes"}', "'policy'"),
    "record_key": (LOAN, '{"activity:forged": 1}', "'activity:forged'"),
    "start_form": (ORDER_INTAKE, '{"customer": "Acme", "quantity": 0}', "quantity"),
}


def _cli(*args: str) -> Any:
    return CliRunner().invoke(main, list(args), catch_exceptions=False)


def _refused(result: Any, named: str) -> dict[str, Any]:
    assert result.exit_code == 2, (result.stdout, result.stderr)
    error: dict[str, Any] = json.loads(result.stdout)["error"]
    assert named in error["message"], error
    assert "store" not in error["kind"], error      # the data's error, not the store's
    return error


def _command(command: str, process: Path, data: str) -> list[str]:
    """``run PROCESS``, ``demo loan`` (the loan process only) or ``submit PROCESS`` with ``--data``."""
    if command == "demo":
        assert process == LOAN
        return ["demo", "loan", "--data", data]
    return [command, str(process), "--data", data]


def _cases() -> list[Any]:
    return [pytest.param(command, *BAD_STARTS[name], id=f"{command}-{name}")
            for command in ("run", "demo", "submit") for name in BAD_STARTS
            if command != "demo" or BAD_STARTS[name][0] == LOAN]


@pytest.fixture
def redis_prefix() -> Iterator[str]:
    with redis_scratch(REDIS, "gaps20") as prefix:
        yield prefix


def _keys(prefix: str) -> list[bytes]:
    import redis

    client = redis.Redis.from_url(REDIS)
    try:
        return sorted(client.scan_iter(match=f"{prefix}*", count=1000))
    finally:
        client.close()


@pytest.mark.parametrize(("command", "process", "data", "named"), _cases())
def test_refused_start_data_makes_no_sqlite_file_and_queues_nothing(tmp_path: Path, redis_prefix: str, command: str,
                                                                    process: Path, data: str, named: str) -> None:
    db = tmp_path / "never.db"
    queue = ["--queue", REDIS, "--stream", f"{redis_prefix}-ready"] if command == "submit" else []
    _refused(_cli(*_command(command, process, data), "--store", f"sqlite:///{db}", *queue, "--json"), named)
    assert not db.exists() and list(tmp_path.iterdir()) == []
    assert _keys(redis_prefix) == []                 # submit made no stream, queued no id


@pytest.mark.parametrize(("command", "process", "data", "named"), _cases())
def test_refused_start_data_writes_no_redis_key(redis_prefix: str, command: str, process: Path, data: str,
                                               named: str) -> None:
    store = f"{REDIS}?prefix={redis_prefix}"
    extra = ["--stream", f"{redis_prefix}-ready"] if command == "submit" else []
    _refused(_cli(*_command(command, process, data), "--store", store, *extra, "--json"), named)
    assert _keys(redis_prefix) == []


@pytest.mark.parametrize(("command", "process", "data", "named"), _cases())
@pytest.mark.parametrize("store", ["bogus://nowhere", "sqlite:///{tmp}/no/such/folder/x.db"])
def test_with_a_bad_store_too_the_data_error_is_reported(tmp_path: Path, command: str, process: Path, data: str,
                                                         named: str, store: str) -> None:
    _refused(_cli(*_command(command, process, data), "--store", store.format(tmp=tmp_path), "--json"), named)


def test_good_data_still_starts_on_each_path(tmp_path: Path, redis_prefix: str) -> None:
    """The check refuses only what the start refuses: the same commands with good data create the instance."""
    db = tmp_path / "runs.db"
    good = '{"customer": "Acme", "quantity": 2}'
    ran = _cli("run", str(ORDER_INTAKE), "--data", good, "--store", f"sqlite:///{db}", "--json")
    assert ran.exit_code == 3 and json.loads(ran.stdout)["status"] == "waiting", ran.stdout
    demo = _cli("demo", "loan", "--scenario", "fast", "--store", f"sqlite:///{db}", "--json")
    assert demo.exit_code == 0, demo.stdout
    submitted = _cli("submit", str(ORDER_INTAKE), "--data", good, "--store", f"{REDIS}?prefix={redis_prefix}",
                     "--stream", f"{redis_prefix}-ready", "--json")
    assert submitted.exit_code == 0, (submitted.stdout, submitted.stderr)
    assert len(json.loads(submitted.stdout)["instance_ids"]) == 1
    assert f"{redis_prefix}-ready".encode() in _keys(redis_prefix)


def test_python_submit_checks_the_data_before_it_opens_the_store_or_the_queue(tmp_path: Path,
                                                                               redis_prefix: str) -> None:
    from context_layers.errors import ContextWriteDenied
    from engine import load_process
    from engine.runtime import check_start
    from engine.worker import submit

    db = tmp_path / "never.db"
    with pytest.raises(ContextWriteDenied, match="'policy'"):
        submit(f"sqlite:///{db}", LOAN, {"policy": "anything goes"}, queue_url=REDIS, stream=f"{redis_prefix}-ready")
    assert not db.exists() and _keys(redis_prefix) == []
    process = load_process(LOAN)
    with pytest.raises(ContextWriteDenied, match="'activity:forged'"):
        check_start(process, {"activity:forged": 1})
    check_start(process, {"amount": 1})            # good data: no error, nothing to open
    with pytest.raises(TypeError, match="loaded already"):
        submit(f"sqlite:///{db}", process, {}, process_id="loan_approval")
    assert not db.exists()


# ----- (b) an engine snapshot id given to the store's get_snapshot ----------------------------------------------

@pytest.mark.parametrize("backend", ["sqlite", "redis"])
def test_get_snapshot_of_an_engine_snapshot_gives_the_replay_that_rebuilds_it(tmp_path: Path, redis_prefix: str,
                                                                               backend: str) -> None:
    from context_layers import Layer
    from context_layers.errors import ContextKeyError
    from engine import Engine

    store = f"sqlite:///{tmp_path / 'runs.db'}" if backend == "sqlite" else f"{REDIS}?prefix={redis_prefix}"
    started = _cli("demo", "loan", "--store", store, "--json")       # waits at the join's confirmation
    assert started.exit_code == 3, started.stdout
    iid = json.loads(started.stdout)["instance_id"]
    engine = Engine(store)
    instance = engine.load(iid)
    branch = next(name for name in instance.contexts if name != "main")
    for name in ("main", branch):
        ctx = instance.contexts[name]
        snapshot_id, snap = list(ctx.snapshots.items())[-1]
        seq = int(snapshot_id.rpartition(":")[2])
        with pytest.raises(ContextKeyError) as caught:
            engine.store.get_snapshot(iid, snapshot_id)
        message = str(caught.value)
        assert caught.value.kind == "not_found" and "lives on the tape" in message and repr(name) in message, message
        command = message.split("`")[1]
        context = [] if name == "main" else ["--context", name]
        assert shlex.split(command) == ["layerflow", "replay", iid, "--until", str(seq), *context], message
        rebuilt = _cli(*shlex.split(command)[1:], "--store", store, "--json")
        assert rebuilt.exit_code == 0, rebuilt.stdout
        assert json.loads(rebuilt.stdout)["layers"] == {
            str(layer): json.loads(json.dumps(dict(snap.layer(layer)))) for layer in Layer}


def test_get_snapshot_of_an_id_no_engine_gives_keeps_its_message() -> None:
    from context_layers.errors import ContextKeyError
    from context_layers.stores import open_store

    store = open_store("memory://")
    store.create({"id": "i1", "process_id": "p", "status": "running"})
    store.put_snapshot("i1", "mine", {"seq": 0, "layers": {}})
    for asked in ("nope", "snap:main", "snap:main:x"):
        with pytest.raises(ContextKeyError, match=r"is not stored for instance 'i1' \(stored: mine\); "
                                                  r"list_snapshots\(\) shows them all$"):
            store.get_snapshot("i1", asked)


# ----- (c) REST: an answer outside the confirmation's allowed values is 400 invalid_answer ---------------------

# each REST way to answer the score conflict (3 against 7; the join's humanConfirm offers numbers 5 and 5.5 for it,
# and the strings needs_review / on_hold, labelled "hold", only for the verdict conflict)
ANSWER_ROUTES = {
    "confirmation": lambda iid, value: ("/api/confirmations/merge/score", {"value": value}),
    "confirmation_of_instance": lambda iid, value: ("/api/confirmations/merge/score",
                                                    {"instance_id": iid, "answer": value, "user": "ann"}),
    "resolve_by_id": lambda iid, value: ("/api/context-governance/resolve", {
        "instance_id": iid, "confirmation_id": "merge/score", "resolution": value, "reason": "r"}),
    "resolve_by_key": lambda iid, value: ("/api/context-governance/resolve", {
        "instance_id": iid, "conflict_key": "score", "resolution": value, "reason": "r"}),
    "resume": lambda iid, value: (f"/api/instances/{iid}/resume",
                                  {"answers": {"confirmations": {"merge/score": value}}}),
}
# (answer, what the refusal names): a typo, an unfit option by its value and by its label
REFUSED_ANSWERS = [("nonsense", ["'nonsense'", "3, 7, 5, 5.5"]),
                   ("needs_review", ["'merge'", "'score'", 'option "needs_review"', "a string", "number"]),
                   ("hold", ["'merge'", "'score'", 'option "on_hold"', "a string", "number"])]


def test_the_readme_promises_400_invalid_answer_for_an_option_a_conflict_was_not_offered() -> None:
    readme = " ".join((Path(__file__).resolve().parents[2] / "README.md").read_text(encoding="utf-8").split())
    promise = readme.index("an answer that picks one a conflict was not offered is bad input")
    assert "REST 400 `invalid_answer`" in readme[promise:promise + 200]


@pytest.mark.parametrize("route", sorted(ANSWER_ROUTES))
@pytest.mark.parametrize(("answer", "named"), REFUSED_ANSWERS, ids=[a for a, _ in REFUSED_ANSWERS])
def test_rest_refuses_an_answer_outside_the_allowed_values_with_400_invalid_answer(tmp_path: Path, route: str,
                                                                                   answer: str,
                                                                                   named: list[str]) -> None:
    from test_known_gaps_15 import AUTH as GAPS15_AUTH
    from test_known_gaps_15 import OPTIONS, VOTE, _client

    client = _client(tmp_path, VOTE, "vote", OPTIONS)
    started = client.post("/api/instances", json={"process_id": "vote"}, headers=GAPS15_AUTH).json()
    iid = started["instance_id"]
    assert started["status"] == "waiting"
    path, body = ANSWER_ROUTES[route](iid, answer)
    refused = client.post(path, json=body, headers=GAPS15_AUTH)
    assert refused.status_code == 400, refused.text
    error = refused.json()["error"]
    assert error["kind"] == "invalid_answer", error
    for word in named:
        assert word in error["message"], (word, error)
    after = client.get(f"/api/instances/{iid}", headers=GAPS15_AUTH).json()
    assert (after["status"], after["version"], after["tape_length"]) == ("waiting", started["version"],
                                                                          started["tape_length"])
    assert {c["id"] for c in client.get("/api/confirmations", headers=GAPS15_AUTH).json()} == {"merge/verdict",
                                                                                              "merge/score"}
    # an allowed value on the same route is taken
    path, body = ANSWER_ROUTES[route](iid, 5.5)
    assert client.post(path, json=body, headers=GAPS15_AUTH).status_code == 200
    assert {c["id"] for c in client.get("/api/confirmations", headers=GAPS15_AUTH).json()} == {"merge/verdict"}
