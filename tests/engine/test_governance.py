"""GovernanceService on stored instances: every operation, its checks and its tape events."""

from __future__ import annotations

import threading
import time
from datetime import datetime, timedelta, timezone

import pytest
from pydantic import ValidationError

from context_layers import ActivityExtensionConfig, canonical_json
from context_layers.errors import ConfigError, ContextKeyError, ContextWriteDenied, VersionConflict
from context_layers.stores import ConfirmationAnswered
from engine.governance import (
    AnswerArgs,
    BadRequest,
    BranchArgs,
    BranchEvaluateArgs,
    Catalog,
    CompressArgs,
    ConfigArgs,
    GovernanceService,
    HumanConfirmArgs,
    InjectArgs,
    InspectArgs,
    InspectFilter,
    InstanceStateError,
    InvalidAnswer,
    ResolveArgs,
    RollbackArgs,
    SnapshotArgs,
    StartArgs,
    runtime_config,
)
from engine.runtime import Engine
from governance_helpers import LOAN_CONFLICT, NOTES, make_catalog


@pytest.fixture
def service(tmp_path):
    return GovernanceService(Engine("memory://"), make_catalog(tmp_path))


@pytest.fixture
def notes(service):
    """An instance waiting at a user task, with a filled HISTORY and no open branch."""
    return service.start(StartArgs(process_id="notes_review", data=NOTES))["instance_id"]


@pytest.fixture
def loan(service):
    """The seed's walk-through: waiting for a person at the review join's conflict."""
    return service.start(StartArgs(process_id="loan_approval", data=LOAN_CONFLICT))["instance_id"]


def notes_on_tape(service, instance_id, note):
    return [e for e in service.load(instance_id).main.tape if e.data.get("note") == note]


# ----------------------------------------------------------------------------- catalog, start

def test_catalog_lists_and_loads_by_process_id(tmp_path):
    catalog = Catalog(make_catalog(tmp_path))
    assert set(catalog.entries()) == {"loan_approval", "notes_review"}
    assert catalog.load("notes_review") is catalog.load("notes_review")  # cached until the file changes
    with pytest.raises(ContextKeyError, match="registered: loan_approval, notes_review"):
        catalog.load("../bpmn_examples/xor_loop")


def test_start_runs_until_the_instance_waits(service, notes):
    doc = service.document(notes)
    assert doc["status"] == "waiting" and doc["process_id"] == "notes_review"
    assert doc["waiting_for"][0]["task_id"] == "approve"
    assert doc["version"] >= 1 and {"risk_level", "notes", "reasoning", "research"} <= set(doc["layers"]["L3"])


# ----------------------------------------------------------------------------- inspect

def test_inspect_reports_every_metric_per_layer(service, notes):
    report = service.inspect(notes, InspectArgs(layers=["L3", "WORKING"]))
    assert set(report["layers"]) == {"L3", "L4"}
    history = report["layers"]["L3"]
    ctx = service.load(notes).main
    assert history["token_count"] == ctx.tokens("L3")
    assert history["key_count"] == len(ctx.layer("L3")) == len(history["keys"])
    assert set(history["attention_score"]) == {"density", "redundancy", "decay", "conflict", "toolEfficiency"}
    assert history["size_bytes"] == len(canonical_json(dict(ctx.as_dict()["L3"])).encode())
    tokens = [k["tokens"] for k in history["top_keys"]]
    assert tokens == sorted(tokens, reverse=True) and len(tokens) == 5
    assert history["last_modified"].endswith("Z")
    assert report["layers"]["L4"]["key_count"] == 0 and report["layers"]["L4"]["last_modified"] is None
    assert report["attention"] and report["tokens"]["total"] == ctx.tokens()


@pytest.mark.parametrize("prefix, keys", [
    ("risk_*", ["risk_level"]),
    ("r", ["risk_level", "reasoning", "research"]),
    ("activity:*", ["activity:collect", "activity:analyse", "activity:research"]),
    ("nothing*", []),
])
def test_inspect_key_prefix_is_a_glob_or_a_prefix(service, notes, prefix, keys):
    report = service.inspect(notes, InspectArgs(layers=["L3"], filter=InspectFilter(key_prefix=prefix)))
    assert report["layers"]["L3"]["keys"] == keys


def test_inspect_modified_after_and_metric_selection(service, notes):
    later = datetime.now(timezone.utc) + timedelta(minutes=1)
    report = service.inspect(notes, InspectArgs(filter=InspectFilter(modified_after=later),
                                                metrics=["key_count", "token_count"]))
    # the keys counted come with key_count, as in the seed's answer
    assert all(v == {"key_count": 0, "keys": [], "token_count": 0} for v in report["layers"].values())
    time.sleep(0.01)
    cutoff = datetime.now(timezone.utc)
    service.inject(notes, InjectArgs(values={"fresh": 1}))
    report = service.inspect(notes, InspectArgs(filter=InspectFilter(modified_after=cutoff), metrics=["keys"]))
    assert {k: v["keys"] for k, v in report["layers"].items() if v["keys"]} == {"L4": ["fresh"]}


def test_inspect_of_a_branch_context_and_unknown_ones(service, loan):
    report = service.inspect(loan, InspectArgs(context="risk_review", layers=["L3"]))
    assert report["context"].startswith("main/risk_review")
    with pytest.raises(ContextKeyError, match="no context or branch 'nope'"):
        service.inspect(loan, InspectArgs(context="nope"))
    with pytest.raises(ContextKeyError, match="not in the store"):
        service.inspect("missing", InspectArgs())
    with pytest.raises(ValidationError):
        InspectArgs(layers=["L9"])


# ----------------------------------------------------------------------------- inject

def test_inject_writes_through_the_layer_rules(service, notes):
    version = service.document(notes)["version"]
    done = service.inject(notes, InjectArgs(values={"hint": "check income", "score": 3}, reason="operator hint"),
                          expected_version=version, actor="ann")
    assert done["written"] == {"hint": "L4", "score": "L4"} and done["version"] == version + 1
    ctx = service.load(notes).main
    assert ctx.layer("L4")["hint"] == "check income"
    writes = [e for e in ctx.tape if e.kind == "write" and e.actor == "ann"]
    assert [e.changes[0][1] for e in writes] == ["hint", "score"]
    assert notes_on_tape(service, notes, "governance")[-1].data["reason"] == "operator hint"


@pytest.mark.parametrize("layer, key, denied", [
    ("L4", "policy", "policy"),  # a SYSTEM key, auto-promoted
    ("L0", "new_key", "new_key"),  # SYSTEM itself: the first key (in key order) is denied already
    ("L4", "applicant", "applicant"),  # PROCESS is append-only
])
def test_inject_denied_by_a_layer_rule_changes_nothing_and_is_recorded(service, notes, layer, key, denied):
    before = service.load(notes)
    with pytest.raises(ContextWriteDenied):
        service.inject(notes, InjectArgs(values={"ok_key": 1, key: "x"}, layer=layer), actor="mallory")
    after = service.load(notes)
    assert after.main.as_dict() == before.main.as_dict()  # all or nothing: ok_key is not written either
    denied_key = denied
    (denied,) = [e for e in after.main.tape if e.data.get("note") == "governance_denied"]
    assert denied.actor == "mallory" and denied.data["key"] == denied_key


def test_inject_into_a_context_with_open_branches_is_refused(service, loan):
    with pytest.raises(InstanceStateError, match="open branches"):
        service.inject(loan, InjectArgs(values={"x": 1}))
    done = service.inject(loan, InjectArgs(values={"x": 1}, context="finance_review"))
    assert done["context"].startswith("main/finance_review")


def test_a_stale_version_is_refused(service, notes):
    version = service.document(notes)["version"]
    service.inject(notes, InjectArgs(values={"a": 1}), expected_version=version)
    with pytest.raises(VersionConflict, match=f"expected version {version}"):
        service.inject(notes, InjectArgs(values={"b": 2}), expected_version=version)
    assert "b" not in service.load(notes).main.layer("L4")


def test_inject_into_a_completed_instance_is_refused(service):
    done = service.start(StartArgs(process_id="loan_approval",
                                   data={**LOAN_CONFLICT, "industry": "bakery", "amount": 20000}))
    assert done["status"] == "completed"
    with pytest.raises(InstanceStateError):
        service.inject(done["instance_id"], InjectArgs(values={"x": 1}))


# ----------------------------------------------------------------------------- compress

def test_compress_evaluate_decompress(service, notes):
    before = service.load(notes).main
    done = service.compress(notes, CompressArgs(action="compress", preserve_keys=["risk_level", "assessment_id"],
                                                max_tokens=300), actor="ops")
    assert done["changed"] and done["tokens_after"] < done["tokens_before"] and done["snapshot_id"]
    inst = service.load(notes)
    assert inst.compressions[-1]["snapshot_id"] == done["snapshot_id"]
    assert {"risk_level", "assessment_id"} <= inst.main.preserved
    assert inst.main.layer("L3")["risk_level"] == "high"
    report = service.compress(notes, CompressArgs(action="evaluate"))  # defaults to the last compression
    assert report["snapshot_id"] == done["snapshot_id"] and report["preserved_intact"]
    assert report["tokens_before"] > report["tokens_after"] and report["version"] == done["version"]
    undone = service.compress(notes, CompressArgs(action="decompress", snapshot_id=done["snapshot_id"]))
    assert undone["tokens_after"] == before.tokens("L3") + before.tokens("L4")
    assert service.load(notes).main.layer("L3")["notes"] == before.layer("L3")["notes"]


def test_compress_rules_from_the_request(service, notes):
    rule = {"pattern": "research", "action": "summarize", "maxTokens": 20}
    done = service.compress(notes, CompressArgs.model_validate({"action": "compress", "compress_rules": [rule]}))
    assert done["rules"][0]["entries"] == 1
    assert service.load(notes).main.tokens("L3") < service.document(notes)["tokens"]["L3"] + 1


@pytest.mark.parametrize("args, error", [
    ({"action": "compress", "target_layers": ["L4"]}, BadRequest),
    ({"action": "evaluate"}, BadRequest),
    ({"action": "evaluate", "before_snapshot_id": "snap:main:999"}, ContextKeyError),
    ({"action": "decompress", "snapshot_id": "nope"}, ContextKeyError),
])
def test_compress_refusals(service, notes, args, error):
    with pytest.raises(error):
        service.compress(notes, CompressArgs.model_validate(args))


@pytest.mark.parametrize("args", [{"action": "shrink"}, {"action": "compress", "max_tokens": 0},
                                  {"action": "compress", "compress_rules": [{"pattern": "x", "action": "eval"}]}])
def test_compress_arguments_are_validated(args):
    with pytest.raises(ValidationError):
        CompressArgs.model_validate(args)


# ----------------------------------------------------------------------------- snapshot, rollback

def test_snapshot_then_rollback(service, notes):
    snap = service.snapshot(notes, SnapshotArgs(label="before fix", layers=["L3"]))
    assert snap["snapshot_id"].startswith("snap:main:") and "risk_level" in snap["layers"]["L3"]
    service.inject(notes, InjectArgs(values={"temp": 1}))
    done = service.rollback(notes, RollbackArgs(snapshot_id=snap["snapshot_id"], reason="undo the hint"))
    assert done["restored_layers"] == ["L2", "L3", "L4", "L5"] and set(done["layers"]) == {f"L{i}" for i in range(6)}
    ctx = service.load(notes).main
    assert "temp" not in ctx.layer("L4")
    assert any(e.kind == "restore" for e in ctx.tape) and any(e.changes and e.changes[0][1] == "temp" for e in ctx.tape)
    with pytest.raises(ContextKeyError):
        service.rollback(notes, RollbackArgs(snapshot_id="snap:main:9999"))


# ----------------------------------------------------------------------------- config

def test_config_is_validated_versioned_and_on_the_tape(service, notes):
    first = service.config(notes, ConfigArgs(activity_id="finish", config={"preserveKeys": ["outcome"]}))
    second = service.config(notes, ConfigArgs(activity_id="finish", config={"compressTokenThreshold": 4000},
                                              reason="tighter"))
    assert (first["config_version"], second["config_version"]) == (1, 2)
    # config (and previous) are complete, every field, defaults too; change is what the request set
    assert second["change"] == {"compressTokenThreshold": 4000}
    assert (second["config"]["preserveKeys"], second["config"]["compressTokenThreshold"]) == (["outcome"], 4000)
    assert second["previous"] == first["config"] and second["previous"]["compressTokenThreshold"] is None
    inst = service.load(notes)
    assert inst.process.config("finish").effective_token_threshold == 4000
    changes = notes_on_tape(service, notes, "config_change")
    assert [e.data["config_version"] for e in changes] == [1, 2] and changes[1].data["reason"] == "tighter"
    replaced = service.config(notes, ConfigArgs(activity_id="finish", config={"preserveKeys": ["x"]}, mode="replace"))
    assert replaced["config"] == {**ActivityExtensionConfig().dump_full(), "preserveKeys": ["x"]}
    assert replaced["config_version"] == 3


def test_config_keeps_the_servers_handler(service, loan):
    done = service.config(loan, ConfigArgs(activity_id="risk_review", config={"preserveKeys": ["x"]}, mode="replace"))
    assert done["config"]["handler"] == "loan_handlers.py:risk_review"


@pytest.mark.parametrize("config, field", [
    ({"handler": "os:system"}, "handler"),
    ({"preScript": "import os"}, "preScript"),
    ({"script": "x = 1"}, "script"),
    ({"conflictPolicy": {"rules": [{"key": "k", "when": "__import__('os')", "value": 1, "reason": "r"}]}},
     "conflictPolicy.rules.0.when"),
    ({"conflictPolicy": {"rules": [{"key": "k", "when": "amount >", "value": 1, "reason": "r"}]}},
     "conflictPolicy.rules.0.when"),
    ({"branches": [{"id": "b", "condition": "amount.__class__"}]}, "branches.0.condition"),
    ({"knowledgeConfig": {"query": "{policy.__class__}"}}, "knowledgeConfig.query"),
    ({"knowledgeConfig": {"query": "rules for {industry"}}, "knowledgeConfig.query"),
    ({"llm": {"apiBase": "http://evil.example"}}, "llm.apiBase"),
    ({"mergeStrategy": "WHATEVER"}, "mergeStrategy"),
    ({"unknownField": 1}, "unknownField"),
])
def test_runtime_config_never_carries_code(config, field):
    with pytest.raises(ConfigError) as caught:
        runtime_config(config, element_id="finish")
    assert field in {p["field"] for p in caught.value.problems}


def test_runtime_config_allows_safe_conditions_and_sentences():
    cfg = runtime_config({"branches": [{"id": "a", "condition": "amount > 1000 and lower(kind) == 'x'"},
                                       {"id": "b", "condition": "the applicant is a returning customer"}],
                          "knowledgeConfig": {"query": "rules for {industry}"}}, element_id="gw")
    assert [b.id for b in cfg.branches] == ["a", "b"]


def test_runtime_config_names_only_elements_of_the_process(service, notes):
    # validate refuses a branchPriority naming no element; the runtime change took it, and the
    # instance stopped at its join ("changed by no branch listed in branchPriority")
    version = service.document(notes)["version"]
    with pytest.raises(ConfigError) as caught:
        service.config(notes, ConfigArgs(activity_id="finish", config={
            "mergeStrategy": "BRANCH_PRIORITY", "branchPriority": ["finish", "nope"]}))
    assert [p["field"] for p in caught.value.problems] == ["branchPriority.1"]
    assert "'nope' is no element" in str(caught.value)
    with pytest.raises(ConfigError, match="branches.0.id"):
        service.config(notes, ConfigArgs(activity_id="finish", config={"branches": [{"id": "ghost"}]}))
    assert service.document(notes)["version"] == version  # nothing changed, nothing on the tape


def test_config_of_an_unknown_activity(service, notes):
    with pytest.raises(ContextKeyError, match="no element 'nope'"):
        service.config(notes, ConfigArgs(activity_id="nope", config={}))


# ----------------------------------------------------------------------------- resolve, confirmations

def test_resolve_a_conflict_with_a_reason(service, loan):
    (pending,) = service.confirmations()
    assert pending["id"] == "review_join/approval_status" and pending["instance_id"] == loan
    done = service.resolve(loan, ResolveArgs(conflict_key="approval_status", resolution="pending_dual_approval",
                                             reason="dual approval per policy"), actor="ann")
    assert done["status"] == "completed" and done["confirmation_id"] == "review_join/approval_status"
    assert done["conflicts"][0]["resolution"]["value"] == "pending_dual_approval"
    (decision,) = notes_on_tape(service, loan, "human_decision")
    assert decision.actor == "ann" and decision.data["reason"] == "dual approval per policy"
    entry = service.load(loan).confirmations[0]
    assert entry["answered"] and entry["reason"] == "dual approval per policy" and entry["answered_by"] == "ann"
    assert service.confirmations() == []


def test_listing_confirmations_reads_record_heads_and_sees_every_change(tmp_path, monkeypatch):
    """Listing every open confirmation reads the record heads of unfinished instances (no
    workflow rebuilt, no tape read), and again only for those whose version changed: an
    answer given through another service on the same store shows at once."""
    url = f"sqlite:///{tmp_path / 'shared.db'}"
    service = GovernanceService(Engine(url), make_catalog(tmp_path))
    other = GovernanceService(Engine(url), make_catalog(tmp_path))
    ids = [service.start(StartArgs(process_id="loan_approval", data=LOAN_CONFLICT))["instance_id"] for _ in range(3)]
    done = service.start(StartArgs(process_id="notes_review", data=NOTES))["instance_id"]
    assert done not in {c["instance_id"] for c in service.confirmations()}

    def no_full_load(*args, **kwargs):
        raise AssertionError("a listing of all instances rebuilt one")
    monkeypatch.setattr(Engine, "load", no_full_load)
    listed = service.confirmations()
    assert sorted(c["instance_id"] for c in listed) == sorted(ids)
    assert all(c["id"] == "review_join/approval_status" and c["version"] == service.engine.store.load_head(
        c["instance_id"])["version"] for c in listed)
    reads = []
    real_head = type(service.engine.store).load_head
    monkeypatch.setattr(type(service.engine.store), "load_head",
                        lambda self, iid: reads.append(iid) or real_head(self, iid))
    assert service.confirmations() == listed and reads == []  # nothing changed: nothing read
    monkeypatch.undo()
    other.resolve(ids[1], ResolveArgs(conflict_key="approval_status", resolution="rejected", reason="too risky"),
                  actor="bob")
    again = service.confirmations()
    assert sorted(c["instance_id"] for c in again) == sorted([ids[0], ids[2]])
    service.engine.store.store.delete(ids[0])
    assert [c["instance_id"] for c in service.confirmations()] == [ids[2]]
    assert service.confirmations(ids[2]) == [c for c in again if c["instance_id"] == ids[2]]


def test_resolve_refusals_change_nothing(service, loan):
    version = service.document(loan)["version"]
    with pytest.raises(InvalidAnswer, match="not one of the offered option values"):
        service.resolve(loan, ResolveArgs(conflict_key="approval_status", resolution="maybe", reason="r"))
    with pytest.raises(ContextKeyError, match="no open confirmation or conflict 'nope'"):
        service.resolve(loan, ResolveArgs(conflict_key="nope", resolution="approved", reason="r"))
    with pytest.raises(VersionConflict):
        service.resolve(loan, ResolveArgs(confirmation_id="review_join/approval_status", resolution="approved",
                                          reason="r"), expected_version=version - 1)
    assert service.document(loan)["version"] == version
    with pytest.raises(ValidationError):
        ResolveArgs(resolution="approved", reason="r")  # which conflict?


def test_answer_finds_the_instance_of_a_confirmation(service, loan):
    done = service.answer("review_join/approval_status", AnswerArgs(value="approved", reason="ok", user="bob"))
    assert done["instance_id"] == loan and done["status"] == "completed"
    # a second answer by id alone: refused as already answered (409), naming who answered, not "unknown" (404)
    with pytest.raises(ConfirmationAnswered, match="by bob"):
        service.answer("review_join/approval_status", AnswerArgs(value="approved"))


def test_a_model_confirmation_waits_for_a_person(service, notes):
    args = HumanConfirmArgs(type="compression_review", message="Keep the compression?",
                            options=[{"label": "keep", "value": "keep"}, {"label": "undo", "value": "undo"}], timeout=60)
    asked = service.request_confirmation(notes, args)
    assert asked["status"] == "pending" and asked["confirmation_id"] == "model:1"
    doc = service.document(notes)
    assert doc["status"] == "waiting" and any(w["id"] == "model:1" for w in doc["waiting_for"])
    assert [c["id"] for c in service.confirmations(notes)] == ["model:1"]
    with pytest.raises(InvalidAnswer):
        service.answer("model:1", AnswerArgs(value="perhaps", instance_id=notes))
    done = service.answer("model:1", AnswerArgs(value="keep", reason="fine", instance_id=notes))
    assert done["status"] == "waiting" and [w["task_id"] for w in done["waiting_for"]] == ["approve"]


# ----------------------------------------------------------------------------- branches

def test_branch_evaluate(service, loan):
    report = service.branch_evaluate(loan, BranchEvaluateArgs(branch_id="finance_review",
                                                              required_keys=["amount", "approval_status", "nope"]))
    assert report["present"] == {"amount": "L1", "approval_status": "L3"} and report["missing"] == ["nope"]
    assert not report["ok"] and report["status"] == "open"
    with pytest.raises(ContextKeyError, match="no branch 'ghost'"):
        service.branch_evaluate(loan, BranchEvaluateArgs(branch_id="ghost", required_keys=["x"]))


@pytest.mark.parametrize("args", [{"action": "evaluate"}, {"action": "resolve_conflict", "conflict_key": "k"},
                                  {"action": "resolve_conflict", "conflict_key": "k", "reason": "r"}])
def test_branch_arguments_per_action(args):
    with pytest.raises(ValidationError):
        BranchArgs.model_validate(args)


# ----------------------------------------------------------------------------- concurrency

@pytest.mark.parametrize("url", ["memory://", "sqlite"])
def test_concurrent_injects_through_two_services_never_lose_a_write(tmp_path, url):
    """Two services (two servers) on one store: each accepted write is kept, the rest get VersionConflict."""
    store = f"sqlite:///{tmp_path / 'lf.db'}" if url == "sqlite" else url
    first = GovernanceService(Engine(store), make_catalog(tmp_path))
    second = first if url == "memory://" else GovernanceService(Engine(store), make_catalog(tmp_path))
    instance_id = first.start(StartArgs(process_id="notes_review", data=NOTES))["instance_id"]
    accepted, rejected = [], []
    lock = threading.Lock()

    def writer(n: int) -> None:
        svc = first if n % 2 else second
        for j in range(6):
            key = f"w{n}_{j}"
            try:
                svc.inject(instance_id, InjectArgs(values={key: n * 100 + j}))
                outcome = accepted
            except VersionConflict:
                outcome = rejected
            with lock:
                outcome.append(key)

    threads = [threading.Thread(target=writer, args=(n,)) for n in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    inst = first.load(instance_id)
    working = inst.main.layer("L4")
    written = {e.changes[0][1] for e in inst.main.tape if e.kind == "write" and e.changes}
    assert len(accepted) + len(rejected) == 36 and accepted
    assert set(accepted) <= set(working) and set(accepted) <= written
    assert not set(rejected) & set(working) and not set(rejected) & written
    assert all(working[k] == int(k[1:].split("_")[0]) * 100 + int(k.split("_")[1]) for k in accepted)
