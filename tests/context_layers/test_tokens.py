import subprocess
import sys

import pytest

from context_layers import Layer, LayeredContext, canonical_json
from context_layers.tokens import count_value, encoding, truncate_to_tokens

VALUES = ["hello", 12345, 1.5, None, True, {"b": [1, 2, {"c": "ünïcode 漢字"}], "a": "x"}, ["a" * 500]]


@pytest.mark.parametrize("value", VALUES)
def test_count_equals_encoding_of_canonical_rendering(value):
    enc = encoding()
    assert count_value(value) == len(enc.encode(canonical_json(value)))


def test_layer_counts_follow_writes_and_moves():
    ctx = LayeredContext(system={"p": "policy text"})
    enc = encoding()
    ctx.write(Layer.WORKING, "a", {"x": "some words here"}, actor="t")
    ctx.write(Layer.WORKING, "b", [1, 2, 3], actor="t")
    expect = sum(len(enc.encode(canonical_json(v))) for v in ctx.layer(Layer.WORKING).values())
    assert ctx.tokens(Layer.WORKING) == expect
    ctx.write(Layer.WORKING, "a", "short", actor="t")
    assert ctx.tokens(Layer.WORKING) == len(enc.encode('"short"')) + len(enc.encode("[1,2,3]"))
    ctx.delete(Layer.WORKING, "b", actor="t")
    assert ctx.tokens(Layer.WORKING) == len(enc.encode('"short"'))
    assert ctx.token_report()["total"] == sum(ctx.tokens(layer) for layer in Layer)


def test_truncate_fits_budget():
    text = "the quick brown fox jumps over the lazy dog " * 20
    cut = truncate_to_tokens(text, 17)
    assert len(encoding().encode(cut)) <= 17 and text.startswith(cut) and len(cut) > 20


def test_tokens_work_with_the_network_unreachable(tmp_path):
    """A fresh interpreter whose sockets all fail still counts tokens (files from litellm's wheel)."""
    script = tmp_path / "probe.py"
    script.write_text(
        "import socket\n"
        "def refuse(*a, **k): raise OSError('network disabled for this test')\n"
        "socket.socket.connect = refuse\nsocket.create_connection = refuse\n"
        "import os, sys\nos.environ.pop('TIKTOKEN_CACHE_DIR', None)\n"
        "from context_layers.tokens import count_value\n"
        "print(count_value({'a': 'hello world'}))\n"
        "print('litellm' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    count, imported = out.stdout.split()
    assert int(count) == len(encoding().encode(canonical_json({"a": "hello world"})))
    assert imported == "False"
