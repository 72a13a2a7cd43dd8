import pytest

from context_layers import ActivityExtensionConfig, ConfigError, config_from_dict, config_json_schema

SEED = {
    "activityId": "risk_assessment",
    "contextStrategy": {
        "preserveKeys": ["risk_level", "assessment_id"],
        "compressRules": [{"pattern": "tool_call_result", "action": "extract_keys", "extractKeys": ["status", "data.id"]}],
        "compressTokenThreshold": 4000,
        "attentionThresholds": {"density": 0.15, "redundancy": 0.3},
    },
    "mergeStrategy": "MERGE_WITH_CONFLICT_DETECT",
    "knowledgeConfig": {"ragCollections": ["risk_kb", "policy_kb"], "confidenceThreshold": 0.7},
}


def test_seed_camel_case_accepted_exactly():
    cfg = config_from_dict(SEED)
    assert cfg.activity_id == "risk_assessment"
    assert cfg.effective_preserve_keys == ["risk_level", "assessment_id"]
    assert cfg.effective_compress_rules[0].extract_keys == ["status", "data.id"]
    assert cfg.effective_token_threshold == 4000
    assert cfg.knowledge_config.rag_collections == ["risk_kb", "policy_kb"]


@pytest.mark.parametrize("build", [config_from_dict, ActivityExtensionConfig.model_validate,
                                   lambda d: ActivityExtensionConfig(**d)])
def test_both_places_of_the_seed_read_the_same(build):
    """The seed writes preserveKeys and the compression fields inside contextStrategy in one
    example and at the top level in another: either place holds what both wrote."""
    cfg = build({**SEED, "preserveKeys": ["risk_factors", "risk_level"], "compressMessageThreshold": 12})
    for where in (cfg, cfg.context_strategy):
        assert where.preserve_keys == ["risk_level", "assessment_id", "risk_factors"]
        assert [r.pattern for r in where.compress_rules] == ["tool_call_result"]
        assert (where.compress_token_threshold, where.compress_message_threshold) == (4000, 12)
        assert where.attention_thresholds.density == 0.15
    assert cfg.explicit_attention_scores == {"density", "redundancy"}
    assert ActivityExtensionConfig.model_validate(cfg.model_dump(by_alias=True)) == cfg  # a round trip adds nothing
    # shown as written: each field where it was written
    assert cfg.dump()["preserveKeys"] == ["risk_level", "assessment_id", "risk_factors"]  # the effective list
    assert "compressTokenThreshold" not in cfg.dump() and "compressMessageThreshold" not in cfg.dump()["contextStrategy"]
    assert config_from_dict({"preserveKeys": ["a"]}).dump() == {"preserveKeys": ["a"]}


def test_a_config_file_replaces_a_field_wherever_either_wrote_it():
    bpmn = config_from_dict({**SEED, "preserveKeys": ["x"], "contextStrategy": {
        **SEED["contextStrategy"], "requiredContext": ["amount"]}})
    file = config_from_dict({"preserveKeys": ["z"], "contextStrategy": {"compressTargetRatio": 0.3}})
    merged = bpmn.merged_with(file)
    # preserved keys add up (a key the process preserves stays preserved); the rest is replaced
    assert merged.preserve_keys == merged.context_strategy.preserve_keys == ["risk_level", "assessment_id", "x", "z"]
    assert merged.compress_token_threshold == 4000 and merged.context_strategy.required_context == ["amount"]
    assert merged.context_strategy.compress_target_ratio == 0.3
    nested = bpmn.merged_with(config_from_dict({"contextStrategy": {"compressTokenThreshold": 99}}))
    assert (nested.preserve_keys, nested.compress_token_threshold) == (["risk_level", "assessment_id", "x"], 99)
    assert ActivityExtensionConfig().merged_with(bpmn) == bpmn


def test_top_level_seed_forms_and_snake_case():
    cfg = config_from_dict({
        "activity_id": "x",
        "preserve_keys": ["risk_level", "assessment_id", "risk_factors"],
        "compress_rules": [
            {"pattern": "reasoning_chain", "action": "summarize", "max_tokens": 100},
            {"pattern": "error_retry_log", "action": "count_only", "keepLast": 1},
        ],
    })
    assert cfg.effective_preserve_keys == ["risk_level", "assessment_id", "risk_factors"]
    assert [r.action for r in cfg.effective_compress_rules] == ["summarize", "count_only"]


def test_gateway_branches():
    cfg = config_from_dict({
        "gatewayId": "approval_split", "type": "XOR_SPLIT",
        "branches": [
            {"id": "fast_track", "condition": "risk low and amount below 50000",
             "contextInject": {"track_type": "fast", "requires_approval": False}},
            {"id": "full_review", "condition": "otherwise", "contextInject": {"track_type": "full"}},
        ],
    })
    assert cfg.branch("fast_track").context_inject == {"track_type": "fast", "requires_approval": False}


@pytest.mark.parametrize("data, field, fragment", [
    ({"preserveKey": ["a"]}, "preserveKey", "unknown field"),
    ({"mergeStrategy": "YOLO"}, "mergeStrategy", "MERGE_WITH_CONFLICT_DETECT"),
    ({"contextStrategy": {"compressTokenThreshold": -5}}, "contextStrategy.compressTokenThreshold", "greater than 0"),
    ({"compressRules": [{"pattern": "x", "action": "shred"}]}, "compressRules.0.action", "extract_keys"),
    ({"knowledgeConfig": {"confidenceThreshold": 2}}, "knowledgeConfig.confidenceThreshold", "less than or equal to 1"),
    ({"preserveKeys": "risk_level"}, "preserveKeys", "list"),
    ({"mergeStrategy": "BRANCH_PRIORITY"}, "(config)", "branchPriority"),
    # what no JSON record can hold passed validation, then failed the run (invalid_record /
    # invalid_value naming the data file or "note event data", not the config)
    ({"humanConfirm": {"timeout": float("inf")}}, "humanConfirm.timeout", "finite number"),
    ({"humanConfirm": {"default": float("inf")}}, "humanConfirm", "default is inf"),
    ({"branches": [{"id": "b", "contextInject": {"score": float("nan")}}]}, "branches.0", "contextInject.score is nan"),
    ({"conflictPolicy": {"rules": [{"key": "k", "when": "True", "value": ["\ud800"], "reason": "r"}]}},
     "conflictPolicy.rules.0", "lone surrogate"),
])
def test_bad_config_names_file_id_and_field(data, field, fragment):
    with pytest.raises(ConfigError) as info:
        config_from_dict(data, source="loan.layerflow.yaml", element_id="risk_assessment")
    problems = info.value.problems
    assert any(p["field"] == field and fragment in p["message"] for p in problems), problems
    assert "loan.layerflow.yaml" in str(info.value) and "risk_assessment" in str(info.value)


@pytest.mark.parametrize("schema, fragment", [
    ({"type": "object", "required": 5}, "/required: a list of key names"),
    ({"type": "objekt"}, "/type: 'objekt' is no JSON Schema type"),
    ({"type": "object", "properties": {"risk": {"type": "string", "enum": "low"}}}, "/properties/risk/enum"),
    ({"type": "object", "properties": {"n": {"type": "number", "minimum": "0"}}}, "/properties/n/minimum"),
    ({"type": "string"}, "top-level type must be \"object\""),
])
def test_an_output_schema_the_answer_cannot_be_checked_against_is_a_config_error(schema, fragment):
    # it was accepted, then every model call failed as a model error ("TypeError: 'int' object is not
    # iterable; check that the model server is reachable"), or an unknown type let every answer through
    with pytest.raises(ConfigError) as info:
        config_from_dict({"llm": {"outputSchema": schema}}, source="review.layerflow.yaml", element_id="summarize")
    problems = info.value.problems
    assert any(p["field"] == "llm.outputSchema" and fragment in p["message"] for p in problems), problems
    good = {"type": "object", "required": ["verdict"], "additionalProperties": False,
            "properties": {"verdict": {"enum": ["ok", "bad"]}, "score": {"type": ["integer", "null"], "minimum": 0},
                           "tags": {"type": "array", "items": {"type": "string", "maxLength": 20}, "maxItems": 5}}}
    assert config_from_dict({"llm": {"outputSchema": good}}).llm.output_schema == good


def test_json_schema_export():
    schema = config_json_schema()
    assert "preserveKeys" in schema["properties"] and "mergeStrategy" in schema["properties"]
    assert ActivityExtensionConfig.model_json_schema(by_alias=True) == schema
