"""The public names of DESIGN.md are importable, listed in __all__, and the pure
packages import no workflow engine, web framework or model client."""

import importlib
import subprocess
import sys

import pytest

PUBLIC = {
    "context_layers": ["Layer", "LayeredContext", "ContextWriteDenied", "ActivityExtensionConfig", "AttentionScore",
                       "CompressTriggerDetector", "RuleDrivenCompressor", "CompressResult", "render"],
    "gateways": ["ContextSplitter", "ConflictDetector", "MergedConflict", "DELETED"],
    "engine": ["load_process", "Engine"],
}


@pytest.mark.parametrize("package", sorted(PUBLIC))
def test_public_names_in_all(package):
    mod = importlib.import_module(package)
    for name in PUBLIC[package]:
        assert name in mod.__all__, f"{package}.__all__ lacks {name}"
        assert getattr(mod, name) is not None
    for name in mod.__all__:
        assert hasattr(mod, name), f"{package}.__all__ names {name}, which does not exist"


def test_pure_packages_import_no_engine_dependencies():
    code = ("import sys, context_layers, gateways\n"
            "bad = [m for m in ('SpiffWorkflow', 'fastapi', 'litellm', 'starlette') if m in sys.modules]\n"
            "print(','.join(bad))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == ""


def test_layer_str_and_identity():
    from context_layers import Layer

    assert str(Layer.WORKING) == "L4" and Layer.SYSTEM is Layer(0) and Layer.EPHEMERAL is Layer(5)


def test_the_seed_s_sketch_runs_as_written_in_python():
    """The seed's Java sketch, its calls in Python spelling: the names it uses answer."""
    from context_layers import (ActivityExtensionConfig, AttentionScore, CompressTriggerDetector, Layer,
                                LayeredContext, RuleDrivenCompressor)
    from gateways import ConflictDetector, ContextSplitter

    ctx = LayeredContext(system={"policy": "dual approval above 100k"})
    ctx.write(Layer.PROCESS, "amount", 120000)
    ctx.begin_activity("risk_assessment")
    ctx.write(Layer.WORKING, "risk_level", "medium")
    ctx.write(Layer.WORKING, "notes", "long reasoning " * 40)
    ctx.complete_activity("risk_assessment")
    assert dict(ctx.get_layer(Layer.PROCESS)) == {"amount": 120000}
    assert ctx.get_token_count(Layer.HISTORY) == ctx.tokens(Layer.HISTORY) > 0
    assert ctx.get_message_count(Layer.HISTORY) == 3  # risk_level, notes and the activity record
    ctx.begin_activity("review")  # the latest activity is kept whole: compression folds older ones
    ctx.write(Layer.WORKING, "review", "ok")
    ctx.complete_activity("review")
    config = ActivityExtensionConfig.model_validate({
        "activityId": "decide", "contextStrategy": {"preserveKeys": ["risk_level"], "compressTokenThreshold": 20}})
    detector = CompressTriggerDetector()
    assert detector.detect(ctx, config) and detector.calculate_attention_score(ctx, config) == \
        AttentionScore.compute(ctx, config)
    result = RuleDrivenCompressor().compress(ctx, config)
    assert result.after_tokens < result.before_tokens and 0 < result.compression_ratio < 1
    assert ctx.resolve("risk_level") == "medium"  # preserved
    gateway = {"gatewayId": "review", "type": "AND_SPLIT",
               "branches": [{"id": "branch_finance"}, {"id": "branch_risk"}]}
    finance, risk = ContextSplitter().split(ctx, gateway)
    assert (finance.context.resolve("_branch_id"), risk.context.resolve("_snapshot_id")) == \
        ("branch_finance", finance.snapshot_id)
    [conflict] = ConflictDetector().detect_conflicts({"approval_status": "pending"},
                                                     [{"approval_status": "approved"}, {"approval_status": "rejected"}])
    assert conflict.source_branches == ("branch_0", "branch_1")
