"""``layerflow inspect`` (layers, writers, triggers, compressions, --prompts), ``rollback``,
``snapshot`` and ``schema``: through click's CliRunner on a temporary sqlite store, with
the loan demo as the instance to look into."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result
from engine_helpers import EXAMPLES

import engine.cli as cli_module
from context_layers.config import LLMConfig, config_json_schema
from engine.cli import main
from engine.governance import GovernanceService, InspectArgs
from engine.llm import prompt_stability, request_messages, run_llm_activity
from engine.runtime import Engine
from engine.store import open_store

LAYERS = ("L0", "L1", "L2", "L3", "L4", "L5")
TRIGGERS = ["token_threshold", "message_threshold", "density", "redundancy", "decay", "conflict", "toolEfficiency"]


@pytest.fixture
def store_url(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    url = f"sqlite:///{tmp_path / 'cli.db'}"
    monkeypatch.setenv("LAYERFLOW_STORE", url)
    return url


@pytest.fixture
def cli(store_url: str):
    runner = CliRunner()

    def invoke(*args: str) -> Result:
        return runner.invoke(main, list(args), catch_exceptions=False)
    return invoke


def _doc(result: Result) -> Any:
    return json.loads(result.stdout)  # exactly one document, nothing else


@pytest.fixture
def full(cli) -> dict[str, Any]:
    """A completed full review: a join, then a compression before disbursement."""
    result = cli("demo", "loan", "--scenario", "full", "--json")
    assert result.exit_code == 0, result.stderr
    return _doc(result)


@pytest.fixture
def conflict(cli) -> dict[str, Any]:
    """Waiting at the join: the two reviews disagree, both branches still open."""
    result = cli("demo", "loan", "--scenario", "conflict", "--json")
    assert result.exit_code == 3, result.stderr
    return _doc(result)


def _rows(stdout: str) -> dict[tuple[str, str], list[str]]:
    """(layer, key) -> the tab-separated fields of inspect's plain table."""
    out = {}
    for line in stdout.splitlines():
        fields = line.split("\t")
        if fields[0] in LAYERS:
            assert len(fields) == 6, line  # layer, key, tokens, preserved, written_by, value
            out[(fields[0], fields[1])] = fields
    return out


def _service(url: str) -> GovernanceService:
    return GovernanceService(Engine(open_store(url)))


# ----------------------------------------------------------------------------- inspect

def test_inspect_plain_shows_every_layer_with_writers_and_preserved_marks(cli, full) -> None:
    result = cli("inspect", full["instance_id"])
    assert result.exit_code == 0, result.stderr
    assert "\x1b[" not in result.stdout, "plain lines when stdout is not a terminal"
    rows = _rows(result.stdout)
    for layer, values in full["layers"].items():
        assert {k for (ly, k) in rows if ly == layer} == set(values)
    assert rows[("L0", "policy")][4] == "engine (init)"
    assert rows[("L1", "amount")][4] == "input"
    assert rows[("L3", "risk_level")][3:5] == ["preserved", "risk_assessment"]
    assert rows[("L3", "approval_status")][4] == "review_join (join)"  # merged at the join
    assert rows[("L3", "compaction:1")][4] == "disbursement_decision (compress)"
    assert all(r[4] == "risk_assessment (retriever)" for (ly, _), r in rows.items() if ly == "L2")
    assert int(rows[("L3", "risk_level")][2]) == 3
    lines = result.stdout.splitlines()
    assert [ln.split("\t")[1] for ln in lines if ln.startswith("threshold\t")] == TRIGGERS
    assert [ln.split("\t")[1] for ln in lines if ln.startswith("stats\t")] == [
        "L0 SYSTEM", "L1 PROCESS", "L2 KNOWLEDGE", "L3 HISTORY", "L4 WORKING", "L5 EPHEMERAL"]
    comp = full["compressions"][0]
    compression = [ln for ln in lines if ln.startswith("compression\t")]
    assert len(compression) == 1
    assert f"{comp['tokens_before']} -> {comp['tokens_after']} tokens" in compression[0]
    assert comp["snapshot_id"] in compression[0]
    assert "thresholds of disbursement_decision" in result.stdout
    assert lines[-1].startswith("tokens L0=")


def test_inspect_json_is_the_governance_inspect_plus_the_run_document(cli, full, store_url) -> None:
    iid = full["instance_id"]
    doc = _doc(cli("inspect", iid, "--json"))
    assert doc["layers"] == full["layers"] and doc["tokens"] == full["tokens"]  # the run document's fields
    assert doc["compressions"] == full["compressions"] and doc["status"] == "completed"
    # CLI and REST agree: the same service computes the statistics and the scores
    rest = _service(store_url).inspect(iid, InspectArgs(activity_id="disbursement_decision"))
    assert doc["attention"] == rest["attention"]
    assert doc["preserved"] == rest["preserved"] and doc["active_config"] == rest["active_config"]
    for layer in LAYERS:
        stats = doc["layer_stats"][layer]
        assert {k: v for k, v in stats.items() if k != "entries"} == rest["layers"][layer]
        assert [e["key"] for e in stats["entries"]] == list(full["layers"][layer])
        assert sum(e["tokens"] for e in stats["entries"]) == full["tokens"][layer]
    risk = next(e for e in doc["layer_stats"]["L3"]["entries"] if e["key"] == "risk_level")
    assert risk["preserved"] and risk["written_by"]["activity"] == "risk_assessment"
    assert risk["written_by"]["context"] == "main" and risk["preview"] == '"medium"'
    check = doc["attention_check"]
    assert check["activity_id"] == "disbursement_decision" and check["config"] == "activity"
    assert [t["name"] for t in check["triggers"]] == TRIGGERS
    assert check["would_trigger"] == rest["compress_status"]["would_trigger"]
    [comp] = doc["context_compressions"]
    assert comp["tokens_before"] > comp["tokens_after"] and comp["attention_before"] and comp["attention_after"]


def test_triggers_against_thresholds(cli, full) -> None:
    check = _doc(cli("inspect", full["instance_id"], "--json"))["attention_check"]
    by = {t["name"]: t for t in check["triggers"]}
    assert by["token_threshold"]["threshold"] == 1200  # the disbursement activity's compressTokenThreshold
    assert by["density"]["threshold"] == 0.15 and by["density"]["fires_when"] == "below"
    assert by["redundancy"]["threshold"] == 0.3 and by["redundancy"]["fires_when"] == "above"
    for t in check["triggers"]:
        if t["threshold"] is None:
            assert not t["crossed"] and not t["fires"]
        else:
            below = t["value"] < t["threshold"]
            above = t["value"] > t["threshold"]
            assert t["crossed"] == (below if t["fires_when"] == "below" else above)
        assert t["fires"] <= t["crossed"]  # firing needs crossing; crossing may be under the floor
        assert t["fires"] == (t["name"] in check["would_trigger"])


def test_thresholds_default_when_the_last_activity_has_no_config(cli, tmp_path: Path) -> None:
    data = tmp_path / "data.json"
    data.write_text(json.dumps({"title": "T"}), encoding="utf-8")
    run = _doc(cli("run", str(EXAMPLES / "parallel_user_task.bpmn"), "--json", "--data", str(data)))
    doc = _doc(cli("inspect", run["instance_id"], "--json"))
    check = doc["attention_check"]
    assert check["config"] == "defaults"
    assert {t["name"]: t["threshold"] for t in check["triggers"]} == {
        "token_threshold": None, "message_threshold": None, "density": 0.15, "redundancy": 0.3, "decay": 0.6,
        "conflict": 0.05, "toolEfficiency": 0.5}
    assert "default thresholds" in cli("inspect", run["instance_id"]).stdout


def test_inspect_a_branch_by_its_id_names_writers_in_the_parent(cli, conflict) -> None:
    iid = conflict["instance_id"]
    doc = _doc(cli("inspect", iid, "--context", "finance_review", "--json"))
    assert doc["context"].startswith("main/finance_review@")
    entries = {e["key"]: e for e in doc["layer_stats"]["L3"]["entries"]}
    assert entries["risk_level"]["written_by"]["context"] == "main"  # inherited at the split
    assert entries["risk_level"]["written_by"]["activity"] == "risk_assessment"
    assert entries["_branch_id"]["written_by"]["via"] == "fork"
    assert entries["approval_status"]["written_by"]["activity"] == "finance_review"
    assert doc["attention_check"]["activity_id"] == "finance_review"
    rows = _rows(cli("inspect", iid, "--context", "finance_review").stdout)
    assert rows[("L3", "_branch_id")][4] == "parallel_review (fork)"


def test_inspect_prompts_without_model_calls(cli, full) -> None:
    iid = full["instance_id"]
    assert "prompts\tno model calls recorded" in cli("inspect", iid, "--prompts").stdout
    doc = _doc(cli("inspect", iid, "--prompts", "--json"))
    assert doc["prompts"] == {"requests": [], "count": 0, "mean_stability": None, "note": "no model calls recorded"}
    assert "prompts" not in _doc(cli("inspect", iid, "--json"))


def _fake_completion(**kw: Any) -> dict[str, Any]:
    return {"choices": [{"message": {"content": '{"ok": true}'}, "finish_reason": "stop"}],
            "usage": {"total_tokens": 3}}


def test_inspect_prompts_reports_each_request_and_the_prefix_stability(cli, full, store_url) -> None:
    iid = full["instance_id"]
    engine = Engine(open_store(store_url))
    instance = engine.load(iid)
    ctx = instance.main
    for _ in range(3):  # three model calls of one agent, recorded on the tape as llm_call notes
        ctx.begin_activity("disbursement_decision")
        run_llm_activity(ctx, "disbursement_decision", LLMConfig(model="fake/model"), completion=_fake_completion)
        ctx.complete_activity("disbursement_decision")
    engine.save(instance)
    doc = _doc(cli("inspect", iid, "--prompts", "--json"))
    prompts = doc["prompts"]
    assert prompts["count"] == 3 and prompts["note"] is None
    first, *later = prompts["requests"]
    assert first["share"] is None and first["prefix_tokens"] == 0
    assert all(0 < r["share"] <= 1 and r["prefix_tokens"] <= r["tokens"] for r in later)
    assert prompts["mean_stability"] == pytest.approx(prompt_stability(ctx.tape))
    for r in prompts["requests"]:
        assert r["context"] == "main" and r["task_id"] == "disbursement_decision"
        assert r["messages"] == request_messages(ctx.tape, r["seq"])
    text = cli("inspect", iid, "--prompts").stdout
    assert len([ln for ln in text.splitlines() if ln.startswith("prompt\tmain#")]) == 3
    assert f"mean prefix stability {prompts['mean_stability']:.3f}" in text


def test_inspect_on_a_terminal_draws_tables_and_escapes_markup(cli, tmp_path: Path, monkeypatch) -> None:
    data = tmp_path / "data.json"
    data.write_text(json.dumps({"amount": 120000, "applicant_id": "APP9", "purpose": "[bold]boom[/bold]",
                                "industry": "logistics"}), encoding="utf-8")
    iid = _doc(cli("demo", "loan", "--data", str(data), "--json"))["instance_id"]
    monkeypatch.setattr(cli_module, "_stdout_is_terminal", lambda: True)
    result = CliRunner().invoke(main, ["inspect", iid, "--prompts"], env={"COLUMNS": "200"}, catch_exceptions=False)
    assert result.exit_code == 0
    out = result.stdout
    for title in ("L0 SYSTEM", "L3 HISTORY", "written by", "triggers", "compressions", "no model calls recorded"):
        assert title in out
    assert "┃" in out and "L4 WORKING · empty" in out
    assert "[bold]boom[/bold]" in out, "user text is shown as text, never as rich markup"


# ----------------------------------------------------------------------------- rollback / snapshot

def test_rollback_undoes_the_compression_as_a_tape_event(cli, full) -> None:
    iid = full["instance_id"]
    comp = full["compressions"][0]
    before = _doc(cli("tape", iid, "--json"))
    result = cli("rollback", iid, "--snapshot", comp["snapshot_id"], "--layers", "L3", "--reason", "audit", "--json")
    assert result.exit_code == 0, result.stdout
    done = _doc(result)
    assert done["restored_layers"] == ["L3"] and done["context"] == "main" and done["snapshot_id"] == comp["snapshot_id"]
    assert done["tokens_before"]["L3"] == full["tokens"]["L3"]
    assert done["tokens_after"]["L3"] > done["tokens_before"]["L3"]
    after = _doc(cli("tape", iid, "--json"))
    assert after[: len(before)] == before, "nothing on the tape changed or went away"
    restore = next(e for e in after[len(before):] if e["kind"] == "restore")
    assert restore["actor"] == "cli" and restore["seq"] == done["event_seq"]
    rows = _rows(cli("inspect", iid).stdout)
    assert rows[("L3", "credit_bureau_result")][4] == "risk_assessment", "a restored value names its writer"
    assert ("L3", "compaction:1") not in rows
    assert rows[("L2", "kb:risk_rules/credit_risk_rules.md#1")], "layers not named are left as they are"
    text = cli("rollback", iid, "--snapshot", comp["snapshot_id"])  # all of L2..L5 this time
    assert text.exit_code == 0 and f"rolled back to {comp['snapshot_id']} (L2, L3, L4, L5)" in text.stdout


def test_snapshot_prints_its_id_and_rollback_returns_to_it(cli, full) -> None:
    iid = full["instance_id"]
    result = cli("snapshot", iid)
    assert result.exit_code == 0
    sid = result.stdout.strip()
    assert sid.startswith("snap:main:") and "\n" not in sid
    labelled = _doc(cli("snapshot", iid, "--label", "checkpoint", "--json"))
    assert labelled["label"] == "checkpoint" and set(labelled["layers"]) == set(LAYERS)
    listed = _doc(cli("snapshot", iid, "--list", "--json"))["snapshots"]
    assert [s["snapshot_id"] for s in listed[:2]] == [labelled["snapshot_id"], sid]  # newest first
    assert listed[0]["label"] == "checkpoint"
    assert sid in cli("snapshot", iid, "--list").stdout
    assert cli("rollback", iid, "--snapshot", sid, "--layers", "L3,L4").exit_code == 0


def test_snapshot_of_a_branch(cli, conflict) -> None:
    sid = cli("snapshot", conflict["instance_id"], "--context", "risk_review").stdout.strip()
    assert sid.startswith("snap:main/risk_review@")
    done = _doc(cli("rollback", conflict["instance_id"], "--snapshot", sid, "--context", "risk_review", "--json"))
    assert done["context"].startswith("main/risk_review@")


@pytest.mark.parametrize(("args", "kind", "says"), [
    (["--snapshot", "snap:nope"], "not_found", ["'snap:nope'", "recent snapshots", "snapshot {iid} --list"]),
    ([], "bad_input", ["--snapshot SNAPSHOT_ID", "recent snapshots"]),
    (["--snapshot", "{sid}", "--layers", "L9"], "bad_input", ["unknown layer 'L9'"]),
    (["--snapshot", "{sid}", "--layers", "SYSTEM,L1"], "bad_input", ["never roll back"]),
    # named beside a layer that does roll back, PROCESS was skipped without a word
    (["--snapshot", "{sid}", "--layers", "L1,L3"], "bad_input", ["L1: SYSTEM and PROCESS never roll back"]),
    (["--snapshot", "{sid}", "--context", "nowhere"], "not_found", ["'nowhere'", "contexts: main"]),
])
def test_rollback_bad_input_exits_2(cli, full, args, kind, says) -> None:
    iid, sid = full["instance_id"], full["compressions"][0]["snapshot_id"]
    args = [a.format(iid=iid, sid=sid) for a in args]
    before = full["tape_length"]
    text = cli("rollback", iid, *args)
    assert text.exit_code == 2 and text.stdout == ""
    for part in says:
        assert part.format(iid=iid) in text.stderr
    result = cli("rollback", iid, *args, "--json")
    assert result.exit_code == 2
    error = _doc(result)["error"]
    assert error["kind"] == kind
    if "recent snapshots" in says:
        assert sid in error["message"] and sid in [s["snapshot_id"] for s in error["recent_snapshots"]]
    assert _doc(cli("inspect", iid, "--json"))["tape_length"] == before, "a refused rollback changes nothing"


def test_rollback_refuses_a_context_whose_branches_are_open(cli, conflict) -> None:
    iid = conflict["instance_id"]
    sid = _doc(cli("snapshot", iid, "--list", "--json"))["snapshots"][-1]["snapshot_id"]
    result = cli("rollback", iid, "--snapshot", sid, "--context", "main", "--json")
    assert result.exit_code == 2
    error = _doc(result)["error"]
    assert error["kind"] == "invalid_state" and "finance_review" in error["message"]


# ----------------------------------------------------------------------------- schema and errors

def test_schema_prints_the_config_json_schema(cli) -> None:
    result = cli("schema")
    assert result.exit_code == 0
    schema = json.loads(result.stdout)
    assert schema == config_json_schema()
    assert schema["title"] == "ActivityExtensionConfig" and "preserveKeys" in schema["properties"]


@pytest.mark.parametrize("args", [
    ["inspect", "no-such-id"],
    ["inspect", "no-such-id", "--prompts"],
    ["rollback", "no-such-id", "--snapshot", "snap:main:1"],
    ["snapshot", "no-such-id"],
    ["snapshot", "no-such-id", "--list"],
    ["tape", "no-such-id"],
])
def test_unknown_instance_names_it_and_layerflow_list(cli, store_url, args) -> None:
    from context_layers.stores import open_store

    open_store(store_url).close()  # the store is there; the instance is not
    text = cli(*args)
    assert text.exit_code == 2 and text.stdout == ""
    assert "'no-such-id'" in text.stderr and "`layerflow list`" in text.stderr
    result = cli(*args, "--json")
    assert result.exit_code == 2
    error = _doc(result)["error"]
    assert error["kind"] == "not_found" and error["instance_id"] == "no-such-id"
    assert "`layerflow list`" in error["message"]


@pytest.mark.parametrize("command", ["inspect", "snapshot", "rollback", "tape", "replay", "list"])
def test_a_bad_store_url_with_json_is_still_one_document(cli, command) -> None:
    args = {"list": ["list"], "replay": ["replay", "x", "--until", "1"]}.get(command, [command, "x"])
    result = cli(*args, "--store", "bogus://nowhere", "--json")
    assert result.exit_code == 2
    assert "bogus" in _doc(result)["error"]["message"]


def test_a_store_password_never_shows_in_messages() -> None:
    assert cli_module._shown_url("redis://:s3cret@host:6379/0") == "redis://***@host:6379/0"
    assert cli_module._shown_url("sqlite:///tmp/x.db") == "sqlite:///tmp/x.db"


def test_a_failure_before_any_instance_still_prints_the_whole_run_document(tmp_path) -> None:
    from click.testing import CliRunner

    from engine.cli import main

    bad = tmp_path / "bad.bpmn"
    bad.write_text('<?xml version="1.0"?>\n<bpmn:definitions xmlns:bpmn="http://www.omg.org/spec/BPMN/20100524/MODEL">\n'
                   '<bpmn:process id="p" isExecutable="true"><bpmn:startEvent id="s"></bpmn:process>\n')
    result = CliRunner().invoke(main, ["run", str(bad), "--json", "--store", "memory://"])
    assert result.exit_code == 2
    doc = json.loads(result.stdout)
    assert doc["status"] == "error" and doc["error"]["kind"] == "invalid_process"
    assert "bad.bpmn:3" in doc["error"]["message"]
    assert set(doc) >= {"instance_id", "process_id", "status", "error", "layers", "tokens", "conflicts",
                        "compressions", "confirmations", "waiting_for", "tape_length"}
    assert doc["layers"] == {f"L{i}": {} for i in range(6)} and doc["tokens"]["total"] == 0


@pytest.mark.parametrize("how", ["sqlite", "redis-with-password", "memory"])
def test_the_suggested_next_command_names_the_store_it_ran_on(tmp_path, monkeypatch, capsys, how):
    """`run --store URL` that leaves the instance waiting suggests `resume ID --store URL`: the
    command as printed finds the instance (without --store it would look in the default store).
    A Redis password is not printed; memory:// says the instance is gone when the command ends."""
    monkeypatch.delenv("LAYERFLOW_STORE", raising=False)
    monkeypatch.setattr(cli_module, "default_store_url", lambda: f"sqlite:///{tmp_path / 'default.db'}")
    url = {"sqlite": f"sqlite:///{tmp_path / 'runs dir' / 'x.db'}", "memory": "memory://",
           "redis-with-password": "redis://:s3cret@127.0.0.1:1/0"}[how]
    if how == "redis-with-password":  # the summary alone: no server needed
        engine = Engine("memory://")
        instance = engine.run(engine.start(cli_module.load_process(EXAMPLES / "parallel_user_task.bpmn"),
                                           {"title": "t"}))
        cli_module._summary(cli_module._Out(False), instance, url)
        text = capsys.readouterr().out
        assert "s3cret" not in text and f"layerflow resume {instance.id} --store URL --answer" in text, text
        return
    result = CliRunner().invoke(main, ["run", str(EXAMPLES / "parallel_user_task.bpmn"), "--data", '{"title": "t"}',
                                       "--store", url], catch_exceptions=False)
    assert result.exit_code == 3, result.output
    line = next(x for x in result.stdout.splitlines() if "layerflow resume" in x)
    command = line.split("`")[1]
    if how == "memory":
        assert "lives only in this command" in result.stdout
        return
    iid = command.split()[2]
    assert command.startswith(f"layerflow resume {iid} --store '{url}' --answer review="), command
    answered = CliRunner().invoke(main, ["resume", iid, "--store", url, "--answer",
                                         'review={"approved": true, "reviewer": "ann"}'], catch_exceptions=False)
    assert answered.exit_code == 0, answered.output


@pytest.mark.parametrize("command", [("inspect",), ("tape",), ("replay", "--until", "3"), ("rollback", "--snapshot", "nope")])
def test_a_refusal_about_a_loaded_instance_names_it_in_the_document(cli, full: dict[str, Any], command: tuple[str, ...]) -> None:
    """An unknown context (or snapshot) of an instance that exists: the error document names the
    instance and its process, as any other document about it does, and the command exits 2."""
    name, *rest = command
    args = [name, full["instance_id"], *rest, "--json"]
    if name != "rollback":
        args += ["--context", "nope"]
    result = cli(*args)
    assert result.exit_code == 2, result.stdout
    doc = _doc(result)
    assert doc["status"] == "error" and doc["error"]["kind"] == "not_found"
    assert "nope" in doc["error"]["message"]
    assert (doc["instance_id"], doc["process_id"]) == (full["instance_id"], "loan_approval")
