"""RuleDrivenCompressor: compress HISTORY by rules, as a cliff, and undo it.

``compress`` works on HISTORY only (WORKING is the open activity's, the other layers
are not the compressor's) and never changes or drops a protected key: the preserved
keys (``ctx.preserved`` plus the config's ``preserveKeys``), the keys of
``contextStrategy.requiredContext``, and the engine's ``_``-prefixed bookkeeping
(``_mergedConflicts``, ``_branch_id``, ...). Token counts are HISTORY + WORKING, the scope
the token threshold is compared with.

1. **Rules**: the config's ``compressRules`` (``compress_rules.apply_rules``), until
   nothing changes.
2. **Remedies** for the attention triggers that fired: ``redundancy`` folds the older
   members of every near-duplicate cluster (the newest stays); ``toolEfficiency``
   folds useless tool results and unanswered calls; ``decay`` folds every entry owned
   by an activity older than the ``recent_activities`` latest. ``conflict`` has no
   compression remedy (contradictions are for the resolvers); it is reported only.
3. **Cliff**: while a size target is not met, fold the oldest finished activity (its
   unprotected entries and its record), oldest first, never one of the
   ``keep_recent`` latest activities nor the open tail. Targets: ``target_tokens``
   when given; ``token_threshold`` fired: ``compressTargetRatio`` x the threshold;
   ``density`` fired: T(P) x ratio / threshold (density lands at threshold / ratio);
   ``message_threshold`` fired: ratio x the entry threshold. Deep enough that the
   next activities append without compressing again; after a cliff no size trigger
   fires, so the rendered prefix stays stable until the next one.
4. **Compaction**: folded entries and earlier ``compaction:*`` records are replaced by
   one record ``compaction:<n>`` = ``{"kind": "compaction", "summary", "covers",
   "entries", "snapshot_id", "tokens_before", "tokens_after"}`` (plus ``kept`` when it
   folded what a rule kept, ``dropped`` when a plan dropped keys). What a rule kept
   survives the fold verbatim: each folded ``extract_keys`` output is one line of
   ``kept`` (``"<key>: <path>: <value>; ..."``), earlier records' ``kept`` lines come
   first, and only the rest (plain entries, ``summarize`` outputs, activity records,
   earlier summaries) is summarized into ``summary``. ``count_only`` counters are
   compressor records, never folded: their counts stay where they are, and so do the
   last ``keepLast`` entries a counter names as kept (verbatim, where they were). The record's
   tokens (``kept`` included) count toward ``tokens_after`` like any entry's, and the
   cliff's estimate counts the kept lines as they are; when they carry the context
   over the target, the summary of the rest is made shorter to meet it (never below
   ``SUMMARY_FLOOR`` tokens; a target it cannot meet leaves the summary whole).
   ``covers`` lists the replaced keys compactly: an activity
   folded whole appears as its record key alone (the record's ``keys`` named what it
   wrote), other keys one by one; ``entries`` counts the HISTORY entries replaced; the
   exact list is the compress event's changes. (Rendering shows only ``kept`` and ``summary``; a
   flat list of thousands of keys would be tokens no model reads.) A fold that would
   not save tokens is not made, unless the message threshold fired and the fold
   leaves fewer HISTORY entries (the entry count is what that threshold limits).

Nothing changes when there is nothing to do: no snapshot, no event, a result with
``entries_affected == 0``; so compressing an already compressed HISTORY with the same
rules changes nothing. Otherwise: a snapshot first, then every change in one
``apply_changes`` event (note ``compress``) whose data carries the report.
``decompress`` restores HISTORY from that snapshot; the compressed version stays on
the tape.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from .attention import (
    COMPACTED,
    RECENT_ACTIVITIES,
    AttentionScore,
    CompressTriggerDetector,
    Scope,
    Segments,
    classify_tool_entries,
    is_compressed,
    is_compressor_record,
)
from .canonical import canonical_json, freeze, thaw
from .compress_rules import Judged, SummaryCache, apply_rules, counter_basis, counter_in_place, extract_paths
from .config import ActivityExtensionConfig, as_config
from .context import LayeredContext, entry_kind
from .errors import ContextKeyError
from .layers import Layer
from .markers import DELETED
from .similarity import near_duplicate_clusters, word_sets
from .summarize import Summarizer, as_summarizer, cut_to_tokens, value_text
from .tokens import count_text, count_value

__all__ = [
    "CompressResult",
    "after_activity",
    "DecompressResult",
    "EvaluateReport",
    "RuleDrivenCompressor",
    "decompress",
    "evaluate",
]

SUMMARY_MIN_TOKENS = 64
SUMMARY_MAX_TOKENS = 1024
SUMMARY_DEFAULT_TOKENS = 256
ENTRY_TEXT_TOKENS = 200  # each folded entry's text is cut to this before summarizing
SUMMARY_SHARE = 0.25  # a compaction summary is at most this share of the text it replaces
SUMMARY_FLOOR = 16  # no compaction summary is planned smaller than this
RECORD_OVERHEAD = 48  # tokens of a compaction record beyond its summary, covers and kept lines (upper bound)
KEPT_OVERHEAD = 4  # tokens of the "kept" field beyond its lines

_ATTENTION_FOLDS = frozenset({"density", "decay", "redundancy", "toolEfficiency"})

PrefixFn = Callable[[LayeredContext], Sequence[Mapping[str, str]]]


@dataclass(frozen=True)
class CompressResult:
    """What one compression did. ``ratio`` is tokens_after / tokens_before (1.0 when
    nothing changed; smaller is better); ``reduction`` is 1 - ratio."""

    tokens_before: int
    tokens_after: int
    ratio: float
    entries_affected: int
    snapshot_id: str | None
    triggers: list[str]
    attention_before: AttentionScore
    attention_after: AttentionScore
    missing_paths: dict[str, list[str]] = field(default_factory=dict)
    compaction_key: str | None = None
    target_tokens: int | None = None
    target_met: bool | None = None
    folded: list[str] = field(default_factory=list)
    dropped: list[str] = field(default_factory=list)
    rules: list[dict[str, Any]] = field(default_factory=list)
    event_seq: int | None = None
    source: str = "rules"
    notes: list[str] = field(default_factory=list)

    @property
    def reduction(self) -> float:
        return 1.0 - self.ratio

    # The seed's names (its CompressResult: beforeTokens, afterTokens, and compressionRatio
    # = 1 - after / before, the share saved, which is ``reduction`` here, not ``ratio``).
    @property
    def before_tokens(self) -> int:
        return self.tokens_before

    @property
    def after_tokens(self) -> int:
        return self.tokens_after

    @property
    def compression_ratio(self) -> float:
        return self.reduction

    # ... as the seed spells them
    beforeTokens = before_tokens
    afterTokens = after_tokens
    compressionRatio = compression_ratio

    @property
    def changed(self) -> bool:
        return self.entries_affected > 0

    def to_dict(self) -> dict[str, Any]:
        return {
            "tokens_before": self.tokens_before, "tokens_after": self.tokens_after, "ratio": self.ratio,
            "reduction": self.reduction, "entries_affected": self.entries_affected,
            "snapshot_id": self.snapshot_id, "triggers": list(self.triggers),
            "attention_before": self.attention_before.to_dict(), "attention_after": self.attention_after.to_dict(),
            "missing_paths": {k: list(v) for k, v in self.missing_paths.items()},
            "compaction_key": self.compaction_key, "target_tokens": self.target_tokens,
            "target_met": self.target_met, "folded": list(self.folded), "dropped": list(self.dropped),
            "rules": [dict(r) for r in self.rules], "event_seq": self.event_seq, "source": self.source,
            "notes": list(self.notes),
        }


@dataclass(frozen=True)
class _Directive:
    """A compression plan, checked: activity records to fold, keys to drop."""

    records: tuple[str, ...] = ()
    drop: tuple[str, ...] = ()
    keep_points: tuple[str, ...] = ()
    max_tokens: int | None = None


#: the latest finished activities the engine's compression (the hook after an activity, the
#: governance service) keeps whole: the next step reads what the activity just wrote
HOOK_KEEP_RECENT = 1


class RuleDrivenCompressor:
    """Compress a context's HISTORY (see the module doc for the algorithm).

    ``summarizer``: used by ``summarize`` rules and for compaction summaries; the
    offline ``ExtractiveSummarizer`` when ``None``. ``prefix``: a function giving the
    activity's normal request messages (the engine passes its renderer), handed to the
    summarizer so a model summary request shares the cached prefix. ``keep_recent``:
    the latest finished activities a cliff never folds: none for a compression asked
    for directly (all of HISTORY but the protected keys may fold), ``HOOK_KEEP_RECENT``
    in the engine's hook after an activity and its governance service, where the next
    step reads what the activity just wrote. ``summary_tokens``: the compaction
    summary budget (default: a quarter of the token target, within 64..1024; 256
    without a target). ``offline_keys``: keys whose values the summarizer may not read (the
    engine's model, for keys named like secrets): a ``summarize`` rule summarizes them offline.
    """

    def __init__(self, summarizer: Summarizer | None = None, *, keep_recent: int = 0,
                 recent_activities: int = RECENT_ACTIVITIES, prefix: PrefixFn | None = None,
                 summary_tokens: int | None = None, detector: CompressTriggerDetector | None = None,
                 offline_keys: Callable[[str], bool] | None = None) -> None:
        self.summarizer = as_summarizer(summarizer)
        self.offline_keys = offline_keys
        self.keep_recent = max(0, keep_recent)
        self.recent_activities = recent_activities
        self.prefix = prefix
        self.summary_tokens = summary_tokens
        self.detector = detector or CompressTriggerDetector(recent_activities=recent_activities)

    def compress(self, ctx: LayeredContext, config: ActivityExtensionConfig | Mapping[str, Any] | None = None, *,
                 actor: str = "compressor", triggers: Sequence[str] | None = None,
                 target_tokens: int | None = None, attention: AttentionScore | None = None) -> CompressResult:
        """Compress HISTORY. ``triggers``: the triggers that fired (detected here when
        ``None``); ``target_tokens``: compress at least down to this many tokens;
        ``attention``: the context's score as it is now, when the caller has it already
        (a detection just before), so it is not computed twice."""
        return self._run(ctx, as_config(config, source="compress"), actor=actor, triggers=triggers,
                         target_tokens=target_tokens, directive=None, attention=attention)

    def evaluate(self, ctx: LayeredContext, before_snapshot_id: "SnapshotRef | ConfigArg" = None,
                 config: ConfigArg = None) -> EvaluateReport:
        return evaluate(ctx, before_snapshot_id, config, recent_activities=self.recent_activities)

    def decompress(self, ctx: LayeredContext, snapshot_id: "SnapshotRef" = None, *,
                   actor: str = "compressor", source: LayeredContext | None = None) -> DecompressResult:
        return decompress(ctx, snapshot_id, actor=actor, source=source)

    # ----- the one algorithm ---------------------------------------------------------------

    def _run(self, ctx: LayeredContext, config: ActivityExtensionConfig, *, actor: str,
             triggers: Sequence[str] | None, target_tokens: int | None, directive: _Directive | None,
             source: str = "rules", attention: AttentionScore | None = None,
             scope: Scope | None = None) -> CompressResult:
        scope = scope if scope is not None else Scope.of(ctx, config)  # TypeError for no context
        enc = ctx.encoding
        before = attention if attention is not None else AttentionScore.of_scope(scope, recent_activities=self.recent_activities)
        if triggers is None:
            fired = list(self.detector.detect(ctx, config, attention=before).triggers)
        else:
            fired = list(triggers)
        # Engine bookkeeping (_mergedConflicts, _branch_id, ...) is read by the engine:
        # protected like preserved keys.
        protected = (scope.preserved | set(config.context_strategy.required_context)
                     | {e.key for e in scope.history if e.key.startswith("_")})
        working_tokens = sum(e.tokens for e in scope.working)
        original = [(e.key, e.value) for e in scope.history]
        # id(value) -> (value, tokens): the scope's counts, and those of the values the
        # rules and folds make, which the estimates below count again and again. Holding
        # the value keeps its id from being reused while the memo lives.
        known = {id(e.value): (e.value, e.tokens) for e in scope.history}

        def tok(value: Any) -> int:
            hit = known.get(id(value))
            if hit is not None and hit[0] is value:
                return hit[1]
            tokens = count_value(value, enc)
            known[id(value)] = (value, tokens)
            return tokens

        rules = config.effective_compress_rules
        counts = [0] * len(rules)
        prefix = self.prefix
        summarize = SummaryCache(self.summarizer, encoding=enc,
                                 prefix_messages=(lambda: prefix(ctx)) if prefix is not None else None,
                                 offline_keys=self.offline_keys)
        # Ownership is read before the rules run: a rule may remove activity records
        # (count_only on "activity:*"), and their entries still belong to them.
        seg = scope.segments
        judged: Judged = {}
        declined: dict[int, Mapping[str, Any]] = {}
        ruled = apply_rules(original, rules, protected=protected, summarize=summarize, encoding=enc, counts=counts,
                            judged=judged, tokens=tok, declined=declined)

        def rerule(pairs: list[tuple[str, Any]]) -> list[tuple[str, Any]]:
            """The rules on what a fold leaves (the verdicts on entries the first run saw are remembered)."""
            return list(apply_rules(pairs, rules, protected=protected, summarize=summarize, encoding=enc,
                                    counts=counts, judged=judged, tokens=tok).items)
        items = list(ruled.items)
        row_kept = _rows_kept(items, rules)
        # what a count_only rule keeps (the last keepLast of its entries) is the rule's point: the
        # folds below leave those entries where they are, as they leave the counter
        folds_protect = protected | _count_kept(items)
        missing = {k: list(v) for k, v in ruled.missing_paths.items()}
        ruled_tokens = sum(tok(v) for _, v in items) + working_tokens

        # Hysteresis: attention scores may stay across their threshold after a cliff (a
        # density target out of reach, say); folding again after every activity would
        # be a sliding window. Attention-driven folds wait until the scope has grown
        # back to tokens_after / ratio of the latest compaction.
        last = _last_compaction_tokens(items)
        ratio = config.context_strategy.compress_target_ratio
        acting = [t for t in fired if t not in _ATTENTION_FOLDS or last is None or scope.tokens * ratio >= last]
        target, entry_target, soft = self._targets(config, acting, scope, target_tokens)
        if directive is not None:
            chosen, dropped = self._directed(items, seg, directive, folds_protect)
        else:
            chosen = self._remedies(items, seg, scope, acting, folds_protect)
            chosen, target = self._cliff(items, seg, chosen, folds_protect, target, entry_target, soft, working_tokens,
                                         tok, enc, kept=row_kept)
            dropped = []
        budget = self._budget(directive, target)

        # The record names the snapshot taken just before it is written; predict that id
        # (as LayeredContext mints it) so the token guard below counts the real record.
        predicted_id = ctx.next_snapshot_id
        record: dict[str, Any] | None = None
        compaction_key: str | None = None
        final = items
        unfolded = items
        if chosen or dropped:
            final, record, compaction_key = self._fold(items, seg, chosen, dropped, directive, budget, summarize,
                                                       rerule, tok, working_tokens, scope.tokens, enc, predicted_id,
                                                       target=target, rows_kept=row_kept)
            after = sum(tok(v) for _, v in final) + working_tokens
            if chosen and dropped:
                unfolded = self._fold(items, seg, [], dropped, directive, budget, summarize, rerule, tok,
                                      working_tokens, scope.tokens, enc, predicted_id, rows_kept=row_kept)[0]
            # A fold must save tokens, except one the message threshold asked for: there the
            # number of HISTORY entries is what the designer limits, and a few tiny entries
            # folded into one record may cost a token or two more.
            saves_entries = entry_target is not None and len(final) < len(items)
            if chosen and after >= ruled_tokens and not saves_entries:  # would not save tokens: do not make it
                chosen = []
                if dropped:
                    final, record, compaction_key = self._fold(items, seg, [], dropped, directive, budget, summarize,
                                                               rerule, tok, working_tokens, scope.tokens, enc,
                                                               predicted_id, rows_kept=row_kept)
                else:
                    final, record, compaction_key = items, None, None

        changes = _diff(original, final, tok)
        if not changes:
            return CompressResult(tokens_before=scope.tokens, tokens_after=scope.tokens, ratio=1.0,
                                  entries_affected=0, snapshot_id=None, triggers=fired, attention_before=before,
                                  attention_after=before, missing_paths=missing, target_tokens=target,
                                  target_met=_met(scope.tokens, len(original), target, entry_target),
                                  rules=_rule_report(rules, counts, declined), source=source,
                                  notes=self._unmet(seg, target, scope.tokens, entry_target, len(original)))

        snap = ctx.snapshot(label="before compress", actor=actor)
        if record is not None and compaction_key is not None and snap.id != predicted_id:
            rest = sum(tok(v) for k, v in final if k != compaction_key) + working_tokens
            record = _finish_record(record, snap.id, scope.tokens, rest, enc)
            final = [(k, record if k == compaction_key else v) for k, v in final]
            if sum(tok(v) for _, v in final) + working_tokens >= ruled_tokens and not (
                    entry_target is not None and len(final) < len(items)):
                final, record, compaction_key, chosen = unfolded, None, None, []
            changes = _diff(original, final, tok)
        folded_set = set(chosen) | (set(record["covers"]) if record is not None else set())
        remaining = {k for k, _ in final}
        folded = [k for k, _ in original if k in folded_set and k not in remaining]
        report = {"triggers": fired, "snapshot_id": snap.id, "tokens_before": scope.tokens,
                  "entries_affected": len(changes), "compaction_key": compaction_key, "target_tokens": target,
                  "folded": len(folded), "dropped": list(dropped), "source": source,
                  "attention_before": before.to_dict(),
                  **({"rules_declined": [{"pattern": rules[n].pattern, "action": rules[n].action, **dict(d)}
                                         for n, d in sorted(declined.items())]} if declined else {})}
        changes, counted = _frozen_counted(changes, tok)
        event = ctx.apply_changes(changes, kind="compress", actor=actor, tokens=counted,
                                  data={**report, "tokens_after": sum(tok(v) for _, v in final) + working_tokens})
        tokens_after = ctx.tokens(Layer.HISTORY) + ctx.tokens(Layer.WORKING)
        after_score = AttentionScore.compute(ctx, config, recent_activities=self.recent_activities)
        return CompressResult(
            tokens_before=scope.tokens, tokens_after=tokens_after,
            ratio=tokens_after / scope.tokens if scope.tokens else 1.0, entries_affected=len(changes),
            snapshot_id=snap.id, triggers=fired, attention_before=before, attention_after=after_score,
            missing_paths=missing, compaction_key=compaction_key, target_tokens=target,
            target_met=_met(tokens_after, len(ctx.layer(Layer.HISTORY)), target, entry_target),
            folded=folded, dropped=list(dropped), rules=_rule_report(rules, counts, declined), event_seq=event.seq,
            source=source, notes=[*self._unmet(seg, target, tokens_after, entry_target, len(ctx.layer(Layer.HISTORY))),
                                  *_grew(record is not None, scope.tokens, tokens_after, len(original),
                                         len(ctx.layer(Layer.HISTORY))),
                                  *_declined(rules, declined, original, folded)])

    def _unmet(self, seg: Segments, target: int | None, tokens: int, entry_target: int | None = None,
               entries: int = 0) -> list[str]:
        """Why a token or entry target was not met: without it a caller sees ``target_met: false``
        and cannot tell by how much, nor what would help."""
        kept = [key.split(":", 1)[-1] for key in seg.records if key in seg.recent(self.keep_recent)]
        why = (f"the latest finished activit{'y' if len(kept) == 1 else 'ies'} ({', '.join(kept)}) "
               f"{'is' if len(kept) == 1 else 'are'} kept whole, " if kept else "")
        notes = []
        if entry_target is not None and entries > entry_target:
            notes.append(f"target of {entry_target} HISTORY entr{'y' if entry_target == 1 else 'ies'} not met "
                         f"({entries} entries after, {entries - entry_target} over): {why}preserved keys, keys no "
                         f"activity wrote and what count_only keeps are never folded, and what is folded becomes "
                         f"one compaction record; raise compressMessageThreshold (or compressTargetRatio) to a "
                         f"count the kept entries fit in")
        if target is not None and tokens > target:
            notes.append(f"target of {target} tokens not met ({tokens} tokens after): {why}preserved keys, the open "
                         f"activity's WORKING, keys no activity wrote and what count_only keeps are never folded; add "
                         f"compress_rules (extract_keys, summarize, count_only) to shrink what stays")
        return notes

    def _targets(self, config: ActivityExtensionConfig, fired: Sequence[str], scope: Scope,
                 target_tokens: int | None) -> tuple[int | None, int | None, list[int]]:
        """Hard token target, entry target, and the density targets (best first), which
        apply only when reachable (see ``_cliff``)."""
        ratio = config.context_strategy.compress_target_ratio
        targets: list[int] = []
        if target_tokens is not None:
            targets.append(max(0, int(target_tokens)))
        limit = config.effective_token_threshold
        if "token_threshold" in fired and limit:
            targets.append(int(ratio * limit))
        soft: list[int] = []
        if "density" in fired:
            threshold = config.effective_attention_thresholds.density
            pinned = sum(e.tokens for e in scope.entries if e.key in scope.preserved)
            if threshold > 0 and pinned:
                # density lands at threshold / ratio, or at least just across the threshold
                soft = [int(pinned * ratio / threshold), int(pinned / threshold)]
        entry_target = None
        messages = config.effective_message_threshold
        if "message_threshold" in fired and messages:
            entry_target = max(1, int(ratio * messages))
        return (min(targets) if targets else None), entry_target, soft

    def _remedies(self, items: list[tuple[str, Any]], seg: Segments, scope: Scope, fired: Sequence[str],
                  protected: frozenset[str] | set[str]) -> list[str]:
        keep = seg.recent(self.keep_recent)

        def foldable(key: str) -> bool:
            owner = seg.owner.get(key)
            return key not in protected and owner is not None and owner != COMPACTED and owner not in keep

        chosen: dict[str, None] = {}
        if "redundancy" in fired:
            pool = [(k, v) for k, v in items if not is_compressed(k, v)]
            in_history = len(pool)
            pool += [(e.key, e.value) for e in scope.working if not is_compressed(e.key, e.value)]
            labels = near_duplicate_clusters(word_sets(pool)).labels
            newest: dict[int, int] = {}
            for i, label in enumerate(labels):
                if label is not None:
                    newest[label] = i
            for i, label in enumerate(labels[:in_history]):
                if label is not None and newest[label] != i and foldable(pool[i][0]):
                    chosen.setdefault(pool[i][0], None)
        if "toolEfficiency" in fired:
            tools = classify_tool_entries(items)
            for key in (*tools.useless, *tools.pending):
                if foldable(key):
                    chosen.setdefault(key, None)
        if "decay" in fired and len(seg.records) > self.recent_activities:
            old = set(seg.records[:-self.recent_activities]) if self.recent_activities else set(seg.records)
            for k, _ in items:
                if seg.owner.get(k) in old and foldable(k):
                    chosen.setdefault(k, None)
        return list(chosen)

    def _cliff(self, items: list[tuple[str, Any]], seg: Segments, chosen: list[str],
               protected: frozenset[str] | set[str],
               target: int | None, entry_target: int | None, soft: Sequence[int], working_tokens: int,
               tok: Callable[[Any], int], enc: str, *,
               kept: frozenset[str] = frozenset()) -> tuple[list[str], int | None]:
        """Fold oldest activities until the targets are met; the effective token target.

        A density target that folding every foldable activity could not reach is dropped
        (folding everything for a share that stays out of reach would only empty HISTORY);
        the next one, just across the threshold, is tried instead.
        """
        keep = seg.recent(self.keep_recent)
        by_owner: dict[str, list[str]] = {}
        for k, _ in items:
            owner = seg.owner.get(k)
            if owner is not None and owner != COMPACTED and k not in protected:
                by_owner.setdefault(owner, []).append(k)
        foldable_records = [r for r in seg.records if r not in keep]
        est = _Estimate(items, working_tokens, tok, enc, kept)
        for key in chosen:
            est.add(key)
        if soft:
            floor = est.copy()
            for record_key in foldable_records:
                for key in by_owner.get(record_key, ()):
                    floor.add(key, listed=key == record_key or record_key not in floor.sizes)
            low = floor.tokens(self._budget(None, min([*soft, *([target] if target is not None else [])])))
            reachable = [t for t in soft if t >= low]
            if reachable:
                target = min(target, reachable[0]) if target is not None else reachable[0]
        if target is None and entry_target is None:
            return list(est.picked), None
        budget = self._budget(None, target)

        def met() -> bool:
            return (target is None or est.tokens(budget) <= target) and (
                entry_target is None or est.entries() <= entry_target)

        for record_key in foldable_records:  # oldest first
            if met():
                break
            for key in by_owner.get(record_key, ()):
                est.add(key, listed=key == record_key or record_key not in est.sizes)
        return list(est.picked), target

    def _budget(self, directive: _Directive | None, target: int | None) -> int:
        """Tokens of the compaction summary."""
        if directive is not None and directive.max_tokens:
            return directive.max_tokens
        if self.summary_tokens:
            return self.summary_tokens
        if target:
            return min(SUMMARY_MAX_TOKENS, max(SUMMARY_MIN_TOKENS, target // 4))
        return SUMMARY_DEFAULT_TOKENS

    @staticmethod
    def _directed(items: list[tuple[str, Any]], seg: Segments, directive: _Directive,
                  protected: frozenset[str] | set[str]) -> tuple[list[str], list[str]]:
        wanted = set(directive.records)
        chosen = [k for k, v in items if seg.owner.get(k) in wanted and k not in protected
                  and not is_compressor_record(k, v)]
        present = {k for k, _ in items}
        dropped = [k for k in directive.drop if k in present and k not in protected and k not in set(chosen)]
        return chosen, dropped

    def _fold(self, items: list[tuple[str, Any]], seg: Segments, chosen: Sequence[str], dropped: Sequence[str],
              directive: _Directive | None, budget: int, summarize: SummaryCache,
              rerule: Callable[[list[tuple[str, Any]]], list[tuple[str, Any]]], tok: Callable[[Any], int],
              working_tokens: int, tokens_before: int, enc: str, snapshot_id: str, *,
              target: int | None = None,
              rows_kept: frozenset[str] = frozenset()) -> tuple[list[tuple[str, Any]], dict[str, Any] | None, str | None]:
        gone = set(chosen) | set(dropped)
        values = dict(items)
        compactions = [k for k, _ in items if k.startswith("compaction:")] if chosen else []
        gone |= set(compactions)
        rest = rerule([(k, v) for k, v in items if k not in gone])
        if not chosen:
            return rest, None, None
        lines: list[str] = []
        # what the rules kept is carried as it is; only the rest is summarized
        kept: list[str] = []
        for key in compactions:
            value = values[key]
            kept += _kept_of(value)
            if isinstance(value, dict) and isinstance(value.get("summary"), str) and value["summary"]:
                lines.append(value["summary"])
        chosen_set = set(chosen)
        for key, value in items:
            if key not in chosen_set:
                continue
            if _rule_kept(value) or key in rows_kept:
                kept.append(_kept_line(key, value))
                continue
            if entry_kind(key, value) == "activity" and isinstance(value, dict):
                name, said = str(value.get("activity", key)), str(value.get("summary", ""))
                line = said if said.startswith(name) else f"{name} {value.get('status', '')}: {said}"
            else:
                line = f"{key}: " + "; ".join(value_text(value).splitlines())
            lines.append(cut_to_tokens(line, ENTRY_TEXT_TOKENS, enc))
        text = "\n".join(lines)
        owner = seg.owner
        # a key whose record folds with it is implied by that record
        covers = [*compactions, *(k for k, _ in items
                                  if k in chosen_set and (owner.get(k) == k or owner.get(k) not in chosen_set))]
        rest_tokens = sum(tok(v) for _, v in rest) + working_tokens

        def record_of(summary: str) -> dict[str, Any]:
            if directive is not None and directive.keep_points:
                summary = "\n".join([*(f"- {p}" for p in directive.keep_points), summary]).strip()
            record: dict[str, Any] = {"kind": "compaction", **({"kept": kept} if kept else {}), "summary": summary,
                                      "covers": covers, "entries": len(compactions) + len(chosen_set),
                                      "snapshot_id": snapshot_id, "tokens_before": tokens_before, "tokens_after": 0}
            if dropped:
                record["dropped"] = list(dropped)
            return _finish_record(record, snapshot_id, tokens_before, rest_tokens, enc)

        size = _fit_budget(budget, count_text(text, enc))
        summary = summarize(text, size) if text else ""
        record = record_of(summary)
        # The kept lines are what the designer asked for: when they carry the context over the
        # target, the summary of the rest makes room for them, if a summary of at least
        # SUMMARY_FLOOR tokens can (else the target is out of reach and the summary stays whole).
        if kept and text and target is not None and record["tokens_after"] > target:
            room = size - (record["tokens_after"] - target)
            for _ in range(3):  # the JSON of a shorter summary may cost a token more or less
                if room < SUMMARY_FLOOR or room >= size:
                    break
                size = room
                shorter = record_of(summarize(text, size))
                record = shorter
                if shorter["tokens_after"] <= target:
                    break
                room = size - (shorter["tokens_after"] - target)
        key = _next_compaction_key(items)
        return [*rest, (key, record)], record, key


def _grew(folded: bool, before: int, after: int, entries_before: int, entries_after: int) -> list[str]:
    """A cliff the message threshold asked for may fold tiny entries into a record that costs
    more tokens than they did (the entry count is what it limits): say so rather than let a
    compression grow the context silently."""
    if not folded or after <= before:
        return []
    fewer = entries_before - entries_after
    return [f"the message-threshold cliff made HISTORY {fewer} entr{'y' if fewer == 1 else 'ies'} shorter "
            f"({entries_before} -> {entries_after}) but {after - before} tokens larger ({before} -> {after}): "
            f"the compaction record costs more than the tiny entries it folds; raise compressMessageThreshold "
            f"or use compressTokenThreshold to limit tokens"]


def _fit_budget(budget: int, input_tokens: int) -> int:
    """The summary budget for ``input_tokens`` of folded text: ``budget``, but at most
    ``SUMMARY_SHARE`` of the input (at least ``SUMMARY_FLOOR`` tokens)."""
    return max(SUMMARY_FLOOR, min(budget, int(input_tokens * SUMMARY_SHARE)))


class _Estimate:
    """Tokens and entries of HISTORY + WORKING if the picked keys were folded into one
    compaction record (with every earlier compaction record merged into it). The
    record's size is an upper bound: overhead + covers + kept lines + min(budget, input),
    where input is the text to summarize (what the rules kept is carried, not summarized)."""

    def __init__(self, items: Sequence[tuple[str, Any]], working_tokens: int, tok: Callable[[Any], int],
                 enc: str, rows_kept: frozenset[str] = frozenset()) -> None:
        self.rows_kept = rows_kept
        self.sizes = {k: tok(v) for k, v in items}
        self.values = dict(items)
        self.enc = enc
        self.base = sum(self.sizes.values()) + working_tokens
        self.count = len(items)
        self.picked: dict[str, None] = {}
        self.removed = self.input = self.covers = self.kept = 0
        self.merged = 0
        self.merged_removed = self.merged_input = self.merged_covers = self.merged_kept = 0
        for k, v in items:
            if k.startswith("compaction:"):
                self.merged += 1
                self.merged_removed += self.sizes[k]
                summary = v.get("summary") if isinstance(v, dict) else None
                self.merged_input += count_text(summary, enc) if isinstance(summary, str) else 0
                self.merged_covers += _covers_tokens(k, enc)
                self.merged_kept += sum(_covers_tokens(line, enc) for line in _kept_of(v))

    def copy(self) -> _Estimate:
        other = object.__new__(_Estimate)
        other.__dict__.update(self.__dict__)
        other.picked = dict(self.picked)
        return other

    def add(self, key: str, *, listed: bool = True) -> None:
        """Pick ``key``; ``listed``: it appears in ``covers`` (not implied by its folded record)."""
        if key in self.picked:
            return
        self.picked[key] = None
        self.removed += self.sizes[key]
        value = self.values[key]
        if _rule_kept(value) or key in self.rows_kept:
            self.kept += _covers_tokens(_kept_line(key, value), self.enc)
        else:
            self.input += min(ENTRY_TEXT_TOKENS, self.sizes[key])
        if listed:
            self.covers += _covers_tokens(key, self.enc)

    def tokens(self, budget: int) -> int:
        if not self.picked:
            return self.base
        kept = self.kept + self.merged_kept
        record = (RECORD_OVERHEAD + self.covers + self.merged_covers + (kept + KEPT_OVERHEAD if kept else 0)
                  + _fit_budget(budget, self.input + self.merged_input))
        return self.base - self.removed - self.merged_removed + record

    def entries(self) -> int:
        return self.count - len(self.picked) - self.merged + 1 if self.picked else self.count


@functools.lru_cache(maxsize=1 << 14)
def _covers_tokens(key: str, enc: str) -> int:
    """Tokens a string adds to a list of a record (a key to ``covers``, a line to ``kept``: the
    same ones, compression after compression)."""
    return count_text(json.dumps(key), enc) + 1


def _rule_kept(value: Any) -> bool:
    """An ``extract_keys`` output: what the designer asked to keep of the entry."""
    return isinstance(value, dict) and value.get("_compressed") == "extract_keys"


def _rows_kept(items: Sequence[tuple[str, Any]], rules: Sequence[Any]) -> frozenset[str]:
    """The entries that are lists of rows an ``extract_keys`` rule of this compression reduced (the
    rule leaves them as they are now): a list has no field for the ``_compressed`` marker a reduced
    object carries, so a fold knows them by the rule, and carries them in ``kept`` as it does the
    objects."""
    paths = [r for r in rules if r.action == "extract_keys" and r.extract_keys]
    return frozenset(k for k, v in items if isinstance(v, list) and any(
        r.matches(entry_kind(k, v), k) and extract_paths(v, r.extract_keys)[0] == v for r in paths))


def _count_kept(items: Sequence[tuple[str, Any]]) -> set[str]:
    """The entries ``count_only`` counters keep where they were (their last ``keepLast``: verbatim,
    summarized or extracted)."""
    return {key for _, v in items if isinstance(v, dict) and v.get("_compressed") == "count_only"
            for key in counter_in_place(v)}


def _kept_line(key: str, value: Any) -> str:
    """A folded rule output as a line of the record's ``kept``: every value it holds, uncut."""
    return f"{key}: " + "; ".join(value_text(value).splitlines())


def _kept_of(record: Any) -> list[str]:
    """The ``kept`` lines of an earlier compaction record (none before records had them)."""
    kept = record.get("kept") if isinstance(record, dict) else None
    return [line for line in kept if isinstance(line, str)] if isinstance(kept, list) else []


def _finish_record(record: dict[str, Any], snapshot_id: str, tokens_before: int, rest: int, enc: str) -> dict[str, Any]:
    """Fill in snapshot id and token counts; ``tokens_after`` counts the record itself."""
    out = {**record, "snapshot_id": snapshot_id, "tokens_before": tokens_before}
    after = rest
    for _ in range(6):
        out["tokens_after"] = after
        total = rest + count_value(out, enc)
        if total == after:
            break
        after = total
    return out


def _last_compaction_tokens(items: Sequence[tuple[str, Any]]) -> int | None:
    """``tokens_after`` of the newest ``compaction:<n>`` record, if any."""
    best: tuple[int, int] | None = None
    for k, v in items:
        tail = k.split(":", 1)[1] if k.startswith("compaction:") else ""
        if tail.isdigit() and isinstance(v, dict) and isinstance(v.get("tokens_after"), int):
            if best is None or int(tail) > best[0]:
                best = (int(tail), v["tokens_after"])
    return best[1] if best else None


def _next_compaction_key(items: Sequence[tuple[str, Any]]) -> str:
    highest = 0
    for k, _ in items:
        if k.startswith("compaction:"):
            tail = k.split(":", 1)[1]
            if tail.isdigit():
                highest = max(highest, int(tail))
    return f"compaction:{highest + 1}"


def _diff(original: Sequence[tuple[str, Any]], final: Sequence[tuple[str, Any]],
          tok: Callable[[Any], int]) -> list[tuple[Layer, str, Any]]:
    new = dict(final)
    changes: list[tuple[Layer, str, Any]] = [(Layer.HISTORY, k, DELETED) for k, _ in original if k not in new]
    old = dict(original)
    for k, v in final:
        o = old.get(k, DELETED)
        # the token counts are known: values that differ in tokens differ in text
        if o is DELETED or (o is not v and (tok(o) != tok(v) or canonical_json(o) != canonical_json(v))):
            changes.append((Layer.HISTORY, k, v))
    return changes


def _frozen_counted(changes: list[tuple[Layer, str, Any]],
                    tok: Callable[[Any], int]) -> tuple[list[tuple[Layer, str, Any]], dict[int, int]]:
    """The changes with their values frozen, and the token counts the compressor made of them (by
    ``id`` of the frozen values, alive in the changes): ``apply_changes`` freezes a value it is
    given (a copy) and counts it again. A frozen copy has the canonical text of its value, so the
    same count. A value that does not freeze is passed on as it is, for ``apply_changes`` to refuse."""
    out: list[tuple[Layer, str, Any]] = []
    counted: dict[int, int] = {}
    for layer, key, value in changes:
        if value is not DELETED:
            try:
                frozen = freeze(value)
            except (TypeError, ValueError):
                frozen = value
            else:
                counted[id(frozen)] = tok(value)
            value = frozen
        out.append((layer, key, value))
    return out, counted


def _met(tokens: int, entries: int, target: int | None, entry_target: int | None) -> bool | None:
    if target is None and entry_target is None:
        return None
    return (target is None or tokens <= target) and (entry_target is None or entries <= entry_target)


def _rule_report(rules: Sequence[Any], counts: Sequence[int],
                 declined: Mapping[int, Mapping[str, Any]] | None = None) -> list[dict[str, Any]]:
    return [{"pattern": r.pattern, "action": r.action, "entries": n,
             **({"declined": dict(declined[i])} if declined and i in declined else {})}
            for i, (r, n) in enumerate(zip(rules, counts))]


def _declined(rules: Sequence[Any], declined: Mapping[int, Mapping[str, Any]], original: Sequence[tuple[str, Any]],
              folded: Sequence[str]) -> list[str]:
    """A ``count_only`` rule that made no counter (it would have cost more than it saved) leaves its
    entries to the cliff, another strategy than the config asked for: say so, and what the fold took."""
    out = []
    gone = set(folded)
    for n, d in sorted(declined.items()):
        took = [k for k, v in original if k in gone and rules[n].matches(entry_kind(k, v), k)]
        fate = (f"the cliff folded {len(took)} of its entries into the compaction summary instead (the ones "
                "keepLast names too: only a counter keeps them out of a fold; preserveKeys keeps entries whole)"
                if took else "its entries stay as they are")
        out.append(f"{d['reason']} (a rule never makes HISTORY bigger); {fate}")
    return out


def after_activity(ctx: LayeredContext, config: ActivityExtensionConfig | None, *, actor: str = "compressor",
                   compressor: RuleDrivenCompressor | None = None) -> CompressResult | None:
    """The engine's hook after every completed activity: detect, and compress when a
    trigger fired. ``None`` when nothing fired or the compression changed nothing.

    Cheap when nothing can fire: the token and message triggers come from the layer
    totals (O(1)), and the attention scores are computed only when the scope has
    reached the detector's floor (``compressTargetRatio`` x ``compressTokenThreshold``):
    under it no attention trigger fires, so ``detect`` would give the same triggers.
    An activity whose config asks for no compression (no threshold, attention
    thresholds or rules: ``compression_configured``) fires nothing.
    """
    if config is None or not config.compression_configured:
        return None
    compressor = compressor or RuleDrivenCompressor(keep_recent=HOOK_KEEP_RECENT)
    detector = compressor.detector
    fired, tokens = detector.size_triggers(ctx, config)
    attention: AttentionScore | None = None
    scope: Scope | None = None
    if tokens >= detector.floor(config):
        scope = Scope.of(ctx, config)
        decision = detector.decide(scope, config)
        fired, attention = decision.triggers, decision.attention
    if not fired:
        return None
    result = compressor._run(ctx, config, actor=actor, triggers=fired, target_tokens=None, directive=None,
                             attention=attention, scope=scope)
    return result if result.changed else None


# ----- evaluate and decompress -----------------------------------------------------------------


@dataclass(frozen=True)
class EvaluateReport:
    """A compression's effect: the context as that compression left it (``after_seq``: the
    sequence number of its event; of the context's last event for a snapshot no compression
    took) against the snapshot taken before it; ``changed_preserved_since``: the preserved keys
    changed after it."""

    snapshot_id: str
    tokens_before: int
    tokens_after: int
    ratio: float
    attention_before: AttentionScore
    attention_after: AttentionScore
    preserved_intact: bool
    changed_preserved: list[str]
    checked_preserved: list[str]
    after_seq: int | None = None
    # preserved keys the compression left that changed after it (an activity, an operator's
    # inject): none of the compression's doing, but no longer what it kept
    changed_preserved_since: list[str] = field(default_factory=list)

    @property
    def reduction(self) -> float:
        return 1.0 - self.ratio

    @property
    def density_gain(self) -> float:
        return self.attention_after.density - self.attention_before.density

    def to_dict(self) -> dict[str, Any]:
        return {"snapshot_id": self.snapshot_id, "tokens_before": self.tokens_before,
                "tokens_after": self.tokens_after, "ratio": self.ratio, "reduction": self.reduction,
                "attention_before": self.attention_before.to_dict(),
                "attention_after": self.attention_after.to_dict(),
                "preserved_intact": self.preserved_intact, "changed_preserved": list(self.changed_preserved),
                "checked_preserved": list(self.checked_preserved), "after_seq": self.after_seq,
                "changed_preserved_since": list(self.changed_preserved_since)}


ConfigArg = ActivityExtensionConfig | Mapping[str, Any] | None
#: what names the compression to evaluate or undo: its snapshot id, its ``CompressResult``, or
#: ``None`` for the latest compression of the context
SnapshotRef = str | CompressResult | None


def latest_compression(ctx: LayeredContext) -> str | None:
    """The snapshot id of the latest compression on ``ctx``'s tape, ``None`` when none ran."""
    for event in reversed(ctx.tape):
        sid = event.data.get("snapshot_id")
        if event.data.get("note") == "compress" and isinstance(sid, str):
            return sid
    return None


def _snapshot_of(ctx: LayeredContext, ref: object, op: str) -> str:
    if isinstance(ref, CompressResult):
        if ref.snapshot_id is None:
            raise ContextKeyError(f"cannot {op}: that compression changed nothing (no snapshot was taken)")
        return ref.snapshot_id
    if isinstance(ref, str):
        return ref
    if ref is None:
        sid = latest_compression(ctx)
        if sid is None:
            raise ContextKeyError(f"cannot {op}: no compression ran on context {ctx.name!r}; compress first, "
                                  "or pass the snapshot_id to compare with")
        return sid
    raise TypeError(f"{op}: pass the snapshot_id of a CompressResult (a str), the CompressResult itself, or "
                    f"nothing for the latest compression; got {type(ref).__name__}")


def evaluate(ctx: LayeredContext, before_snapshot_id: SnapshotRef | ConfigArg = None,
             config: ConfigArg = None, *,
             recent_activities: int = RECENT_ACTIVITIES) -> EvaluateReport:
    """Tokens and attention scores before (the snapshot) vs right after the compression that took
    it, and whether every preserved key in HISTORY or WORKING before is still there with
    byte-identical canonical JSON (a key that moved between the two layers still counts as intact).
    The context after is rebuilt from the tape up to the compression's event, as ``replay`` does:
    what ran since (an activity, an operator's inject, a later compression) is no effect of this
    one. A snapshot no compression took is compared with the context now.

    ``before_snapshot_id`` may be a ``CompressResult``, or left out for the latest
    compression; ``evaluate(ctx, config)`` is that too, with the config."""
    if isinstance(before_snapshot_id, (Mapping, ActivityExtensionConfig)):
        if config is not None:
            raise TypeError("evaluate: pass the config once; the second argument is the snapshot_id of the "
                            "compression to evaluate (or its CompressResult)")
        before_snapshot_id, config = None, before_snapshot_id
    snap = ctx.get_snapshot(_snapshot_of(ctx, before_snapshot_id, "evaluate"))
    config = as_config(config, source="evaluate")
    then = Scope.of(snap, config)
    made = next((e for e in ctx.tape.since(snap.seq + 1)
                 if e.data.get("note") == "compress" and e.data.get("snapshot_id") == snap.id), None)
    after = ctx if made is None or made.seq == ctx.tape[-1].seq else LayeredContext.replay(
        ctx.tape, until=made.seq, name=ctx.name, encoding=ctx.encoding)
    now = Scope.of(after, config)
    pinned = then.preserved | now.preserved
    old = {e.key: e.value for e in then.entries if e.key in pinned}
    new = {e.key: e.value for e in now.entries if e.key in pinned}
    changed = _changed(old, new)
    since: list[str] = []
    if after is not ctx:  # what became of them since, by the activities and operators after it
        current = Scope.of(ctx, config)
        since = _changed(new, {e.key: e.value for e in current.entries if e.key in pinned | current.preserved})
    return EvaluateReport(
        snapshot_id=snap.id, tokens_before=then.tokens, tokens_after=now.tokens,
        ratio=now.tokens / then.tokens if then.tokens else 1.0,
        attention_before=AttentionScore.of_scope(then, recent_activities=recent_activities),
        attention_after=AttentionScore.of_scope(now, recent_activities=recent_activities),
        preserved_intact=not changed, changed_preserved=changed, checked_preserved=sorted(old),
        after_seq=made.seq if made is not None else (ctx.tape[-1].seq if len(ctx.tape) else None),
        changed_preserved_since=since)


def _changed(old: Mapping[str, Any], new: Mapping[str, Any]) -> list[str]:
    """The keys of ``old`` that ``new`` lacks or holds with other canonical JSON, sorted."""
    return sorted(k for k, v in old.items() if k not in new or canonical_json(new[k]) != canonical_json(v))


@dataclass(frozen=True)
class DecompressResult:
    snapshot_id: str
    tokens_before: int
    tokens_after: int
    event_seq: int

    def to_dict(self) -> dict[str, Any]:
        return {"snapshot_id": self.snapshot_id, "tokens_before": self.tokens_before,
                "tokens_after": self.tokens_after, "event_seq": self.event_seq}


def decompress(ctx: LayeredContext, snapshot_id: SnapshotRef = None, *, actor: str = "compressor",
               source: LayeredContext | None = None) -> DecompressResult:
    """Undo the compression that took ``snapshot_id``: HISTORY as it was in that snapshot (one
    restore event; the compressed version stays on the tape, so a later ``restore`` can bring it
    back too), plus what HISTORY gained or changed since the compression (the activities that ran
    after it, a later compression), re-applied in one more event: undoing a compression drops
    nothing written after it. A snapshot no compression took is restored as it is.
    ``snapshot_id`` may be the ``CompressResult``, or left out for the latest compression.

    ``source``: the context the compression ran in, when it is not ``ctx`` (a parallel branch
    that compressed, then was merged into ``ctx`` at its join): what that compression changed in
    HISTORY and ``ctx`` still holds as the compression left it is put back as it was before it."""
    if source is not None and source is not ctx:
        return _decompress_merged(ctx, source, _snapshot_of(source, snapshot_id, "decompress"), actor)
    snapshot_id = _snapshot_of(ctx, snapshot_id, "decompress")
    try:
        snap = ctx.get_snapshot(snapshot_id)
    except ContextKeyError as exc:
        raise ContextKeyError(f"cannot decompress: {exc}; pass the snapshot_id of a CompressResult") from None
    since = _history_since_compression(ctx, snap)
    before = ctx.tokens(Layer.HISTORY) + ctx.tokens(Layer.WORKING)
    event = ctx.restore(snapshot_id, layers=[Layer.HISTORY], actor=actor, note="decompress")
    restored = ctx.layer(Layer.HISTORY)
    changes = [(Layer.HISTORY, k, v) for k, v in since if not (v is DELETED and k not in restored)]
    if changes:
        event = ctx.apply_changes(changes, kind="decompress", actor=actor,
                                  data={"snapshot_id": snapshot_id, "kept": [k for _, k, _ in changes]})
    after = ctx.tokens(Layer.HISTORY) + ctx.tokens(Layer.WORKING)
    return DecompressResult(snapshot_id=snapshot_id, tokens_before=before, tokens_after=after, event_seq=event.seq)


def _decompress_merged(ctx: LayeredContext, source: LayeredContext, snapshot_id: str, actor: str) -> DecompressResult:
    try:
        snap = source.get_snapshot(snapshot_id)
    except ContextKeyError as exc:
        raise ContextKeyError(f"cannot decompress: {exc}; pass the snapshot_id of a CompressResult") from None
    event = next((e for e in reversed(source.tape)
                  if e.data.get("note") == "compress" and e.data.get("snapshot_id") == snap.id), None)
    if event is None:
        raise ContextKeyError(f"cannot decompress into {ctx.name!r}: snapshot {snapshot_id!r} of context "
                              f"{source.name!r} was taken by no compression; pass the snapshot_id of a CompressResult")
    left: dict[str, Any] = {}  # what the compression left in HISTORY, key by key (its last change wins)
    for layer, key, value in event.changes:
        if layer == Layer.HISTORY:
            left[key] = value
    before, now = snap.layer(Layer.HISTORY), ctx.layer(Layer.HISTORY)

    def same(a: Any, b: Any) -> bool:
        if a is DELETED or b is DELETED:
            return a is b
        # a counter the join told which of its kept entries another branch folded is still this count
        return a is b or canonical_json(counter_basis(thaw(a))) == canonical_json(counter_basis(thaw(b)))

    # a key changed since (or that the join took from another branch) keeps its value
    changes = [(Layer.HISTORY, key, before.get(key, DELETED)) for key, value in left.items()
               if same(now.get(key, DELETED), value) and not same(now.get(key, DELETED), before.get(key, DELETED))]
    tokens_before = ctx.tokens(Layer.HISTORY) + ctx.tokens(Layer.WORKING)
    done = ctx.apply_changes(changes, kind="decompress", actor=actor,
                             data={"snapshot_id": snapshot_id, "context": source.name})
    return DecompressResult(snapshot_id=snapshot_id, tokens_before=tokens_before,
                            tokens_after=ctx.tokens(Layer.HISTORY) + ctx.tokens(Layer.WORKING), event_seq=done.seq)


def _history_since_compression(ctx: LayeredContext, snap: Any) -> list[tuple[str, Any]]:
    """HISTORY's changes (``(key, value | DELETED)``) between the end of the compression that took
    ``snap`` and now: the entries a decompression must keep. Empty when no compression took it."""
    event = next((e for e in reversed(ctx.tape)
                  if e.data.get("note") == "compress" and e.data.get("snapshot_id") == snap.id), None)
    if event is None:
        return []
    then = dict(snap.layer(Layer.HISTORY).items())
    for layer, key, value in event.changes:
        if layer == Layer.HISTORY:
            if value is DELETED:
                then.pop(key, None)
            else:
                then[key] = value
    now = ctx.layer(Layer.HISTORY)
    out: list[tuple[str, Any]] = [(k, v) for k, v in now.items()
                                  if k not in then or not (then[k] is v or canonical_json(then[k]) == canonical_json(v))]
    out += [(k, DELETED) for k in then if k not in now]
    return out
