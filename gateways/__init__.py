"""layerflow gateways: split and join of contexts, conflict detection, merge
strategies and conflict resolution (policy, model, person). Pure: imports no workflow
engine, web framework or model client."""

from .arbiter import (
    ArbiterAnswerError,
    ArbitrationAnswer,
    ArbitrationRequest,
    ConflictArbiter,
    build_conflict_prompt,
    parse_arbiter_answer,
)
from .conditions import (
    BranchAnswer,
    BranchAnswerError,
    BranchChooser,
    BranchOption,
    BranchQuestion,
    ask_branch,
    build_branch_prompt,
    is_natural_language,
    parse_branch_answer,
)
from .conflicts import DELETED, ConflictDetector, MergedConflict, MergeOutcome, Resolution, three_way_merge
from .expressions import ExpressionError, UnknownNameError, UnsafeExpressionError, evaluate, evaluate_condition
from .join import MERGED_CONFLICTS_KEY, JoinResult, ResolvedConflict, apply_join, join_contexts
from .policy import (
    HumanRequest,
    InvalidAnswerError,
    ResolutionOutcome,
    ResolutionStep,
    build_human_request,
    resolve_by_policy,
    resolve_conflicts,
)
from .splitter import BranchContext, ContextSplitter
from .strategies import ReducerError, reduce_values, resolve_by_strategy

__all__ = [
    "ArbiterAnswerError",
    "ArbitrationAnswer",
    "ArbitrationRequest",
    "BranchAnswer",
    "BranchAnswerError",
    "BranchChooser",
    "BranchContext",
    "BranchOption",
    "BranchQuestion",
    "ConflictArbiter",
    "ConflictDetector",
    "ContextSplitter",
    "DELETED",
    "ExpressionError",
    "HumanRequest",
    "InvalidAnswerError",
    "JoinResult",
    "MERGED_CONFLICTS_KEY",
    "MergeOutcome",
    "MergedConflict",
    "ReducerError",
    "Resolution",
    "ResolvedConflict",
    "ResolutionOutcome",
    "ResolutionStep",
    "UnknownNameError",
    "UnsafeExpressionError",
    "apply_join",
    "ask_branch",
    "build_branch_prompt",
    "build_conflict_prompt",
    "build_human_request",
    "evaluate",
    "evaluate_condition",
    "is_natural_language",
    "join_contexts",
    "parse_arbiter_answer",
    "parse_branch_answer",
    "reduce_values",
    "resolve_by_policy",
    "resolve_by_strategy",
    "resolve_conflicts",
    "three_way_merge",
]
