"""The layerflow context model: layers, permissions, tape, snapshots, tokens,
attention, compression and rendering. Pure: imports no workflow engine, web
framework or model client."""

from .canonical import canonical_json, canonical_key, freeze, json_equal, thaw
from .config import (
    ActivityExtensionConfig,
    AttentionThresholds,
    BranchConfig,
    CompressRule,
    ContextStrategy,
    KnowledgeConfig,
    config_from_dict,
    config_json_schema,
)
from .attention import AttentionScore, CompressTriggerDetector, TriggerDecision
from .compression import CompressResult, DecompressResult, EvaluateReport, RuleDrivenCompressor, decompress, evaluate
from .compression_plan import (
    CompressionPlan,
    CompressionPlanRejected,
    build_compression_prompt,
    execute_plan,
    parse_compression_plan,
)
from .summarize import ExtractiveSummarizer, Summarizer
from .context import Entry, LayeredContext, Snapshot, View
from .hooks import drop_tool_results, newest_read_only, redact
from .prefix import prefix_stability, sliding_window_trim
from .render import RenderOptions, render
from .errors import (
    ConfigError,
    ContextKeyError,
    ContextValueError,
    ContextWriteDenied,
    LayerflowError,
)
from .layers import Layer
from .markers import DELETED
from .tape import Event, EventKind, Tape

__all__ = [
    "ActivityExtensionConfig",
    "AttentionScore",
    "CompressResult",
    "CompressionPlan",
    "CompressionPlanRejected",
    "DecompressResult",
    "ExtractiveSummarizer",
    "Summarizer",
    "build_compression_prompt",
    "execute_plan",
    "parse_compression_plan",
    "CompressTriggerDetector",
    "EvaluateReport",
    "RenderOptions",
    "RuleDrivenCompressor",
    "TriggerDecision",
    "decompress",
    "drop_tool_results",
    "evaluate",
    "newest_read_only",
    "prefix_stability",
    "redact",
    "render",
    "sliding_window_trim",
    "AttentionThresholds",
    "BranchConfig",
    "CompressRule",
    "ConfigError",
    "ContextKeyError",
    "ContextStrategy",
    "ContextValueError",
    "ContextWriteDenied",
    "DELETED",
    "Entry",
    "Event",
    "EventKind",
    "KnowledgeConfig",
    "Layer",
    "LayeredContext",
    "LayerflowError",
    "Snapshot",
    "Tape",
    "View",
    "canonical_json",
    "canonical_key",
    "config_from_dict",
    "config_json_schema",
    "freeze",
    "json_equal",
    "thaw",
]
