"""ActivityExtensionConfig: the per-activity (and per-gateway) governance config.

Accepts the seed's camelCase JSON exactly as written and snake_case too. Unknown
fields, wrong types and bad values are errors that name the field
(``config_from_dict`` turns pydantic's errors into one ``ConfigError``).
"""

from __future__ import annotations

import difflib
import fnmatch
import json
import math
import types
import typing
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Literal, Union

from pydantic import BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, field_validator, model_validator
from pydantic.alias_generators import to_camel
from pydantic_core import PydanticCustomError

from .canonical import canonical_json, text_problem
from .context import key_begins
from .errors import ConfigError

__all__ = [
    "ActivityExtensionConfig",
    "AttentionThresholds",
    "BranchConfig",
    "CompressRule",
    "ConflictPolicy",
    "ContextStrategy",
    "HumanConfirmConfig",
    "KnowledgeConfig",
    "LLMConfig",
    "PolicyRule",
    "MERGE_STRATEGIES",
    "REDUCERS",
    "as_config",
    "config_from_dict",
    "config_json_schema",
    "format_validation_error",
]

MERGE_STRATEGIES = ("MERGE_WITH_CONFLICT_DETECT", "LAST_WRITER_WINS", "BRANCH_PRIORITY", "FAIL_ON_CONFLICT")
REDUCERS = ("append", "union", "sum", "max", "min", "merge")


def _json_problem(value: Any, path: str) -> str | None:
    """Why ``value`` (free-form config JSON; nested config models are checked on their
    own) is no JSON a context can hold, or None."""
    if isinstance(value, BaseModel):
        return None
    if isinstance(value, float):
        return None if math.isfinite(value) else f"{path} is {value!r}, which JSON cannot represent"
    if isinstance(value, str):
        problem = text_problem(value)
        return None if problem is None else f"{path} {problem}"
    if isinstance(value, dict):
        for k, v in value.items():
            found = _json_problem(k, f"{path} key") if isinstance(k, str) else None
            found = found or _json_problem(v, f"{path}.{k}")
            if found:
                return found
    if isinstance(value, (list, tuple)):
        for i, v in enumerate(value):
            found = _json_problem(v, f"{path}[{i}]")
            if found:
                return found
    return None


def _number_only(annotation: Any) -> bool:
    """Whether a field's type takes numbers (int or float, maybe None) and no boolean."""
    args = typing.get_args(annotation) if typing.get_origin(annotation) in (Union, types.UnionType) else (annotation,)
    return bool(args) and any(a in (int, float) for a in args) and all(a in (int, float, type(None)) for a in args)


class _Model(BaseModel):
    model_config = ConfigDict(
        alias_generator=to_camel,
        populate_by_name=True,
        extra="forbid",
        frozen=True,
        str_strip_whitespace=True,
        allow_inf_nan=False,  # no JSON document (an instance record, the tape) can hold them
    )

    @field_validator("*", mode="before")
    @classmethod
    def _no_bool_for_numbers(cls, value: Any, info: ValidationInfo) -> Any:
        # pydantic's lax mode reads a JSON/YAML boolean as a number (true -> 1): a YAML
        # ``compressTokenThreshold: yes`` would compress after every token. A boolean where
        # a number is asked for is a mistake the config's author should hear about.
        if isinstance(value, bool) and info.field_name is not None:
            field = cls.model_fields.get(info.field_name)
            if field is not None and _number_only(field.annotation):
                raise PydanticCustomError("number_not_bool", "Input should be a number, not a boolean (YAML reads an "
                                          "unquoted yes/no/on/off/true/false as one)")
        return value

    @model_validator(mode="after")
    def _json_values(self) -> "_Model":
        # free-form values (contextInject, a rule's value, a default, extra options) end up
        # in contexts, records and the tape: NaN, Infinity or a lone surrogate there would
        # pass validation and fail the run far from the config that holds it
        for name, value in self:
            if isinstance(value, (dict, list, float, str)):
                problem = _json_problem(value, to_camel(name))
                if problem is not None:
                    raise ValueError(problem)
        return self

    if not TYPE_CHECKING:  # for mypy a misspelt field stays an error
        def __getattr__(self, name: str) -> Any:
            # the seed's camelCase names read the fields too (cfg.preserveKeys, rule.extractKeys,
            # thresholds.toolEfficiency), as they are accepted when a config is built
            for field_name, info in type(self).model_fields.items():
                if info.alias == name and field_name != name:
                    return getattr(self, field_name)
            return super().__getattr__(name)

    def dump(self) -> dict[str, Any]:
        """camelCase JSON as in the seed, only fields that were set or differ from defaults."""
        return self.model_dump(mode="json", by_alias=True, exclude_defaults=True)


def _unclosed_bracket(pattern: str) -> bool:
    """Whether a glob has a ``[`` that fnmatch cannot close (``[!`` and a leading ``]`` as fnmatch reads them)."""
    i, n = 0, len(pattern)
    while i < n:
        if pattern[i] == "[":
            j = i + 1
            if j < n and pattern[j] == "!":
                j += 1
            if j < n and pattern[j] == "]":
                j += 1
            j = pattern.find("]", j)
            if j < 0:
                return True
            i = j
        i += 1
    return False


class CompressRule(_Model):
    """A rule applied to HISTORY entries whose kind or key matches ``pattern`` (glob)."""

    pattern: str = Field(min_length=1)
    action: Literal["extract_keys", "summarize", "count_only"]
    extract_keys: list[str] = Field(default_factory=list)
    max_tokens: int | None = Field(default=None, gt=0)
    keep_last: int = Field(default=0, ge=0)

    @field_validator("pattern")
    @classmethod
    def _check_glob(cls, pattern: str) -> str:
        # fnmatch reads an unclosed "[" as a literal, so a typo like "tool_[0-9" would silently
        # match nothing instead of the class its writer meant
        if _unclosed_bracket(pattern):
            raise ValueError(f"glob {pattern!r} opens a character class with '[' and never closes it: "
                             "close it with ']', or write '[[]' for a literal '['")
        return pattern

    @model_validator(mode="after")
    def _check_action_fields(self) -> "CompressRule":
        if self.action == "summarize" and self.max_tokens is None:
            object.__setattr__(self, "max_tokens", 100)
        return self

    def matches(self, kind: str | None, key: str) -> bool:
        """``pattern`` is a glob on the key or the kind; a plain word (no ``*?[``) also matches
        the keys it begins up to a separator: ``tool_call_result`` matches ``tool_call_result_1``
        and ``tool_call_result:search``, not ``tool_call_results``."""
        pattern = self.pattern
        if fnmatch.fnmatchcase(key, pattern) or (kind is not None and fnmatch.fnmatchcase(kind, pattern)):
            return True
        return not any(c in pattern for c in "*?[") and key_begins(key, pattern)


class AttentionThresholds(_Model):
    """Compression fires when a score crosses its threshold (density/decay/toolEfficiency below, redundancy/conflict above)."""

    density: float = Field(default=0.15, ge=0, le=1)
    redundancy: float = Field(default=0.3, ge=0, le=1)
    decay: float = Field(default=0.6, ge=0, le=1)
    conflict: float = Field(default=0.05, ge=0, le=1)
    tool_efficiency: float = Field(default=0.5, ge=0, le=1)


# DESIGN.md's defaults, validated once: the model is frozen, and the compression hook asks
# for the thresholds after every activity (validation costs more than the rest of a check)
_DEFAULT_THRESHOLDS = AttentionThresholds()


class ContextStrategy(_Model):
    preserve_keys: list[str] = Field(default_factory=list)
    compress_rules: list[CompressRule] = Field(default_factory=list)
    compress_token_threshold: int | None = Field(default=None, gt=0)
    compress_message_threshold: int | None = Field(default=None, gt=0)
    attention_thresholds: AttentionThresholds | None = None
    # Cliff compression compresses down to this share of the threshold, so the next
    # activities append without compressing again.
    compress_target_ratio: float = Field(default=0.5, gt=0, le=1)
    required_context: list[str] = Field(default_factory=list)
    # Who decides what a compression folds when it fires: the rules (and the cliff), or
    # the model shown the compression decision prompt (its JSON plan is validated and
    # run by the same compressor; offline, rejected or failed: the rules).
    compression_planner: Literal["model", "rules"] = "rules"


class KnowledgeConfig(_Model):
    rag_collections: list[str] = Field(default_factory=list)
    confidence_threshold: float = Field(default=0.0, ge=0, le=1)
    top_k: int = Field(default=3, gt=0)
    query: str | None = None

    @field_validator("rag_collections")
    @classmethod
    def _plain_names(cls, v: list[str]) -> list[str]:
        # a collection is a folder of knowledge/ beside the process, named, never a path
        for name in v:
            if not name or name in (".", "..") or "/" in name or "\\" in name:
                raise ValueError(f"collection {name!r} is not a folder name; name a folder of knowledge/ "
                                 "beside the process (no '/', '\\' or '..')")
        return v


class BranchConfig(_Model):
    """One outgoing branch of a split gateway; ``id`` is the BPMN id of the branch's first element."""

    id: str = Field(min_length=1)
    condition: str | None = None
    context_inject: dict[str, Any] = Field(default_factory=dict)
    reason_key: str | None = None


class PolicyRule(_Model):
    """Set ``key`` to ``value`` with ``reason`` when ``when`` (an expression over the context) holds;
    a rule without ``when`` always holds.

    ``confirm: true`` still sends the result to a person (human_confirm) with the rule's
    value as the suggested answer.
    """

    key: str = Field(min_length=1)
    when: str = Field(default="True", min_length=1)
    value: Any = None
    reason: str = Field(default="the join's conflictPolicy rule for this key", min_length=1)
    confirm: bool = False


class ConflictPolicy(_Model):
    """Rankings: ``{key: [best, ..., worst]}``: the conflicting value ranked first wins."""

    rankings: dict[str, list[Any]] = Field(default_factory=dict)
    rules: list[PolicyRule] = Field(default_factory=list)
    policy_text: str | None = None


# the longest a person's answer is waited for, in seconds (1,000 years): a large timeout is how a config
# says "never", but a deadline past year 9999 (1e300 seconds) overflowed every date it was shown as,
# failing the instance when it was saved or resumed, not the config or the call
MAX_CONFIRM_TIMEOUT = 1000 * 365.25 * 86400


def doubled_option(values: Sequence[Any], *, before: Sequence[Any] = ()) -> str | None:
    """Why two of the options' ``values`` (after ``before``, options listed earlier) cannot be told
    apart, or None: an answer is one option's value, so two options of one value would take the
    same answer, whichever a person meant."""
    seen = {canonical_json(v) for v in before}
    for i, value in enumerate(values):
        text = canonical_json(value)
        if text in seen:
            shown = json.dumps(value, ensure_ascii=False)
            return (f"offers the value {shown} twice (option {i + 1} here repeats one listed before it): an answer "
                    f"could not tell the two apart; give each option its own value, or drop one")
        seen.add(text)
    return None


def _option_values(options: list[Any]) -> list[Any]:
    """A join's ``humanConfirm`` options as the values a person answers with (a ``{label, value}``
    or the value itself)."""
    return [o["value"] if isinstance(o, Mapping) and "value" in o else o for o in options]


class HumanConfirmConfig(_Model):
    """How a person is asked about a join conflict. ``message`` opens the question (the
    branches' values follow it); ``options`` (values, or ``{label, value}``) are offered
    besides the branches' values, as ``extraOptions`` are. ``defaults`` (``{KEY: VALUE}``)
    gives a conflict on KEY its own default, over the join's one ``default``."""

    message: str | None = None
    options: list[Any] = Field(default_factory=list)
    timeout: float = Field(default=300, gt=0, le=MAX_CONFIRM_TIMEOUT)
    default: Any = None
    defaults: dict[str, Any] = Field(default_factory=dict)
    on_timeout: Literal["default", "escalate"] = "default"
    extra_options: list[dict[str, Any]] = Field(default_factory=list)

    @field_validator("options")
    @classmethod
    def _options_differ(cls, options: list[Any]) -> list[Any]:
        doubled = doubled_option(_option_values(options))
        if doubled:
            raise PydanticCustomError("options_doubled", "{why}", {"why": doubled})
        return options

    @field_validator("extra_options")
    @classmethod
    def _extra_options_differ(cls, extra: list[dict[str, Any]], info: ValidationInfo) -> list[dict[str, Any]]:
        doubled = doubled_option(_option_values(extra), before=_option_values(info.data.get("options") or []))
        if doubled:
            raise PydanticCustomError("options_doubled", "{why}", {"why": doubled + " (humanConfirm.options and "
                                                                       "extraOptions are offered together)"})
        return extra

    @field_validator("defaults", mode="before")
    @classmethod
    def _defaults_per_key(cls, value: Any) -> Any:
        # one default per context key; a conflict on a key not listed keeps the join's ``default``
        if not isinstance(value, Mapping):
            raise PydanticCustomError(
                "defaults_not_mapping", "must be a mapping of context key to its default (defaults: {go_decision: "
                "no_go}), got a {kind}: write one entry per key, or use humanConfirm.default for one default for "
                "every conflict of the join", {"kind": type(value).__name__})
        for key, default in value.items():
            if not isinstance(key, str) or not key.strip():
                raise PydanticCustomError(
                    "defaults_key", f"has an empty key {key!r} or one that is not text: name the context key whose "
                    "conflict takes the default (keys not listed take humanConfirm.default)")
            if default is None:
                raise PydanticCustomError(
                    "defaults_value", f"gives key {key!r} no value (null): give its default (a value, or $escalate), "
                    "or remove the entry so that the key takes humanConfirm.default")
        return value


class LLMOnError(_Model):
    """What a model activity does when the model fails for good (unreachable, no valid answer
    after its retries, an answer its ``outputSchema`` refuses): ``throw`` the BPMN error of this
    errorCode at the task (an error boundary event or error event sub-process catches it),
    instead of failing the instance."""

    throw: str = Field(min_length=1)


class LLMConfig(_Model):
    model: str | None = None
    instructions: str = ""
    output_schema: dict[str, Any] | None = None
    output_keys: list[str] = Field(default_factory=list)
    temperature: float | None = Field(default=None, ge=0, le=2)
    max_tokens: int | None = Field(default=None, gt=0)
    max_retries: int = Field(default=2, ge=0, le=10)
    timeout: float = Field(default=30, gt=0)
    api_base: str | None = None
    tools: bool = False
    render_format: Literal["xml", "json", "plain"] = "xml"
    on_error: LLMOnError | None = None

    @field_validator("output_schema")
    @classmethod
    def _checked_schema(cls, v: dict[str, Any] | None) -> dict[str, Any] | None:
        # the model's answer is checked against it at every call: a keyword the checker cannot
        # read (required: 5, an unknown type) failed each call as a model error, or passed every answer
        if v is not None:
            problem = _schema_problem(v, "")
            if problem is None and "type" in v and "object" not in _type_names(v["type"]):
                problem = "/type: the answer is one JSON object, so the top-level type must be \"object\""
            if problem is not None:
                raise ValueError(f"not a JSON Schema the answer can be checked against: {problem}")
        return v


_SCHEMA_TYPES = ("object", "array", "string", "boolean", "null", "integer", "number")


def _type_names(types: Any) -> list[Any]:
    return [types] if isinstance(types, str) else list(types) if isinstance(types, list) else [types]


def _schema_problem(schema: Any, path: str) -> str | None:
    """Why ``schema`` (at JSON pointer ``path``) is not one the answer checker
    (``engine.answer.validate_schema``) reads, or None. Keywords it does not know are ignored,
    as JSON Schema says; the ones it knows must have the shape JSON Schema gives them."""
    if isinstance(schema, bool):
        return None
    if not isinstance(schema, dict):
        return f"{path or '/'}: a schema is an object, got {type(schema).__name__}"
    if "type" in schema:
        names = _type_names(schema["type"])
        bad = [t for t in names if t not in _SCHEMA_TYPES]
        if bad or not names:
            return (f"{path}/type: {bad[0] if bad else schema['type']!r} is no JSON Schema type; use "
                    f"{', '.join(_SCHEMA_TYPES)}")
    if "required" in schema and not (isinstance(schema["required"], list)
                                     and all(isinstance(k, str) for k in schema["required"])):
        return f"{path}/required: a list of key names, got {schema['required']!r}"
    if "enum" in schema and not isinstance(schema["enum"], list):
        return f"{path}/enum: a list of the allowed values, got {schema['enum']!r}"
    for word in ("minimum", "maximum"):
        if word in schema and (isinstance(schema[word], bool) or not isinstance(schema[word], (int, float))):
            return f"{path}/{word}: a number, got {schema[word]!r}"
    for word in ("minLength", "maxLength", "minItems", "maxItems"):
        if word in schema and (isinstance(schema[word], bool) or not isinstance(schema[word], int) or schema[word] < 0):
            return f"{path}/{word}: a whole number >= 0, got {schema[word]!r}"
    if "properties" in schema:
        if not isinstance(schema["properties"], dict):
            return f"{path}/properties: an object of key -> schema, got {schema['properties']!r}"
        for key, sub in schema["properties"].items():
            found = _schema_problem(sub, f"{path}/properties/{key}")
            if found:
                return found
    for word in ("items", "additionalProperties"):
        if word in schema:
            found = _schema_problem(schema[word], f"{path}/{word}")
            if found:
                return found
    if "anyOf" in schema:
        if not isinstance(schema["anyOf"], list) or not schema["anyOf"]:
            return f"{path}/anyOf: a non-empty list of schemas, got {schema['anyOf']!r}"
        for i, sub in enumerate(schema["anyOf"]):
            found = _schema_problem(sub, f"{path}/anyOf/{i}")
            if found:
                return found
    return None


# fields the seed writes at the top level and inside contextStrategy alike
_EITHER_PLACE = frozenset({"preserve_keys", "compress_rules", "compress_token_threshold",
                           "compress_message_threshold", "attention_thresholds"})
# settings made of fields of their own, which a config file overrides one by one, as contextStrategy's:
# a file that lengthens a join's humanConfirm.timeout keeps the BPMN's message, default and options
_FIELD_BY_FIELD = ("conflict_policy", "human_confirm", "knowledge_config", "llm")
# their maps keyed by context key, which an override merges key by key as well: a change of one key's
# ranking (or default answer) keeps the other keys' (``mode: replace`` replaces them all)
_KEY_BY_KEY = (("conflict_policy", "rankings"), ("human_confirm", "defaults"))


def _once(rules: list[CompressRule]) -> list[CompressRule]:
    out: list[CompressRule] = []
    for rule in rules:
        if rule not in out:
            out.append(rule)
    return out


class ActivityExtensionConfig(_Model):
    """Config of one BPMN element (task or gateway), keyed by its BPMN id."""

    activity_id: str | None = None
    gateway_id: str | None = None
    type: str | None = None
    handler: str | None = None
    context_strategy: ContextStrategy = Field(default_factory=ContextStrategy)
    # The seed also writes these at the top level; they merge into context_strategy.
    preserve_keys: list[str] = Field(default_factory=list)
    compress_rules: list[CompressRule] = Field(default_factory=list)
    compress_token_threshold: int | None = Field(default=None, gt=0)
    compress_message_threshold: int | None = Field(default=None, gt=0)
    attention_thresholds: AttentionThresholds | None = None
    merge_strategy: Literal[
        "MERGE_WITH_CONFLICT_DETECT", "LAST_WRITER_WINS", "BRANCH_PRIORITY", "FAIL_ON_CONFLICT"
    ] = "MERGE_WITH_CONFLICT_DETECT"
    branch_priority: list[str] = Field(default_factory=list)
    reducers: dict[str, Literal["append", "union", "sum", "max", "min", "merge"]] = Field(default_factory=dict)
    conflict_policy: ConflictPolicy | None = None
    human_confirm: HumanConfirmConfig | None = None
    knowledge_config: KnowledgeConfig | None = None
    branches: list[BranchConfig] = Field(default_factory=list)
    llm: LLMConfig | None = None
    # what the engine sends a model from this element (an activity's request and its tools'
    # results, a gateway's condition question, a join's conflict prompt): true hides
    # context_layers.hooks.SECRET_PATTERNS / SECRET_TEXT, false nothing, a list hides these
    # glob patterns of key names too
    redact: bool | list[str] = True

    @field_validator("redact", mode="before")
    @classmethod
    def _redact_setting(cls, v: Any) -> Any:
        # one clear message rather than pydantic's two for the union (and no "yes" read as true)
        if isinstance(v, bool) or (isinstance(v, list) and all(isinstance(p, str) and p.strip() for p in v)):
            return [p.strip() for p in v] if isinstance(v, list) else v
        raise PydanticCustomError(
            "redact_setting", "redact takes true (hide passwords, API keys and tokens from the model: the "
            "default), false (send the values as they are) or a list of extra glob patterns of key names to "
            "hide too, e.g. ['*iban*']" + ("; got {value}" if isinstance(v, (list, dict)) else ""), {"value": repr(v)})

    @field_validator("branches", mode="before")
    @classmethod
    def _branch_ids(cls, v: Any) -> Any:
        """A branch named by its id alone (``branches: [finance, risk]``) is ``{id: finance}``."""
        if isinstance(v, list):
            return [{"id": b} if isinstance(b, str) else b for b in v]
        return v

    @field_validator("preserve_keys")
    @classmethod
    def _no_empty_keys(cls, v: list[str]) -> list[str]:
        for k in v:
            if not k:
                raise ValueError("preserve key must not be empty")
        return v

    @model_validator(mode="after")
    def _check(self) -> "ActivityExtensionConfig":
        ids = [b.id for b in self.branches]
        dup = sorted({i for i in ids if ids.count(i) > 1})
        if dup:
            raise ValueError(f"branch ids must be unique, repeated: {dup}")
        if self.merge_strategy == "BRANCH_PRIORITY" and not self.branch_priority:
            raise ValueError("mergeStrategy BRANCH_PRIORITY needs branchPriority (ordered branch ids)")
        return self._one_strategy()

    def _one_strategy(self) -> "ActivityExtensionConfig":
        """The seed writes ``preserveKeys``, ``compressRules``, the thresholds and
        ``attentionThresholds`` both at the top level and inside ``contextStrategy``. Both
        places then hold the same, effective values (the keys and rules of both, in that
        order, once; a threshold written at the top level over the nested one), so
        ``config.preserve_keys`` and ``config.context_strategy.preserve_keys`` agree."""
        cs = self.context_strategy
        effective: dict[str, Any] = {
            "preserve_keys": list(dict.fromkeys([*cs.preserve_keys, *self.preserve_keys])),
            "compress_rules": _once([*cs.compress_rules, *self.compress_rules]),
            "compress_token_threshold": self.compress_token_threshold or cs.compress_token_threshold,
            "compress_message_threshold": self.compress_message_threshold or cs.compress_message_threshold,
            "attention_thresholds": self.attention_thresholds or cs.attention_thresholds,
        }
        if all(getattr(self, k) == v and getattr(cs, k) == v for k, v in effective.items()):
            return self
        # frozen: set once, while validating; model_fields_set keeps what was written where
        mirrored = cs.model_copy()
        for name, value in effective.items():
            object.__setattr__(self, name, value)
            object.__setattr__(mirrored, name, value)
        object.__setattr__(self, "context_strategy", mirrored)
        return self

    @property
    def _written(self) -> frozenset[str]:
        """Of the fields either place may hold, those written (at the top level or nested)."""
        return frozenset((self.model_fields_set | self.context_strategy.model_fields_set) & _EITHER_PLACE)

    def dump(self) -> dict[str, Any]:
        """As ``_Model.dump``, each field in the place it was written (not mirrored: ``_one_strategy``)."""
        data = super().dump()
        for name in _EITHER_PLACE:
            alias = to_camel(name)
            if name not in self.model_fields_set:
                data.pop(alias, None)
            nested = data.get("contextStrategy")
            if isinstance(nested, dict) and name not in self.context_strategy.model_fields_set:
                nested.pop(alias, None)
        if data.get("contextStrategy") == {}:
            del data["contextStrategy"]
        return data

    def dump_full(self) -> dict[str, Any]:
        """camelCase JSON of every field, those at their defaults too, each once: a field the seed
        lets a config write at the top level or inside ``contextStrategy`` is given at the top level
        (both places hold its effective value: ``_one_strategy``). What a reader of a change needs
        to see each field before and after it (the tape's ``config_change``); validated again, it
        is this config."""
        data = self.model_dump(mode="json", by_alias=True)
        for name in _EITHER_PLACE:
            data["contextStrategy"].pop(to_camel(name), None)
        return data

    # Effective values (top-level fields and contextStrategy agree: ``_one_strategy``).
    @property
    def effective_preserve_keys(self) -> list[str]:
        return self.preserve_keys

    @property
    def effective_compress_rules(self) -> list[CompressRule]:
        return self.compress_rules

    @property
    def effective_token_threshold(self) -> int | None:
        return self.compress_token_threshold

    @property
    def effective_message_threshold(self) -> int | None:
        return self.compress_message_threshold

    @property
    def effective_attention_thresholds(self) -> AttentionThresholds:
        return self.attention_thresholds or _DEFAULT_THRESHOLDS

    @property
    def explicit_attention_scores(self) -> frozenset[str]:
        """The attention scores whose threshold the designer wrote (names as in
        ``AttentionScore.to_dict``: ``toolEfficiency``); the others use DESIGN.md's defaults."""
        written = self.attention_thresholds or self.context_strategy.attention_thresholds
        if written is None:
            return frozenset()
        return frozenset("toolEfficiency" if name == "tool_efficiency" else name for name in written.model_fields_set)

    @property
    def compression_configured(self) -> bool:
        """Whether this activity asks for compression at all: a threshold, attention
        thresholds or rules. Without one, nothing fires after it (a cliff happens where
        the designer put one, not after every activity that merely has a handler)."""
        return bool(self.effective_token_threshold or self.effective_message_threshold
                    or self.attention_thresholds or self.context_strategy.attention_thresholds
                    or self.effective_compress_rules)

    def branch(self, branch_id: str) -> BranchConfig | None:
        for b in self.branches:
            if b.id == branch_id:
                return b
        return None

    def merged_with(self, override: "ActivityExtensionConfig") -> "ActivityExtensionConfig":
        """Fields set in ``override`` replace ours (the config file over the BPMN extension),
        those of ``contextStrategy``, ``humanConfirm``, ``llm``, ``knowledgeConfig`` and
        ``conflictPolicy`` one by one, and the entries of ``conflictPolicy.rankings`` and
        ``humanConfirm.defaults`` (maps keyed by context key) key by key; a field the seed lets either place hold
        (``compressRules``, the thresholds, ...) is replaced wherever ``override`` wrote it.
        ``preserveKeys`` add up: a key the process preserves stays preserved."""
        data = self.model_dump(exclude_unset=True)
        over = override.model_dump(exclude_unset=True)
        for name in _EITHER_PLACE - override._written:  # normalized there, never written
            over.pop(name, None)
            over.get("context_strategy", {}).pop(name, None)
        for name in override._written - {"preserve_keys"}:
            data.pop(name, None)
            data.get("context_strategy", {}).pop(name, None)
        if "preserve_keys" in override._written:
            over["preserve_keys"] = list(dict.fromkeys([*self.preserve_keys, *override.preserve_keys]))
            over.get("context_strategy", {}).pop("preserve_keys", None)
        strategy = {**data.get("context_strategy", {}), **over.get("context_strategy", {})}
        for section, name in _KEY_BY_KEY:
            mine, theirs = data.get(section) or {}, over.get(section) or {}
            if isinstance(mine.get(name), dict) and isinstance(theirs.get(name), dict):
                theirs[name] = {**mine[name], **theirs[name]}
        for name in _FIELD_BY_FIELD:
            if isinstance(data.get(name), dict) and isinstance(over.get(name), dict):
                over[name] = {**data[name], **over[name]}
        data.update(over)
        if strategy:
            data["context_strategy"] = strategy
        return ActivityExtensionConfig.model_validate(data)


def format_validation_error(err: ValidationError, *, source: str = "", element_id: str | None = None) -> list[dict[str, Any]]:
    """One problem per pydantic error: ``{"file", "id", "field", "message"}``."""
    problems = []
    for e in err.errors():
        field = ".".join(str(p) for p in e["loc"]) or "(config)"
        msg = e["msg"]
        if e["type"] == "extra_forbidden":
            msg = _unknown_field(tuple(e["loc"]))
        elif e["type"] == "string_type" and isinstance(e.get("input"), bool):
            # a YAML file's yes/no/on/off (an element id "no") arrive as booleans
            msg = (f"{msg}, got {e['input']!r}; YAML reads an unquoted yes/no/on/off/true/false as a boolean: "
                   "put the value in quotes")
        elif _quotable(e.get("input")) and e["type"] != "missing":
            msg = f"{msg}, got {e['input']!r}"  # the offending value, so it can be found in the file
        problems.append({"file": source, "id": element_id, "field": field, "message": msg})
    return problems


def _quotable(value: Any) -> bool:
    """A value short enough to quote in a message (a scalar: a dict or list would drown it)."""
    return isinstance(value, (str, int, float)) and len(repr(value)) <= 80


def _fields(model: type[BaseModel]) -> dict[str, str]:
    """Every name a model's fields accept (camelCase alias and snake_case) -> the alias."""
    out = {}
    for name, info in model.model_fields.items():
        alias = info.alias or name
        out[name] = out[alias] = alias
    return out


# where a field given in the wrong place belongs (checked in this order)
_HOMES: tuple[tuple[type[BaseModel], str], ...] = (
    (BranchConfig, "a field of one branch of a split gateway: put it under the gateway's "
                   "branches: [{id: BRANCH_FIRST_ELEMENT_ID, ...}]"),
    (ContextStrategy, "a field of contextStrategy"),
    (KnowledgeConfig, "a field of knowledgeConfig"),
    (LLMConfig, "a field of llm"),
    (HumanConfirmConfig, "a field of humanConfirm"),
    (ConflictPolicy, "a field of conflictPolicy"),
)


def _model_in(annotation: Any) -> type[BaseModel] | None:
    """The config model an annotation holds (``Model``, ``Model | None``, ``list[Model]``), if any."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    return next((m for a in getattr(annotation, "__args__", ()) if (m := _model_in(a)) is not None), None)


def _model_at(loc: tuple[Any, ...]) -> type[BaseModel] | None:
    """The model whose field ``loc[-1]`` was looked up in (list indexes skipped)."""
    model: type[BaseModel] | None = ActivityExtensionConfig
    for part in loc[:-1]:
        if isinstance(part, int) or model is None:
            continue
        field = next((f for n, f in model.model_fields.items() if part in (n, f.alias)), None)
        model = _model_in(field.annotation) if field is not None else None
    return model


def _unknown_field(loc: tuple[Any, ...]) -> str:
    """What to do about a field the config does not know: where it belongs, or the name it resembles."""
    name = str(loc[-1]) if loc else ""
    model = _model_at(loc)
    known = _fields(model) if model is not None else {}
    homes = [(home, where) for home, where in _HOMES if home is not model and name in _fields(home)]
    if homes:
        alias = _fields(homes[0][0])[name]
        return f"unknown field here; {alias!r} is " + ", or ".join(where for _, where in homes)
    close = difflib.get_close_matches(name, list(known), n=1, cutoff=0.75)
    if close:
        return f"unknown field; did you mean {known[close[0]]!r}?"
    return "unknown field; check the spelling (camelCase or snake_case)"


def as_config(config: "ActivityExtensionConfig | Mapping[str, Any] | None", *, source: str = "config") -> ActivityExtensionConfig:
    """A config as given: the model, its JSON form (validated, as the seed writes it), or none (the defaults)."""
    if config is None:
        return ActivityExtensionConfig()
    if isinstance(config, ActivityExtensionConfig):
        return config
    if isinstance(config, Mapping):
        return config_from_dict(dict(config), source=source)
    raise TypeError(f"{source}: config must be an ActivityExtensionConfig or its JSON object, got {type(config).__name__}")


def config_from_dict(data: Any, *, source: str = "", element_id: str | None = None) -> ActivityExtensionConfig:
    """Validate a config mapping; raise one ``ConfigError`` naming file, element id and every bad field."""
    if not isinstance(data, dict):
        raise ConfigError(f"{source or 'config'}: config for {element_id or 'element'} must be an object, got {type(data).__name__}",
                          problems=[{"file": source, "id": element_id, "field": "(config)", "message": "must be an object"}])
    try:
        return ActivityExtensionConfig.model_validate(data)
    except ValidationError as err:
        problems = format_validation_error(err, source=source, element_id=element_id)
        lines = [f"{p['file'] or 'config'}: {p['id'] or 'element'}: field {p['field']}: {p['message']}" for p in problems]
        raise ConfigError("invalid activity config:\n  " + "\n  ".join(lines), problems=problems) from None


def config_json_schema() -> dict[str, Any]:
    """The JSON Schema of ActivityExtensionConfig (camelCase, as written in config files)."""
    return ActivityExtensionConfig.model_json_schema(by_alias=True)
