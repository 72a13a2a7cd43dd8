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
