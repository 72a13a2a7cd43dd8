"""Processes written for this file (``tests/engine/unseen4/``), each exercising layerflow's
compression, attention scores and rendering on a realistic shape the earlier unseen rounds do
not: a research assistant whose failed, empty and repeated search results fire
``toolEfficiency``; a support conversation whose long first message fires ``decay``; a contract
review whose preserved keys are a small share (``density``); a token cliff and a message cliff,
each alone; ``extract_keys`` with dotted, list and missing paths; ``summarize`` (offline
extractive fallback and a fake model, both within ``maxTokens``) with ``count_only`` and
``keepLast``; a compression inside a call activity and inside a non-interrupting event
sub-process; a model activity whose rendered request carries hostile values.

Every expected value here was derived by hand from DESIGN.md and README.md (the token counts
from the entries' sizes), then checked through ``layerflow run --json`` (in-process, click's
CliRunner), ``inspect``, ``tape``, ``replay --until``, ``rollback``, REST and the Python API."""

from __future__ import annotations

import json
import types
from pathlib import Path
from typing import Any, NamedTuple

import pytest
from click.testing import CliRunner

from context_layers import LayeredContext, RuleDrivenCompressor, render, thaw
from context_layers.tokens import count_text
from engine import Engine, load_process
from engine.cli import main

from test_unseen_processes import _check_document

UNSEEN = Path(__file__).resolve().parent / "unseen4"
NOTE_TEXT = " ".join(f"Point {i}: the {w} I ordered should arrive before the office move on Friday, please pack it "
                     f"separately and call the reception desk on arrival."
                     for i, w in enumerate(["lamp", "arm", "cable", "bracket", "screws"], 1))
NOTE = {"text": NOTE_TEXT, "topic": "delivery before the move"}


class Case(NamedTuple):
    process: str
    data: dict[str, Any]
    config: str | None  # --config FILE in unseen4 (None: PROCESS.layerflow.yaml)
    status: str
    values: dict[str, Any]  # data keys after the run (PROCESS and HISTORY), a subset
    compressions: list[tuple[str, list[str], list[str]]]  # activity id, triggers, folded keys
    history: list[str] | None  # the HISTORY keys at the end, in order (None: not checked)


CASES: dict[str, Case] = {
    # web useful; news an error; papers an empty payload (its query is in args, meta); the retry the
    # same payload as web: 1 useful of 4 = 0.25 < 0.5. The remedy folds the useless results of older
    # activities (the retry is the activity just finished: kept whole)
    "a research assistant: failed, empty and repeated search results fire toolEfficiency": Case(
        "research_tools", {"topic": "solar"}, None, "completed",
        {"answer": "Spain: +28% rooftop solar (2025) for solar", "plan_steps": ["web", "news", "papers", "web again"]},
        [("search_again", ["toolEfficiency"], ["tool_call_result_news", "tool_call_result_papers"])],
        ["plan_steps", "activity:plan", "tool_call_result_web", "activity:search_web", "activity:search_news",
         "activity:search_papers", "tool_call_result_retry", "activity:search_again", "compaction:1", "answer",
         "activity:synthesize"]),
    # four activity records after ask_refund: greet's long message is old (not among the 3 latest)
    # and holds most tokens; decay folds it whole, the preserved ticket id stays
    "a support conversation: the long first message decays and is folded": Case(
        "support_chat", {}, None, "completed", {"ticket_id": "T-5531", "closed": "T-5531 closed"},
        [("ask_refund", ["decay"], ["transcript_intro", "activity:greet"])],
        ["ticket_id", "turn_billing", "activity:ask_billing", "turn_plan", "activity:ask_plan", "turn_refund",
         "activity:ask_refund", "compaction:1", "closed", "activity:close_ticket"]),
    # the preserved contract id, key terms and verdict are a small share of the clauses and risk notes:
    # the density cliff folds every older activity (the preserved keys stay where they were)
    "a contract review: preserved keys a small share, density folds the clauses": Case(
        "contract_review", {}, None, "completed", {"contract_id": "K-2026-118", "verdict": "negotiate"},
        [("decide", ["density"], ["activity:intake", "clause_text", "activity:read_clauses", "risk_notes",
                                  "activity:risk_review"])],
        ["contract_id", "key_terms", "verdict", "activity:decide", "compaction:1"]),
    # ~85 tokens per meeting: after meeting_4 (303 > 300) the cliff folds meetings 1-3; wrap_up then
    # reads minutes_1, which the cliff folded: the error names the compression
    "a token cliff alone: a later step that reads a folded key fails, naming the compression": Case(
        "meeting_minutes", {}, None, "error", {"minutes_4": "<present>", "minutes_1": "<absent>"},
        [("meeting_4", ["token_threshold"], ["minutes_1", "activity:meeting_1", "minutes_2", "activity:meeting_2",
                                             "minutes_3", "activity:meeting_3"])],
        ["minutes_4", "activity:meeting_4", "compaction:1", "minutes_5", "activity:meeting_5"]),
    # 2 entries per mail: 8 > 6 after mail_4, the entry target 0.5 x 6 = 3 keeps mail_4 and the record;
    # after mail_6 again 7 > 6: compaction:1 folds into compaction:2 with mails 4 and 5
    "a message cliff alone, twice: the second compaction takes in the first": Case(
        "inbox_triage", {}, None, "completed", {"label_6": "contract", "label_1": "<absent>"},
        [("mail_4", ["message_threshold"], ["label_1", "activity:mail_1", "label_2", "activity:mail_2", "label_3",
                                           "activity:mail_3"]),
         ("mail_6", ["message_threshold"], ["label_4", "activity:mail_4", "compaction:1", "label_5",
                                           "activity:mail_5"])],
        ["label_6", "activity:mail_6", "compaction:2"]),
    # 288 tokens > 250; extract_keys alone brings it to 156 <= 0.7 x 250: no cliff. The contacts result
    # has none of the paths: unchanged
    "extract_keys: dotted and list paths kept in place, a missing path reported, an entry with none unchanged": Case(
        "crm_lookup", {}, None, "completed", {"account_line": "C-9 rows 3"},
        [("find_contacts", ["token_threshold"], [])],
        ["tool_call_result_crm", "activity:find_customer", "tool_call_result_contacts", "activity:find_contacts",
         "account_line", "activity:summarize_account"]),
    # 760 tokens > 700: the reasoning chain summarized (offline, extractive) and 4 of 6 retry logs
    # counted reach 235 <= 350; density (1 preserved token) fires too, out of reach: nothing folded
    "summarize offline and count_only with keepLast: the rules alone meet the target": Case(
        "credit_memo", {}, None, "completed", {"memo": "score 42", "risk_score": 42, "retry_log_4": "<absent>"},
        [("retry_fetch", ["token_threshold", "density"], [])],
        ["risk_score", "reasoning_chain", "activity:gather", "retry_log_5", "retry_log_6", "activity:retry_fetch",
         "summary:count:retry_log", "memo", "activity:write_memo"]),
    # the called process runs in the caller's context: its last step's cliff folds the caller's intake
    # too; what settle reads is preserved
    "a compression inside a call activity: the caller's next step reads what was preserved": Case(
        "claim_intake", {"claim_no": "CL-88"}, None, "completed",
        {"settlement": "P-CL-88: severe", "photo_notes": "<absent>", "report_text": "<absent>"},
        [("rate", ["token_threshold", "density"], ["activity:intake", "photo_notes", "activity:read_photos",
                                                    "report_text", "activity:read_report"])],
        ["policy_no", "damage_rating", "activity:rate", "compaction:1", "settlement", "activity:settle"]),
}


def _data(doc: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in doc["layers"]["L3"].items()
            if not k.startswith(("_", "activity:", "compaction:", "summary:", "event:"))} | doc["layers"]["L1"]


def _cli(*args: str) -> tuple[int, Any, str]:
    result = CliRunner().invoke(main, list(args))
    try:
        doc = json.loads(result.stdout) if "--json" in args else result.stdout
    except json.JSONDecodeError:
        raise AssertionError(f"not one JSON document: {result.stdout!r} {result.stderr!r}") from None
    return result.exit_code, doc, result.stderr


def _run(case: Case, tmp_path: Path, *extra: str) -> tuple[int, dict[str, Any], str, str]:
    store = f"sqlite:///{tmp_path / 'u4.db'}"
    args = ["run", str(UNSEEN / f"{case.process}.bpmn"), "--json", "--store", store, "--data", json.dumps(case.data)]
    if case.config:
        args += ["--config", str(UNSEEN / case.config)]
    code, doc, err = _cli(*args, *extra)
    return code, doc, err, store


def _present(values: dict[str, Any], data: dict[str, Any]) -> dict[str, Any]:
    out = {}
    for k, want in values.items():
        got = data.get(k, "<absent>")
        out[k] = "<present>" if want == "<present>" and got != "<absent>" else got
    return out


@pytest.mark.parametrize("name", list(CASES))
def test_run_json_gives_the_outcome_derived_by_hand(name: str, tmp_path: Path) -> None:
    case = CASES[name]
    code, doc, err, _ = _run(case, tmp_path)
    _check_document(doc, code, case.process)
    assert doc["status"] == case.status, (doc["error"], err)
    assert _present(case.values, _data(doc)) == case.values
    assert [(c["activity_id"], c["triggers"], c["folded"]) for c in doc["compressions"]] == case.compressions
    if case.history is not None:
        assert list(doc["layers"]["L3"]) == case.history
    for c in doc["compressions"]:
        # every compression: a snapshot first, fewer tokens after, its compaction record names that snapshot
        assert c["snapshot_id"].startswith("snap:") and c["tokens_after"] < c["tokens_before"]
        if c["compaction_key"] and c["compaction_key"] in doc["layers"]["L3"]:
            record = doc["layers"]["L3"][c["compaction_key"]]
            assert (record["snapshot_id"], record["tokens_before"], record["tokens_after"]) == (
                c["snapshot_id"], c["tokens_before"], c["tokens_after"])


@pytest.mark.parametrize("name", list(CASES))
def test_replay_rebuilds_every_snapshot_and_the_end_byte_for_byte(name: str, tmp_path: Path) -> None:
    case = CASES[name]
    code, doc, _, store = _run(case, tmp_path)
    instance = Engine(store).load(doc["instance_id"])
    for ctx in instance.contexts.values():
        for snap in ctx.snapshots.values():
            rebuilt = LayeredContext.replay(ctx.tape, until=snap.seq, name=ctx.name)
            assert json.dumps(rebuilt.as_dict()) == json.dumps(
                {layer: {k: thaw(v) for k, v in values.items()} for layer, values in snap.as_dict().items()})
        assert LayeredContext.replay(ctx.tape, name=ctx.name) == ctx
    end = instance.main.tape[-1].seq
    rc, replayed, _ = _cli("replay", doc["instance_id"], "--until", str(end), "--store", store, "--json")
    assert rc == 0 and json.dumps(replayed["layers"]) == json.dumps(doc["layers"])


@pytest.mark.parametrize("name", list(CASES))
def test_the_python_api_gives_what_the_cli_gives(name: str, tmp_path: Path) -> None:
    case = CASES[name]
    code, doc, _, _ = _run(case, tmp_path)
    process = load_process(UNSEEN / f"{case.process}.bpmn", config=UNSEEN / case.config if case.config else None)
    instance = Engine("memory://").run_process(process, case.data)
    ours = instance.to_document()
    assert ours["status"] == doc["status"] and ours["layers"] == doc["layers"]
    assert [(c["activity_id"], c["triggers"], c["tokens_before"], c["tokens_after"]) for c in ours["compressions"]] \
        == [(c["activity_id"], c["triggers"], c["tokens_before"], c["tokens_after"]) for c in doc["compressions"]]


# ----- a compression inside a non-interrupting event sub-process ------------------------------------------

def _order_desk(tmp_path: Path, config: str | None = None) -> tuple[str, str]:
    store = f"sqlite:///{tmp_path / 'desk.db'}"
    args = ["run", str(UNSEEN / "order_desk.bpmn"), "--json", "--store", store]
    code, doc, err = _cli(*args, *(["--config", str(UNSEEN / config)] if config else []))
    assert code == 3, err
    assert [(w["kind"], w["task_id"]) for w in doc["waiting_for"]] == [("user_task", "review_order"),
                                                                         ("event", "note_in")]
    code, doc, err = _cli("send", doc["instance_id"], "customer_note", "--store", store,
                          "--json-payload", json.dumps(NOTE), "--json")
    assert code == 3, err
    # the note's handling ran beside the waiting review, compressed in its own context and merged back
    [c] = doc["compressions"]
    assert (c["activity_id"], c["context"], c["triggers"]) == ("answer_note", "main/note_handling@6",
                                                               ["token_threshold", "density"])
    assert doc["layers"]["L3"]["note_reply"] == "Thanks, we noted: delivery before the move"
    return doc["instance_id"], store


def test_an_event_sub_process_compression_merges_back_and_the_flow_goes_on(tmp_path: Path) -> None:
    iid, store = _order_desk(tmp_path)
    code, doc, err = _cli("resume", iid, "--store", store, "--answer", 'review_order={"approved": true}', "--json")
    assert code == 0, err
    assert doc["layers"]["L3"]["shipped"] == "O-7 shipped, 2 items"
    assert [k for k in doc["layers"]["L3"] if k.startswith("compaction:")] == ["compaction:1"]


def test_an_event_sub_process_that_folds_what_the_flow_reads_later_names_its_compression(tmp_path: Path) -> None:
    """README: a later script that reads a key the cliff folded fails naming the compression; the
    fold happened in the event sub-process's context, and the merge took it (the flow had not
    changed ``items`` meanwhile)."""
    iid, store = _order_desk(tmp_path, "order_desk.narrow.yaml")
    code, doc, err = _cli("resume", iid, "--store", store, "--answer", 'review_order={"approved": true}', "--json")
    assert code == 1 and doc["error"]["task_id"] == "ship"
    assert ("'items' was removed from HISTORY by the compression after activity 'answer_note' in context "
            "'main/note_handling@6'") in doc["error"]["message"]
    assert "add 'items' to that activity's preserveKeys" in doc["error"]["message"]


def test_keys_an_event_sub_process_preserved_stay_preserved_after_it_merges_back(tmp_path: Path) -> None:
    """DESIGN: preserveKeys always survive unchanged; README: keys a branch's activities preserve
    stay preserved after the join. The event sub-process's answer_note preserved order_id, items and
    note_reply; once merged back, a compression of the main context (REST, a model tool, the
    Python API) must not fold them. Before the fix the merge brought the values but not the marks."""
    iid, store = _order_desk(tmp_path)
    instance = Engine(store).load(iid)
    main_ctx = instance.main
    assert {"order_id", "items", "note_reply"} <= set(main_ctx.preserved)
    before = {k: main_ctx.layer(3)[k] for k in ("order_id", "items", "note_reply")}
    result = RuleDrivenCompressor().compress(main_ctx, {}, target_tokens=40)
    assert result.changed
    assert {k: main_ctx.layer(3).get(k) for k in before} == before
    code, report, _ = _cli("inspect", iid, "--store", store, "--json")
    assert code == 0 and {"order_id", "items", "note_reply"} <= set(report["preserved"])
    # the marks are on the tape: a replay of main has them too
    assert {"order_id", "items", "note_reply"} <= set(LayeredContext.replay(main_ctx.tape, name="main").preserved)
