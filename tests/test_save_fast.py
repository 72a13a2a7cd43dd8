"""The cheaper save after every activity stores what the long way stored.

* A record may carry parts that are JSON text already (``JSONText``); every backend
  stores the record as if the parts were values, and loads back those values.
  A record that is not JSON still fails whole, naming the part, with nothing written.
* Records saved before the workflow went in as an object (record format 1, the
  workflow as a string; ``test_save_fast_v1_records.json`` was written by layerflow at
  commit b07947b) load on every backend, resume and complete.
* The engine's record, once stored and loaded, is the long way's: each context equals
  ``ctx.to_dict()``, the process ``Process.to_record()``, the workflow SpiffWorkflow's
  own serialization, at every save.
* ``InstanceRecords`` skips reading the tape heads only on the version its own last
  write left; a stale writer still gets ``VersionConflict`` and writes nothing.
"""

from __future__ import annotations

import gc
import json
import math
import uuid
import weakref
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from context_layers import LayeredContext
from context_layers.errors import LayerflowError, VersionConflict
from context_layers.stores import InstanceRecords, InvalidRecord, JSONText, Store, json_text, open_store
from context_layers.stores.base import dumps, encode_record
from engine import Engine, load_process, spiff
from engine.runtime import from_record
from engine.store import RECORD_FORMAT
from stores.conftest import REDIS_URL, drop_prefix, redis_or_skip

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "bpmn_examples"
V1_RECORDS = Path(__file__).with_name("test_save_fast_v1_records.json")

LOAN_CONFLICT = {"amount": 120000, "applicant_id": "APP001", "purpose": "business loan", "industry": "gambling"}
LOAN_FULL = {"amount": 120000, "applicant_id": "APP002", "purpose": "warehouse expansion", "industry": "logistics"}

# fixture instance -> (how to finish it, what the main context then holds)
RESUMES: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {
    "loan_conflict": ({"confirmations": {"review_join/approval_status": "approved"}},
                      {"approval_status": "approved"}),
    "parallel_user_task": ({"user_tasks": {"review": {"approved": True, "reviewer": "ann"}}},
                           {"approved": True, "reviewer": "ann"}),
}


@pytest.fixture(params=["memory", "sqlite", "redis"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    prefix = None
    if request.param == "memory":
        url = "memory://"
    elif request.param == "sqlite":
        url = f"sqlite:///{tmp_path / 'layerflow.db'}"
    else:
        redis_or_skip()
        prefix = f"lftest-{uuid.uuid4().hex[:12]}"
        url = f"{REDIS_URL}{'&' if '?' in REDIS_URL else '?'}prefix={prefix}"
    backend = open_store(url)
    try:
        yield backend
    finally:
        backend.close()
        if prefix is not None:
            drop_prefix(REDIS_URL, prefix)


def _plain(value: Any) -> Any:
    """The value a record stands for, its ``JSONText`` parts decoded."""
    if isinstance(value, JSONText):
        return json.loads(value.text)
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    return value


# ------------------------------------------------------------------------ JSON text parts

_scalars = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text()
_json = st.recursive(_scalars, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(), inner, max_size=3),
                     max_leaves=12)


@st.composite
def _records(draw: st.DrawFn, depth: int = 0) -> dict[str, Any]:
    """Dicts whose values are JSON, ``JSONText`` of JSON, or such dicts again."""
    out: dict[str, Any] = {}
    for key in draw(st.lists(st.text(max_size=4), max_size=5, unique=True)):
        kind = draw(st.sampled_from(["plain", "text", "dict"] if depth < 3 else ["plain", "text"]))
        if kind == "dict":
            out[key] = draw(_records(depth + 1))
        else:
            value = draw(_json)
            out[key] = JSONText(dumps(value)) if kind == "text" else value
    return out


@given(_records())
def test_text_parts_are_written_as_the_values_they_encode(record: dict[str, Any]) -> None:
    text = encode_record(record, "record")
    assert json.loads(text) == _plain(record)
    assert text == dumps(_plain(record)), "the same text, dict order included"


def test_a_record_with_text_parts_round_trips_on_every_backend(store: Store) -> None:
    snapshot = {"layers": {"L4": {"k": [1, 2.5, "ü"]}}}
    record = {"id": "i", "process_id": "p", "status": "running", "process": json_text({"id": "p"}, "process"),
              "workflow": JSONText('{"spec":{"name":"p"},"tasks":{}}'),
              "contexts": {"main": {"format": 1, "snapshots": JSONText(dumps(snapshot)), "tape_length": 0}},
              "engine": {"activities": 1}}
    store.create(record)
    loaded, version = store.load("i")
    assert (loaded, version) == (_plain(record), 1)
    assert list(loaded) == list(record), "the record keeps its key order"
    loaded["contexts"]["main"]["snapshots"]["layers"] = {}  # a fresh copy: the store is not changed through it
    assert store.load("i")[0] == _plain(record)
    assert store.save("i", {**record, "status": "waiting"}, 1) == 2
    assert store.load("i") == ({**_plain(record), "status": "waiting"}, 2)


@pytest.mark.parametrize(("part", "match"), [
    ({"engine": {"seen": {1, 2}}}, r"instance record 'i'.*not JSON-compatible"),
    ({"engine": {"score": math.nan}}, r"instance record 'i'.*not JSON-compatible"),
    ({"contexts": {"main": {"tape_length": {3}, "snapshots": JSONText("{}")}}},
     r"instance record 'i'\['contexts'\]\['main'\] is not JSON-compatible"),
    ({"contexts": [JSONText("{}")]}, r"JSONText is not JSON serializable"),
    ({"contexts": {3: JSONText("{}")}}, r"has the key 3 .*keys are str"),
], ids=["set", "nan", "set-in-a-head", "text-in-a-list", "int-key"])
def test_a_record_that_is_not_json_fails_whole(store: Store, part: dict[str, Any], match: str) -> None:
    good = {"id": "i", "process_id": "p", "status": "running", "workflow": JSONText("{}"), "engine": {}}
    store.create(good)
    with pytest.raises(InvalidRecord, match=match):
        store.save("i", {**good, **part}, 1)
    assert store.load("i") == (_plain(good), 1), "nothing was written"


# ----------------------------------------------------------------- records of format 1

def _v1(name: str) -> tuple[dict[str, Any], dict[str, list[dict[str, Any]]]]:
    """A stored head record and its tapes, as layerflow wrote them at commit b07947b."""
    def here(value: Any) -> Any:  # the fixture names the repository root {ROOT}
        if isinstance(value, str):
            return value.replace("{ROOT}", str(ROOT))
        if isinstance(value, dict):
            return {k: here(v) for k, v in value.items()}
        if isinstance(value, list):
            return [here(v) for v in value]
        return value

    saved = here(json.loads(V1_RECORDS.read_text(encoding="utf-8"))["instances"][name])
    return saved["record"], saved["tapes"]


@pytest.mark.parametrize("name", sorted(RESUMES))
def test_a_record_saved_in_format_1_loads_resumes_and_saves_in_the_new_format(store: Store, name: str) -> None:
    record, tapes = _v1(name)
    assert record["format"] == 1 and isinstance(record["workflow"], str)
    store.create(record, tape_appends=tapes)
    engine = Engine(InstanceRecords(store))
    instance = engine.load(record["id"])
    assert instance.status == "waiting"
    assert {n: c.to_dict()["tape"] for n, c in instance.contexts.items()} == tapes
    answers, expected = RESUMES[name]
    done = engine.resume(instance, answers=answers)
    assert done.status == "completed", done.error
    assert {k: done.main.resolved()[k] for k in expected} == expected

    stored, version = store.load(record["id"])
    assert (stored["format"], version) == (RECORD_FORMAT, done.version)
    assert isinstance(stored["workflow"], dict), "the workflow is stored as the object it is"
    again = Engine(InstanceRecords(store)).load(record["id"])
    assert again.status == "completed"
    assert {n: c.to_dict() for n, c in again.contexts.items()} == {n: c.to_dict() for n, c in done.contexts.items()}
    assert json.loads(spiff.serialize_json(again.workflow)) == json.loads(spiff.serialize_json(done.workflow))


def test_a_record_of_a_newer_format_is_refused_with_what_to_do() -> None:
    engine = Engine()
    record = _v1("parallel_user_task")[0]
    with pytest.raises(LayerflowError, match=r"has format 3; this layerflow reads formats 1, 2\. Upgrade layerflow"):
        from_record(engine, {**record, "format": 3, "version": 1})


# -------------------------------------------------------------- the engine's records

class _CheckingRecords(InstanceRecords):
    """At every save, compares the record (as stored and loaded) with the long way's."""

    checked = 0

    def __init__(self, store: Store, engine: Engine) -> None:
        super().__init__(store)
        self.engine = engine

    def save(self, record: Any, expected_version: int) -> int:
        instance = self.engine.current
        loaded = json.loads(encode_record(record, "record"))
        assert loaded["process"] == instance.process.to_record()
        assert loaded["workflow"] == json.loads(spiff.SERIALIZER.serialize_json(instance.workflow))
        assert loaded["contexts"] == {n: c.to_dict() for n, c in instance.contexts.items()}
        assert {n: LayeredContext.from_dict(c) for n, c in loaded["contexts"].items()} == instance.contexts
        type(self).checked += 1
        return super().save(record, expected_version)


class _Engine(Engine):
    current: Any = None

    def save(self, instance: Any, **kw: Any) -> None:
        self.current = instance
        super().save(instance, **kw)

    _save = save


def test_every_saved_record_is_the_long_ways_record() -> None:
    engine = _Engine()
    engine.store = _CheckingRecords(open_store("memory://"), engine)
    before = _CheckingRecords.checked
    instance = engine.run(engine.start(load_process(EXAMPLES / "loan_approval.bpmn"), LOAN_FULL))
    assert instance.status == "completed", instance.error
    assert _CheckingRecords.checked - before >= instance.activities
    assert len(instance.contexts) > 1, "branch contexts, with the snapshot they were forked from, were saved"


@pytest.mark.parametrize(("example", "data"), [
    ("subprocess_parallel.bpmn", {"amount": 120000}), ("call_activity.bpmn", {"amount": 5000}),
    ("error_boundary.bpmn", {"years_in_business": 3}), ("multi_instance_parallel.bpmn", {}),
    ("xor_loop.bpmn", {"batch_size": 4})])
def test_every_saved_record_of_sub_processes_loops_and_instances_is_the_long_ways_record(example: str,
                                                                                         data: dict[str, Any]) -> None:
    """Sub-workflows and the instances of a multi-instance activity are kept as text between
    saves too: every save writes what SpiffWorkflow's serializer writes."""
    engine = _Engine()
    engine.store = _CheckingRecords(open_store("memory://"), engine)
    before = _CheckingRecords.checked
    instance = engine.run(engine.start(load_process(EXAMPLES / example), data))
    assert instance.status == "completed", instance.error
    assert _CheckingRecords.checked - before >= instance.activities > 0


@pytest.mark.parametrize("internal", [{5: "x"}, {"k": 1.5, "flag": False}, {"k": [1, {"a": None}]}, {"k": "ü\n"}],
                         ids=["int-key", "scalars", "not-scalar", "escaped"])
def test_the_workflow_text_is_spiffworkflows_whatever_a_task_holds(internal: dict[Any, Any]) -> None:
    """Plain tasks are written without the registry; anything else takes the long way."""
    instance = Engine().start(load_process(EXAMPLES / "parallel_scripts.bpmn"))
    wf = instance.workflow
    spiff.serialize_json(wf)  # the tasks' texts are kept
    next(t for t in wf.tasks.values() if t.parent is not None).internal_data.update(internal)
    assert json.loads(spiff.serialize_json(wf)) == json.loads(spiff.SERIALIZER.serialize_json(wf))


def _waiting_instances(folder: Path) -> Any:
    """A workflow whose multi-instance activity waits on its instances (data on both sides)."""
    task = """<bpmn:userTask id="each"><bpmn:multiInstanceLoopCharacteristics isSequential="false">
      <bpmn:loopDataInputRef>items</bpmn:loopDataInputRef><bpmn:loopDataOutputRef>out</bpmn:loopDataOutputRef>
      <bpmn:inputDataItem id="item" name="item"/><bpmn:outputDataItem id="res" name="res"/>
      </bpmn:multiInstanceLoopCharacteristics></bpmn:userTask>"""
    (folder / "mi.bpmn").write_text(
        '<?xml version="1.0" encoding="UTF-8"?>\n<bpmn:definitions xmlns:bpmn="http://www.omg.org/spec/BPMN/20100524/MODEL" '
        'id="d" targetNamespace="t"><bpmn:process id="mi" isExecutable="true"><bpmn:startEvent id="start"/>'
        f'{task}<bpmn:endEvent id="end"/><bpmn:sequenceFlow id="f1" sourceRef="start" targetRef="each"/>'
        '<bpmn:sequenceFlow id="f2" sourceRef="each" targetRef="end"/></bpmn:process></bpmn:definitions>', encoding="utf-8")
    engine = Engine()
    instance = engine.run(engine.start(load_process(folder / "mi.bpmn"), {"items": [1, "two", 3.5, None]}))
    assert instance.status == "waiting"
    return instance.workflow


@pytest.mark.parametrize("change", [
    "none", "item value", "item not scalar", "key shared with the activity", "same value as the activity",
    "activity gains a key", "activity value changes", "activity loses its data", "instance gains a key"])
def test_the_text_of_an_instance_with_items_is_spiffworkflows_before_and_after_a_change(change: str,
                                                                                         tmp_path: Path) -> None:
    """Instances of a multi-instance activity are kept as text between saves, by their scalar
    items and the activity's keys: every change that alters SpiffWorkflow's text alters it."""
    wf = _waiting_instances(tmp_path)
    assert json.loads(spiff.serialize_json(wf)) == json.loads(spiff.SERIALIZER.serialize_json(wf))  # and kept
    parent = next(t for t in wf.tasks.values() if t.task_spec.name == "each")
    child = next(t for t in wf.tasks.values() if t.task_spec.name == "each [child]")
    assert parent.data and child.data
    if change == "item value":
        child.data["item"] = "changed"
    elif change == "item not scalar":
        child.data["item"] = [1, {"a": 2}]
    elif change == "key shared with the activity":
        parent.data["flag"], child.data["flag"] = 1, 2
    elif change == "same value as the activity":
        parent.data["flag"], child.data["flag"] = 1, 1
    elif change == "activity gains a key":
        parent.data["extra"] = 1
    elif change == "activity value changes":
        parent.data["out"] = [9]
    elif change == "activity loses its data":
        parent.data = {}
    elif change == "instance gains a key":
        child.data["note"] = "n"
    assert json.loads(spiff.serialize_json(wf)) == json.loads(spiff.SERIALIZER.serialize_json(wf))


def test_what_is_kept_between_saves_goes_with_the_instance() -> None:
    engine = Engine()

    def finished() -> weakref.ref[Any]:
        instance = engine.run(engine.start(load_process(EXAMPLES / "loan_approval.bpmn"), LOAN_FULL))
        assert instance.status == "completed"
        return weakref.ref(instance.workflow)

    workflow = finished()
    gc.collect()
    assert workflow() is None, "a finished run's workflow is not kept alive by a cache"


def test_a_workflow_that_is_not_json_fails_the_save_naming_it() -> None:
    engine = Engine()
    instance = engine.start(load_process(EXAMPLES / "parallel_scripts.bpmn"))
    before = engine.store.load(instance.id)
    instance.workflow.task_tree.data["ratio"] = math.inf
    with pytest.raises(InvalidRecord, match=rf"the workflow of instance '{instance.id}' cannot be saved"):
        engine.save(instance)
    assert engine.store.load(instance.id) == before, "nothing was written"


# ------------------------------------------------------------------------ tape heads

class _CountingStore:
    """A store that counts how often the tape heads are read."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.url = store.url
        self.head_reads = 0

    def tape_heads(self, instance_id: str) -> dict[str, int]:
        self.head_reads += 1
        return self.store.tape_heads(instance_id)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.store, name)


def _record(events: int, status: str = "running") -> dict[str, Any]:
    tape = [{"seq": i, "kind": "note", "time": float(i), "actor": "t"} for i in range(1, events + 1)]
    return {"id": "i", "process_id": "p", "status": status, "contexts": {"main": {"format": 1, "tape": tape}}}


def test_the_heads_of_its_own_last_write_are_used_and_a_stale_writer_still_conflicts(store: Store) -> None:
    counting = _CountingStore(store)
    records = InstanceRecords(counting)  # type: ignore[arg-type]
    assert records.create(_record(2)) == 1
    assert records.save(_record(3), 1) == 2
    assert records.save(_record(5), 2) == 3
    assert counting.head_reads == 0, "the heads its own writes left"

    other = InstanceRecords(store)  # another process
    assert other.load("i")["version"] == 3
    assert other.save(_record(6, "waiting"), 3) == 4
    with pytest.raises(VersionConflict, match="expected version 3, stored version 4"):
        records.save(_record(7), 3)
    assert store.load("i")[0]["status"] == "waiting" and store.tape_heads("i") == {"main": 6}, "nothing was written"

    assert records.load("i")["version"] == 4
    assert records.save(_record(8), 4) == 5
    assert counting.head_reads == 1, "read once: its heads were of version 3"
    assert [e["seq"] for e in records.load("i")["contexts"]["main"]["tape"]] == list(range(1, 9))


def test_the_heads_of_few_instances_are_kept() -> None:
    records = InstanceRecords(open_store("memory://"))
    for i in range(InstanceRecords.HEADS_KEPT + 10):
        records.create({**_record(1), "id": f"i{i}"})
    assert len(records._heads) == InstanceRecords.HEADS_KEPT
    assert "i0" not in records._heads and f"i{InstanceRecords.HEADS_KEPT + 9}" in records._heads
